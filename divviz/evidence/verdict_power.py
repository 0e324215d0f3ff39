"""The power of a cell's verdict: how often the whole rule would say *holds* for a true gain, by simulation.

The t-test's power (`significance.power`) answers only half of what a verdict needs. A cell *holds* after Holm when
(`significance.verdict`, `significance.adjusted_verdict`, docs/claims.md "How a cell is read")

    1. the 95% Student-t interval of the mean difference excludes 0 on the predicted side,
    2. the two-sided sign-flip p of the mean is below α (every 2^n flip for n ≤ 16, else RESAMPLES random ones),
    3. the mean and the median do not disagree (opposite signs, one of them resolved on its own), and
    4. its Holm-adjusted p within its family of m readings is below α.

`verdict_power` draws the n seeds' differences from a normal distribution with mean `effect` (in the predicted
direction) and standard deviation `sd` — the cell's own spread — `simulations` times from a fixed seed, and for the
family the m − 1 other readings' p's as independent uniforms (their claims null: the most favourable assumption
about them that does not borrow a result). Every test on every draw is the one a report runs, vectorised: the
sign-flip p counts as scipy's `permutation_test` does (the identity among the flips; (k + 1)/(R + 1) for random
flips), so the estimate matches a brute-force loop of scipy calls (tests/evidence/test_verdict_power.py). Its Monte
Carlo standard error is at most 0.5/√simulations (0.016 at 1,000).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from scipy import stats

from divviz.evidence import significance

SIMULATIONS = 1_000
AT_ONCE = 2 ** 22  # flip means a pass holds (32 MB of float64)


def verdict_power(n: int, effect: float, sd: float, family: int = 1, simulations: int = SIMULATIONS,
                  seed: int = 0) -> float:
    """P(the cell's verdict holds after Holm in a family of `family` readings) at n seeds for a true mean gain
    `effect` > 0 in the predicted direction with differences' standard deviation `sd` (NaN below 2 seeds or with no
    spread). Scale-free: only effect/sd, n and the family matter."""
    if n < 2 or not sd > 0 or not np.isfinite(sd):
        return np.nan
    return _power(n, round(float(effect) / float(sd), 6), int(family), int(simulations), int(seed))


@functools.lru_cache(maxsize=4096)
def _power(n: int, ratio: float, family: int, simulations: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    d = rng.normal(ratio, 1.0, (simulations, n))
    others = rng.uniform(size=(simulations, family - 1))
    mean, se = d.mean(axis=1), d.std(axis=1, ddof=1) / np.sqrt(n)
    interval = mean - stats.t.ppf(1 - significance.ALPHA / 2, n - 1) * se > 0
    p = sign_flip_p_rows(d)
    median = np.median(d, axis=1)
    up, down = (d > 0).sum(axis=1), (d < 0).sum(axis=1)
    with np.errstate(invalid="ignore"):  # the exact two-sided sign test (`binomtest` at 1/2, which is symmetric)
        p_median = np.where(up + down > 0, np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(up, down), up + down, 0.5)),
                            np.nan)
    disagree = (np.sign(mean) * np.sign(median) < 0) & (interval | (p_median < significance.ALPHA))
    holds = interval & (p < significance.ALPHA) & ~disagree
    holm = np.array([significance.holm(np.concatenate(([pi], rest)))[0] for pi, rest in zip(p, others)])
    return float(np.mean(holds & (holm < significance.ALPHA)))


def sign_flip_p_rows(d: np.ndarray) -> np.ndarray:
    """The two-sided sign-flip p of each row's mean, as `scipy.stats.permutation_test` computes it: every flip for
    n ≤ 16 (the identity among them), else RESAMPLES random flips, p = min(1, 2 min(P≥, P≤)) with (k + 1)/(R + 1)
    per side (scipy's random flips are its own draws, so there the two agree in distribution, not row by row)."""
    sims, n = d.shape
    if n <= significance.EXACT_UP_TO:
        flips = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        extra, count = 0, len(flips)
    else:
        flips = np.where(np.random.default_rng(1).random((significance.RESAMPLES, n)) < 0.5, -1.0, 1.0)
        extra, count = 1, len(flips) + 1
    observed = d.mean(axis=1)
    gamma = np.abs(100 * np.finfo(np.float64).eps * observed)  # scipy's tolerance for ties
    greater, less = np.zeros(sims), np.zeros(sims)
    rows = max(1, AT_ONCE // len(flips))
    for start in range(0, sims, rows):
        part = slice(start, start + rows)
        null = d[part] @ flips.T / n
        greater[part] = (null >= (observed[part] - gamma[part])[:, None]).sum(axis=1)
        less[part] = (null <= (observed[part] + gamma[part])[:, None]).sum(axis=1)
    return np.minimum(1.0, 2 * np.minimum(greater + extra, less + extra) / count)


def seeds_for_verdict_power(effect: float, sd: float, family: int = 1, target: float = significance.POWER,
                            cap: int = 64, simulations: int = SIMULATIONS) -> tuple[int | None, float]:
    """The fewest seeds at which the whole rule's verdict holds with probability ≥ `target` (`verdict_power`) for
    a true gain `effect` with differences' standard deviation `sd` in a family of `family` readings, searched from 2
    seeds up to `cap` (the power is not monotone in n: the sign-flip p's smallest value and the t quantile step
    with n, so every n is tried in order); with that power. (None, the power at `cap`) when even `cap` falls short:
    what a pre-registration capped by its cost states."""
    for n in range(2, cap + 1):
        found = verdict_power(n, effect, sd, family, simulations)
        if found >= target:
            return n, found
    return None, verdict_power(cap, effect, sd, family, simulations)
