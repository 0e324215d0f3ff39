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


def test_paired_difference_counts_reversed_seeds():
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    p = intervals.paired(base + np.array([0.5, 0.4, -0.1, 0.6, 0.5]), base)
    assert p.mean == pytest.approx(0.38) and p.n == 5 and p.reversed == 1
    ci = stats.ttest_1samp([0.5, 0.4, -0.1, 0.6, 0.5], 0.0).confidence_interval(0.95)
    assert (p.low, p.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert p.text().endswith("n = 5, 1 of 5 seeds reversed")


@pytest.mark.parametrize("diff, sign, want", [
    (np.full(20, 0.5) + np.linspace(-0.1, 0.1, 20), +1, intervals.HOLDS),  # clearly positive
    (np.full(20, -0.5) + np.linspace(-0.1, 0.1, 20), +1, intervals.REVERSED),  # clearly negative
    (np.full(20, -0.5) + np.linspace(-0.1, 0.1, 20), -1, intervals.HOLDS),  # a claim that predicts a decrease
    (np.linspace(-1, 1.2, 20), +1, intervals.NOT_RESOLVED),  # straddles 0
    (np.array([0.3]), +1, intervals.NOT_RESOLVED),  # one seed: no interval
])
def test_verdicts_on_synthetic_differences(diff, sign, want):
    p = intervals.paired(diff, np.zeros_like(diff))
    assert intervals.verdict(p.low, p.high, sign) == want


def test_identity_verdict():
    assert intervals.identity_verdict(3e-16, 1e-12) == intervals.EXACT
    assert intervals.identity_verdict(1e-6, 1e-12) == intervals.NOT_EXACT


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
