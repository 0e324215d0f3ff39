"""Every figure and number of the run pages (Training lab, Runs, Step inspector), from runs' metrics: compute (the
engine's records, `explain`, the same-batch comparison) then draw (`run_plots`, `plots`). Pages call these and lay
the results out; their words about a run are in `run_text.py`, their reading of run folders in `run_files.py`, the
explorer pages' figures in `explorer.py`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from divviz import loss_grids
from divviz.catalogue.divergences import ClipTest, clip_test
from divviz.catalogue.instances import unique_labels
from divviz.engine.config import RunConfig, correction_from, objective_from
from divviz.evidence.intervals import summarize
from divviz.losses import Objective
from divviz.metrics import METRIC_ALIASES, bin_labels, metric, metric_range
from divviz.views import plots, run_plots
from divviz.views.explorer import PI_OLD_GRID
from divviz.views.figures import Chart

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


COMPARISON_COLUMNS = {"clip_ratio/low_mean": "masked low, mean of the μ × K steps",
                      "clip_ratio/high_mean": "masked high, mean of the μ × K steps",
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
    last optimiser step (π_old·w; not for a token the loss did not see) and after the update."""
    tests = [(label, o.clip) for label, o in objectives if o.clip is not None]
    marks = [] if ratio is None else [("token at the last optimiser step", pi_old, pi_old * ratio)]
    if pi_after is not None:
        marks.append(("token after the update", pi_old, pi_after))
    return plots.region_chart(PI_OLD_GRID, [(label, *loss_grids.feasible_region(t, PI_OLD_GRID)) for label, t in tests],
                              marks)


def in_colour_order(runs: list[tuple[str, list[dict]]], evals: list | None = None) -> tuple[list, list | None]:
    """Runs [(label, rows)] (and their evaluations, alike) in the order their colours are given: by label, so that a
    measure keeps its colour whatever order the runs were listed in — after a reload, on the lab and the Runs page."""
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])
    return [runs[i] for i in order], (None if evals is None else [evals[i] for i in order])


def one_seed_each(labels: list[str]) -> bool:
    """Whether runs labelled by their measure (`labels`) compare two or more measures on one seed each: a gap between
    their curves is then as much the seeds' as the measures'."""
    return len(labels) >= 2 and len(set(labels)) == len(labels)


def binding_minibatches(completions: int) -> int:
    """The mini-batches that make a clip test bind, as the lab offers them: 4, else the first of 2 and 3 that splits
    a batch of `completions` into equal parts (every mini-batch after the first is off-policy)."""
    return next((k for k in (4, 2, 3) if completions % k == 0), completions)
