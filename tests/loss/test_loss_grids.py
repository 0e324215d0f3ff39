"""Explorer computations: curves are the training loss on a grid, intervals are the catalogue's."""

import numpy as np
import pytest
import torch

from divviz import loss_grids

from divviz.catalogue import theory
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective, policy_loss


def test_ratio_curves_match_the_spot_checks_and_autograd():
    # docs/theory.md §5.5 with ε1 = 0.2, ε2 = 0.28, c = 3: objective = −loss
    curves = loss_grids.ratio_curves(clip_test("clip_higher", eps_low=0.2, eps_high=0.28), np.array([0.5, 1.5, 2.0, 5.0]),
                                  pi_old=0.5, dual_clip_c=3.0)
    assert curves.surrogate[+1][:2].tolist() == pytest.approx([0.5, 1.28])
    assert curves.surrogate[-1].tolist() == pytest.approx([-0.8, -1.5, -2.0, -3.0])
    assert curves.masked[+1].tolist() == [False, True, True, True]
    assert curves.masked[-1].tolist() == [True, False, False, True]
    # slope d(−ℓ)/dw: A for unmasked tokens, 0 where masked
    assert curves.slope[+1].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert curves.slope[-1].tolist() == pytest.approx([0.0, -1.0, -1.0, 0.0])
    assert curves.bounds == pytest.approx((0.8, 1.28))


def test_ratio_curves_slope_is_finite_difference_of_surrogate():
    ratio = np.linspace(0.3, 2.5, 2001)
    curves = loss_grids.ratio_curves(clip_test("kl3", delta=0.05), ratio)
    for sign in (+1, -1):
        numeric = np.gradient(curves.surrogate[sign], ratio)
        inner = np.abs(np.diff(curves.masked[sign].astype(int), prepend=0, append=0))[:-1] == 0
        inner &= np.r_[True, inner[:-1]] & np.r_[inner[1:], True]  # away from the kinks
        assert np.allclose(curves.slope[sign][inner], numeric[inner], atol=1e-6)


def test_masked_spans():
    ratio = np.arange(6.0)
    assert loss_grids.masked_spans(ratio, np.array([1, 1, 0, 0, 1, 1], bool)) == [(0.0, 1.0), (4.0, 5.0)]
    assert loss_grids.masked_spans(ratio, np.zeros(6, bool)) == []


def test_feasible_region_cone_vs_band():
    pi_old = np.array([0.01, 0.5, 0.9])
    lo, hi = loss_grids.feasible_region(clip_test("ratio", eps=0.2), pi_old)
    assert lo.tolist() == pytest.approx([0.008, 0.4, 0.72]) and hi.tolist() == pytest.approx([0.012, 0.6, 1.0])
    lo, hi = loss_grids.feasible_region(clip_test("prob_tv", delta=0.1), pi_old)
    assert lo.tolist() == pytest.approx([0.0, 0.4, 0.8]) and hi.tolist() == pytest.approx([0.11, 0.6, 1.0])


@pytest.mark.parametrize("name, param", [("ratio", "eps"), ("clip_higher", "eps_high"), ("kl1", "delta"),
                                         ("kl2", "delta"), ("kl3", "delta"), ("prob_tv", "delta")])
def test_interval_sweep_equals_pointwise_bounds(name, param):
    test = clip_test(name)
    values = np.linspace(0.01, 0.5, 7)
    lower, upper = loss_grids.interval_sweep(test, param, values, pi_old=0.3)
    for v, lo, up in zip(values, lower, upper):
        want = clip_test(name, **{**test.params, param: v}).bounds(np.asarray(0.3))
        assert (lo, up) == pytest.approx(tuple(float(b) for b in want), rel=1e-12)


def test_logit_room_matches_theory():
    pi_old = np.linspace(0.05, 0.95, 10)
    d_min, d_max = loss_grids.logit_room(clip_test("kl3", delta=0.05), pi_old)
    want = theory.logit_shift_bounds(*theory.kl3_bounds(0.05), pi_old)
    assert np.array_equal(d_min, want[0]) and np.array_equal(d_max, want[1])


@pytest.mark.parametrize("delta", [0.001, 0.02, 0.05, 0.3])
def test_kl3_equivalence_check(delta):
    check = loss_grids.kl3_equivalence_check(delta, seed=3)
    assert check.outside > 0 and check.masked > 0
    assert check.max_abs_loss_diff <= 1e-12 and check.max_abs_grad_diff <= 1e-12
    assert check.max_abs_grad > 0


def test_random_token_batch_is_reproducible_and_masks_padding():
    a = loss_grids.random_token_batch(5)
    b = loss_grids.random_token_batch(5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    logp_new, logp_old, adv, mask = a
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip_test("ratio")))
    assert not out.outside[mask == 0].any()


def test_each_rollout_correction_multiplies_a_token_by_its_formula():
    """`correction_curve` against ρ = π_old/π_roll: TIS min(ρ, u); IcePop ρ on [l, u], else 0, per token and per
    (one-token) completion; rejection 1 where k1, k2 or k3 keeps the token, else 0; no correction 1."""
    from divviz.catalogue.rollout_correction import RolloutCorrection

    rho = np.geomspace(0.1, 10.0, 201)
    curve = lambda **kw: loss_grids.correction_curve(RolloutCorrection(**kw), rho)  # noqa: E731
    np.testing.assert_allclose(curve(rollout_is="token", rollout_is_threshold=2.0), np.minimum(rho, 2.0), rtol=1e-12)
    icepop = np.where((rho >= 0.5) & (rho <= 2.0), rho, 0.0)
    for level in ("token", "sequence"):
        np.testing.assert_allclose(curve(rollout_is=level, rollout_is_threshold="0.5_2"), icepop, rtol=1e-12)
    np.testing.assert_array_equal(curve(rollout_rs="token_k1", rollout_rs_threshold="0.5_2"),
                                  ((-np.log(rho) >= np.log(0.5)) & (-np.log(rho) <= np.log(2.0))).astype(float))
    np.testing.assert_array_equal(curve(rollout_rs="token_k3", rollout_rs_threshold="0.1"),
                                  (rho - 1 - np.log(rho) <= 0.1).astype(float))
    np.testing.assert_allclose(curve(rollout_is="token", rollout_is_batch_normalize=True), np.minimum(rho, 2.0),
                               rtol=1e-12)
    np.testing.assert_array_equal(curve(), np.ones_like(rho))
