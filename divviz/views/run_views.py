"""Every figure and number of the run pages (Training lab, Runs, Step inspector), from runs and their metrics:
compute (the engine's records, `explain`, the same-batch comparison) then draw (`run_plots`, `plots`). Pages call
these and lay the results out; the explorer pages' are in `explorer.py`."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import numpy as np
import pandas as pd

from divviz import loss_grids

from divviz.catalogue.divergences import ClipTest, clip_test
from divviz.catalogue.instances import unique_labels
from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig, config_label, correction_from, objective_from, setting_of
from divviz.evidence.intervals import summarize
from divviz.losses import Objective
from divviz.metrics import METRIC_ALIASES, bin_labels, metric, metric_range
from divviz.runs import published, store
from divviz.runs import runner
from divviz.runs.pool import worker_threads
from divviz.runs.processes import cpu_share
from divviz.runs.runner import TIMING
from divviz.safetext import literal
from divviz.views import plots, run_plots
from divviz.views.explorer import PI_OLD_GRID
from divviz.views.figures import Chart, spreadsheet_csv

TRAINING_PANELS = {
    "reward": ("reward", "accuracy"),
    "entropy": ("entropy", "top1_mass"),
    "entropy_change": ("entropy/change", "entropy/change_predicted"),
    "entropy_cov": ("entropy/cov_inside", "entropy/cov_masked_low", "entropy/cov_masked_high"),
    "clipping": ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/overshoot_mean"),
    "kl": ("kl/k1", "kl/k2", "kl/k3"),
    "update": ("mass_to_argmax", "grad_norm"),
    "stability": ("stability/max_kl", "stability/max_clip", "stability/collapsed"),
}
WHEN_LOGGED = ("entropy_change", "entropy_cov", "stability")  # panels drawn only where a run logs their metrics
# drawn when a run's sampler may differ from its policy: verl's measures of the mismatch and of what corrected it
ROLLOUT_PANEL = ("rollout_corr/k3_kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
                 "rollout_corr/rollout_rs_masked_fraction")

def trailing_mean(values, window: int) -> np.ndarray:
    """Mean of the last `window` values at each step (fewer at the start); window 1 returns the values."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(values) == 0:
        return values
    sums = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    start = np.maximum(idx - window, 0)
    return (sums[idx] - sums[start]) / (idx - start)


def column(rows: list[dict], key: str) -> np.ndarray:
    """One metric over a run's rows: from the metrics cache's columns when the rows came from it (`tail.Rows`), else
    row by row; a TRL run's name for it where the rows have that instead (`metrics.metric`)."""
    if hasattr(rows, "column"):
        values = rows.column(key)
        alias = METRIC_ALIASES.get(key)
        return values if alias is None or not np.isnan(values).all() else rows.column(alias)
    return np.array([metric(row, key) for row in rows], dtype=np.float64)


def memo(rows, key, compute):
    """compute() on a run's rows, kept with the metrics cache's rows until the run grows (`tail.Rows.memo`): a
    chart redrawn every 2 s computes again only the curves of runs that changed, and the same arrays come back for
    the others (so their thinning is kept too, `figures.thinned`)."""
    return rows.memo(key, compute) if hasattr(rows, "memo") else compute()


def training_charts(runs: list[tuple[str, list[dict]]], smooth: int = 1) -> dict[str, Chart]:
    """Metric curves of several runs (label, metrics rows), one chart per panel of TRAINING_PANELS, each
    curve the trailing mean over `smooth` steps (1 = the raw per-step values). Runs that share a label (one
    measure with several seeds) are drawn thin, under their mean and its 95% band over the steps all of them
    have reached, labelled with their n."""
    logged = lambda key: any(key in row for _, rows in runs for row in rows[:1])  # noqa: E731
    panels = {name: metrics for name, metrics in TRAINING_PANELS.items()  # a panel no run logs (a TRL run has no
              if name not in WHEN_LOGGED or logged(metrics[0])}  # forward after its update) is left out
    if logged(ROLLOUT_PANEL[0]):
        panels["rollout"] = ROLLOUT_PANEL
    keys = tuple(sorted({k for metrics in panels.values() for k in metrics}))
    curves = lambda rows: memo(rows, ("curves", keys, smooth),  # noqa: E731
                               lambda: {key: trailing_mean(column(rows, key), smooth) for key in keys})
    series, members = [], {}
    for label, group in grouped(runs):
        if len(group) == 1:
            series.append((label, curves(group[0])))
            continue
        label = f"{label} (n = {len(group)})"
        members[label] = [curves(rows) for rows in group]
        reached = min(len(rows) for rows in group)
        series.append((label, {key: summarize([m[key][:reached] for m in members[label]], bounds=metric_range(key))
                               for key in keys}))
    if not series:
        return {}
    titles = {"reward": "Reward and accuracy", "entropy": "Entropy of the sampling distribution and top-1 mass",
              "entropy_change": "Entropy change of each update at the sampled positions: observed, and predicted to "
                                "first order, −Cov_π(log π, Δz) (Cui et al. 2025)",
              "entropy_cov": "Who drives it: Cov(log π_old, A) over the batch's tokens, by clip state (positive: "
                             "entropy falls)",
              "clipping": "Clip fractions (TRL: clip_ratio/low_mean, high_mean) and the share past the bound after "
                          "the update",
              "kl": "KL of each update, new vs old (k1, k2, k3 of w = π_new/π_old; k1 is unbiased and can dip below 0, "
                    "k2 and k3 cannot)",
              "stability": "Stability so far: the largest update KL (k3) and clip fraction, and 1 from the step the run "
                           "collapsed",
              "update": "Share of the mass gained that went to argmax tokens, and the gradient's norm",
              "rollout": "The sampler against the policy (verl's k3 KL of π_roll‖π_old), and the correction: mean "
                         "weight, effective sample size, share rejected"}
    return {name: run_plots.history_chart(series, metrics, "step", titles[name], members=members)
            for name, metrics in panels.items()}


def collapse_step(rows) -> int | None:
    """The step a run collapsed on (`engine.stability`), None if it has not (or logs no stability)."""
    steps = column(rows, "stability/collapse_step") if rows else np.array([])
    steps = steps[~np.isnan(steps)]
    return int(steps[0]) if len(steps) else None


def held_out_chart(runs: list[tuple[str, list[dict], list[dict]]]) -> Chart | None:
    """The held-out accuracy of runs [(label, metrics rows, eval rows)] over training (`run_plots.eval_chart`), each
    run's collapse marked; runs that share a label (grouped by objective) as one line, "label (n = k)", their mean
    with its band (`seeds_band`), as the other charts draw them. None when no run evaluated."""
    groups: dict[str, list[tuple[list[dict], int | None]]] = {}
    for label, rows, evals in runs:
        if evals:
            groups.setdefault(label, []).append((evals, collapse_step(rows)))
    if not groups:
        return None
    series = [(label if len(members) == 1 else f"{label} (n = {len(members)})",
               members[0][0] if len(members) == 1 else seeds_band([evals for evals, _ in members]),
               [step for _, step in members if step is not None]) for label, members in groups.items()]
    return run_plots.eval_chart([(name, evals) for name, evals, _ in series],
                                {name: steps for name, _, steps in series if steps})


def seeds_band(runs_evals: list[list[dict]]) -> list[dict]:
    """Several runs' held-out evaluations as one: at each step all of them evaluated, each accuracy's mean over the
    runs with its band in [0, 1] (`intervals.summarize`: the runs' range below 4 of them, else the 95% t interval)."""
    steps = sorted(set.intersection(*({row["step"] for row in evals} for evals in runs_evals)))
    by_step = [{row["step"]: row for row in evals} for evals in runs_evals]
    out = []
    for step in steps:
        row = {"step": step}
        for name, _ in run_plots.EVAL_PANELS:
            band = summarize([[run[step].get(name, np.nan)] for run in by_step], bounds=(0.0, 1.0))
            row.update({name: float(band.mean[0]), f"{name}_low": float(band.low[0]),
                        f"{name}_high": float(band.high[0])})
        out.append(row)
    return out


def minibatch_profile(runs: list[tuple[str, list[dict]]]) -> Chart | None:
    """The clip fraction and KL by optimiser step within an update (`run_plots.minibatch_chart`), each the mean over
    a run's steps (and over a label's runs); None when no run trained in mini-batches."""
    series = []
    for label, group in grouped(runs):
        names = sorted({k for rows in group for k in rows[0] if k.startswith("clip_ratio/region_mean_by_minibatch/")},
                       key=lambda k: int(k.rsplit("/", 1)[1]))
        if not names:
            continue
        positions = [int(k.rsplit("/", 1)[1]) for k in names]
        series.append((label, {metric: np.array([np.nanmean([np.nanmean(column(rows, f"{metric}/{p}")) for rows in group])
                                                 for p in positions])
                               for metric in ("clip_ratio/region_mean_by_minibatch", "kl/k3_by_minibatch")}))
    return run_plots.minibatch_chart(series) if series else None


BINDING_WINDOW = 10  # the "nothing clipped" notice looks at a run's last this many steps


def nothing_clipped(runs: list[tuple[str, list[dict]]]) -> bool:
    """Whether every run with rows has had no token clipped (clip_ratio/region_mean 0) over its last `BINDING_WINDOW`
    steps (its whole run when shorter): then every measure made the same update, and comparing them shows nothing."""
    logged = [rows for _, rows in runs if rows]
    return bool(logged) and all(not np.nansum(column(rows, "clip_ratio/region_mean")[-BINDING_WINDOW:])
                                for rows in logged)


def grouped(runs: list[tuple[str, list[dict]]]) -> list[tuple[str, list[list[dict]]]]:
    """Runs with metrics, gathered by label in order of first appearance."""
    groups: dict[str, list[list[dict]]] = {}
    for label, rows in runs:
        if rows:
            groups.setdefault(label, []).append(rows)
    return list(groups.items())


def mass_shift(runs: list[tuple[str, list[dict]]], last: int = 10) -> Chart:
    """Δπ per token by π_old bin, averaged over each run's last `last` steps (and over a label's runs, with their
    95% interval)."""
    series = []
    for label, group in grouped(runs):
        per_run = [np.array([np.mean([r.get(f"mass_shift/{b}", 0.0) for r in rows[-last:]]) for b in bin_labels()])
                   for rows in group]
        series.append((label, per_run[0]) if len(group) == 1 else (f"{label} (n = {len(group)})",
                                                                   summarize(per_run, bounds=(-1, 1))))
    return run_plots.mass_bins_chart(series, f"Mass reallocation: Δπ of sampled tokens by π_old (last {last} steps)")


def token_scatter(runs: list[tuple[str, str, dict, dict]]) -> Chart:
    """runs: [(measure label, run label, run config dict, tokens of one step)] → scatter with each measure's clip
    boundary (`run_plots.token_scatter`)."""
    drawn, grid = [], np.linspace(0.005, 1.0, 200)
    for measure, label, config, tokens in runs:
        if config.get("clip"):
            lower, upper = clip_test(config["clip"], **config.get("clip_params", {})).bounds(grid)
            lower, upper = np.broadcast_to(lower, grid.shape), np.broadcast_to(upper, grid.shape)
        else:
            lower, upper = np.full_like(grid, np.nan), np.full_like(grid, np.nan)
        drawn.append((measure, label, tokens, (grid, lower, upper)))
    return run_plots.token_scatter(drawn)


def run_label(run, unique: bool = False) -> str:
    """A legend label for a run: its objective, where it came from when not divviz's engine ("(TRL)", "· imported
    (unipo)"), and the end of its folder name when `unique`."""
    try:
        label = config_label(run.config)
    except (DivvizInputError, TypeError, AttributeError):  # a config written by another version, or none
        return run.name
    if run.config.get("backend") == "trl":
        label = f"{label} (TRL)"
    if run.config.get("backend") == "import":  # its file's format, as `importers.source.source_config` keeps it
        source = run.config.get("source") if isinstance(run.config.get("source"), dict) else {}
        label = f"{label} · imported ({source.get('format', 'unknown format')})"
    return f"{label} · {run.name[-6:]}" if unique else label


COMPARISON_COLUMNS = {"clip_ratio/low_mean": "clipped low, mean of the μ × K steps",
                      "clip_ratio/high_mean": "clipped high, mean of the μ × K steps",
                      "masked_share": "gradient masked at the last step (low, high or dual-clip)",
                      "kl/k3": "KL k3 of the update",
                      "entropy/change": "entropy change", "mass_to_argmax": "mass gain to argmax tokens"}


def same_batch(configs: list[RunConfig], step: int, weights=None, progress=None):
    """Every config's objective and rollout correction on step `step`'s batch from the same weights (the start model,
    or a run's checkpoint file), sampled by the first config's sampler: a table, two charts, and each one's (label,
    record of whole completions). `progress(done, total, text)` hears of each part as it ends."""
    from divviz.engine.compare import same_batch as compare

    labels = unique_labels([cfg.label for cfg in configs])
    results = compare(configs[0], list(zip(labels, configs)), step, weights=weights, progress=progress)
    columns = {**COMPARISON_COLUMNS, **({"rejected_share": "rejected (rollout)"}
                                        if any(cfg.correction().rollout_rs for cfg in configs) else {})}
    table = pd.DataFrame([{"objective": r.label, **{name: r.metrics[key] for key, name in columns.items()}}
                          for r in results])
    charts = {
        "mass": run_plots.mass_bins_chart([(r.label, np.array([r.metrics[f"mass_shift/{b}"] for b in bin_labels()]))
                                       for r in results], "Same batch: Δπ of sampled tokens by π_old"),
        "shift": run_plots.probability_shift_scatter([(r.label, r.pi_old, r.pi_new) for r in results]),
    }
    return table, charts, [(r.label, r.record) for r in results]


def explained_objectives(config: dict, extra: list[ClipTest]) -> list[tuple[str, Objective]]:
    """The run's own objective, then the same objective with each of `extra` as its clip test (its penalty, β,
    dual-clip and aggregation kept): the measures the token explainer puts a token's numbers into."""
    own = objective_from(config)
    objectives = [own, *(replace(own, clip=test) for test in extra)]
    labels = unique_labels([f"{o.label} (this run)" if i == 0 else o.label for i, o in enumerate(objectives)])
    return list(zip(labels, objectives))


def rejected_note(config: dict, tokens: dict, i: int) -> str:
    """Why token i has no loss to explain: the run's rollout correction rejected it (`completions` state 5)."""
    pi_old, pi_roll = (tokens.get(key)[i] if tokens.get(key) else None for key in ("pi_old", "pi_roll"))
    ratio = f"π_old/π_roll = {pi_old / pi_roll:.4g}; " if pi_old and pi_roll else ""
    return (f"The run's rollout correction ({correction_from(config).label}) rejected this token: {ratio}it took no "
            "part in the loss. A sequence-level option (seq_…) judges the whole completion.")


def token_region(objectives: list[tuple[str, Objective]], pi_old: float, ratio: float | None, pi_after: float | None):
    """The Clipping regions picture (π_old, π_new) of the objectives' clip tests, with the token on it: at the
    last inner step (π_old·w; not for a token the loss did not see) and after the update."""
    tests = [(label, o.clip) for label, o in objectives if o.clip is not None]
    marks = [] if ratio is None else [("token at the last inner step", pi_old, pi_old * ratio)]
    if pi_after is not None:
        marks.append(("token after the update", pi_old, pi_after))
    return plots.region_chart(PI_OLD_GRID, [(label, *loss_grids.feasible_region(t, PI_OLD_GRID)) for label, t in tests],
                              marks)


def metrics_csv(runs) -> str:
    """Every step of `runs` as one CSV (the Runs page's download): each run's metrics rows and its held-out
    evaluations joined on the step (an evaluation's columns empty at the steps it did not evaluate; step 0's
    evaluation a row of its own), with the columns that say which run a row is of — its folder, objective, model,
    setting, task and seed."""
    frames = []
    for run in runs:
        metrics, evals = pd.DataFrame(store.read_metrics(run.folder)), pd.DataFrame(store.read_evals(run.folder))
        steps = (metrics.merge(evals, on="step", how="outer") if len(metrics) and len(evals)
                 else metrics if len(metrics) else evals)
        if len(steps):
            who = {"run": run.name, "objective": run_label(run), "model": run.config.get("model", ""),
                   "setting": setting_of(run.config), "task": task_label(run.config), "seed": run.config.get("seed")}
            frames.append(pd.DataFrame({**who, **steps.sort_values("step").reset_index(drop=True)}))
    return spreadsheet_csv(pd.concat(frames)) if frames else ""



def task_label(config: dict) -> str:
    """A run's task as lists show it, with "random reward" where the task's checker did not give the rewards ("task
    not given" where its config names none, as an imported file may not)."""
    task = config.get("task") or "task not given"
    return f"{task} (random reward)" if config.get("reward") == "random" else task


def run_choice(run) -> str:
    """A run as a list shows it: its measure, model (and the model's setting) and task, seed, state and steps
    ("kl3 δ=0.05 · add · seed 1 · done, 20 steps · 20261125-143529", "ratio ε=0.2 · smollm2-135m · stress · add · …"),
    so runs are picked by what they are, not by their folder's name. An imported run has no seed (its file gives
    none): its label says "imported (format)" instead."""
    config = run.config
    setting = setting_of(config)
    model = ("" if config.get("model", "builtin") == "builtin"
             else f"{config.get('model')} · {f'{setting} · ' if setting else ''}")
    seed = "" if config.get("backend") == "import" else f"seed {config.get('seed', '?')} · "
    timing = "timing run · " if run.status.get("kind") == TIMING else ""
    return (f"{timing}{run_label(run)} · {model}{task_label(config)} · {seed}{run.state}, "
            f"{run.step} step{'s' if run.step != 1 else ''} · {run.name[:15]}")


def in_colour_order(runs: list[tuple[str, list[dict]]], evals: list | None = None) -> tuple[list, list | None]:
    """Runs [(label, rows)] (and their evaluations, alike) in the order their colours are given: by label, so that a
    measure keeps its colour whatever order the runs were listed in — after a reload, on the lab and the Runs page."""
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])
    return [runs[i] for i in order], (None if evals is None else [evals[i] for i in order])


def one_seed_each(labels: list[str]) -> bool:
    """Whether runs labelled by their measure (`labels`) compare two or more measures on one seed each: a gap between
    their curves is then as much the seeds' as the measures'."""
    return len(labels) >= 2 and len(set(labels)) == len(labels)


def progress_text(run, rows: list[dict], now: float) -> str:
    """The lab's line for one of its runs (Markdown, the label escaped): queued, its place in the queue and when it
    starts; before its first step, what it is doing; else its step, time, speed, device and time left, or the final
    evaluation it is answering; and, while it trains, when it gets too little of the CPU (`starved_text`)."""
    timing = "timing run · " if run.status.get("kind") == TIMING else ""
    label = f"**{timing}{literal(run_label(run))} · seed {run.config.get('seed')}**"
    if run.state == "queued":
        ahead, eta = runner.queue_position(run.folder)
        slots = runner.max_runs()
        return (f"{label} — queued, {ahead} ahead" + (f", starts in about {duration(eta)}" if eta is not None else "")
                + f" (this machine trains {slots} run{'s' if slots != 1 else ''} at a time)")
    started = run.status.get("started", now)
    if not rows:
        return f"{label} — {run.state}, {before_first_step(run, now - started)}{starved_text(run)}"
    elapsed = run.status.get("updated", now) - started
    if run.state == "running" and run.step >= run.steps and int(run.config.get("eval_every") or 0) > 0:
        return (f"{label} — running, step {run.step}/{run.steps}, answering its held-out problems after the last "
                f"step ({duration(now - run.status.get('updated', now))} so far){starved_text(run)}")
    return (f"{label} — {run.state}, step {run.step}/{run.steps}, {elapsed:.0f} s, "
            f"{rows[-1].get('tokens_per_s', 0):.0f} tokens/s on {literal(run.status.get('device') or '…')}"
            + (" (a Ray worker)" if run.status.get("executor") == "ray" else "")
            + time_left_text(run, elapsed) + starved_text(run))


STARVED_AFTER_S = 30.0  # a run's share of the CPU is judged once it has been alive this long
STARVED_SHARE = 0.5  # of the cores its threads could use


def starved_text(run) -> str:
    """For a running run whose process has had under half the CPU its threads could use since it started
    (`processes.cpu_share`): that the machine is busy, that the app's pool trains below the user's own work, and
    how to give it an even share; "" otherwise (and for a run not yet alive `STARVED_AFTER_S`)."""
    if run.state != "running" or time.time() - run.status.get("started", time.time()) < STARVED_AFTER_S:
        return ""
    share = cpu_share(run.status)
    threads = run.status.get("threads") or worker_threads()
    if share is None or share >= STARVED_SHARE * min(threads, os.cpu_count() or 1):
        return ""
    return (f". It has had {share:.0%} of a core since it started: this machine is busy with other work, and the "
            "app's pool trains below the priority of your own work so that the app stays quick. To give training "
            "an even share, start the app with `DIVVIZ_POOL_PRIORITY=normal` (docs/workshop.md)")


def kept_steps_label(steps: list[int]) -> str:
    """The Step inspector's step slider's label: which steps the run kept, "Step (3 kept: 1, 15, 30)", so that a
    slider between 1 and 30 does not read as 30 steps to choose from."""
    kept = ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}, {steps[1]}, …, {steps[-1]}"
    return f"Step ({len(steps)} kept: {kept})"


def binding_minibatches(completions: int) -> int:
    """The mini-batches that make a clip test bind, as the lab offers them: 4, else the first of 2 and 3 that splits
    a batch of `completions` into equal parts (every mini-batch after the first is off-policy)."""
    return next((k for k in (4, 2, 3) if completions % k == 0), completions)


def time_left_text(run, elapsed: float) -> str:
    """", about 4 min left at its pace" for a running run: its steps to go at the wall time per step so far
    (evaluations included); "" otherwise."""
    if run.state != "running" or not run.step or run.step >= run.steps:
        return ""
    return f", about {duration((run.steps - run.step) * elapsed / run.step)} left at its pace so far"


def before_first_step(run, elapsed: float) -> str:
    """What a run that has trained no step is doing, in words, `elapsed` seconds after it started: loading its model
    and answering its held-out problems before the first step (a SmolLM2 run's first evaluation takes minutes on a
    CPU, with no step to show), or sampling that step; "no step trained yet" when it is not running."""
    if run.state != "running":
        return "no step trained yet"
    evaluates = int(run.config.get("eval_every") or 0) > 0
    if evaluates and not store.read_evals(run.folder):
        return (f"loading the model, then answering its held-out problems before the first step ({duration(elapsed)} "
                "so far; this evaluation comes before any update, so the bars stay empty until it is done)")
    return f"loading the model and sampling the first step's completions ({duration(elapsed)} so far)"


def duration(seconds: float) -> str:
    """"40 s", "3 min", "1 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def seconds_text(seconds: float) -> str:
    """A few seconds in plain numbers: "0.42 s", "8.7 s", "87 s", "174 s"."""
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def timed_beside(side_by_side: int | None) -> str:
    """How a step time was measured: alone, or beside how many other runs (`runs_training`)."""
    if side_by_side is None:
        return "whether other runs trained beside it was not recorded"
    return "timed alone" if side_by_side <= 1 else f"timed while {side_by_side} runs trained side by side"


def every_run(root) -> list:
    """The runs folder's runs, newest first, then the published runs (`runs/published.py`), read-only: what the
    Runs page and the Step inspector list. A published run's folder is in the published runs' folder."""
    shared = published.folder()
    return [*store.list_runs(root), *(store.list_runs(shared) if shared else ())]
