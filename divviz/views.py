"""Every figure of each explorer page, from the page's control values: compute (explore, theory, bandit)
then draw (plots). Pages call these and lay the results out; `bench/explorer.py` times them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from divviz import explore, plots, theory
from divviz.bandit import BanditConfig, BanditRun, run_bandit
from divviz.divergences import ClipTest, clip_test, penalty
from divviz.estimators import k3
from divviz.losses import Objective

RATIO_GRID = np.linspace(0.01, 3.0, 600)
PI_OLD_GRID = np.linspace(0.001, 1.0, 400)


def clipping_regions(tests: list[ClipTest], pi_old: float, dual_clip_c: float | None) -> dict[str, plots.Chart]:
    """Intervals now, intervals as the parameter moves, the (π_old, π_new) region, surrogate/gradient, logit room."""
    sweeps = []
    for test in tests:
        param = test.entry.params[-1]
        low, high, _ = param.slider_range()
        values = np.linspace(low, high, 120)
        lower, upper = explore.interval_sweep(test, param.name, values, pi_old)
        sweeps.append({"label": test.label, "param": param.name, "values": values, "lower": lower,
                       "upper": upper, "current": test.params[param.name]})
    intervals = [(t.label, *(float(b) for b in t.bounds(np.asarray(pi_old)))) for t in tests]
    return {
        "intervals": plots.interval_chart(intervals),
        "sweeps": plots.sweep_chart(sweeps),
        "region": plots.region_chart(PI_OLD_GRID, [(t.label, *explore.feasible_region(t, PI_OLD_GRID)) for t in tests]),
        "surrogate": plots.surrogate_chart(
            [(t.label, explore.ratio_curves(t, RATIO_GRID, pi_old, dual_clip_c)) for t in tests]),
        "logit": plots.logit_chart(PI_OLD_GRID, [(t.label, *explore.logit_room(t, PI_OLD_GRID)) for t in tests]),
    }


@dataclass
class KL3Facts:
    delta: float
    bounds: tuple[float, float]
    series: tuple[float, float]
    box: tuple[float, float]  # (ε_low, ε_high)
    inverse: tuple[float, float]  # the wrong-direction interval
    ppo: dict
    dapo: dict
    check: explore.EquivalenceCheck


def kl3_equivalence(delta: float, eps: float, eps_low: float, eps_high: float, seed: int,
                    completions: int = 64) -> tuple[KL3Facts, dict[str, plots.Chart]]:
    """Numbers and figures of the KL3 ⇔ asymmetric clipping page."""
    deltas = np.geomspace(1e-4, 1.0, 200)
    bounds = theory.kl3_bounds(delta)
    facts = KL3Facts(
        delta=delta, bounds=bounds, series=theory.kl3_bounds_series(delta), box=theory.kl3_equivalent_box(delta),
        inverse=theory.kl3_inverse_bounds(delta), ppo=theory.match_box_to_kl3(eps, eps),
        dapo=theory.match_box_to_kl3(eps_low, eps_high),
        check=explore.kl3_equivalence_check(delta, seed, completions=completions),
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


def bandit_run(cfg: dict, clip: tuple[str, dict] | None, penalty_spec: tuple[str, dict] | None, beta: float,
               dual_clip_c: float | None, aggregation: str) -> BanditRun:
    """One bandit run from plain values (hashable for the page's cache)."""
    objective = Objective(clip=clip_test(clip[0], **clip[1]) if clip else None,
                          penalty=penalty(penalty_spec[0], **penalty_spec[1]) if penalty_spec else None,
                          beta=beta, dual_clip_c=dual_clip_c, aggregation=aggregation)
    return run_bandit(BanditConfig.make(**cfg), objective)


def mass_reallocation(runs: list[BanditRun]) -> dict[str, plots.Chart]:
    """Figures of the bandit page from already computed runs."""
    series = [(run.label, run.history) for run in runs]
    return {
        "distribution": plots.bandit_distribution_chart(runs),
        "mass": plots.mass_shift_chart(runs),
        "history": plots.history_chart(series, ("expected_reward", "entropy", "top1_mass", "initial_top_mass"),
                                       "iteration", "Expected reward, entropy, and where the mass sits"),
        "clipping": plots.history_chart(series, ("clip_ratio/low_mean", "clip_ratio/high_mean", "kl"), "iteration",
                                        "How often each clip binds, and how far each update moves π"),
    }


def default_tests() -> list[ClipTest]:
    """PPO ε = 0.2, DAPO (0.2, 0.28), KL3 δ = 0.05: the comparison the app opens with."""
    return [clip_test("ratio"), clip_test("clip_higher"), clip_test("kl3")]
