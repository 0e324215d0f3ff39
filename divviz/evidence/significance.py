"""What a paired cell's seeds say beyond the t interval: a distribution-free test of the mean, the median and its
test, the multiplicity of a report's cells, the power of a comparison and the gains it rules out (docs/claims.md, "How a cell is read").

Every statistic is scipy's; this module chooses them and reads their results:

    sign-flip p        H0: each seed's difference is as likely + as − (the two measures are exchangeable within a
                       seed). `scipy.stats.permutation_test` on the mean with every 2^n sign flip for n ≤ 16 (exact),
                       else random flips from a fixed seed (reproducible): 9,999, and more (MORE_FLIPS) for a cell
                       whose verdict the draw could change (`p_bounds`: the Monte Carlo p's 99.9% Wilson bounds; a
                       report refines such cells, `claims_report.adjust`); the published evidence's p's are read from
                       published/sign-flip-p.json (`publish`). No normality: at n seeds the smallest
                       possible two-sided p is 2/2^n — 0.125 at n = 4, so nothing can hold at 4 seeds.
    sign test          the median difference and the exact binomial test of #(d > 0) against #(d < 0) (zeros
                       dropped), `scipy.stats.binomtest`'s p (`binomial_p`: at ½ a sum of binomial coefficients):
                       whether most seeds go one way, however large the few others.
    Holm               within a family (a claim's readings at one setting): p_(i) ↦ max_{j ≤ i} min(1, (m − j + 1) p_(j))
                       over the m sorted p-values, the family-wise error kept at α.
    Benjamini–Hochberg across a report: `scipy.stats.false_discovery_control`, the false-discovery rate kept at α.
    power              of the two-sided paired t-test at n seeds for a true mean difference δ when the differences'
                       standard deviation is σ: P(|T| > t_{1−α/2, n−1}) with T noncentral t, df n − 1, noncentrality
                       δ√n/σ (`scipy.stats.nct`); the seeds for 80% power are the smallest such n.
    rules out a gain   one side of the two one-sided tests (TOST) at the margin X: H0 mean ≥ X rejected at α by the
                       one-sided t-test (`scipy.stats.ttest_1samp(alternative="less")`: the 90% interval's upper end
                       below X) and by the one-sided sign-flip test of the differences less X — as a verdict needs
                       both, so no normality: the smallest one-sided p is 1/2^n, so fewer than 5 seeds rule out nothing.

A verdict needs the t interval and the sign-flip test to agree (`verdict`); where the mean and the median point
opposite ways the cell says so instead of a verdict from the mean alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
from scipy import stats

from divviz.engine.policy import cache_dir
from divviz.evidence import intervals
from divviz.runs import published

ALPHA = 0.05
EXACT_UP_TO = 16  # every sign flip up to 2^16 = 65,536; random flips beyond
RESAMPLES = 9_999  # random flips of a first reading beyond EXACT_UP_TO
MORE_FLIPS = (99_999, 999_999, 9_999_999)  # the flips of the next readings, for a cell whose verdict a draw can change
BOUND_Z = 3.29  # the Monte Carlo p's bounds: 99.9% (two-sided) Wilson score interval of its flips' proportion
POWER = 0.8
MOST_SEEDS = 10_000  # a power search stops here: "more than 10,000 seeds"
DISAGREE = "mean and median disagree"  # opposite signs, one of them resolved on its own (`verdict`)


AT_ONCE = 2 ** 20  # numbers a pass of flips holds (scipy's `batch`: 8 MB at a time, a result that does not change)
Key = tuple[str, str, int]  # (the differences' digest, alternative, flips; 0: every flip)
_TESTED: dict[Key, float] = {}  # each p tested once per process
_MOST_KEPT = 65_536
KEPT_FROM = 99_999  # p's from this many flips or more are also kept on disk (`kept_file`): each costs seconds
PUBLISHED_FILE = "sign-flip-p.json"  # in published/: the p's the published evidence reads, computed with it
ALTERNATIVES = ("two-sided", "greater", "less")


def digest(differences) -> str:
    """What a p is kept under: the SHA-256 of the differences as float64, in order, so that a kept p answers those
    differences exactly and no others."""
    return hashlib.sha256(np.asarray(differences, dtype=np.float64).ravel().tobytes()).hexdigest()


def kept_file() -> Path:
    """Where the costly Monte Carlo p's are kept between processes: the Claims page's first load and the CLI read
    them instead of drawing 10⁵–10⁷ flips again (a file divviz wrote; one it cannot read is ignored)."""
    return cache_dir() / "sign-flip-p.json"


def published_file() -> Path:
    """The p's of the published evidence (`publish`), read like the kept file: a fresh clone's Claims page tests its
    cells without drawing a flip; tests/evidence/test_significance.py draws every one again and compares."""
    return published.root() / PUBLISHED_FILE


KEPT_BYTES = 64 * 2**20  # a kept file larger than this is not read (it holds a few hundred kB)


def _read_kept(path: Path) -> dict[Key, float]:
    """The p's of a kept or published file, each row checked (a file from outside is untrusted): a digest, one of
    `ALTERNATIVES`, a flip count ≥ 0 and a p in (0, 1]; a damaged row, or a file that cannot be read, is left out."""
    try:
        if path.stat().st_size > KEPT_BYTES:
            return {}
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    kept = {}
    for row in rows if isinstance(rows, list) else ():
        try:
            key, flips, p = (str(row[0]), str(row[1]), int(row[2])), int(row[2]), float(row[3])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if len(key[0]) == 64 and key[1] in ALTERNATIVES and flips >= 0 and 0 < p <= 1:
            kept[key] = p
    return kept


def _write(path: Path, found: dict[Key, float]) -> None:
    """`found` as the file `path` (written whole, then renamed: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps([[*key, p] for key, p in sorted(found.items())], indent=0))
    partial.replace(path)


def _keep(found: dict[Key, float]) -> None:
    """Add `found`'s costly p's to the kept file (the newest `_MOST_KEPT`)."""
    costly = {k: p for k, p in found.items() if k[2] >= KEPT_FROM}
    if not costly:
        return
    try:
        _write(kept_file(), dict(list({**_read_kept(kept_file()), **costly}.items())[-_MOST_KEPT:]))
    except OSError:
        pass  # a read-only cache: the p's are drawn again next time


def publish() -> int:
    """Write every sign-flip p this process has read (`sign_flip_ps`) into `published_file()`: run after building
    the published evidence's reports, it holds their p's and no others. Returns how many."""
    found = {key: _TESTED[key] for key in _READ if key in _TESTED}
    _write(published_file(), found)
    return len(found)


def _drawn(n: int, flips: int | None) -> int:
    """The flips a p of n seeds is read from: 0 (every flip) for n ≤ EXACT_UP_TO, else `flips` (RESAMPLES)."""
    return 0 if n <= EXACT_UP_TO else flips or RESAMPLES


def _load_kept(flips: int) -> None:
    """The p's of the published file and, for costly flips, the kept file's of those flips, into this process's,
    each file once."""
    for path, wanted in ((published_file(), None), *(((kept_file(), flips),) if flips >= KEPT_FROM else ())):
        if (path, wanted) in _LOADED:
            continue
        _LOADED.add((path, wanted))
        _TESTED.update({k: p for k, p in _read_kept(path).items() if wanted is None or k[2] == wanted})


_LOADED: set[tuple[Path, int | None]] = set()
_READ: set[Key] = set()  # the p's this process was asked for (`publish`)


def sign_flip_ps(samples, alternative: str = "two-sided", flips: int | None = None) -> list[float]:
    """The sign-flip permutation p-value of the mean of each sample of paired differences (`alternative` as
    scipy's; NaN below 2 seeds, 1 when every difference is 0). The samples not tested yet are tested together: one
    `permutation_test` per seed count, along the samples' axis, so they share its flips — every flip for n ≤ 16,
    else `flips` (RESAMPLES unless given) drawn from a fixed seed, the same flips a call of each sample's own would
    draw. So each p is the one it would have alone, at a fraction of the time (a report's 344 cells of 64 seeds: 1.3
    s instead of 9). Kept per distinct set of differences and flips (`digest`): a page rerun does not test a cell
    again, and the published evidence's p's are read from published/ (`publish`)."""
    arrays = [np.asarray(d, dtype=np.float64).ravel() for d in samples]
    keys = [(digest(d), alternative, _drawn(d.size, flips)) for d in arrays]
    _load_kept(flips or RESAMPLES)
    found = {key: _TESTED.get(key) for key, d in zip(keys, arrays) if d.size >= 2 and d.any()}
    untested = {key: d for key, d in zip(keys, arrays) if key in found and found[key] is None}
    for n in sorted({d.size for d in untested.values()}):
        group = [(key, d) for key, d in untested.items() if d.size == n]
        drawn = _drawn(n, flips)
        result = stats.permutation_test((np.array([d for _, d in group]),), np.mean, permutation_type="samples",
                                        vectorized=True, n_resamples=drawn or np.inf, alternative=alternative,
                                        axis=-1, batch=max(1, AT_ONCE // (len(group) * n)),
                                        rng=np.random.default_rng(0))
        found.update(zip([key for key, _ in group], np.atleast_1d(result.pvalue).tolist()))
    if len(_TESTED) + len(untested) > _MOST_KEPT:
        _TESTED.clear()
        _LOADED.clear()
        _READ.clear()
    _TESTED.update(found)
    _READ.update(found)
    _keep({key: found[key] for key in untested})
    return [np.nan if d.size < 2 else 1.0 if not d.any() else found[key] for key, d in zip(keys, arrays)]


def sign_flip_p(differences, alternative: str = "two-sided", flips: int | None = None) -> float:
    """The sign-flip p-value of one sample's mean (`sign_flip_ps`)."""
    return sign_flip_ps([differences], alternative, flips)[0]


def flips_of(n: int) -> int | None:
    """How many random flips a first sign-flip p of n seeds is read from: None where every flip is (n ≤ 16)."""
    return None if n <= EXACT_UP_TO else RESAMPLES


def p_bounds(p: float, flips: int | None, alternative: str = "two-sided") -> tuple[float, float]:
    """Where the exact sign-flip p lies, given its Monte Carlo reading p from `flips` random flips (scipy's
    (k + 1)/(flips + 1) per side, doubled for two-sided): the 99.9% Wilson score interval of the one side's
    proportion, z = BOUND_Z, doubled back. (p, p) when every flip was read (`flips` None)."""
    if flips is None:
        return p, p
    sides = 2 if alternative == "two-sided" else 1
    q, z2 = min(1.0, p / sides), BOUND_Z ** 2
    centre = (q + z2 / (2 * flips)) / (1 + z2 / flips)
    half = BOUND_Z / (1 + z2 / flips) * np.sqrt(q * (1 - q) / flips + z2 / (4 * flips ** 2))
    return max(0.0, sides * (centre - half)), min(1.0, sides * (centre + half))


def sign_test(differences) -> tuple[float, float, int, int]:
    """(median, two-sided exact sign-test p, seeds with d > 0, seeds with d < 0); p is NaN when no seed differs
    from 0 or there are fewer than 2."""
    d = np.asarray(differences, dtype=np.float64)
    up, down = int((d > 0).sum()), int((d < 0).sum())
    median = float(np.median(d)) if d.size else np.nan
    p = binomial_p(up, up + down) if d.size >= 2 and up + down else np.nan
    return median, p, up, down


def binomial_p(k: int, n: int) -> float:
    """The two-sided exact binomial test's p of k successes in n trials at probability ½, `scipy.stats.binomtest`'s
    (tests/evidence/test_significance.py): the distribution is symmetric, so it is min(1, 2 · P(X ≤ min(k, n − k)))
    — summed in integers, exact, without scipy's search over the other tail."""
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the order given (NaN stays NaN and does not count in m)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full_like(p, np.nan)
    kept = np.flatnonzero(~np.isnan(p))
    order = kept[np.argsort(p[kept], kind="stable")]
    m = order.size
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def benjamini_hochberg(pvalues) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (q), in the order given (NaN stays NaN and does not count)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full_like(p, np.nan)
    kept = ~np.isnan(p)
    if kept.any():
        out[kept] = stats.false_discovery_control(p[kept], method="bh")
    return out


def power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """The power of the two-sided paired t-test over n seeds for a true mean difference `effect` when the
    differences' standard deviation is `sd`."""
    if n < 2 or not sd > 0:
        return np.nan
    df, shift = n - 1, effect * np.sqrt(n) / sd
    critical = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))


def fewest_seeds(alpha: float = ALPHA) -> int:
    """The fewest seeds at which the sign-flip test can reach `alpha` (`smallest_p`), and so a verdict can be
    reached at all: 6 at α = 0.05 (2/2⁶ = 0.031; 5 seeds give at best 0.0625)."""
    return next(n for n in range(2, MOST_SEEDS) if smallest_p(n) < alpha)


def seeds_for_power(effect: float, sd: float, target: float = POWER, alpha: float = ALPHA) -> int | None:
    """The fewest seeds whose paired t-test has `target` power for `effect` at spread `sd`, and no fewer than
    `fewest_seeds` (below them no verdict is possible, whatever the t-test's power); None when more than
    `MOST_SEEDS` would be needed or the spread is unknown."""
    if not (sd > 0 and effect != 0 and np.isfinite(sd)):
        return None
    low = high = fewest_seeds(alpha)
    while power(high, effect, sd, alpha) < target:  # double, then bisect: power grows with n
        low, high = high, high * 2
        if high > 2 * MOST_SEEDS:
            return None
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if power(middle, effect, sd, alpha) < target else (low, middle)
    return high if high <= MOST_SEEDS else None


def seeds_needed(differences, effect: float) -> tuple[int | None, int | None, int | None]:
    """The seeds for 80% power at `effect` from these differences' spread s, and at the ends of s's 95% interval
    (`intervals.sd_interval`): (at s, at its lower end, at its upper end); Nones below 2 seeds."""
    s, s_low, s_high = intervals.sd_interval(differences)
    return tuple(seeds_for_power(effect, sd) for sd in (s, s_low, s_high))


def gain_bound(differences, alpha: float = ALPHA) -> float:
    """The one-sided (1 − α) upper confidence bound of the mean difference (the 90% t interval's upper end at α =
    0.05): the t-test half of `rules_out_gain` rejects a gain ≥ X exactly when this bound is below X."""
    d = np.asarray(differences, dtype=np.float64)
    return float(stats.ttest_1samp(d, 0.0, alternative="less").confidence_interval(1 - alpha).high)


def rules_out_gain(differences, margin: float, alpha: float = ALPHA) -> bool:
    """Whether the differences reject "the mean gain is at least `margin`" (the TOST half that bounds a gain) by
    both the one-sided t-test and the one-sided sign-flip test of d − margin, each at α; False below 2 seeds or with
    no spread."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2 or not d.std() > 0:
        return False
    return bool(stats.ttest_1samp(d, margin, alternative="less").pvalue < alpha
                and sign_flip_p(d - margin, "less") < alpha)


def verdict(low: float, high: float, p: float, mean: float, median: float, predicted_sign: int,
            p_median: float = np.nan) -> str:
    """A cell's verdict: "identical" when its interval is [0, 0]; "mean and median disagree" when they have
    opposite signs and one of them is resolved on its own — the t interval excludes 0, or the sign test's p
    (`p_median`) is below α (a mean of +0.003 beside a median of −0.002, neither resolved, is two readings of nothing,
    not a disagreement; 46 of 64 seeds below 0 beside a positive mean one seed carries is one); "holds" / "reversed"
    when the t interval excludes 0 and the sign-flip p is below α; else "not resolved"."""
    if low == 0 == high:
        return intervals.IDENTICAL
    resolved = low > 0 or high < 0 or p_median < ALPHA
    if np.sign(mean) * np.sign(median) < 0 and resolved:
        return DISAGREE
    interval = intervals.verdict(low, high, predicted_sign)
    if interval in (intervals.HOLDS, intervals.REVERSED) and p < ALPHA:
        return interval
    return intervals.NOT_RESOLVED


def adjusted_verdict(raw: str, p_adjusted: float) -> str:
    """The verdict once its p-value is adjusted for multiplicity: a cell that held or reversed stays so only if the
    adjusted p is below α."""
    if raw in (intervals.HOLDS, intervals.REVERSED) and not p_adjusted < ALPHA:
        return intervals.NOT_RESOLVED
    return raw


def smallest_p(n: int) -> float:
    """The smallest two-sided sign-flip p-value n seeds can give: 2 / 2^n (1 below 2 seeds)."""
    return min(1.0, 2.0 / 2 ** n) if n >= 2 else 1.0
