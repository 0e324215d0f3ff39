"""Every figure of each explorer page (Clipping regions, KL3, Mass reallocation), from the page's control values:
compute (loss_grids, theory, bandit) then draw (plots). Pages call these and lay the results out; `bench/explorer.py`
times them. The run pages' are in `run_views.py`."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from divviz import loss_grids

from divviz.catalogue import theory

from divviz.views import plots, run_plots
from divviz.bandit.entropy import ATTRIBUTION
from divviz.bandit.grpo import ROLLOUT_HISTORY, BanditRun, run_bandits
from divviz.bandit.setting import BanditConfig
from divviz.catalogue.divergences import ClipTest, clip_test
from divviz.engine.config import correction_from, objective_settings, rollout_label
from divviz.catalogue.estimators import k3
from divviz.evidence.intervals import Summary, paired, summarize
from divviz.views.figures import Chart
from divviz.catalogue.instances import unique_labels
from divviz.losses import Objective
from divviz.metrics import mass_shift_by_bin, metric_range
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import Penalty
from divviz.catalogue.rollout_correction import CORRECTIONS
from divviz.catalogue.surrogates import Surrogate

RATIO_GRID = np.linspace(0.01, 3.0, 600)
PI_OLD_GRID = np.linspace(0.001, 1.0, 400)
RHO_GRID = np.geomspace(0.1, 10.0, 801)  # ρ = π_old/π_roll, symmetric in log
PENALTY_GRID = np.linspace(0.2, 3.0, 400)  # r = π_θ/π_ref; below 0.2 k3's 1/r dwarfs the others


def compared_objectives(tests: list[ClipTest], surrogates: list[Surrogate], bandit: bool = False,
                        **shared) -> tuple[list[Objective], list[str]]:
    """The objectives a page compares: each clip test under PPO's surrogate, then each surrogate. A surrogate that
    masks with a clip test (dppo, geo_mean, clip_cov, RPG's) takes the first of `tests`; dual-clip and the ratio cap act
    on PPO's surrogate, so the surrogates go without them. `shared` holds the other `Objective` fields (penalties and
    their coefficients, dual_clip_c, ratio_cap, off_policy_mask_threshold, aggregation, importance_sampling_level). With
    neither a test nor a surrogate: one objective without a clip. For the `bandit`, a surrogate that draws its tokens at
    random (clip_cov) is refused. Returns (objectives, one message per entry that these settings refuse)."""
    uncapped = {k: v for k, v in shared.items() if k not in ("dual_clip_c", "ratio_cap")}
    wanted = [(t.label, {"clip": t, **shared}) for t in tests]
    refused = []
    for s in surrogates:
        if s.entry.clip == "needs" and not tests:
            refused.append(f"{s.label}: it masks with a clip test; add one (it takes the first)")
        elif bandit and s.entry.random:
            refused.append(f"{s.label}: it draws its tokens at random from torch's global generator, so a bandit run "
                           "would depend on the runs beside it; train it in the Training lab")
        else:
            wanted.append((s.label, {"clip": tests[0] if s.entry.clip == "needs" else None, "surrogate": s,
                                     **uncapped}))
    objectives = []
    for label, fields in wanted or [("no clip", dict(shared))]:
        try:
            objectives.append(Objective(**fields))
        except DivvizInputError as err:
            refused.append(f"{label}: {err}")
    return objectives, refused


def weight_curves(objectives: list[Objective], pi_old: float) -> list[tuple[str, dict]]:
    """(label, γ for A = ±1) of each objective; a batch-selecting surrogate has two: the tokens it picks, the others."""
    curves = []
    for label, o in zip(unique_labels([o.label for o in objectives]), objectives):
        if o.surrogate is not None and o.surrogate.entry.select is not None:
            curves += [(f"{label}: tokens it picks", loss_grids.gradient_weight(o, RATIO_GRID, pi_old, picked=True)),
                       (f"{label}: the others", loss_grids.gradient_weight(o, RATIO_GRID, pi_old))]
        else:
            curves.append((label, loss_grids.gradient_weight(o, RATIO_GRID, pi_old)))
    return curves


CLIPPING_CHARTS = ("intervals", "sweeps", "surrogate", "weight", "penalty", "correction", "region", "logit")


def clipping_regions(tests: list[ClipTest], pi_old: float, dual_clip_c: float | None,
                     surrogates: list[Surrogate] = (), penalties: list[Penalty] = (),
                     corrections: list[dict] = (), charts: tuple[str, ...] = CLIPPING_CHARTS) -> dict[str, Chart]:
    """The `charts` named (the page asks for the ones it shows): intervals now, intervals as the parameter moves, the
    surrogate/gradient, the gradient weight of each test under PPO's surrogate and of each surrogate, each penalty's
    value and slope against π_θ/π_ref at π_ref = π_old, each rollout correction's multiplier against π_old/π_roll
    (`corrections`: `rollout_variant`s; bypass mode has none: its ratio is the loss's), the (π_old, π_new) region and
    the logit room. The same test may come several times (its labels are made distinct)."""
    labels = unique_labels([t.label for t in tests])
    labelled = list(zip(labels, tests))

    def sweeps() -> list[dict]:
        found = []
        for label, test in labelled:
            param = test.entry.params[-1]
            low, high, _ = param.slider_range()
            values = np.linspace(low, high, 120)
            lower, upper = loss_grids.interval_sweep(test, param.name, values, pi_old)
            found.append({"label": label, "param": param.name, "values": values, "lower": lower,
                          "upper": upper, "current": test.params[param.name]})
        return found

    def weighed() -> list:
        return compared_objectives(tests, surrogates, dual_clip_c=dual_clip_c)[0] if tests or surrogates else []

    build = {
        "intervals": lambda: plots.interval_chart([(label, *(float(b) for b in t.bounds(np.asarray(pi_old))))
                                                   for label, t in labelled]),
        "sweeps": lambda: plots.sweep_chart(sweeps()),
        "surrogate": lambda: plots.surrogate_chart(
            [(label, loss_grids.ratio_curves(t, RATIO_GRID, pi_old, dual_clip_c)) for label, t in labelled]),
        "weight": lambda: plots.gradient_weight_chart(RATIO_GRID, weight_curves(weighed(), pi_old)),
        "penalty": lambda: plots.penalty_chart(PENALTY_GRID, [(p.label, *loss_grids.penalty_curves(p, PENALTY_GRID, pi_old))
                                                              for p in penalties], pi_old),
        "correction": lambda: plots.correction_chart(RHO_GRID, [
            (rollout_label(v) or "none", loss_grids.correction_curve(correction_from(v), RHO_GRID))
            for v in corrections if not v.get("bypass_mode")]),
        "region": lambda: plots.region_chart(PI_OLD_GRID, [(label, *loss_grids.feasible_region(t, PI_OLD_GRID))
                                                           for label, t in labelled]),
        "logit": lambda: plots.logit_chart(PI_OLD_GRID, [(label, *loss_grids.logit_room(t, PI_OLD_GRID))
                                                         for label, t in labelled]),
    }
    return {name: build[name]() for name in charts}


@dataclass
class KL3Facts:
    delta: float
    bounds: tuple[float, float]
    series: tuple[float, float]
    box: tuple[float, float]  # (ε_low, ε_high)
    inverse: tuple[float, float]  # the wrong-direction interval
    ppo: dict
    dapo: dict
    check: loss_grids.EquivalenceCheck


def kl3_equivalence(delta: float, eps: float, eps_low: float, eps_high: float, seed: int,
                    completions: int = 64) -> tuple[KL3Facts, dict[str, Chart]]:
    """Numbers and figures of the KL3 ⇔ asymmetric clipping page."""
    deltas = np.geomspace(1e-4, 1.0, 200)
    bounds = theory.kl3_bounds(delta)
    facts = KL3Facts(
        delta=delta, bounds=bounds, series=theory.kl3_bounds_series(delta), box=theory.kl3_equivalent_box(delta),
        inverse=theory.kl3_inverse_bounds(delta), ppo=theory.match_box_to_kl3(eps, eps),
        dapo=theory.match_box_to_kl3(eps_low, eps_high),
        check=loss_grids.kl3_equivalence_check(delta, seed, completions=completions),
    )
    ratio = np.linspace(0.3, 2.5, 500)
    charts = {
        "level": plots.k3_level_chart(ratio, k3(np.log(ratio)), delta, bounds,
                                      [(f"PPO ε={eps:g}", 1 - eps, 1 + eps),
                                       (f"DAPO ({eps_low:g}, {eps_high:g})", 1 - eps_low, 1 + eps_high)]),
        "bounds": plots.kl3_bounds_chart(deltas, theory.kl3_bounds(deltas), theory.kl3_bounds_series(deltas, 2),
                                         theory.kl3_bounds_series(deltas, 5), delta),
    }
    return facts, charts


def matching_table(facts: KL3Facts, eps: float, eps_low: float, eps_high: float):
    """Box → δ for each edge of PPO and DAPO, and δ → box for the chosen δ, as one table."""
    rows = []
    for name, box, match in ((f"PPO ε={eps:g}", (1 - eps, 1 + eps), facts.ppo),
                             (f"DAPO ({eps_low:g}, {eps_high:g})", (1 - eps_low, 1 + eps_high), facts.dapo)):
        for edge, value, key in (("lower", box[0], "low"), ("upper", box[1], "high")):
            lo, hi = match[f"interval_{key}"]
            rows.append({"box": name, "edge": f"{edge} {value:.4f}", "KL3 δ through this edge": match[f"delta_{key}"],
                         "KL3 interval at that δ": f"[{lo:.5f}, {hi:.5f}]"})
    lo, hi = facts.bounds
    rows.append({"box": f"KL3 δ={facts.delta:g}", "edge": "both",
                 "KL3 δ through this edge": facts.delta, "KL3 interval at that δ": f"[{lo:.5f}, {hi:.5f}]"})
    return pd.DataFrame(rows)


BANDIT_CACHE_RUNS = 4096  # a run keeps two distributions and its metrics: at most ~0.2 MB at K = 1000
_bandit_cache: OrderedDict[str, BanditRun] = OrderedDict()  # the latest runs, by their plain values (JSON)
_bandit_cache_lock = threading.Lock()  # Streamlit runs each session's page in its own thread
BANDIT_METRICS = ("expected_reward", "entropy", "top1_mass", "initial_top_mass")
ENTROPY_CHANGE = ("entropy/change", "entropy/change_predicted")
BANDIT_CLIPPING = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/overshoot_mean",
                   "clip_ratio/first_step_past_high", "kl")


BANDIT_WORK_CAP = 25_000_000  # `bandit_work` of one view: 50 × the page's default (8 seeds, 3 objectives), about
                              # 1 s of one core on the closed-form gradient
AUTOGRAD_COST = 20  # an action-update through torch's autograd against the closed form (13.2 s against 0.66 s for
                    # 16 M of them, 2 seeds × 2 objectives × 500 iterations, the AMX CPU, 2026-12-02)


def bandit_work_cap() -> int:
    """The most `bandit_work` one view may ask: $DIVVIZ_BANDIT_WORK_CAP (a host's choice), else BANDIT_WORK_CAP."""
    return int(os.environ.get("DIVVIZ_BANDIT_WORK_CAP") or BANDIT_WORK_CAP)


def bandit_work(cfg: dict, runs: int) -> int:
    """What a view of the bandit asks of the CPU, in action-updates: runs × iterations × μ × (K + the samples an
    iteration draws), the closed-form step's cost (`bandit/grpo.py`) and the sampler's; × AUTOGRAD_COST through
    autograd."""
    setting = BanditConfig.make(**cfg)
    updates = runs * setting.iterations * setting.mu * (setting.k + setting.groups * setting.group_size)
    return updates * (AUTOGRAD_COST if setting.autograd else 1)


def check_bandit_work(cfg: dict, objectives: int, seeds: int) -> None:
    """DivvizInputError saying what to lower when a view asks more than `bandit_work_cap()` (a link or the controls
    can ask for minutes of the CPU every visitor of a room shares)."""
    work, cap = bandit_work(cfg, objectives * seeds), bandit_work_cap()
    if work > cap:
        raise DivvizInputError(f"this view asks for {work:,} action-updates ({objectives} objectives × {seeds} seeds × "
                               "iterations × μ × (K + samples)" + (f" × {AUTOGRAD_COST} through autograd"
                                                                   if cfg.get("autograd") else "")
                               + f"); one view computes at most {cap:,}, to keep the shared CPU for everyone: lower "
                               "the seeds, the iterations, μ, K or the samples per iteration")


def bandit_runs(cfg: dict, objectives: list[Objective], seeds: int = 1, variants: list[dict] | None = None,
                progress=None) -> list[list[BanditRun]]:
    """For each objective under each rollout correction of `variants` (run-config keys, `rollout_variant`; default:
    none), its runs with seeds cfg["seed"], cfg["seed"] + 1, … (`seeds` of them), from plain values; labels made
    distinct. `progress(done, iterations)` hears of the training's iterations (`run_bandits`).

    The latest runs are kept: a change to one objective re-trains its runs only, more seeds train only the new
    seeds, and what is not kept trains side by side (`run_bandits`; a run is the same alone or together)."""
    check_bandit_work(cfg, len(objectives) * len(variants or [{}]), seeds)
    first = cfg.get("seed", 0)
    seed_list = list(range(first, first + seeds))
    shared = {**cfg, "seed": 0}
    pairs = [(o, v) for o in objectives for v in variants or [{}]]
    rollouts = [(correction_from(v), bool(v.get("bypass_mode"))) for _, v in pairs]
    settings = [{**objective_settings(o), **v} for o, v in pairs]
    key = lambda i, seed: json.dumps([shared, seed, settings[i]], sort_keys=True)  # noqa: E731
    keys = [[key(i, seed) for seed in seed_list] for i in range(len(pairs))]
    with _bandit_cache_lock:
        runs = {k: _bandit_cache[k] for row in keys for k in row if k in _bandit_cache}
    missing = [i for i, row in enumerate(keys) if any(k not in runs for k in row)]
    missing_seeds = sorted({s for i in missing for s, k in zip(seed_list, keys[i]) if k not in runs})
    if missing:
        trained = run_bandits(BanditConfig.make(**cfg), [pairs[i][0] for i in missing], missing_seeds,
                              [rollouts[i] for i in missing], progress)
        for r, run in enumerate(trained):  # the product of missing objectives and seeds: keep what was kept
            runs.setdefault(key(missing[r % len(missing)], run.seed), run)
    with _bandit_cache_lock:
        for k in (k for row in keys for k in row):
            _bandit_cache[k] = runs[k]
            _bandit_cache.move_to_end(k)
        while len(_bandit_cache) > max(BANDIT_CACHE_RUNS, len(pairs) * seeds):
            _bandit_cache.popitem(last=False)
    labels = unique_labels([" · ".join(part for part in (runs[row[0]].label, rollout_label(v)) if part)
                            for row, (_, v) in zip(keys, pairs)])
    return [[replace(runs[k], label=label) for k in row] for label, row in zip(labels, keys)]


def across_seeds(runs: list[BanditRun], metric: str) -> Summary:
    """A history metric's mean and 95% interval over the seeds, at every iteration."""
    return summarize(np.stack([run.history[metric] for run in runs]), bounds=metric_range(metric))


def group_cards(groups: list[list[BanditRun]]) -> list[tuple[str, str, str]]:
    """Per objective: (its label, its expected reward at the end over the seeds, "band [low, high] · entropy
    before → after · n = seeds") for the page's metric cards."""
    cards = []
    for runs in groups:
        reward, entropy = across_seeds(runs, "expected_reward"), across_seeds(runs, "entropy")
        band = f"band [{reward.low[-1]:.3f}, {reward.high[-1]:.3f}] · " if reward.n > 1 else ""
        cards.append((runs[0].label, f"E[r] = {reward.mean[-1]:.3f}",
                      f"{band}entropy {runs[0].initial_entropy:.2f} → {entropy.mean[-1]:.2f} · n = {reward.n}"))
    return cards


def first_step_past_high(groups: list[list[BanditRun]], iterations: int) -> tuple[float, int]:
    """The share of A > 0 samples already above u after the first optimiser step, averaged over the first iterations
    (at most 10), for the objective where it is largest; and how many iterations that mean is over."""
    early = min(10, iterations)
    return max(float(across_seeds(runs, "clip_ratio/first_step_past_high").mean[:early].mean())
               for runs in groups), early


def mass_reallocation(groups: list[list[BanditRun]]) -> dict[str, Chart]:
    """Figures of the bandit page from already computed runs (one list over seeds per measure): means with 95%
    bands when there are several seeds."""
    labels = [runs[0].label for runs in groups]
    series = lambda metrics: [(label, {m: across_seeds(runs, m) for m in metrics})  # noqa: E731
                              for label, runs in zip(labels, groups)]
    first = groups[0][0]
    return {
        "distribution": run_plots.bandit_distribution_chart(
            np.mean([run.initial for run in groups[0]], axis=0), first.rewards,
            [(label, summarize([run.final for run in runs], bounds=(0, 1))) for label, runs in zip(labels, groups)]),
        "mass": run_plots.mass_shift_chart([(label, summarize([mass_shift_by_bin(run.initial, run.final) for run in runs],
                                                               bounds=(-1, 1)))
                                        for label, runs in zip(labels, groups)]),
        "history": run_plots.history_chart(series(BANDIT_METRICS), BANDIT_METRICS, "iteration",
                                       "Expected reward, entropy, and where the mass sits"),
        "clipping": run_plots.history_chart(series(BANDIT_CLIPPING), BANDIT_CLIPPING, "iteration",
                                        "How often each clip binds, how many samples end past it (after the update, "
                                        "and after one optimiser step), how far π moves"),
        "entropy": run_plots.history_chart(series(ENTROPY_CHANGE), ENTROPY_CHANGE, "iteration",
                                           "Entropy change of each update: observed (exact) and predicted to first "
                                           "order, −Cov_π(log π, Δz) (Cui et al. 2025)"),
        **({"attribution": run_plots.entropy_attribution_chart(labels, {
            metric: summarize(np.stack([[run.history[metric].mean() for run in runs] for runs in groups], axis=1))
            for metric in ("entropy/change", *ATTRIBUTION)},
            "Who moves the entropy: each clip state's samples, per update (mean over the iterations), and what the "
            "masked ones would have done")} if ATTRIBUTION[0] in first.history else {}),
        **({"rollout": run_plots.history_chart(series(ROLLOUT_HISTORY), ROLLOUT_HISTORY, "iteration",
                                               "The sampler against the policy (exact KL(π_roll ‖ π_old)), the mean "
                                               "importance weight and the share of samples rejected")}
           if ROLLOUT_HISTORY[0] in first.history else {}),
    }


def paired_differences(groups: list[list[BanditRun]], baseline: int, metrics=BANDIT_METRICS,
                       iteration: int = -1) -> pd.DataFrame:
    """Each measure minus the baseline measure, seed by seed, at one iteration (default the last): the mean
    difference, its 95% interval, n, and in how many seeds the order is reversed."""
    rows = []
    for i, runs in enumerate(groups):
        if i == baseline:
            continue
        for name in metrics:
            d = paired([run.history[name][iteration] for run in runs],
                       [run.history[name][iteration] for run in groups[baseline]])
            rows.append({"measure": runs[0].label, "metric": name, "difference": d.mean, "95% low": d.low,
                         "95% high": d.high, "n": d.n, "seeds against the mean": f"{d.against_mean} of {d.n}"})
    return pd.DataFrame(rows)


def paired_difference_chart(groups: list[list[BanditRun]], baseline: int, metric: str) -> Chart:
    """A metric's paired difference to the baseline measure over the iterations: mean and 95% band per measure."""
    base = np.stack([run.history[metric] for run in groups[baseline]])
    series = [(runs[0].label, {metric: summarize(np.stack([run.history[metric] for run in runs]) - base)})
              for i, runs in enumerate(groups) if i != baseline]
    return run_plots.history_chart(series, (metric,), "iteration",
                                   f"{metric}: each measure minus {groups[baseline][0].label}, seed by seed "
                                   f"(mean and 95% band, n = {len(base)})",
                                   colours=[i for i in range(len(groups)) if i != baseline])  # as in the curves


def default_tests() -> list[ClipTest]:
    """PPO ε = 0.2, DAPO (0.2, 0.28), KL3 δ = 0.05: the comparison the app opens with."""
    return [clip_test("ratio"), clip_test("clip_higher"), clip_test("kl3")]


ROLLOUT_VARIANTS = {"none": "no correction: the loss divides by π_old, whatever sampled the tokens",  # the lab's list
                    **{name: f"{e.title}: {e.doc}" for name, e in CORRECTIONS.items()}}


def rollout_variant(name: str, tis_u: float, icepop: tuple[float, float], rs_option: str,
                    rs_ratio: tuple[float, float], rs_bound: float, normalize: bool) -> dict:
    """The run-config keys of one of `ROLLOUT_VARIANTS`, from the numbers the sidebar sets: the TIS cap u, IcePop's
    [l, u], the rejection option with its ratio bounds (k1) or bound (k2, k3), and verl's batch normalisation."""
    if name == "bypass":
        return {"bypass_mode": True}
    if name == "rejection":
        threshold = f"{rs_ratio[0]:g}_{rs_ratio[1]:g}" if rs_option.endswith("k1") else f"{rs_bound:g}"
        return {"rollout_rs": rs_option, "rollout_rs_threshold": threshold}
    if name == "none":
        return {}
    kind, level = name.split()
    threshold = tis_u if kind == "TIS" else f"{icepop[0]:g}_{icepop[1]:g}"
    return {"rollout_is": level, "rollout_is_threshold": threshold, "rollout_is_batch_normalize": normalize}
