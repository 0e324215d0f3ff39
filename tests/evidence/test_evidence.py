"""Intervals against scipy and a textbook case; paired differences; verdicts on synthetic differences."""

import numpy as np
import pytest
from scipy import stats

from divviz.evidence import intervals
from divviz.metrics import proportion


def test_interval_equals_scipy_and_a_textbook_case():
    rng = np.random.default_rng(0)
    for n in (2, 5, 20, 64):
        x = rng.normal(0.3, 1.7, size=n)
        ci = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
        s = intervals.summarize(x)
        assert (s.low, s.high, s.n) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12), n)
    # n = 10, mean 5.0, s = 1.0: t_{0.975, 9} = 2.262157, half-width 2.262157/√10 = 0.715357
    x = 5.0 + np.array([-1, 1, -1, 1, -1, 1, -1, 1, -1, 1]) * np.sqrt(0.9)
    s = intervals.summarize(x)
    assert s.mean == pytest.approx(5.0) and s.high - s.mean == pytest.approx(0.715357, abs=1e-6)


def test_interval_per_iteration_and_one_seed():
    x = np.random.default_rng(1).normal(size=(8, 30))  # 8 seeds, 30 iterations
    s = intervals.summarize(x)
    assert s.mean.shape == (30,) and s.n == 8
    ci = stats.ttest_1samp(x[:, 7], 0.0).confidence_interval(0.95)
    assert (s.low[7], s.high[7]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    one = intervals.summarize(x[:1])
    assert one.n == 1 and np.isnan(one.low).all() and np.array_equal(one.mean, x[0])


def test_paired_difference_counts_the_seeds_against_its_mean():
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    p = intervals.paired(base + np.array([0.5, 0.4, -0.1, 0.6, 0.5]), base)
    assert p.mean == pytest.approx(0.38) and p.n == 5 and p.against_mean == 1
    ci = stats.ttest_1samp([0.5, 0.4, -0.1, 0.6, 0.5], 0.0).confidence_interval(0.95)
    assert (p.low, p.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert p.text().endswith("n = 5, 1 of 5 seeds against the mean")


@pytest.mark.parametrize("diff, sign, want", [
    (np.full(20, 0.5) + np.linspace(-0.1, 0.1, 20), +1, intervals.HOLDS),  # clearly positive
    (np.full(20, -0.5) + np.linspace(-0.1, 0.1, 20), +1, intervals.REVERSED),  # clearly negative
    (np.full(20, -0.5) + np.linspace(-0.1, 0.1, 20), -1, intervals.HOLDS),  # a claim that predicts a decrease
    (np.linspace(-1, 1.2, 20), +1, intervals.NOT_RESOLVED),  # straddles 0
    (np.array([0.3]), +1, intervals.NOT_RESOLVED),  # one seed: no interval
    (np.zeros(8), +1, intervals.IDENTICAL),  # the same on every seed: not noise, no difference at all
    (np.array([0.0]), +1, intervals.NOT_RESOLVED),  # ... which one seed cannot tell
])
def test_verdicts_on_synthetic_differences(diff, sign, want):
    p = intervals.paired(diff, np.zeros_like(diff))
    assert intervals.verdict(p.low, p.high, sign) == want


def test_identity_verdict():
    assert intervals.identity_verdict(3e-16, 1e-12) == intervals.EXACT
    assert intervals.identity_verdict(1e-6, 1e-12) == intervals.NOT_EXACT
    assert all(map(intervals.is_identity, (intervals.EXACT, intervals.NOT_EXACT)))
    assert not any(map(intervals.is_identity, (intervals.HOLDS, intervals.IDENTICAL, intervals.NOT_RESOLVED)))


@pytest.mark.parametrize("k,n", [(0, 10), (5, 10), (10, 10), (77, 256), (1, 3)])
def test_a_proportions_interval_is_wilsons_and_stays_in_0_1(k, n):
    """scipy's binomtest gives Wilson's score interval too: the same numbers, inside [0, 1], around k/n."""
    from scipy.stats import binomtest

    share, low, high = proportion(k, n)
    want = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert share == k / n and 0 <= low <= share <= high <= 1
    assert low == pytest.approx(want.low, abs=1e-12) and high == pytest.approx(want.high, abs=1e-12)


def test_a_band_respects_the_quantitys_range():
    """With 2 or 3 seeds a band is the seeds' range; with 4 or more the t-interval cut at the bounds; a share's band
    never leaves [0, 1], an entropy's never goes below 0. Without bounds (a difference) the t-interval is kept."""
    from divviz.metrics import metric_range

    two = intervals.summarize([[0.0, 1.0], [1.0, 1.0]], bounds=(0, 1))
    assert two.low.tolist() == [0.0, 1.0] and two.high.tolist() == [1.0, 1.0]
    assert intervals.summarize([[0.0], [1.0]]).high[0] > 5  # the t-interval at n = 2 (t = 12.7)
    shares = np.array([[0.9], [1.0], [1.0], [1.0], [0.2]])
    band = intervals.summarize(shares, bounds=metric_range("accuracy"))
    plain = intervals.summarize(shares)
    assert plain.high[0] > 1 and band.high[0] == 1 and band.low[0] == plain.low[0]
    entropy = intervals.summarize([[0.01], [0.0], [0.0], [0.5]], bounds=metric_range("entropy"))
    assert entropy.low[0] == 0 and metric_range("clip_ratio/low_mean") == (0, 1)
    assert metric_range("kl/k1") == (-np.inf, np.inf) and metric_range("loss") == (-np.inf, np.inf)


def test_a_spreads_interval_is_the_chi_square_one():
    """The standard deviation over seeds with its 95% interval: the chi-square interval, which is also the interval
    of scipy's `mvsdist` (the posterior of σ under the Jeffreys prior), and a textbook case (n = 4, s = 1:
    √(3/9.348) = 0.5665 to √(3/0.2158) = 3.7285)."""
    x = np.array([0.3, 0.5, 0.45, 0.62, 0.41])
    s, low, high = intervals.sd_interval(x)
    assert s == pytest.approx(x.std(ddof=1)) and (low, high) == pytest.approx(stats.mvsdist(x)[2].interval(0.95))
    one = np.array([-1.0, 1.0, -1.0, 1.0]) * np.sqrt(3) / 2  # s = 1
    assert intervals.sd_interval(one) == pytest.approx((1.0, 0.5665, 3.7285), abs=5e-4)
    assert np.isnan(intervals.sd_interval([0.4])).all()
    s2, _, high2 = intervals.sd_interval([0.3, 0.4])  # 2 seeds: the χ² upper end is 32 s, past any reward in [0, 1]
    assert high2 == pytest.approx(31.9 * s2, rel=1e-3) and intervals.sd_interval([0.3, 0.4], within=(0, 1))[2] == 0.5


def flags(n11: int, n10: int, n01: int, n00: int) -> tuple[list[int], list[int]]:
    """Two 0/1 readings per seed from the paired 2 × 2 table (candidate, baseline): n11 both 1, n10 only the first …"""
    return [1] * (n11 + n10) + [0] * (n01 + n00), [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00


def test_a_paired_flags_interval_is_newcombes_and_stays_in_minus_1_1():
    """Newcombe's square-and-add interval for paired proportions against the R package contingencytables' test of
    Chapter 8 (complete response before and after consolidation therapy, Cavo et al. 2012: 59, 6, 16, 80 →
    −0.0621 [−0.1186, −0.0046]); and at 4 seeds, where the t-interval of the differences says [0, 0] when no seed
    differs and [−1.84, +1.84] when two seeds collapse under each measure, on other seeds."""
    d = intervals.paired_binary(*flags(59, 6, 16, 80))
    assert (round(d.mean, 4), round(d.low, 4), round(d.high, 4), d.n, d.against_mean) == (-0.0621, -0.1186, -0.0046, 161, 6)
    none = intervals.paired_binary(*flags(0, 0, 0, 4))
    assert none.mean == 0 and none.low == pytest.approx(-proportion(0, 4)[2]) and none.high == -none.low
    assert intervals.paired(*flags(0, 0, 0, 4)).low == 0  # the t-interval: degenerate
    swapped = intervals.paired_binary(*flags(0, 2, 2, 0))
    assert -1 < swapped.low < -0.5 and swapped.high == pytest.approx(-swapped.low)
    assert intervals.paired(*flags(0, 2, 2, 0)).high > 1.8  # the t-interval: past what a difference of shares can be
    rng = np.random.default_rng(3)
    for _ in range(200):
        a, b = rng.integers(0, 2, size=(2, int(rng.integers(1, 12))))
        d = intervals.paired_binary(a, b)
        assert -1 <= d.low <= d.mean <= d.high <= 1 and d.mean == pytest.approx(a.mean() - b.mean())
        back = intervals.paired_binary(b, a)  # the other way round: the same interval, mirrored
        assert (back.low, back.high) == (pytest.approx(-d.high), pytest.approx(-d.low))
    with pytest.raises(ValueError):
        intervals.paired_binary([0.5], [1])
