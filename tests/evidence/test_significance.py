"""The robust statistics of a cell against exact enumerations and textbook values: the sign-flip p (every flip
enumerated here), the sign test (binomial sums), Holm and Benjamini–Hochberg (their step procedures written out),
power (a textbook value and a simulation), the gain a cell rules out (the 90% interval and every sign flip), the
verdict's rules, and the 64-seed bandit cell whose mean and median disagree."""

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from divviz.evidence import claims, claims_report, intervals, significance
from divviz.evidence.kept import Kept


def enumerated_sign_flip_p(d) -> float:
    """Every one of the 2^n sign flips: the share whose |mean| reaches the observed |mean|."""
    d = np.asarray(d, dtype=np.float64)
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    means = np.abs(signs @ d) / d.size
    return float(np.mean(means >= abs(d.mean()) * (1 - 1e-12)))


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_p_is_the_exact_enumeration(seed):
    rng = np.random.default_rng(seed)
    n = 2 + seed * 2
    d = rng.normal(0.3, 1.0, size=n)
    d[0] = -d[1] if n > 2 else d[0]  # a tie in |d|
    assert significance.sign_flip_p(d) == pytest.approx(enumerated_sign_flip_p(d), abs=1e-12)


def test_four_seeds_cannot_go_below_one_eighth():
    assert significance.sign_flip_p([0.1, 0.2, 0.3, 0.4]) == 0.125 == significance.smallest_p(4)
    assert significance.smallest_p(12) == pytest.approx(2 / 4096)
    assert np.isnan(significance.sign_flip_p([0.3])) and significance.sign_flip_p([0.0, 0.0, 0.0]) == 1.0


def test_sign_flip_p_beyond_sixteen_seeds_is_within_monte_carlo_error_of_every_flip():
    d = np.random.default_rng(7).normal(0.2, 1.0, size=20)  # 2^20 flips enumerated
    exact = enumerated_sign_flip_p(d)
    assert abs(significance.sign_flip_p(d) - exact) < 4 * math.sqrt(exact * (1 - exact) / significance.RESAMPLES) + 1e-3


@pytest.mark.parametrize("alternative", ["two-sided", "less"])
def test_samples_tested_together_get_the_p_each_gets_alone(alternative):
    """Cells of several seed counts tested in one pass (exact at 6 and 12 seeds, Monte Carlo at 20 and 64) get
    exactly the p of scipy's own call per cell with the same fixed seed — the flips are shared, not changed."""
    rng = np.random.default_rng(3)
    samples = [rng.normal(rng.uniform(-0.3, 0.3), 1.0, size=n) for n in (6, 12, 20, 64) for _ in range(7)]
    samples += [[0.0, 0.0], [0.4]]  # every difference 0: p = 1; one seed: NaN
    alone = [stats.permutation_test((d,), np.mean, permutation_type="samples", vectorized=True,
                                    n_resamples=np.inf if d.size <= 16 else significance.RESAMPLES,
                                    alternative=alternative, rng=np.random.default_rng(0)).pvalue
             for d in samples[:-2]]
    together = significance.sign_flip_ps(samples, alternative)
    assert together[:-2] == alone and together[-2] == 1.0 and np.isnan(together[-1])
    assert [significance.sign_flip_p(d, alternative) for d in samples[:3]] == alone[:3]  # one at a time: the same

def test_sign_test_is_the_binomial_sum():
    d = np.array([0.1] * 3 + [-0.2] * 11 + [0.0] * 2)  # zeros dropped: 3 up, 11 down
    median, p, up, down = significance.sign_test(d)
    tail = sum(math.comb(14, k) for k in range(0, 4)) / 2 ** 14
    assert (up, down, median) == (3, 11, pytest.approx(-0.2)) and p == pytest.approx(2 * tail, rel=1e-12)


def test_the_binomial_p_is_scipys_binomtest():
    """`binomial_p`, summed in integers, against scipy's binomtest for every k of every n up to 70."""
    from scipy.stats import binomtest

    for n in range(1, 71):
        for k in range(n + 1):
            assert significance.binomial_p(k, n) == pytest.approx(binomtest(k, n, 0.5).pvalue, rel=1e-12, abs=1e-300)


def test_a_damaged_published_p_file_is_read_row_by_row_and_never_trusted_blindly(tmp_path, monkeypatch):
    """Each row of a kept or published p file is checked: a wrong digest, alternative, flip count or p leaves that
    row out; a file that is not JSON gives nothing; the p's are then drawn as without a file."""
    good = significance.digest([0.1, -0.2, 0.3])
    path = tmp_path / "sign-flip-p.json"
    path.write_text(json.dumps([[good, "two-sided", 0, 0.75], ["short", "two-sided", 0, 0.5],
                                [good, "sideways", 0, 0.5], [good, "less", -1, 0.5], [good, "greater", 0, 1.5],
                                [good, "greater", 0, "nan"], "a row", [good]]))
    assert significance._read_kept(path) == {(good, "two-sided", 0): 0.75}
    path.write_text("{not json")
    assert significance._read_kept(path) == {}
    monkeypatch.setattr(significance, "published_file", lambda: path)
    monkeypatch.setattr(significance, "_TESTED", {})
    monkeypatch.setattr(significance, "_LOADED", set())
    d = [0.3, -0.1, 0.2, 0.4, 0.5]
    assert significance.sign_flip_p(d) == pytest.approx(stats.permutation_test(
        (np.array(d),), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue)


def holm_step_down(p, alpha):
    """Holm's procedure: reject the sorted hypotheses while p_(i) ≤ α / (m − i + 1)."""
    order = np.argsort(p)
    rejected = np.zeros(len(p), bool)
    for i, k in enumerate(order):
        if p[k] > alpha / (len(p) - i):
            break
        rejected[k] = True
    return rejected


def bh_step_up(p, alpha):
    """Benjamini–Hochberg's procedure: reject the k smallest, k the largest i with p_(i) ≤ i α / m."""
    order = np.argsort(p)
    passing = [i + 1 for i, k in enumerate(order) if p[k] <= (i + 1) * alpha / len(p)]
    rejected = np.zeros(len(p), bool)
    rejected[order[:max(passing, default=0)]] = True
    return rejected


def test_holm_and_bh_adjusted_p_reject_what_their_procedures_reject():
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = np.concatenate([rng.uniform(0, 0.02, size=rng.integers(0, 5)), rng.uniform(0, 1, size=rng.integers(1, 9))])
        for alpha in (0.01, 0.05, 0.1):
            assert np.array_equal(significance.holm(p) <= alpha, holm_step_down(p, alpha))
            assert np.array_equal(significance.benjamini_hochberg(p) <= alpha, bh_step_up(p, alpha))
    assert significance.holm([0.01, np.nan, 0.04])[1] != significance.holm([0.01, np.nan, 0.04])[1]  # NaN stays
    assert significance.holm([0.01, np.nan, 0.04])[[0, 2]] == pytest.approx([0.02, 0.04])  # m = 2, not 3


def test_power_against_a_textbook_value_and_a_simulation():
    assert significance.power(10, 1.0, 1.0) == pytest.approx(0.8031, abs=5e-4)  # one-sample t, d = 1, n = 10
    rng = np.random.default_rng(0)
    samples = rng.normal(0.055, 0.0556, size=(20_000, 11))
    rejected = stats.ttest_1samp(samples, 0.0, axis=1).pvalue < 0.05
    assert significance.power(11, 0.055, 0.0556) == pytest.approx(rejected.mean(), abs=0.015)
    n = significance.seeds_for_power(0.055, 0.0556)
    assert n == 11 and significance.power(n - 1, 0.055, 0.0556) < 0.8 <= significance.power(n, 0.055, 0.0556)
    assert significance.seeds_for_power(1e-4, 1.0) is None and significance.seeds_for_power(0.05, np.nan) is None
    # a huge effect: the t-test's power is 80% at 3 seeds, but no sign-flip p can go below 0.05 before 6
    assert significance.power(3, 1.0, 0.1) > 0.8 and significance.smallest_p(5) > 0.05 > significance.smallest_p(6)
    assert significance.fewest_seeds() == 6 == significance.seeds_for_power(1.0, 0.1)


def enumerated_one_sided_p(d, margin: float) -> float:
    """Every one of the 2^n sign flips of d − margin: the share whose mean is at most the observed one."""
    e = np.asarray(d, dtype=np.float64) - margin
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=e.size)))
    return float(np.mean(signs @ e / e.size <= e.mean() + 1e-12 * abs(e.mean())))


def test_a_gain_is_ruled_out_when_the_90_percent_interval_and_every_sign_flip_put_it_out_of_reach():
    rng = np.random.default_rng(1)
    for _ in range(40):
        d = rng.normal(rng.uniform(-0.05, 0.05), 0.03, size=rng.integers(3, 12))
        upper = stats.ttest_1samp(d, 0.0).confidence_interval(0.90).high
        assert significance.rules_out_gain(d, 0.055) == (upper < 0.055 and enumerated_one_sided_p(d, 0.055) < 0.05)
    tight = [0.004, 0.0045, 0.0035, 0.004]  # the 90% interval ends far below 0.05, but 4 seeds give p ≥ 1/16
    assert stats.ttest_1samp(tight, 0.0).confidence_interval(0.90).high < 0.05
    assert enumerated_one_sided_p(tight, 0.05) == 1 / 16 and not significance.rules_out_gain(tight, 0.05)
    assert significance.rules_out_gain([*tight, 0.004], 0.05)  # five seeds can: p = 1/32


def test_the_verdict_needs_the_interval_and_the_permutation_test_to_agree():
    four = np.array([0.10, 0.11, 0.12, 0.13])  # t interval far from 0, but p = 0.125
    eight = np.concatenate([four, four + 0.01])  # p = 2/256
    for d, expected in ((four, intervals.NOT_RESOLVED), (eight, intervals.HOLDS), (-eight, intervals.REVERSED)):
        s = intervals.summarize(d)
        median = float(np.median(d))
        assert significance.verdict(s.low, s.high, significance.sign_flip_p(d), s.mean, median, +1) == expected
    def reading(d):
        s, (median, p_median, _, _) = intervals.summarize(d), significance.sign_test(d)
        return significance.verdict(s.low, s.high, significance.sign_flip_p(d), s.mean, median, +1, p_median)
    skewed = np.array([-0.01] * 12 + [0.9])  # one seed carries the mean; 12 of 13 below 0 (sign test p 0.0034)
    assert reading(skewed) == significance.DISAGREE
    assert reading(np.array([-0.01] * 7 + [0.5])) == intervals.NOT_RESOLVED  # 7 of 8 below: sign test p 0.07
    null = np.array([0.03, -0.002, -0.004, 0.01, -0.001, -0.003, 0.02, -0.05, 0.035, -0.002, -0.006, 0.009])
    assert np.mean(null) > 0 > np.median(null) and reading(null) == intervals.NOT_RESOLVED  # two readings of nothing


def test_adjust_applies_holm_within_a_family_and_bh_within_a_section():
    def row(family, p, setting=claims.BANDIT, verdict=intervals.HOLDS):
        return {"family": family, "p": p, "verdict": verdict, "setting": setting}
    rows = [row("a", 0.01), row("a", 0.02), row("a", 0.03), row("a", 0.5, verdict=intervals.NOT_RESOLVED),
            row("b", 0.04, claims.LM_TRAINING), row("c", 0.03, claims.REAL),
            {"family": "d", "p": None, "verdict": intervals.EXACT, "setting": "random batches"}]
    out = claims_report.adjust(rows)
    assert [r["p_holm"] for r in out[:6]] == pytest.approx([0.04, 0.06, 0.06, 0.5, 0.04, 0.03])
    assert [r["verdict_adjusted"] for r in out] == [intervals.HOLDS, intervals.NOT_RESOLVED, intervals.NOT_RESOLVED,
                                                   intervals.NOT_RESOLVED, intervals.HOLDS, intervals.HOLDS,
                                                   intervals.EXACT]
    bandit = stats.false_discovery_control([0.01, 0.02, 0.03, 0.5])  # the bandit's own section
    smollm2 = stats.false_discovery_control([0.04, 0.03])  # over training and one update: SmolLM2's section
    assert [r["q_bh"] for r in out[:6]] == pytest.approx([*bandit, *smollm2])
    assert "p_holm" not in rows[0] and out[6]["p_holm"] is None  # the rows given are not changed


def test_a_descriptive_reading_is_in_no_family_and_keeps_its_raw_verdict():
    """Holm and BH run over the primary readings alone: a descriptive row neither dilutes its claim's family nor gets
    an adjusted p, and reads *descriptive* whatever its raw verdict."""
    def row(p, primary=True, setting=claims.LM_TRAINING):
        return {"family": "kl3_training · stress", "p": p, "verdict": intervals.HOLDS, "setting": setting,
                "primary": primary}
    out = claims_report.adjust([row(0.02), row(0.03), row(0.001, primary=False), row(0.004, primary=False)])
    assert [r["p_holm"] for r in out] == pytest.approx([0.04, 0.04, None, None], nan_ok=True)
    assert [r["q_bh"] for r in out[:2]] == pytest.approx(list(stats.false_discovery_control([0.02, 0.03])))
    assert [r["verdict_adjusted"] for r in out] == [intervals.HOLDS, intervals.HOLDS, claims_report.DESCRIPTIVE,
                                                   claims_report.DESCRIPTIVE]
    assert [r["verdict"] for r in out] == [intervals.HOLDS] * 4 and out[2]["q_bh"] is None


def test_the_primary_readings_are_those_the_claims_words_name():
    assert claims.is_primary(claims.KL3_WIDE, "eval/accuracy", "end")
    assert claims.is_primary(claims.KL3_HIGH_EDGE, "stability/collapsed", "whole run")
    assert claims.is_primary(claims.KL3_WIDE, "entropy", "late")
    assert claims.is_primary(claims.KL3_WIDE, "entropy/change", "")
    for candidate, metric, reading in ((claims.KL3_WIDE, "eval/accuracy", "over the run"),
                                       (claims.KL3_WIDE, "eval/accuracy_greedy", "end"),
                                       (claims.KL3_WIDE, "stability/max_kl", "whole run"),
                                       (claims.KL3_WIDE, "stability/max_clip", "whole run"),
                                       (claims.KL3_WIDE, "entropy", "early"),
                                       (claims.BOX_LOW_ONLY, "eval/accuracy", "end"),
                                       (claims.BOX_HIGH_ONLY, "stability/collapsed", "whole run")):
        assert not claims.is_primary(candidate, metric, reading), (candidate, metric, reading)


def test_a_monte_carlo_p_near_a_threshold_is_read_again_until_no_draw_changes_its_verdict():
    """20 seeds (random flips: 2^20 is past the exact limit) with a p near 0.05: the report draws more flips until
    the p's 99.9% bounds are on one side of α, the bounds hold the exact p (all 2^20 flips, enumerated by scipy), and
    the verdict is the exact p's. A p far from any threshold keeps its 9,999 flips."""
    rng = np.random.default_rng(3)
    base = rng.normal(0, 1, 20)
    near = base + 0.73  # its t interval excludes 0, so only the sign-flip p decides the verdict
    exact = stats.permutation_test((near,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                   vectorized=True).pvalue
    assert intervals.summarize(near).low > 0 and 0.04 < exact < 0.045  # 9,999 flips' bounds reach 0.05; 99,999's not
    low, high = significance.p_bounds(significance.sign_flip_p(near), significance.RESAMPLES)
    assert low < significance.ALPHA < high
    far = base + 3.0
    rows = []
    for d in (near, far):
        s, (median, p_median, up, down) = intervals.summarize(d), significance.sign_test(d)
        rows.append({"family": "f", "setting": claims.BANDIT, "n": 20, "differences": d.tolist(), "low": s.low,
                     "high": s.high, "mean": s.mean, "median": median, "p_median": p_median, "predicted_sign": "+",
                     "p": significance.sign_flip_p(d), "verdict": None})
    out = claims_report.adjust(rows)
    low, high = out[0]["p_bounds"]
    assert out[0]["p_flips"] > significance.RESAMPLES and low <= exact <= high
    assert (high < significance.ALPHA) or (low > significance.ALPHA)
    r = rows[0]
    assert out[0]["verdict"] == significance.verdict(r["low"], r["high"], exact, r["mean"], r["median"], +1,
                                                     r["p_median"])
    assert out[1]["p_flips"] == significance.RESAMPLES and out[1]["verdict"] == intervals.HOLDS
    again = claims_report.adjust(out)  # a report adjusted again (more rows added) keeps each p's reading
    assert [(r["p"], r["p_flips"]) for r in again] == [(r["p"], r["p_flips"]) for r in out]


def test_the_64_seed_bandit_cell_whose_mean_and_median_disagree():
    """DAPO − PPO entropy, likely correct actions, K = 50, SGD, iteration 80, 64 seeds: the mean is +0.0045 and not
    resolved, while 46 of the 64 seeds are negative (sign test p ≈ 1e-4): one seed at about +0.65 carries the mean."""
    report = claims_report.build(64, grid=(claims.Condition("likely", 50, "sgd"),))
    cell = next(r for r in report.rows if r["candidate"] == claims.DAPO and "late" in r["condition"])
    assert cell["n"] == 64 and cell["mean"] == pytest.approx(0.0045, abs=5e-4) and cell["low"] < 0 < cell["high"]
    assert (cell["seeds_down"], cell["seeds_up"]) == (46, 15) and cell["p_median"] < 1e-3 and cell["median"] < 0
    assert cell["verdict"] == cell["verdict_adjusted"] == significance.DISAGREE
    assert max(cell["differences"]) == pytest.approx(0.65, abs=0.01)


def test_the_largest_clip_fraction_against_a_wider_box_is_labelled_by_construction():
    rows = claims_report.adjust([{"family": "f", "p": 0.001, "verdict": intervals.HOLDS, "setting": claims.LM_TRAINING,
                                  "by_construction": claims.BY_CONSTRUCTION[(claims.KL3_WIDE, "stability/max_clip")]}])
    assert rows[0]["verdict_adjusted"] == claims_report.BY_CONSTRUCTION_VERDICT
    assert (claims.KL3_HIGH_EDGE, "stability/max_clip") not in claims.BY_CONSTRUCTION  # narrower below: not wider


def test_the_gain_bound_is_where_the_t_half_of_ruling_out_flips():
    """The bound the cells print beside "rules out a gain ≥ X": the one-sided t-test rejects a gain ≥ X exactly when
    X lies above it (checked at margins just either side), and it is the 90% two-sided t interval's upper end."""
    d = np.random.default_rng(7).normal(-0.01, 0.04, 8)
    bound = significance.gain_bound(d)
    interval = stats.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert bound == pytest.approx(interval[1], rel=1e-12)
    for margin, rejected in ((bound + 1e-9, True), (bound - 1e-9, False)):
        assert bool(stats.ttest_1samp(d, margin, alternative="less").pvalue < significance.ALPHA) is rejected


@pytest.mark.slow
def test_the_bandit_counts_readme_quotes_do_not_change_with_ten_times_the_flips(monkeypatch):
    """The published 64-seed bandit grid read with every Monte Carlo p drawn from 10× the flips (99,999 first, then
    up to 10⁸ where a verdict could change): every cell's verdict, raw and after Holm, and so README's sentence, the
    same; and no cell's verdict in the report as published still depends on the draw."""
    from divviz.evidence import claims_export
    published = claims_report.build(claims.SEEDS)
    assert not claims_report.draw_dependent(published.rows)
    monkeypatch.setattr(significance, "RESAMPLES", 10 * significance.RESAMPLES + 9)
    monkeypatch.setattr(significance, "MORE_FLIPS", tuple(10 * f + 9 for f in significance.MORE_FLIPS))
    monkeypatch.setattr(significance, "_TESTED", {})
    monkeypatch.setattr(claims_report, "COMPUTED", Kept())  # the report built before was kept: build it again
    again = claims_report.build(claims.SEEDS)
    assert all(r["p_flips"] is None or r["p_flips"] >= 99_999 for r in again.rows)
    assert [(r["verdict"], r["verdict_adjusted"]) for r in again.rows] == \
        [(r["verdict"], r["verdict_adjusted"]) for r in published.rows]
    assert claims_export.bandit_sentence(again) == claims_export.bandit_sentence(published)
