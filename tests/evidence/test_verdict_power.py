"""The verdict's power by simulation against a brute-force loop of the report's own calls, draw by draw."""

import numpy as np
import pytest
from scipy import stats

from divviz.evidence import intervals, significance, verdict_power


def brute_force(n, ratio, family, simulations, seed=0):
    """The same draws as `verdict_power`, each read by scipy's permutation test, the t interval, the sign test,
    `significance.verdict` and `significance.holm`, one at a time."""
    rng = np.random.default_rng(seed)
    d = rng.normal(ratio, 1.0, (simulations, n))
    others = rng.uniform(size=(simulations, family - 1))
    held = 0
    for row, rest in zip(d, others):
        p = stats.permutation_test((row,), np.mean, permutation_type="samples", n_resamples=np.inf if n <= 16 else
                                   significance.RESAMPLES, rng=np.random.default_rng(seed + 1)).pvalue
        s = intervals.summarize(row)
        median, p_median, _, _ = significance.sign_test(row)
        raw = significance.verdict(s.low, s.high, p, s.mean, median, +1, p_median)
        holm = significance.holm(np.concatenate(([p], rest)))[0]
        held += significance.adjusted_verdict(raw, holm) == intervals.HOLDS
    return held / simulations


@pytest.mark.parametrize("n, ratio, family", [(8, 1.2, 1), (8, 1.2, 4), (10, 0.9, 3), (6, 2.0, 1)])
def test_the_simulated_power_is_the_brute_force_loops_draw_by_draw(n, ratio, family):
    assert verdict_power.verdict_power(n, ratio, 1.0, family, simulations=300) == brute_force(n, ratio, family, 300)


def test_beyond_16_seeds_the_random_flips_agree_in_distribution():
    fast, slow = verdict_power.verdict_power(20, 0.6, 1.0, 2, simulations=200), brute_force(20, 0.6, 2, 200)
    assert abs(fast - slow) < 4 * np.sqrt(0.25 / 200)


def test_what_the_rule_can_and_cannot_reach():
    """Below 6 seeds no sign-flip p reaches 0.05: power 0 whatever the gain. At 8 seeds the smallest p is 2/2⁸ =
    0.0078, which Holm multiplies by the family's size when it is the family's smallest: a large
    gain at 8 seeds alone holds nearly always; in a family of 7 only when a null reading's p falls below it first
    (Holm then multiplies it by 6); in a family of 22 never. The t-test's power is an upper bound of the verdict's."""
    assert verdict_power.verdict_power(5, 5.0, 1.0) == 0.0
    assert verdict_power.verdict_power(8, 5.0, 1.0) > 0.99
    assert 0 < verdict_power.verdict_power(8, 5.0, 1.0, family=7) < 0.1
    assert verdict_power.verdict_power(8, 5.0, 1.0, family=22) == 0.0
    for n, ratio in ((12, 0.8), (16, 0.6)):
        assert verdict_power.verdict_power(n, ratio, 1.0) <= significance.power(n, ratio, 1.0) + 0.03
    assert verdict_power.verdict_power(12, 0.05, 0.0) != verdict_power.verdict_power(12, 0.05, 0.0)  # NaN: no spread
    assert verdict_power.verdict_power(12, 0.05, 0.04) == verdict_power.verdict_power(12, 0.5, 0.4)  # scale-free


def test_the_seeds_for_the_verdicts_power_are_the_first_n_that_reaches_it_and_a_cap_says_what_it_leaves():
    """The search returns the first n whose simulated power reaches the target (every smaller n's falls short), and
    at a cap below it, no n and the cap's own power."""
    n, found = verdict_power.seeds_for_verdict_power(1.0, 1.0, family=2, target=0.8, cap=30, simulations=300)
    assert n is not None and found >= 0.8 and found == verdict_power.verdict_power(n, 1.0, 1.0, 2, 300)
    assert all(verdict_power.verdict_power(m, 1.0, 1.0, 2, 300) < 0.8 for m in range(2, n))
    assert significance.seeds_for_power(1.0, 1.0) < n <= 16  # more than the t-test alone (10 here) needs
    capped, at_cap = verdict_power.seeds_for_verdict_power(1.0, 1.0, family=2, target=0.8, cap=n - 1,
                                                           simulations=300)
    assert capped is None and at_cap == verdict_power.verdict_power(n - 1, 1.0, 1.0, 2, 300) < 0.8
