"""The claims over training on a language model: the cells are runs of the runs folder, trained by its pool and read
back as the cache — paired by seed and prompts, read from the runs' own records, resumed, reported without training,
on the Claims page and the Runs page; SmolLM2's settings."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from divviz.catalogue.params import DivvizInputError
from divviz.cli import main
from divviz.evidence import claims, claims_export, claims_lm, claims_report, forest, intervals, lm_evidence, significance
from divviz.evidence.lm_evidence import LMEvidence
from divviz.runs import runner, store
from divviz.runs.pool import max_runs
from divviz.runs.store import read_status, write_status
from divviz.safetext import literal
from tests.lm_grid import LM_SEEDS, LM_STEPS, wait_until_finished
from tests.evidence.test_claims import SMALL_GRID, report  # noqa: F401  (a fixture: the bandit's report on a small grid)

def test_lm_cells_equal_their_runs_metrics(lm_plan):
    rows = LMEvidence(lm_plan).rows()
    assert len(rows) == sum(len(lm_evidence.readings(c.metric, LM_STEPS)) for claim in claims.CLAIMS
                            for c in claim.lm_comparisons)
    assert {r["setting"] for r in rows} == {claims.LM}
    row = next(r for r in rows if r["claim_key"] == "kl3_entropy" and r["candidate"] == claims.KL3_WIDE
               and "late" in r["condition"])

    def entropy(measure, seed, reward="task", step=LM_STEPS):  # straight from metrics.jsonl: the late window of 3
        lines = (lm_plan.runs[(measure, reward, seed)].folder / "metrics.jsonl").read_text().splitlines()  # steps
        return next(json.loads(line)["entropy"] for line in lines if json.loads(line)["step"] == step)  # is step 3

    falls = next(r for r in rows if r["claim_key"] == "random_reward_entropy_falls" and "late" in r["condition"])
    d = intervals.paired([entropy(claims.PPO, s, "random") for s in range(LM_SEEDS)],
                         [entropy(claims.PPO, s, "random", step=1) for s in range(LM_SEEDS)])
    assert (falls["mean"], falls["low"], falls["high"]) == pytest.approx((d.mean, d.low, d.high))
    assert "random rewards" in falls["condition"] and lm_plan.runs[(claims.PPO, "random", 0)].config["reward"] == "random"

    d = intervals.paired([entropy(claims.KL3_WIDE, s) for s in range(LM_SEEDS)],
                        [entropy(claims.PPO, s) for s in range(LM_SEEDS)])
    assert (row["mean"], row["low"], row["high"], row["n"]) == pytest.approx((d.mean, d.low, d.high, LM_SEEDS))
    assert row["verdict"] == intervals.verdict(d.low, d.high, +1)
    lm_report = LMEvidence(lm_plan).report(claims_report.build(seeds=2, grid=SMALL_GRID[:1]))
    assert "built-in LM" in lm_report.scope and any(s["setting"] == claims.LM for s in lm_report.summary())
    assert len(lm_report.lm_details) == len(claims_lm.measures()) - 2 + 1  # a collapse line per measure, the pilot
    assert all(line in claims_export.to_text(lm_report) for line in lm_report.lm_details)
    reported = next(r for r in lm_report.rows if (r["condition"], r["candidate"], r["metric"]) ==
                    (row["condition"], row["candidate"], row["metric"]))
    assert f"  {claims_export.cell_text(reported)}" in claims_export.to_text(lm_report).splitlines()  # its numbers
    assert f"n = {LM_SEEDS}, {row['seeds_against_mean']} of {LM_SEEDS} seeds against the mean, sign-flip p " in \
        claims_export.cell_text(reported) and f": {row['verdict']}; dose: " in claims_export.cell_text(reported)
    assert reported["dose"]["disagreement"] >= 0 and set(reported["dose"]["clip"]) == {claims.KL3_WIDE, claims.PPO}
    assert "<h2>Over training</h2>" in claims_export.to_html(lm_report) and "Pilot (" in claims_export.to_html(lm_report)


def test_over_training_cells_pair_runs_that_share_seed_and_prompts_and_read_held_out_and_stability(lm_plan):
    """Every measure's run of a seed saw the same prompts at every step (from the runs' own records); the cell of
    KL3 δ = 0.05 against PPO on held-out accuracy, recomputed here from eval.jsonl (at the end, and the trapezoid mean
    over the run), and on the largest update KL of the run; each verdict read by the rule (`significance.verdict`:
    the t interval, the sign-flip p and the median's sign test) or off its interval."""
    def prompts(measure, seed):
        lines = (lm_plan.runs[(measure, "task", seed)].folder / "samples.jsonl").read_text().splitlines()
        return [[sample[0] for sample in json.loads(line)["samples"]] for line in lines]

    for seed in range(LM_SEEDS):
        runs = [run for (m, r, s), run in lm_plan.runs.items() if s == seed and r == "task"]
        assert {run.config["seed"] for run in runs} == {seed} and len(runs) == len(claims_lm.measures()) - 2
        assert all(prompts(m, seed) == prompts(claims.PPO, seed) for m, r, s in lm_plan.runs if r == "task" and s == seed)

    def held_out(measure, seed):
        evals = [json.loads(line) for line in
                 (lm_plan.runs[(measure, "task", seed)].folder / "eval.jsonl").read_text().splitlines()]
        steps, values = [e["step"] for e in evals], [e["eval/accuracy"] for e in evals]
        assert steps == [0, 1, 2, 3]  # every T/4 = 0.75 → 1 step
        area = sum((values[i] + values[i + 1]) / 2 * (steps[i + 1] - steps[i]) for i in range(3)) / LM_STEPS
        return values[-1], area

    def last(measure, seed, metric):
        lines = (lm_plan.runs[(measure, "task", seed)].folder / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1])[metric]

    rows = [r for r in LMEvidence(lm_plan).rows() if r["claim_key"] == "kl3_training" and r["candidate"] == claims.KL3_WIDE]
    for reading, index in (("end", 0), ("over the run", 1)):
        cell = next(r for r in rows if r["metric"] == "eval/accuracy" and f"· {reading} (" in r["condition"])
        kl3, ppo = ([held_out(m, s)[index] for s in range(LM_SEEDS)] for m in (claims.KL3_WIDE, claims.PPO))
        d, differences = intervals.paired(kl3, ppo), np.subtract(kl3, ppo)
        median, p_median = significance.sign_test(differences)[:2]
        rule = significance.verdict(d.low, d.high, significance.sign_flip_p(differences), d.mean, median, +1, p_median)
        assert (cell["mean"], cell["n"], cell["verdict"]) == (pytest.approx(d.mean), LM_SEEDS, rule)
    cell = next(r for r in rows if r["metric"] == "stability/max_kl")
    d = intervals.paired([last(claims.KL3_WIDE, s, "stability/max_kl") for s in range(LM_SEEDS)],
                         [last(claims.PPO, s, "stability/max_kl") for s in range(LM_SEEDS)])
    assert (cell["mean"], cell["low"], cell["high"]) == pytest.approx((d.mean, d.low, d.high))
    assert cell["predicted_sign"] == "−" and cell["verdict"] == intervals.verdict(d.low, d.high, -1)
    cell = next(r for r in rows if r["metric"] == "stability/collapsed")  # 0/1 per run: Newcombe's paired interval
    d = intervals.paired_binary([last(claims.KL3_WIDE, s, "stability/collapsed") for s in range(LM_SEEDS)],
                                [last(claims.PPO, s, "stability/collapsed") for s in range(LM_SEEDS)])
    assert (cell["mean"], cell["low"], cell["high"]) == pytest.approx((d.mean, d.low, d.high))
    assert -1 <= cell["low"] < cell["high"] <= 1  # not [0, 0] when no run collapsed


def test_collapses_and_learning_curves_over_seeds(lm_plan):
    table = {row["measure"]: row for row in LMEvidence(lm_plan).collapses()}
    assert set(table) == {m for m, r in claims_lm.measures() if r == "task"}
    for measure, row in table.items():
        flags = [store.last_metrics(lm_plan.runs[(measure, "task", s)].folder)["stability/collapsed"]
                 for s in range(LM_SEEDS)]
        assert (row["n"], row["collapsed"]) == (LM_SEEDS, sum(flags)) and 0 <= row["low"] <= row["high"] <= 1
        mean_rewards = [np.mean([r["reward"] for r in store.read_metrics(lm_plan.runs[(measure, "task", s)].folder)])
                        for s in range(LM_SEEDS)]  # the reward curve's spread over seeds, by hand
        assert (row["reward_n"], row["reward_sd"]) == (LM_SEEDS, pytest.approx(np.std(mean_rewards, ddof=1)))
    row = table[claims.PPO]
    assert lm_evidence.collapse_table([row])[0][lm_evidence.SPREAD] == (
        f"{row['reward_sd']:.3f} [{row['reward_sd_low']:.3f}, {row['reward_sd_high']:.3f}], n = {LM_SEEDS}")
    curves = LMEvidence(lm_plan).curves("eval/accuracy")
    ppo = curves[claims.PPO]
    assert ppo["steps"] == [0, 1, 2, 3] and ppo["n"] == LM_SEEDS
    firsts = [store.read_evals(lm_plan.runs[(claims.PPO, "task", s)].folder)[0]["eval/accuracy"] for s in range(LM_SEEDS)]
    assert ppo["mean"][0] == pytest.approx(np.mean(firsts)) and ppo["low"][0] == pytest.approx(min(firsts))
    assert len(LMEvidence(lm_plan).curves("reward")[claims.PPO]["steps"]) == LM_STEPS

    finals = {m: np.array([store.read_evals(lm_plan.runs[(m, "task", s)].folder)[-1]["eval/accuracy"]
                           for s in range(LM_SEEDS)]) for m in claims_lm.PILOT}
    pilot = LMEvidence(lm_plan).pilot()
    diff = finals[claims.KL3_WIDE] - finals[claims.PPO]
    assert (pilot["n"], pilot["difference_sd"]) == (LM_SEEDS, pytest.approx(diff.std(ddof=1)))
    d = intervals.paired(finals[claims.KL3_WIDE], finals[claims.PPO])  # the half-width S seeds resolve, at n = S,
    assert LMEvidence(lm_plan).pilot(sizes=(LM_SEEDS,))["resolvable"][LM_SEEDS] == pytest.approx((d.high - d.low) / 2)  # is
    assert "detected about half the time" in lm_evidence.pilot_text(pilot)  # the interval's own half-width


def test_the_pilot_pair_can_have_more_seeds_than_the_other_measures(lm_plan, capsys):
    """The pilot's declared extension: PPO and KL3 δ = 0.05 on more seeds than the other measures. Read here as 2 seeds
    per measure and 3 for the pair, from the fixture's runs of seeds 0–2: a cell of the pair alone (and of one of
    them against its own start) has the pair's 3 seeds and equals the 3-seed plan's cell; every other cell has 2
    and equals the 2-seed plan's; so do the collapse table's rows and the pilot."""
    plan = claims_lm.LMPlan.read(lm_plan.root, 2, LM_STEPS, pilot_seeds=3)
    two = claims_lm.LMPlan.read(lm_plan.root, 2, LM_STEPS)
    assert plan.finished and len(plan.runs) == 2 * len(claims_lm.measures()) + 2
    assert "with 2 seeds per measure (3 for the pilot pair, " in plan.text
    pair = {claims.START, claims.ZERO, *claims_lm.PILOT}
    by_cell = {seeds: {(r["claim_key"], r["candidate"], r["baseline"], r["condition"], r["metric"]): r for r in rows}
               for seeds, rows in ((2, LMEvidence(two).rows()), (3, LMEvidence(lm_plan).rows()))}
    rows = LMEvidence(plan).rows()
    assert len(rows) == len(by_cell[2]) and any(r["n"] == 3 for r in rows) and any(r["n"] == 2 for r in rows)
    for row in rows:
        seeds = 3 if {row["candidate"], row["baseline"]} <= pair and "random rewards" not in row["condition"] else 2
        same = by_cell[seeds][(row["claim_key"], row["candidate"], row["baseline"], row["condition"], row["metric"])]
        assert row["n"] == seeds and (row["mean"], row["low"], row["high"]) == pytest.approx(
            (same["mean"], same["low"], same["high"]), nan_ok=True)
    table = {row["measure"]: row["n"] for row in LMEvidence(plan).collapses()}
    assert table[claims.PPO] == table[claims.KL3_WIDE] == 3 and table[claims.DAPO] == 2
    assert LMEvidence(plan).pilot()["n"] == 3 and LMEvidence(plan).curves("eval/accuracy")[claims.PPO]["n"] == 3
    assert "Pilot (PPO ε=0.2 and KL3 δ=0.05 (wide), 3 seeds):" in lm_evidence.pilot_text(LMEvidence(plan).pilot())
    more = claims_lm.LMPlan.read(lm_plan.root, 3, LM_STEPS, pilot_seeds=4)  # the pair's next seed is queued first
    assert more.missing == [(claims.PPO, "task", 3), (claims.KL3_WIDE, "task", 3)]
    assert ", 3 seeds of its 4 done):" in lm_evidence.pilot_text(LMEvidence(more).pilot())
    assert claims_lm.LMPlan.read(lm_plan.root, 3, LM_STEPS, pilot_seeds=2).pilot_seeds == 3  # never below the rest

    argv = ["claims", "--seeds", "2", "--lm", "--lm-seeds", "2", "--lm-pilot-extra", "1", "--lm-steps", str(LM_STEPS),
            "--runs-dir", str(lm_plan.root), "--no-train", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert f"{len(plan.runs)} of {len(plan.runs)} runs found" in out.err
    cells = json.loads(out.out)["cells"]
    assert sorted(r["n"] for r in cells if r["setting"] == claims.LM) == sorted(r["n"] for r in rows)
    assert main([*argv[:7], "57", *argv[8:]]) == 2 and "lm_pilot_extra" in capsys.readouterr().err


def test_finished_runs_are_read_not_trained_again(lm_plan, capsys):
    folders = sorted(p.name for p in lm_plan.root.iterdir())  # the pool's writability probe has no name to list
    assert claims_lm.LMPlan.read(lm_plan.root, LM_SEEDS, LM_STEPS).finished
    argv = ["claims", "--seeds", "2", "--lm", "--lm-seeds", str(LM_SEEDS), "--lm-steps", str(LM_STEPS),
            "--runs-dir", str(lm_plan.root), "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert f"{len(lm_plan.runs)} of {len(lm_plan.runs)} runs found, 0 queued" in out.err
    assert sum(r["setting"] == claims.LM for r in json.loads(out.out)["cells"]) == len(LMEvidence(lm_plan).rows())
    assert sorted(p.name for p in lm_plan.root.iterdir()) == folders


def test_a_rerun_over_the_same_runs_computes_no_cell_again_and_a_changed_run_file_is_read_again(lm_plan, tmp_path):
    """A page's rerun reads a new plan; over the same final runs its evidence is the one computed before (a copy: a
    caller's change does not reach the next), and a run file changed in place (its held-out evaluations here) is read
    again: the cell moves by what was written."""
    root = tmp_path / "runs"
    shutil.copytree(lm_plan.root, root, ignore=shutil.ignore_patterns(".divviz"))
    end_cell = lambda rows: next(r for r in rows if r["claim_key"] == "kl3_training" and r["metric"] == "eval/accuracy"
                                 and r["candidate"] == claims.KL3_WIDE and r["reading"] == "end")  # noqa: E731
    first = LMEvidence(claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS)).rows()
    before, computed = end_cell(first)["mean"], len(lm_evidence.COMPUTED)
    again = LMEvidence(claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS))
    assert again.rows() == first and len(lm_evidence.COMPUTED) == computed  # nothing computed again
    end_cell(first)["mean"] = 99.0
    assert end_cell(again.rows())["mean"] == before
    evals = again.plan.runs[(claims.KL3_WIDE, "task", 0)].folder / "eval.jsonl"
    lines = [json.loads(line) for line in evals.read_text().splitlines()]
    last = next(row for row in lines if row["step"] == LM_STEPS)
    moved = -0.5 if last["eval/accuracy"] >= 0.5 else 0.5
    last["eval/accuracy"] += moved
    evals.write_text("".join(json.dumps(row) + "\n" for row in lines))
    changed = end_cell(LMEvidence(claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS)).rows())
    assert changed["mean"] == pytest.approx(before + moved / LM_SEEDS)


def test_a_stopped_run_is_queued_again_and_a_failed_one_drops_out(lm_plan, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(lm_plan.root, root, ignore=shutil.ignore_patterns(".divviz"))
    older = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS).runs[(claims.KL3_WIDE, "task", 2)].folder / "config.json"
    config = {k: v for k, v in json.loads(older.read_text()).items() if not k.startswith("inspect_")}
    older.write_text(json.dumps({**config, "checkpoint_every": 10}))  # a run written before those settings
    plan = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS)
    assert not plan.missing  # what a run keeps does not decide whether it is the cell's run
    failed, stopped = plan.runs[(claims.PPO, "task", 0)].folder, plan.runs[(claims.DAPO, "task", 1)].folder
    write_status(failed, {**read_status(failed), "state": "failed", "message": "metric 'loss' became nan"})
    plan = plan.refreshed()
    assert plan.finished and plan.failed == [f"{claims.PPO} · seed 0: metric 'loss' became nan"]
    assert {r["n"] for r in LMEvidence(plan).rows() if "random rewards" not in r["condition"]} == {LM_SEEDS - 1}  # every
    # comparison with the task's rewards is against PPO; PPO's runs with random rewards are other runs
    write_status(stopped, {**read_status(stopped), "state": "stopped"})
    plan = plan.refreshed()
    assert plan.missing == [(claims.DAPO, "task", 1)] and not plan.finished
    assert plan.queue_missing() == [stopped]  # queued again in its own folder, not a new run
    assert wait_until_finished(plan.refreshed()).runs[(claims.DAPO, "task", 1)].folder == stopped


def test_no_wait_reports_the_finished_runs_and_leaves_the_rest_queued(lm_plan, tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs"
    shutil.copytree(lm_plan.root, root, ignore=shutil.ignore_patterns(".divviz"))
    monkeypatch.setenv("DIVVIZ_MEMORY_CAP_MB", "1")  # the pool this starts may start nothing: the run stays queued
    stopped = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS).runs[(claims.KL3_WIDE, "task", 0)].folder
    write_status(stopped, {**read_status(stopped), "state": "stopped", "step": 1})
    plan = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS)
    assert lm_plan.time_left() == 0.0 and 0.0 < plan.time_left() < np.inf  # 2 steps left, at the runs' pace
    argv = ["claims", "--seeds", "2", "--lm", "--lm-seeds", str(LM_SEEDS), "--lm-steps", str(LM_STEPS),
            "--runs-dir", str(root), "--no-wait", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    total = len(lm_plan.runs)
    assert f"{total - 1} of {total} runs finished" in out.err and read_status(stopped)["state"] == "queued"
    kl3 = [r for r in json.loads(out.out)["cells"] if r["setting"] == claims.LM and r["candidate"] == claims.KL3_WIDE]
    assert kl3 and {r["n"] for r in kl3} == {LM_SEEDS - 1}  # seed 0's pairs wait for its run
    assert runner.stop_run(stopped) == "stopped"  # so that the pool this started finds nothing queued and leaves


def test_no_train_reports_a_grid_trained_elsewhere_and_queues_nothing(lm_plan, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(lm_plan.root, root, ignore=shutil.ignore_patterns(".divviz"))
    stopped = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS).runs[(claims.KL3_WIDE, "task", 0)].folder
    write_status(stopped, {**read_status(stopped), "state": "stopped", "step": 1})
    folders = sorted(p.name for p in root.iterdir())
    argv = ["claims", "--seeds", "2", "--lm", "--lm-seeds", str(LM_SEEDS), "--lm-steps", str(LM_STEPS),
            "--runs-dir", str(root), "--no-train", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    total = len(lm_plan.runs)
    assert f"{total - 1} of {total} runs finished" in out.err and "nothing was queued (--no-train)" in out.err
    assert read_status(stopped)["state"] == "stopped" and sorted(p.name for p in root.iterdir()) == folders
    assert not (root / ".divviz" / "pool.log").exists()  # no pool was started
    kl3 = [r for r in json.loads(out.out)["cells"] if r["setting"] == claims.LM and r["candidate"] == claims.KL3_WIDE]
    assert kl3 and {r["n"] for r in kl3} == {LM_SEEDS - 1}
    plan = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS)
    assert plan.text.endswith(f"; trained on cpu ({total - 1} runs)")  # each run's status.json names its device
    assert 0.0 < plan.time_left() < np.inf

    # the pool trains the folder's queue in order: another plan's runs queued before this plan's last one count
    write_status(stopped, {**read_status(stopped), "state": "queued", "queued_at": 100.0})  # its 2 steps left
    for name, queued_at in (("before", 50.0), ("after", 200.0)):  # a run of no cell of this plan, 3 steps left
        shutil.copytree(plan.runs[(claims.PPO, "task", 0)].folder, root / name)
        config = json.loads((root / name / "config.json").read_text())
        (root / name / "config.json").write_text(json.dumps({**config, "seed": 99}))
        write_status(root / name, {**read_status(root / name), "state": "queued", "step": 0, "queued_at": queued_at})
    plan = plan.refreshed()
    assert [run.name for run in plan.ahead] == ["before"] and not plan.missing
    pace = plan.time_left() / (2 + LM_STEPS) * min(max_runs(), 2)  # seconds per step, both runs side by side
    write_status(root / "before", {**read_status(root / "before"), "state": "done", "step": LM_STEPS})
    assert plan.refreshed().time_left() == pytest.approx(2 * pace / min(max_runs(), 1))  # only the plan's own left
    write_status(stopped, {**read_status(stopped), "state": "stopped"})  # to be queued again: behind every run
    assert [run.name for run in plan.refreshed().ahead] == ["after"]
    for run in plan.runs.values():  # as if trained on a GPU and copied here: another grid, whose pace is not this CPU's
        write_status(run.folder, {**read_status(run.folder), "device": "cuda"})
    assert plan.refreshed().done == 0  # a CPU's plan holds none of them
    on_gpu = claims_lm.LMPlan.read(root, LM_SEEDS, LM_STEPS, device="cuda")
    assert on_gpu.text.endswith(f"; trained on cuda ({total - 1} runs)") and on_gpu.time_left() is None


def test_cli_refuses_lm_options_without_lm(capsys):
    assert main(["claims", "--lm-seeds", "4"]) == 2
    assert "add --lm" in capsys.readouterr().err
    assert main(["claims", "--lm", "--lm-seeds", "1"]) == 2
    assert "1 seed per measure gives no interval" in capsys.readouterr().err
    assert main(["claims", "--lm", "--lm-setting", "stress"]) == 2
    assert "builtin has no settings" in capsys.readouterr().err
    assert main(["claims", "--lm", "--lm-model", "smollm2-135m", "--lm-setting", "fast"]) == 2
    assert "smollm2-135m has the settings with held-out evaluations learn, stress; got 'fast'" in capsys.readouterr().err
    assert main(["claims", "--lm", "--lm-model", "smollm2-135m", "--lm-setting", "look only"]) == 2  # no evaluation
    assert "got 'look only'" in capsys.readouterr().err
    with pytest.raises(DivvizInputError, match="no setting 'look only' with held-out evaluations"):
        claims_lm.run_config(claims.PPO, 0, 20, "smollm2-135m", setting="look only")


def test_claims_page_trains_and_then_includes_the_lm_cells(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/claims.py").run()
    at.selectbox(key="claims:lm_model").set_value("builtin").run()  # the page opens on SmolLM2's published grid
    assert at.slider(key="claims:lm_seeds").value == claims_lm.SEEDS_PARAM.default  # the built-in LM's default
    at.slider(key="claims:seeds").set_value(2)
    at.slider(key="claims:lm_seeds").set_value(2)
    at.number_input(key="claims:lm_steps").set_value(LM_STEPS).run()
    button = at.button(key="claims:lm_start")
    assert not at.exception and button.label == f"Train the {2 * len(claims_lm.measures())} missing runs"
    button.click().run()
    plan = claims_lm.LMPlan.read(tmp_path, 2, LM_STEPS)
    assert not plan.missing and {run.status["owner"] for run in plan.runs.values()} != {""}
    wait_until_finished(plan)
    at.run()
    assert not at.exception and any("Included" in s.value for s in at.success)
    on_lm = 0
    for claim in (c for c in claims.CLAIMS if c.lm_comparisons):  # each claim's cells, one claim shown at a time
        at.selectbox(key="claims:claim").set_value(claim.key).run()
        cells = next(d.value for d in at.dataframe if "condition" in d.value.columns)
        on_lm += ((cells.setting == claims.LM).sum() if "setting" in cells else  # else said once, above the table
                  len(cells) * any(literal(f"setting {claims.LM}") in c.value for c in at.caption))
    assert not at.exception and on_lm == len(LMEvidence(plan).rows())
    collapses = next(d.value for d in at.dataframe if "steps of collapse" in d.value.columns)
    assert len(collapses) == len(claims_lm.measures()) - 2 and set(collapses.collapsed.str[-4:]) == {"of 2"}
    curves = [c for c in at.get("plotly_chart") if "Learning curves" in c.proto.spec]
    assert len(curves) == 1 and all(panel in curves[0].proto.spec for panel in ("held-out, sampled", "entropy"))
    at.number_input(key="claims:lm_pilot_extra").set_value(1).run()  # the pilot pair on one more seed
    assert not at.exception and at.button(key="claims:lm_start").label == "Train the 2 missing runs"


def test_claims_page_says_when_the_runs_folder_is_unusable(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "a-file"))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception and any("is a file" in e.value for e in at.error)
    assert "Every claim at a glance" in [h.value for h in at.subheader]  # the bandit report is still there


def test_a_runs_setting_is_named_from_its_config_on_the_runs_page(tmp_path):
    """A run folder records its settings, not the setting's name: the Runs page names it back (learn / stress), so
    that the two grids' runs — the same measure, seed and task — can be told apart and filtered."""
    from divviz.engine.config import setting_of
    from divviz.views import run_text, runs_table

    learn = claims_lm.run_config(claims.PPO, 0, 30, "smollm2-135m", setting="learn").to_dict()
    stress = claims_lm.run_config(claims.PPO, 0, 30, "smollm2-135m", setting="stress").to_dict()
    assert (setting_of(learn), setting_of(stress)) == ("learn", "stress")  # kept every 5 steps: still "learn"
    assert setting_of({**learn, "lr": 1e-4}) == "" and setting_of(claims_lm.run_config(claims.PPO, 0, 4).to_dict()) == ""
    runs = [store.RunInfo(tmp_path / name, "done", "", 30, 30, config, {"device": "cpu"})
            for name, config in (("a", learn), ("b", stress))]
    assert [row["setting"] for row in runs_table.overview_rows(runs, None)] == ["learn", "stress"]
    assert "· smollm2-135m · stress · add · seed 0 ·" in run_text.run_choice(runs[1])
    assert runs_table.matching(runs, "stress") == [runs[1]]


def test_the_lm_cells_can_train_smollm2_with_its_own_settings(tmp_path, capsys):
    """A plan for SmolLM2 asks for runs of that model on its task, with its learning setting; nothing is trained here."""
    from divviz.engine.models import SMOLLM2_LEARN

    plan = claims_lm.LMPlan.read(tmp_path, seeds=2, model="smollm2-135m", setting="learn")
    configs = [claims_lm.run_config(m, s, plan.steps, "smollm2-135m", r, "learn") for m, r, s in plan.missing]
    assert len(plan.missing) == 2 * len(claims_lm.measures()) and not plan.finished
    assert {c.model for c in configs} == {"smollm2-135m"} and {c.task for c in configs} == {"add"}
    assert {c.lr for c in configs} == {SMOLLM2_LEARN["lr"]} and {c.minibatches for c in configs} == {4}
    assert {c.steps for c in configs} == {SMOLLM2_LEARN["steps"]} and {c.eval_every for c in configs} == {15}
    assert "smollm2-135m (learn): add, 30 steps" in plan.text
    assert plan.missing[:4] == [(claims.PPO, "task", 0), (claims.KL3_WIDE, "task", 0), (claims.PPO, "task", 1),
                                (claims.KL3_WIDE, "task", 1)]  # the pilot first, then seed by seed
    assert [s for m, r, s in plan.missing[4:9]] == [0] * 5 and plan.missing[-1][1] == "random"
    stress = claims_lm.LMPlan.read(tmp_path, seeds=2, model="smollm2-135m", setting="stress")
    assert {claims_lm.run_config(m, s, 30, "smollm2-135m", r, "stress").lr for m, r, s in stress.missing} == {2e-4}
    with pytest.raises(DivvizInputError, match="no setting 'fast'"):
        claims_lm.run_config(claims.PPO, 0, 30, "smollm2-135m", setting="fast")
    first = claims_lm.measures()[0][0]
    assert {c.reward for c in configs} == {"task", "random"}
    assert claims_lm.run_config(first, 0, 4).model == "builtin" and claims_lm.run_config(first, 0, 4).task == "reverse"
    assert main(["claims", "--lm-model", "smollm2-135m"]) == 2 and "add --lm" in capsys.readouterr().err


def test_a_comparison_without_data_says_so_and_is_not_drawn(report, tmp_path):
    """Before any run of a pair is done its cells are "no data" (n = 0), not "not resolved" — nothing was tested —
    and they are in the tables but not in the forest plots."""
    plan = claims_lm.LMPlan.read(tmp_path, 2, LM_STEPS)  # nothing trained yet
    assert LMEvidence(plan).rows() and {(r["n"], r["verdict"]) for r in LMEvidence(plan).rows()} == {(0, intervals.NO_DATA)}
    both = LMEvidence(plan).report(report)
    assert not any(cell["setting"] == claims.LM for _, _, cells in forest.panels(both) for cell in cells)
    lm_lines = [line for line in claims_export.to_text(both).splitlines() if line.startswith(f"  [{claims.LM}]")]
    assert lm_lines and all(line.endswith("no data of " + line.split(" no data of ")[-1]) for line in lm_lines)
    assert "not resolved" not in " ".join(lm_lines)

