"""Evidence over seeds: means with 95% intervals, paired differences, and verdicts computed from them.

A view of one seed is an anecdote; these turn n seeds into a statement with its uncertainty. Intervals are
Student-t intervals of the mean, mean ± t_{(1+level)/2, n−1} · s / √n with the sample standard deviation s
(ddof = 1; a chart's band also respects the quantity's range, `summarize`'s `bounds`), the interval `scipy.stats.ttest_1samp(x).confidence_interval()` gives (tests/evidence/test_evidence.py
checks both against each other and against a textbook case). A comparison of two measures is *paired*: both
ran with the same seeds, so the difference is taken seed by seed before averaging, and the share of seeds whose
difference has the other sign says how often one seed alone would have told the opposite story. A reading that is
0 or 1 per run (a collapse flag) is paired as two shares instead (`paired_binary`, Newcombe's interval).

A verdict is never typed: `verdict` reads it off the interval of the paired difference and the sign a claim
predicts — "holds" (the interval lies on the predicted side of 0), "reversed" (on the other side), "not resolved"
(it contains 0, or one seed gives none), "identical" (every seed's difference is exactly 0: the two measures did the
same thing, e.g. the edge where they differ never bound — a finding of its own, not noise) — and `identity_verdict`
says "exact" when two computations agree to a tolerance. A comparison with no seed at all is "no data"
(`claims_report.comparison_row`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from divviz.metrics import proportion

LEVEL = 0.95
HOLDS, REVERSED, NOT_RESOLVED, EXACT, NOT_EXACT = "holds", "reversed", "not resolved", "exact", "not exact"
IDENTICAL = "identical"  # a paired difference of exactly 0 on every seed (n ≥ 2): its interval is [0, 0]
NO_DATA = "no data"  # a comparison no seed has both runs of yet: not tested, so not "not resolved"


@dataclass(frozen=True)
class Summary:
    """The mean over seeds (axis 0) with its interval; arrays shaped like one seed's values."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: int


RANGE_BELOW = 4  # a band over fewer seeds than this is their range


def summarize(values, level: float = LEVEL, bounds: tuple[float, float] | None = None) -> Summary:
    """Mean and Student-t interval over axis 0 (the seeds). With one seed the interval is undefined (NaN).

    With `bounds`, the quantity's possible range (a share in [0, 1], an entropy ≥ 0), the interval is a band that
    respects it, the one every chart draws: with fewer than `RANGE_BELOW` seeds it is the seeds' range (min to
    max), since a t-interval there multiplies s/√n by 12.7 (n = 2) or 4.3 (n = 3) and runs far past both what was
    seen and what is possible; with more, the t-interval cut at the bounds. Without `bounds` (a difference, a
    verdict's interval) it is the t-interval as it is."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[0]
    mean = values.mean(axis=0)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return Summary(mean, nan, nan, n)
    if bounds is not None and n < RANGE_BELOW:
        return Summary(mean, values.min(axis=0), values.max(axis=0), n)
    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(axis=0, ddof=1) / np.sqrt(n)
    if bounds is None:
        return Summary(mean, mean - half, mean + half, n)
    return Summary(mean, np.maximum(mean - half, bounds[0]), np.minimum(mean + half, bounds[1]), n)


@dataclass(frozen=True)
class Paired:
    """candidate − baseline, seed by seed: its mean, interval, n, and in how many seeds the difference has the sign
    opposite to the mean's (`against_mean`; not "reversed", which a verdict says of the prediction)."""

    mean: float
    low: float
    high: float
    n: int
    against_mean: int

    def text(self, digits: int = 4) -> str:
        """"+0.0123 [0.0051, 0.0195], n = 20, 2 of 20 seeds against the mean"."""
        interval = "" if np.isnan(self.low) else f" [{self.low:.{digits}f}, {self.high:.{digits}f}]"
        return (f"{self.mean:+.{digits}f}{interval}, n = {self.n}, "
                f"{self.against_mean} of {self.n} seed{'s' if self.n != 1 else ''} against the mean")


def _against_mean(differences, mean: float) -> int:
    """How many seeds' differences have the sign opposite to the mean's (none when the mean is 0)."""
    sign = np.sign(mean)
    return int((np.sign(differences) == -sign).sum()) if sign != 0 else 0


def paired(candidate, baseline, level: float = LEVEL) -> Paired:
    """The paired difference of two measures' values over the same seeds (1-D arrays, seed i in both)."""
    diff = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    s = summarize(diff, level)
    return Paired(float(s.mean), float(s.low), float(s.high), s.n, _against_mean(diff, s.mean))


def paired_binary(candidate, baseline, level: float = LEVEL) -> Paired:
    """The paired difference of two 0/1 readings over the same seeds (a collapse flag): the difference of the two
    shares with Newcombe's square-and-add interval for paired proportions (Newcombe 1998, Stat. Med. 17:2635, his
    method 10), which stays inside [−1, 1] and is not degenerate when no seed differs — where the t-interval of the
    0/±1 differences is [0, 0] then, and runs past ±1 at a few seeds.

    With the (candidate, baseline) flags counted over N seeds as n11, n10, n01, n00, the shares p1 = (n11 + n10)/N
    and p2 = (n11 + n01)/N, their Wilson intervals [l1, u1] and [l2, u2] (`metrics.proportion`), and ψ the pairs'
    correlation — A = n11·n00 − n10·n01 taken as A − N/2 above N/2, 0 on [0, N/2], A below 0, over the square root
    of the product of the four margins (ψ = 0 when a margin is empty):
        low  = (p1 − p2) − √((p1 − l1)² + (u2 − p2)² − 2ψ (p1 − l1)(u2 − p2))
        high = (p1 − p2) + √((p2 − l2)² + (u1 − p1)² − 2ψ (p2 − l2)(u1 − p1))
    (tests/evidence/test_evidence.py checks it against the R package contingencytables, Fagerland, Lydersen & Laake)."""
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if not np.isin(np.concatenate([a, b]), (0.0, 1.0)).all():
        raise ValueError("paired_binary takes 0/1 readings")
    n = a.size
    if n == 0:
        return Paired(np.nan, np.nan, np.nan, 0, 0)
    n11, n10 = int((a * b).sum()), int((a * (1 - b)).sum())
    n01, n00 = int(((1 - a) * b).sum()), int(((1 - a) * (1 - b)).sum())
    p1, l1, u1 = proportion(n11 + n10, n, level)
    p2, l2, u2 = proportion(n11 + n01, n, level)
    margins = (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
    cross = n11 * n00 - n10 * n01
    psi = 0.0 if margins == 0 else (cross - n / 2 if cross > n / 2 else min(cross, 0)) / np.sqrt(margins)
    low = (p1 - p2) - np.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    high = (p1 - p2) + np.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    return Paired(float(p1 - p2), float(low), float(high), n, _against_mean(a - b, p1 - p2))


def half_width(sd: float, n: int, level: float = LEVEL) -> float:
    """The half-width of the paired Student-t interval over n seeds when the differences' standard deviation is
    `sd`: t_{(1+level)/2, n−1} · sd / √n — a mean difference smaller than this cannot be resolved from 0 at n."""
    return float(stats.t.ppf((1 + level) / 2, n - 1) * sd / np.sqrt(n)) if n >= 2 else np.nan


def sd_interval(values, level: float = LEVEL, within: tuple[float, float] = (-np.inf, np.inf)) \
        -> tuple[float, float, float]:
    """The sample standard deviation s (ddof 1) of `values` and its interval under normality:
    s·√((n−1)/χ²_{(1+level)/2, n−1}) to s·√((n−1)/χ²_{(1−level)/2, n−1}) — a spread over seeds with its
    uncertainty (4 seeds put the upper end at 3.7 s). Values that lie `within` [a, b] cannot have a standard
    deviation above (b − a)/2 (Popoviciu's inequality): the upper end stops there (a reward in [0, 1]: 0.5, where
    2 seeds' χ² end reaches 32 s). NaN below 2 values."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if n < 2:
        return np.nan, np.nan, np.nan
    s = float(values.std(ddof=1))
    high = s * float(np.sqrt((n - 1) / stats.chi2.ppf((1 - level) / 2, n - 1)))
    return (s, s * float(np.sqrt((n - 1) / stats.chi2.ppf((1 + level) / 2, n - 1))),
            min(high, (within[1] - within[0]) / 2))


def verdict(low: float, high: float, predicted_sign: int) -> str:
    """What a paired difference's interval says of a claim that predicts its sign (+1 or −1)."""
    if low == 0 == high:
        return IDENTICAL
    if np.isnan(low) or np.isnan(high) or low <= 0 <= high:
        return NOT_RESOLVED
    return HOLDS if (low > 0) == (predicted_sign > 0) else REVERSED


def identity_verdict(max_abs_difference: float, tolerance: float) -> str:
    """For a claimed identity: "exact" when the largest difference found is within `tolerance`."""
    return EXACT if max_abs_difference <= tolerance else NOT_EXACT


def is_identity(verdict_: str) -> bool:
    """Whether a cell's verdict is an identity's (`identity_verdict`): its mean is then the largest |difference|
    found, and it has no interval or predicted sign."""
    return verdict_ in (EXACT, NOT_EXACT)
