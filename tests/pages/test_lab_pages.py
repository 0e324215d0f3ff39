"""The Training lab and Runs pages under AppTest: start real runs on the built-in model, see metrics arrive,
stop, open on the Runs page, overlay, export, delete; two sessions do not interfere."""

import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from divviz.engine.config import RunConfig
from divviz.runs import runner, store

APP = str(Path(__file__).resolve().parents[2] / "router.py")


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    return tmp_path


def lab(query=None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if query:
        at.query_params.update(query)
    at.run()
    at.switch_page("app_pages/training_lab.py").run()
    assert not at.exception, at.exception
    return at


def wait_for(at: AppTest, predicate, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        at.run()
        assert not at.exception, at.exception
        if predicate(at):
            return
        time.sleep(0.5)
    raise AssertionError("timed out")


def button(at, label):
    return next(b for b in at.button if b.label == label)


def test_start_watch_stop_and_find_on_runs_page(runs_root):
    at = lab({"m": "ratio,kl3", "steps": "200", "prompts": "16", "group_size": "8"})  # minutes: still running at Stop
    button(at, "Start").click().run()
    names = at.session_state["lab_runs"]
    assert len(names) == 2 and all((runs_root / n).is_dir() for n in names)
    wait_for(at, lambda at: all(len(store.read_metrics(runs_root / n)) >= 3 for n in names))
    assert len(at.get("plotly_chart")) == 10  # reward, entropy, its change and covariance by state, clipping, kl,
    # update, mass by π_old, token scatter
    assert button(at, "Start").disabled and not button(at, "Stop").disabled
    button(at, "Stop").click().run()  # returns at once; the runs stop in the background
    wait_for(at, lambda at: [store.read_run(runs_root / n).state for n in names] == ["stopped", "stopped"], 30)
    at.run()
    assert not button(at, "Start").disabled

    at.switch_page("app_pages/runs.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["run"]) == set(names) and set(table["state"]) == {"stopped"}
    assert len(at.get("plotly_chart")) == 9  # the two latest runs are overlaid
    csv = next(b for b in at.get("download_button") if "CSV" in b.proto.label).proto
    assert csv.label == "Metrics of these runs (CSV)"


def test_a_failing_run_shows_its_message(runs_root):
    at = lab({"m": "ratio", "steps": "3"})
    next(sb for sb in at.selectbox if sb.label == "Model").set_value("a folder or hub id").run()
    next(t for t in at.text_input if t.label == "Folder or hub id").set_value("./no/such/model").run()
    button(at, "Start").click().run()
    wait_for(at, lambda at: any("does not exist" in e.value for e in at.error))


def test_runs_page_delete_with_confirmation(runs_root):
    folder = runner.start_run(RunConfig.make(steps=1, prompts=2, group_size=2), runs_root)
    deadline = time.time() + 120
    while store.read_run(folder).state in ("queued", "running") and time.time() < deadline:
        time.sleep(0.2)
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    at.selectbox(key="runs:delete").set_value(folder.name).run()
    assert not [b for b in at.button if b.key == "runs:delete_button"]  # no button before the confirmation
    at.checkbox(key="runs:confirm").check().run()
    at.button(key="runs:delete_button").click().run()
    assert not at.exception and not folder.exists()
    assert "Deleted" in at.success[0].value


def test_two_sessions_do_not_interfere(runs_root):
    a = lab({"m": "ratio", "steps": "2", "prompts": "2", "group_size": "2"})
    b = lab({"m": "kl3", "steps": "2", "prompts": "2", "group_size": "2"})
    button(a, "Start").click().run()
    button(b, "Start").click().run()
    runs_a, runs_b = a.session_state["lab_runs"], b.session_state["lab_runs"]
    assert len(runs_a) == len(runs_b) == 1 and runs_a != runs_b
    for at, runs in ((a, runs_a), (b, runs_b)):
        wait_for(at, lambda at: store.read_run(runs_root / runs[0]).state == "done")
    assert store.read_run(runs_root / runs_a[0]).config["clip"] == "ratio"
    assert store.read_run(runs_root / runs_b[0]).config["clip"] == "kl3"


def test_same_batch_comparison_on_the_page(runs_root):
    at = lab({"m": "ratio,kl3,kl3:delta=0.1,prob_tv", "prompts": "4", "group_size": "4", "mu": "4",
              "lr": "0.005"})
    at.button(key="lab:compare").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["objective"]) == ["ratio ε=0.2", "kl3 δ=0.05", "kl3 δ=0.1", "prob_tv δ=0.1"]
    assert (table["gradient masked at the last step (low, high or dual-clip)"] > 0).any()
    assert table["KL k3 of the update"].nunique() == 4  # the measures moved the policy differently
    assert len(at.get("plotly_chart")) == 2
    columns = [h.proto.body for h in at.get("html") if "dv-c" in h.proto.body and "dv-legend" not in h.proto.body]
    assert len(columns) == 4 and len(set(columns)) > 1  # the same completion under each measure, told apart
    at.selectbox(key="lab:compare_colour").set_value("Δπ").run()
    assert not at.exception and any("Δπ" in h.proto.body for h in at.get("html"))
    assert not any("settings of the last comparison" in w.value for w in at.warning)
    next(s for s in at.slider if s.label == "mu").set_value(2).run()  # the results on screen are now for μ = 4
    assert any("settings of the last comparison" in w.value for w in at.warning)


def test_the_lab_compares_rollout_corrections_under_a_lagging_sampler(runs_root):
    """A link with a bfloat16 sampler two updates behind and three corrections to compare: one run per correction,
    each labelled with it, verl's rollout panel drawn, the rejection rejecting, and the same-batch comparison's table
    telling the corrections apart (rejected share, KL of the update)."""
    at = lab({"m": "kl3", "rollout_dtype": "bfloat16", "rollout_lag": "2", "rc": "none,TIS token,rejection",
              "tis_u": "1.2", "rs_option": "token_k3", "rs_bound": "0.0001", "steps": "4", "prompts": "4",
              "group_size": "4", "lr": "0.01", "mu": "1"})
    button(at, "Start").click().run()
    names = at.session_state["lab_runs"]
    configs = [store.read_run(runs_root / n).config for n in names]
    assert [(c["rollout_is"], c["rollout_rs"], c["rollout_lag"], c["rollout_dtype"]) for c in configs] == [
        (None, None, 2, "bfloat16"), ("token", None, 2, "bfloat16"), (None, "token_k3", 2, "bfloat16")]
    wait_for(at, lambda at: all(store.read_run(runs_root / n).state == "done" for n in names))
    charts = at.get("plotly_chart")
    assert len(charts) == 11  # the eight panels (stability too), verl's rollout panel, mass by π_old, the token scatter
    last = [store.read_metrics(runs_root / n)[-1] for n in names]
    assert last[0]["rollout_corr/k3_kl"] > 0 and "rollout_corr/rollout_is_mean" in last[1]
    assert last[2]["rollout_corr/rollout_rs_masked_fraction"] > 0
    at.button(key="lab:compare").click().run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert [label.split(" · ")[-1] for label in table["objective"]] == [
        "sampler bfloat16, lag 2", "TIS token u=1.2", "RS token_k3 0.0001"]
    assert table["rejected (rollout)"].tolist()[:2] == [0.0, 0.0] and table["rejected (rollout)"].iloc[2] > 0
    assert table["KL k3 of the update"].nunique() == 3


def test_same_batch_shares_rollouts_and_start_weights():
    from divviz.catalogue.divergences import clip_test
    from divviz.engine.compare import same_batch
    from divviz.losses import Objective

    cfg = RunConfig.make(prompts=4, group_size=4, mu=4, lr=0.05)  # big steps: the boxes bind
    ratio = Objective(clip=clip_test("ratio"))
    narrow = Objective(clip=clip_test("kl3", delta=0.001))  # ratios in [0.956, 1.045]: masks what PPO's box keeps
    a, b, c = same_batch(cfg, [("a", ratio), ("kl3", narrow), ("a again", ratio)])
    assert (a.pi_old == b.pi_old).all()  # the same tokens from the same start
    assert (a.pi_new == c.pi_new).all()  # the start weights are restored before each objective
    assert not (a.pi_new == b.pi_new).all()


def test_a_terminal_run_appears_on_the_runs_page_and_updates(runs_root):
    import subprocess
    import sys

    exe = str(Path(sys.executable).with_name("divviz"))
    proc = subprocess.Popen([exe, "train", "--steps", "5000", "--prompts", "4", "--group-size", "4",  # never ends first
                             "--runs-dir", str(runs_root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        at.switch_page("app_pages/runs.py").run()

        def steps(at):
            table = at.dataframe[0].value if at.dataframe else None
            return None if table is None or table.empty else table.iloc[0]

        wait_for(at, lambda at: steps(at) is not None and steps(at)["state"] == "running"
                 and int(steps(at)["step"].split("/")[0]) >= 1)
        first = int(steps(at)["step"].split("/")[0])
        wait_for(at, lambda at: int(steps(at)["step"].split("/")[0]) > first)  # it updates as it trains
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    at.run()
    assert steps(at)["state"] == "stopped"


def test_checkpoints_feed_the_same_batch_comparison(tmp_path):
    from divviz.catalogue.divergences import clip_test
    from divviz.engine.compare import same_batch
    from divviz.losses import Objective
    from divviz.runs.train import train

    cfg = RunConfig.make(steps=4, prompts=4, group_size=4, checkpoint_every=2, lr=0.01)
    folder = train(cfg, tmp_path)
    assert store.checkpoint_steps(folder) == [2, 4]
    ratio = [("ratio", Objective(clip=clip_test("ratio")))]
    (from_start,) = same_batch(cfg, ratio, step=4)
    (from_step_4,) = same_batch(cfg, ratio, step=4, weights=store.checkpoint_path(folder, 4))
    assert from_start.pi_old.tolist() != from_step_4.pi_old.tolist()  # the trained weights sample and score anew
    none = RunConfig.make(steps=2, prompts=2, group_size=2, checkpoint_every=0)
    assert store.checkpoint_steps(train(none, tmp_path / "none")) == []


def test_seeds_per_measure_and_the_same_measure_twice(runs_root):
    """Two settings of one measure × two seeds: four runs, and charts with each measure's mean, band and runs;
    the Runs page groups them the same way."""
    import json

    at = lab({"m": "kl3:delta=0.0177,kl3", "seeds": "2", "steps": "3", "prompts": "2", "group_size": "2"})
    button(at, "Start").click().run()
    names = at.session_state["lab_runs"]
    configs = [store.read_run(runs_root / n).config for n in names]
    assert [(c["clip_params"]["delta"], c["seed"]) for c in configs] == [(0.0177, 0), (0.0177, 1), (0.05, 0), (0.05, 1)]
    wait_for(at, lambda at: all(store.read_run(runs_root / n).state == "done" for n in names))
    at.run()
    traces = [t.get("name") for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]]
    assert "kl3 δ=0.0177 (n = 2)" in traces and "kl3 δ=0.05 (n = 2)" in traces
    fills = [t for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"] if t.get("fill") == "toself"]
    assert len(fills) == 2 * 2  # a band per measure in each of the panel's two metrics

    at.switch_page("app_pages/runs.py").run()
    at.multiselect[0].set_value(names).run()
    at.toggle(key="runs:group").set_value(True).run()
    assert not at.exception
    traces = [t.get("name") for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]]
    assert "reverse · kl3 δ=0.0177 (n = 2)" in traces


def test_the_lab_trains_a_surrogate_beside_a_clip_test(runs_root):
    """One run per clip test and per surrogate; what a setting refuses is named and not started."""
    at = lab({"m": "kl3", "s": "sapo,dppo", "level": "sequence", "steps": "2", "prompts": "2", "group_size": "2"})
    refused = " ".join(w.value for w in at.warning)
    assert "Not started" in refused and "kl3" not in refused and "dppo" in refused
    button(at, "Start").click().run()
    names = at.session_state["lab_runs"]
    configs = [store.read_run(runs_root / n).config for n in names]
    assert [(c["clip"], c["surrogate"], c["importance_sampling_level"]) for c in configs] == [
        ("kl3", None, "sequence"), (None, "sapo", "sequence")]
    wait_for(at, lambda at: all(store.read_run(runs_root / n).state == "done" for n in names))
    assert all(len(store.read_metrics(runs_root / n)) == 2 for n in names)


def test_the_lab_says_when_nothing_clipped_and_draws_held_out_accuracy(runs_root):
    """μ = 1 and K = 1: every ratio is exactly 1, nothing can clip, and the page says that every measure then makes the
    same update; the held-out evaluations (start, every 2 steps, end) are drawn with their intervals."""
    at = lab({"m": "ratio,kl3", "steps": "3", "prompts": "4", "group_size": "4", "mu": "1", "eval_every": "2"})
    button(at, "Start").click().run()
    names = at.session_state["lab_runs"]
    wait_for(at, lambda at: all(store.read_run(runs_root / n).state == "done" for n in names))
    at.run()
    assert any("No token was clipped" in info.value and "mini-batches" in info.value for info in at.info)
    button(at, "Train in 4 mini-batches").click().run()  # the setting that makes it bind, for the next Start
    assert next(s for s in at.slider if s.label == "minibatches").value == 4
    titles = [chart.proto.spec for chart in at.get("plotly_chart")]
    assert any("Held-out accuracy" in spec for spec in titles)
    assert [row["step"] for row in store.read_evals(runs_root / names[0])] == [0, 2, 3]


def test_minibatches_draw_the_clip_fraction_by_optimiser_step(runs_root):
    at = lab({"m": "ratio", "steps": "2", "prompts": "4", "group_size": "4", "mu": "2", "minibatches": "4"})
    button(at, "Start").click().run()
    (name,) = at.session_state["lab_runs"]
    wait_for(at, lambda at: store.read_run(runs_root / name).state == "done")
    at.run()
    assert not any("No token was clipped" in info.value for info in at.info)  # off-policy mini-batches clip here
    assert any("By mini-batch" in chart.proto.spec for chart in at.get("plotly_chart"))
    assert store.read_run(runs_root / name).config["minibatches"] == 4


def test_the_time_estimate_counts_runs_side_by_side_and_says_how_uncertain(runs_root, monkeypatch):
    """Two seeds on a machine that trains two runs at once: the page says how the step it counts on was timed, that
    the runs train two at a time, the evaluations to come and how far to trust the figure."""
    from divviz.runs.train import train

    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "2")
    train(RunConfig.make(task="reverse", steps=3, prompts=16, group_size=8), runs_root)  # a timed run here
    at = lab({"m": "ratio", "seeds": "2", "task": "reverse", "eval_every": "20"})
    caption = next(c.value for c in at.caption if c.value.startswith("Expected")).replace("\\", "")  # unescaped
    assert "timed alone" in caption and "these 2 runs train 2 at a time" in caption and "factor of 2" in caption
    assert "4 held-out evaluations each (not yet timed here)" in caption  # steps 0, 20, 40 and the last (60)
    train(RunConfig.make(task="reverse", steps=2, prompts=4, group_size=4, eval_every=2), runs_root)  # evaluated
    at = lab({"m": "ratio", "seeds": "2", "task": "reverse", "eval_every": "20"})
    caption = next(c.value for c in at.caption if c.value.startswith("Expected")).replace("\\", "")
    assert "4 held-out evaluations each included (about" in caption
