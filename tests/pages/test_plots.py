"""Every figure the app shows passes plotly's full validation (the app skips it for speed) and carries
the table it was drawn from."""

import io
import os
import json
import shutil
import sys

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from divviz.bandit.grpo import run_bandit
from divviz.bandit.setting import BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.catalogue.penalties import PENALTIES, penalty
from divviz.catalogue.surrogates import SURROGATES, surrogate
from divviz.losses import Objective
from divviz.views import explorer, run_files, run_plots, run_text, run_views, runs_table


def validated(chart):
    fig = go.Figure(chart.figure.to_dict())  # raises on any invalid property
    assert len(fig.data) > 0
    assert len(chart.data) > 0
    return fig


def test_clipping_region_figures_validate():
    tests = [clip_test(n) for n in ("ratio", "clip_higher", "kl1", "kl2", "kl3", "prob_tv")]
    surrogates = [surrogate(n) for n in SURROGATES]
    penalties = [penalty(n) for n in PENALTIES]
    corrections = [explorer.rollout_variant(name, 2.0, (0.5, 2.0), "token_k2", (0.5, 2.0), 0.05, False)
                   for name in explorer.ROLLOUT_VARIANTS]
    charts = explorer.clipping_regions(tests, pi_old=0.2, dual_clip_c=3.0, surrogates=surrogates, penalties=penalties,
                                    corrections=corrections)
    assert set(charts) == {"intervals", "sweeps", "region", "surrogate", "logit", "weight", "penalty", "correction"}
    assert {t.name for t in validated(charts["penalty"]).data if t.showlegend} == {p.label for p in penalties}
    assert [t.name for t in validated(charts["correction"]).data] == [  # bypass has no multiplier of its own
        "none", "TIS token u=2", "TIS sequence u=2", "IcePop token [0.5, 2]", "IcePop sequence [0.5, 2]",
        "RS token_k2 0.05"]
    for chart in charts.values():
        validated(chart)
    # one legend entry per test in the surrogate chart; kl1's unbounded top is drawn as an arrow
    names = {t.name for t in validated(charts["surrogate"]).data if t.showlegend}
    assert names == {t.label for t in tests}
    assert charts["intervals"].data["upper"].tolist()[2] == np.inf
    # the gradient weight: every test with dual-clip, and every surrogate (those with a test take the first, ratio)
    names = {t.name for t in validated(charts["weight"]).data if t.showlegend}
    labels = {s.name: s.label if s.entry.clip == "none" else f"{s.label} with ratio ε=0.2" for s in surrogates}
    assert names == {f"{t.label} c=3" for t in tests} | {labels[s.name] for s in surrogates if not s.entry.select} | {
        f"{labels[s.name]}: {which}" for s in surrogates if s.entry.select for which in ("tokens it picks", "the others")}


def test_a_confident_token_shows_whole_in_the_regions_corner_and_says_where_it_is():
    """The Step inspector's token on the clipping regions: at π_old ≈ 1 its star sat half outside the plot, in the
    corner where the bands meet; now the axes run a little past [0, 1], the star is drawn over the edge, and its
    legend entry gives its coordinates."""
    chart = run_views.token_region([("PPO", Objective(clip=clip_test("ratio")))], 0.9991, 1.0004, 0.9996)
    fig = validated(chart)
    marks = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in marks] == ["token at the last optimiser step (0.9991, 0.9995)",
                                       "token after the update (0.9991, 0.9996)"]
    assert all(t.cliponaxis is False for t in marks)
    assert all(low < 0 and high > 1 for low, high in (fig.layout.xaxis.range, fig.layout.yaxis.range))


def test_kl3_page_figures_and_table():
    facts, charts = explorer.kl3_equivalence(0.05, 0.2, 0.2, 0.28, seed=1)
    for chart in charts.values():
        validated(chart)
    table = explorer.matching_table(facts, 0.2, 0.2, 0.28)
    assert table["KL3 δ through this edge"].round(7).tolist()[:4] == [0.0231436, 0.0176784, 0.0231436, 0.0331399]
    assert facts.check.max_abs_grad_diff <= 1e-12


def clipped(*specs) -> list[Objective]:
    return [Objective(clip=clip_test(name, **params)) for name, params in specs]


def test_bandit_figures():
    for seeds in (1, 4):
        shared = {"penalty": penalty("k3", importance_weight=False), "beta": 0.1, "dual_clip_c": 3.0,
                  "aggregation": "dr_grpo"}
        groups = explorer.bandit_runs(BanditConfig.make(k=30, iterations=10).to_dict(),
                                   [Objective(clip=clip_test("kl3", delta=0.05), **shared), Objective(**shared)], seeds)
        assert [runs[0].label for runs in groups] == ["kl3 δ=0.05 + 0.1·k3 c=3", "no clip + 0.1·k3 c=3"]
        assert [[run.seed for run in runs] for runs in groups] == [list(range(seeds))] * 2
        for chart in [*explorer.mass_reallocation(groups).values(), explorer.paired_difference_chart(groups, 1, "entropy")]:
            validated(chart)


def test_bandit_runs_are_kept_and_only_a_changed_run_retrains():
    cfg = BanditConfig.make(k=20, iterations=10).to_dict()
    first = explorer.bandit_runs(cfg, clipped(("ratio", {}), ("kl3", {"delta": 0.05})), 2)
    second = explorer.bandit_runs(cfg, clipped(("ratio", {}), ("kl3", {"delta": 0.07})), 3)
    assert second[0][0].final is first[0][0].final and second[1][0].final is not first[1][0].final
    for seed in range(3):
        alone = run_bandit(BanditConfig.make(**{**cfg, "seed": seed}), Objective(clip=clip_test("kl3", delta=0.07)))
        assert np.array_equal(second[1][seed].final, alone.final) and second[1][seed].label == alone.label
    other_seed = explorer.bandit_runs({**cfg, "seed": 1}, clipped(("ratio", {})))
    assert other_seed[0][0].final is second[0][1].final  # seed 1 was trained already, as the second seed


def test_the_same_measure_twice_gets_two_labels_and_paired_differences():
    cfg = BanditConfig.make(k=20, iterations=12).to_dict()
    groups = explorer.bandit_runs(cfg, clipped(("kl3", {"delta": 0.05}), ("kl3", {"delta": 0.05}), ("ratio", {})), 5)
    assert [runs[0].label for runs in groups] == ["kl3 δ=0.05", "kl3 δ=0.05 (2)", "ratio ε=0.2"]
    table = explorer.paired_differences(groups, 0)
    same = table[table.measure == "kl3 δ=0.05 (2)"]
    assert (same.difference == 0).all() and (same["seeds against the mean"] == "0 of 5").all()
    other = table[(table.measure == "ratio ε=0.2") & (table.metric == "entropy")].iloc[0]
    diffs = [r.history["entropy"][-1] - b.history["entropy"][-1] for r, b in zip(groups[2], groups[0])]
    assert other.difference == pytest.approx(np.mean(diffs)) and other.n == 5


def test_trailing_mean_smoothing():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert run_views.trailing_mean(values, 1).tolist() == values
    assert run_views.trailing_mean(values, 2).tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert run_views.trailing_mean(values, 10).tolist() == [1.0, 1.5, 2.0, 2.5, 3.0]
    rows = [{"reward": v, "accuracy": v} for v in values]
    chart = run_views.training_charts([("run", rows)], smooth=2)["reward"]
    assert chart.data["reward"].tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]


def test_the_token_scatter_stays_readable_with_many_runs():
    """Six runs of two measures: the legend names each clip state, each measure's marker and its bound once (not
    per run); bounds are drawn once per measure in its colour; the ratio axis is logarithmic."""
    rng = np.random.default_rng(0)

    def tokens(n=50):
        return {"pi_old": rng.uniform(0.01, 1, n), "ratio": np.exp(rng.normal(0, 0.5, n)), "adv": rng.normal(0, 1, n),
                "state": rng.integers(0, 3, n).astype(np.int8)}

    runs = [(measure, f"{measure} · seed {s}", {"clip": clip, "clip_params": {}}, tokens())
            for measure, clip in (("ratio ε=0.2", "ratio"), ("kl3 δ=0.05", "kl3")) for s in range(3)]
    chart = run_views.token_scatter(runs)
    traces = chart.figure.to_dict()["data"]
    legend = [t["name"] for t in traces if t.get("showlegend", True)]
    assert len(legend) == 3 + 2 + 2, legend  # three clip states, two markers, two bounds
    assert len([t for t in traces if t.get("mode") == "lines"]) == 4  # l and u of each measure, once
    assert chart.figure.to_dict()["layout"]["yaxis"]["type"] == "log"
    assert len(chart.data) == 6 * 50 and set(chart.data["measure"]) == {"ratio ε=0.2", "kl3 δ=0.05"}


def test_a_long_series_is_thinned_to_its_extremes_and_exported_whole():
    """50,000 steps: each bucket's min and max and the first and last point are kept (per-pixel min/max), the
    screen gets WebGL traces of a few thousand points, the CSV and the HTML export every step."""
    from divviz.evidence.intervals import summarize
    from divviz.views import run_plots
    import base64

    from divviz.views.figures import BUCKETS, thinned

    GL_POINTS_MIN = BUCKETS  # at least a point per bucket

    rng = np.random.default_rng(1)
    walk = np.cumsum(rng.normal(size=50_000))
    idx = thinned(walk)
    edges = np.linspace(0, len(walk), BUCKETS + 1).astype(int)
    for a, b in zip(edges[:-1], edges[1:]):
        kept = idx[(idx >= a) & (idx < b)]
        assert walk[a:b].min() in walk[kept] and walk[a:b].max() in walk[kept]
    assert idx[0] == 0 and idx[-1] == len(walk) - 1 and np.all(np.diff(idx) > 0) and len(idx) <= 2 * BUCKETS + 2
    assert np.array_equal(thinned(walk[:500]), np.arange(500))

    seeds = np.stack([walk + rng.normal(size=walk.shape) for _ in range(5)])
    chart = run_plots.history_chart([("kl3", {"entropy": summarize(seeds, bounds=(-np.inf, np.inf))})], ("entropy",),
                                    "step", "long", members={"kl3": [{"entropy": s} for s in seeds]})
    shown, export = chart.figure.to_dict()["data"], chart.export.to_dict()["data"]

    def points(trace) -> int:  # a numeric array goes out as plotly.js's typed array: 8 bytes a float64
        x = trace["x"]
        return len(base64.b64decode(x["bdata"])) // 8 if isinstance(x, dict) else len(x)

    assert all(t["type"] == "scattergl" for t in export) and len(shown) == len(export)
    edges = lambda t: 2 if t.get("fill") == "toself" else 1  # noqa: E731  (the band: its upper edge, then its lower)
    assert sum(t.get("fill") == "toself" for t in export) == 1
    assert all(points(t) == edges(t) * 50_000 for t in export)
    assert all(GL_POINTS_MIN < points(t) / edges(t) <= 3 * 2 * BUCKETS + 2 for t in shown)
    assert len(chart.data) == 50_000
    short = run_plots.history_chart([("a", {"entropy": walk[:100]})], ("entropy",), "step", "short")
    assert short.export is None


def test_a_curve_hidden_under_an_identical_one_is_named_and_steps_are_whole():
    """Two measures whose curves coincide (nothing clipped: the same update) would draw the first invisibly under the
    second; the title names it. Step axes have whole-number ticks (one per step while there are few)."""
    from divviz.views import run_plots

    same = {"reward": np.array([0.1, 0.2, 0.3])}
    chart = run_plots.history_chart([("ratio <ε>", same), ("kl3", dict(same)), ("dapo", {"reward": np.array([0.1, 0.2, 0.4])})],
                                    ("reward",), "step", "Reward")
    layout = chart.figure.to_dict()["layout"]
    assert "ratio &lt;ε&gt; lies under kl3" in layout["title"]["text"] and "dapo" not in layout["title"]["text"]
    assert layout["xaxis"]["tickformat"] == "d" and layout["xaxis"]["dtick"] == 1
    apart = run_plots.history_chart([("a", same), ("b", {"reward": np.array([0.0, 0.2, 0.3])})], ("reward",), "step", "R")
    assert "lies under" not in apart.figure.to_dict()["layout"]["title"]["text"]


def test_the_kl_panel_says_why_k1_can_be_negative():
    """k1 = −log w averages below 0 on some updates (it is unbiased, not non-negative): the panel says so."""
    rows = [{"step": s, "kl/k1": -0.001, "kl/k2": 0.001, "kl/k3": 0.001, "reward": 0.5} for s in range(1, 4)]
    title = run_views.training_charts([("ratio", rows)])["kl"].figure.to_dict()["layout"]["title"]["text"]
    assert "k1 is unbiased and can dip below 0" in title


def test_learning_curves_mark_sparse_readings_dot_a_lone_seed_and_cross_collapses():
    """Held-out accuracy read at 3 steps: points on the line; a measure with one finished seed: dotted, no band; one
    with three: solid, its band a closed polygon; a seed's collapse: a ✕ on its measure's mean line, in its colour."""
    from divviz.views.run_plots import learning_curves_chart

    curve = lambda n: {"steps": [0, 15, 30], "mean": [0.2, 0.3, 0.4], "low": [0.1, 0.2, 0.3],  # noqa: E731
                       "high": [0.3, 0.4, 0.5], "n": n}
    fig = validated(learning_curves_chart({"eval/accuracy": {"PPO": curve(3), "KL3": curve(1)}}, "t"))
    means = {t.name: t for t in fig.data if t.name}
    assert set(means) == {"PPO (n = 3)", "KL3 (n = 1)"} and all(t.mode == "lines+markers" for t in means.values())
    assert means["KL3 (n = 1)"].line.dash == "dot" and means["PPO (n = 3)"].line.dash is None
    assert [t.fill for t in fig.data if not t.name] == ["toself"]  # PPO's band only
    steps = list(range(31))  # the reward, read at every step
    per_step = {"steps": steps, "mean": [s / 100 for s in steps], "low": [0.0] * 31, "high": [0.5] * 31, "n": 3}
    fig = validated(learning_curves_chart({"eval/accuracy": {"PPO": curve(3)}, "reward": {"PPO": per_step}}, "t",
                                          {"PPO": [20, 20, 30]}))
    marks = [t for t in fig.data if t.marker.symbol == "x"]  # on the reward's mean line only: none interpolated
    assert len(marks) == 1 and list(marks[0].x) == [20, 20, 30] and np.allclose(marks[0].y, [0.2, 0.2, 0.3])
    line = next(t for t in fig.data if t.name == "PPO (n = 3)" and t.xaxis == marks[0].xaxis)
    assert marks[0].marker.color == line.line.color and marks[0].legendgroup == line.name and marks[0].hoverinfo == "skip"
    assert (line.customdata[20], line.customdata[30], line.customdata[21]) == (  # the line's hover says it
        " · 2 seeds collapsed at this step", " · 1 seed collapsed at this step", "")


def test_runs_grouped_by_objective_are_one_held_out_line_with_their_seeds_band():
    """Group by objective drew every other chart as one line per objective but the held-out chart as one per run
    ("ratio ε=0.2" and "ratio ε=0.2 (2)"); now it is one line, "(n = 2)", the runs' mean with their range."""
    def evals(values):
        return [{"step": s, "eval/accuracy": v, "eval/accuracy_low": v - 0.1, "eval/accuracy_high": v + 0.1,
                 "eval/accuracy_greedy": v, "eval/accuracy_greedy_low": v, "eval/accuracy_greedy_high": v}
                for s, v in zip((0, 15, 30), values)]

    chart = run_views.held_out_chart([("PPO", [], evals([0.2, 0.5, 0.6])), ("PPO", [], evals([0.2, 0.4, 0.5])),
                                      ("KL3", [], evals([0.2, 0.3, 0.4]))])
    assert [t.name for t in validated(chart).data if t.xaxis == "x"] == ["PPO (n = 2)", "KL3"]
    ppo, kl3 = (chart.data[chart.data.run == name] for name in ("PPO (n = 2)", "KL3"))
    assert np.allclose(ppo["eval/accuracy"], [0.2, 0.45, 0.55])
    assert np.allclose(ppo["eval/accuracy low"], [0.2, 0.4, 0.5]) and np.allclose(ppo["eval/accuracy high"],
                                                                                [0.2, 0.5, 0.6])  # the range
    assert np.allclose(kl3["eval/accuracy high"] - kl3["eval/accuracy"], 0.1)  # one run: its own Wilson interval


def test_a_held_out_chart_with_one_evaluation_ticks_whole_steps_once():
    """One evaluation (step 0): the axis had ticks at −1, −0.5, 0, 0.5, 1 printed as "−1 −1 0 1 1"; now one tick per
    whole step within half a step of it, and the chart's CSV writes steps as integers."""
    row = {"step": 0, **{f"{m}{end}": v for m in ("eval/accuracy", "eval/accuracy_greedy")
                         for end, v in (("", 0.3), ("_low", 0.2), ("_high", 0.4))}}
    chart = run_plots.eval_chart([("PPO", [row])], {})
    layout = chart.figure.to_plotly_json()["layout"]
    axes = [axis for name, axis in layout.items() if name.startswith("xaxis")]
    for axis in axes:
        low, high = axis["range"]
        ticks = np.arange(np.ceil(low - axis["tick0"]), high, axis["dtick"]) + axis["tick0"]
        assert axis["dtick"] == 1 and list(ticks) == [0.0]
    assert len(axes) == 2
    assert chart.data.step.dtype.kind == "i" and chart.data.to_csv(index=False).splitlines()[1].startswith("PPO,0,")
    long = run_plots.eval_chart([("PPO", [{**row, "step": s} for s in (0, 15, 30)])], {})
    assert "dtick" not in long.figure.to_plotly_json()["layout"]["xaxis"]  # plotly's own whole-numbered ticks over 30 steps


def test_the_runs_csv_has_the_held_out_accuracy_and_says_which_run_each_row_is(tmp_path):
    from divviz.runs import store

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": "builtin", "task": "reverse", "seed": 3,
                                                    "clip": "ratio", "clip_params": {"eps": 0.2}}))
    (folder / "status.json").write_text(json.dumps({"state": "done", "step": 2, "steps": 2}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1 * s}) + "\n" for s in (1, 2)))
    (folder / "eval.jsonl").write_text("".join(json.dumps({"step": s, "eval/accuracy": 0.5 + s / 10}) + "\n"
                                               for s in (0, 2)))
    csv = pd.read_csv(io.StringIO(run_files.metrics_csv([store.read_run(folder)])))
    assert list(csv.step) == [0, 1, 2] and csv.step.dtype.kind == "i"
    assert csv.set_index("step")["eval/accuracy"].dropna().to_dict() == {0: 0.5, 2: 0.7}
    assert (csv.seed == 3).all() and (csv.run == "run").all() and {"objective", "model", "setting", "task"} <= set(csv)


def a_run(tmp_path, state="running", step=0, steps=30, config=None, status=None):
    from divviz.runs import processes, store

    folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": "builtin", "task": "reverse", "seed": 0, "clip": "ratio",
                                                    "clip_params": {"eps": 0.2}, **(config or {})}))
    (folder / "status.json").write_text(json.dumps({"state": state, "step": step, "steps": steps,
                                                    **processes.running(os.getpid()), **(status or {})}))
    return store.read_run(folder)


def test_a_run_says_what_it_does_before_its_first_step_and_how_long_it_has_left(tmp_path):
    evaluating = a_run(tmp_path, config={"eval_every": 15})
    assert "answering its held-out problems before the first step (4 min so far" in run_text.before_first_step(
        evaluating, 240.0)
    assert "loading the model" in run_text.before_first_step(a_run(tmp_path, step=0, config={"eval_every": 0},
                                                                    steps=31), 3.0)
    assert run_text.before_first_step(a_run(tmp_path, state="queued"), 1.0) == "no step trained yet"
    half = a_run(tmp_path, step=15, steps=30)
    assert run_text.time_left_text(half, 600.0) == ", about 10 min left at its pace so far"
    assert run_text.time_left_text(a_run(tmp_path, state="done", step=30), 600.0) == ""
    assert run_views.one_seed_each(["PPO", "KL3"]) and not run_views.one_seed_each(["PPO", "PPO", "KL3", "KL3"])


def test_a_timing_run_is_listed_as_one(tmp_path):
    from divviz.runs import runner
    from divviz.runs.runner import Viewer

    timing = a_run(tmp_path, state="done", step=1, steps=1, status={"kind": runner.TIMING})
    assert run_text.run_choice(timing).startswith("timing run · ")
    assert runs_table.overview_rows([timing], Viewer("x", teacher=True))[0]["source"] == "timing run (Measure one step)"
    assert not run_text.run_choice(a_run(tmp_path, state="done", step=3)).startswith("timing")


def test_an_overlaid_run_is_told_apart_by_its_folders_id_or_a_published_runs_whole_name(tmp_path):
    from divviz.runs import store

    run = a_run(tmp_path, state="done").folder
    mine = store.new_run_folder(tmp_path / "runs", "add-ratio-ε-0.2")  # "<date>-<time>-add-ratio-ε-0.2-<6 hex>"
    published = tmp_path / "runs" / "mu4-K8-lr5e-5-ppo"
    for folder in (mine, published):
        shutil.copytree(run, folder, dirs_exist_ok=True)
    assert run_text.run_label(store.read_run(mine), unique=True) == f"ratio ε=0.2 · {mine.name[-6:]}"
    assert run_text.run_label(store.read_run(published), unique=True) == "ratio ε=0.2 · mu4-K8-lr5e-5-ppo"


def test_a_measure_keeps_its_colour_whatever_order_its_runs_come_in():
    rows = [{"step": 1, "reward": 0.1, "entropy": 1.0}]
    listed = [("ratio ε=0.2", rows), ("kl3 δ=0.05", rows)]
    for order in (listed, listed[::-1]):
        runs, evals = run_views.in_colour_order(order, [["r"], ["k"]] if order is listed else [["k"], ["r"]])
        assert [label for label, _ in runs] == ["kl3 δ=0.05", "ratio ε=0.2"] and evals == [["k"], ["r"]]


def test_a_timing_run_stays_marked_once_it_has_trained(tmp_path):
    """The worker rewrites status.json when it starts: the mark "timing" survives it (a two-step run of the built-in
    model, through the pool, as the lab's button starts it)."""
    import time

    from divviz.engine.config import RunConfig
    from divviz.runs import runner, store

    folder = runner.start_run(RunConfig.make(steps=2, eval_every=0), tmp_path, kind=runner.TIMING)
    deadline = time.time() + 300
    while store.read_run(folder).state not in ("done", "failed") and time.time() < deadline:
        time.sleep(0.2)
    run = store.read_run(folder)
    assert run.state == "done" and run.status.get("kind") == runner.TIMING and folder.name.split("-")[2] == "timing"


def test_a_run_starved_of_the_cpu_says_so_and_how_to_give_it_a_share(tmp_path, monkeypatch):
    """A running run whose process has had almost no CPU since it started (here a process that sleeps) says the
    machine is busy and how to raise the pool's priority; one that computes (a busy loop) says nothing — judged at a
    tenth of a core, which a busy loop gets even on a machine as loaded as CI's worst (load 9 on 2 cores); a run
    alive under `STARVED_AFTER_S` is not judged yet."""
    import subprocess
    import time

    from divviz.runs import processes

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.5)
        starved = a_run(tmp_path, step=3, status={**processes.running(sleeper.pid), "started": time.time() - 60})
        text = run_text.progress_text(starved, [{"step": 3, "tokens_per_s": 1.0}], time.time())
        assert "of a core since it started: this machine is busy" in text and "DIVVIZ_POOL_PRIORITY=normal" in text
        assert run_text.starved_text(a_run(tmp_path, status={**processes.running(sleeper.pid),
                                                               "started": time.time()})) == ""
    finally:
        sleeper.kill()
    monkeypatch.setattr(run_text, "STARVED_SHARE", 0.1)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        assert run_text.starved_text(a_run(tmp_path, status={**processes.running(busy.pid), "threads": 1,
                                                               "started": time.time() - 60})) == ""
    finally:
        busy.kill()


def test_the_lab_names_a_timing_run_and_a_final_evaluation(tmp_path):
    import time

    timing = a_run(tmp_path, step=2, steps=2, config={"eval_every": 0}, status={"kind": "timing"})
    assert run_text.progress_text(timing, [{"step": 2}], time.time()).startswith("**timing run · ")
    evaluating = a_run(tmp_path, step=10, steps=10, config={"eval_every": 5}, status={"updated": time.time() - 30})
    assert "answering its held-out problems after the last step (30 s so far)" in run_text.progress_text(
        evaluating, [{"step": 10}], time.time())
