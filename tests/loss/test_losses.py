"""The one policy loss: docs/theory.md §5.5 spot checks, TRL's clip fractions, the interval equivalences
(value and autograd gradient, float64, 1e-12), aggregations against hand-written sums, RPG Prop. 4.1."""

import io
import json
import math

import numpy as np
import pytest
import torch

from divviz.catalogue import divergences as dv, penalties as pn
from divviz.catalogue.aggregation import AGGREGATIONS, aggregation_weights, prefix_weights
from divviz.loss_grids import random_token_batch
from divviz.bandit.loss_gradient import PolicyLossGradient
from divviz.losses import Objective, policy_loss
from divviz.catalogue.theory import kl3_bounds

F64 = torch.float64


def one_token_batch(ratios, advs, dtype=F64):
    w = torch.tensor(ratios, dtype=dtype).unsqueeze(1)  # (B, 1)
    logp_new = w.log().requires_grad_()
    return logp_new, torch.zeros_like(w), torch.tensor(advs, dtype=dtype), torch.ones_like(w)


def grads(out, logp_new):
    (g,) = torch.autograd.grad(out.loss, logp_new)
    return g


# docs/theory.md §5.5: A, w, loss value, gradient through w?
SPOT = [(+1, 0.5, -0.5, True), (+1, 1.5, -1.28, False), (-1, 0.5, 0.8, False),
        (-1, 2.0, 2.0, True), (-1, 5.0, 3.0, False)]


def test_masking_and_dual_clip_spot_checks():
    advs, ratios, losses, has_grad = zip(*SPOT)
    logp_new, logp_old, adv, mask = one_token_batch(ratios, advs)
    out = policy_loss(logp_new, logp_old, adv, mask,
                      Objective(clip=dv.clip_test("clip_higher", eps_low=0.2, eps_high=0.28), dual_clip_c=3.0,
                                aggregation="bnpo"))
    assert out.per_token_loss.flatten().tolist() == pytest.approx(losses, rel=1e-12)
    g = grads(out, logp_new).flatten()
    assert [bool(x != 0) for x in g] == list(has_grad)
    assert out.grad_masked.flatten().tolist() == [not h for h in has_grad]
    assert out.dual_clip.flatten().tolist() == [False, False, False, False, True]


def test_kl3_masking_rule_at_delta_005():
    l, u = 0.716189, 1.35040  # docs/theory.md §5.5: A=+1 masked iff w > u, A=−1 masked iff w < l
    ratios = [u - 1e-4, u + 1e-4, l + 1e-4, l - 1e-4]
    logp_new, logp_old, adv, mask = one_token_batch(ratios, [1, 1, -1, -1])
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("kl3", delta=0.05)))
    assert out.grad_masked.flatten().tolist() == [False, True, False, True]
    assert out.masked_high.flatten().tolist() == [False, True, False, False]
    assert out.masked_low.flatten().tolist() == [False, False, False, True]


def test_trl_clip_fraction_convention():
    # outside on the "wrong" side keeps its gradient and is not counted (A>0 below l, A<0 above u)
    logp_new, logp_old, adv, mask = one_token_batch([0.5, 1.5, 0.5, 1.5], [1, -1, -1, 1])
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("ratio", eps=0.2)))
    assert out.outside.flatten().tolist() == [True, True, True, True]
    assert out.masked_low.flatten().tolist() == [False, False, True, False]
    assert out.masked_high.flatten().tolist() == [False, False, False, True]
    assert out.masked_region.flatten().tolist() == [False, False, True, True]
    assert (grads(out, logp_new).flatten() != 0).tolist() == [True, True, False, False]
    # the earlier spellings, for code written with them, read the same tensors
    assert out.clipped_low is out.masked_low and out.clipped_high is out.masked_high
    assert out.dual_clipped is out.dual_clip and out.clipped_region.equal(out.masked_region)


def random_batch(seed, B=16, T=12, spread=0.6):
    """loss_grids.random_token_batch (float64, mixed-sign advantages, padding) plus reference log-probs."""
    logp_new, logp_old, adv, mask = random_token_batch(seed, B, T, spread)
    logp_ref = logp_old + 0.2 * torch.randn(B, T, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    return logp_new.requires_grad_(), logp_old, adv, mask, logp_ref


def ppo_clamp_reference(logp_new, logp_old, adv, mask, lower, upper):
    """The textbook PPO loss on an interval, written out independently: −min(wA, clamp(w, l, u)A), grpo mean."""
    w = (logp_new - logp_old).exp()
    lower = torch.as_tensor(lower, dtype=w.dtype).expand_as(w)
    upper = torch.as_tensor(upper, dtype=w.dtype).expand_as(w)
    clamped = torch.minimum(torch.maximum(w, lower), upper)
    per_token = -torch.minimum(w * adv[:, None], clamped * adv[:, None])
    return ((per_token * mask).sum(1) / mask.sum(1)).mean()


@pytest.mark.parametrize("seed", range(5))
def test_kl3_test_equals_clip_higher_on_lambert_interval(seed):
    logp_new, logp_old, adv, mask, _ = random_batch(seed)
    for delta in (0.02, 0.05, 0.1):
        lower, upper = kl3_bounds(delta)
        kl3 = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("kl3", delta=delta)))
        box = policy_loss(logp_new, logp_old, adv, mask,
                          Objective(clip=dv.clip_test("clip_higher", eps_low=1 - lower, eps_high=upper - 1)))
        assert kl3.outside.any() and (~kl3.outside & (mask > 0)).any()  # both regimes present
        assert torch.equal(kl3.outside, box.outside)
        assert abs(float(kl3.loss - box.loss)) < 1e-12
        assert torch.allclose(grads(kl3, logp_new), grads(box, logp_new), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, params", [("ratio", {"eps": 0.2}), ("clip_higher", {"eps_low": 0.2, "eps_high": 0.28}),
                                          ("kl1", {"delta": 0.1}), ("kl2", {"delta": 0.05}),
                                          ("kl3", {"delta": 0.05}), ("prob_tv", {"delta": 0.1})])
@pytest.mark.parametrize("seed", range(3))
def test_every_interval_test_equals_ppo_clamp_on_its_interval(name, params, seed):
    logp_new, logp_old, adv, mask, _ = random_batch(seed)
    test = dv.clip_test(name, **params)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=test))
    lower, upper = test.bounds(logp_old.exp())
    ref = ppo_clamp_reference(logp_new, logp_old, adv, mask, lower, upper)
    assert out.outside.any()
    assert abs(float(out.loss - ref)) < 1e-12
    (g_ref,) = torch.autograd.grad(ref, logp_new)
    assert torch.allclose(grads(out, logp_new), g_ref, rtol=0, atol=1e-12)


def test_gradient_is_zero_exactly_on_masked_tokens():
    logp_new, logp_old, adv, mask, _ = random_batch(7)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("kl3", delta=0.05), dual_clip_c=2.0))
    g = grads(out, logp_new)
    active = mask > 0
    assert torch.equal(g[active] == 0, out.grad_masked[active])


def test_aggregations_against_hand_sums():
    logp_new, logp_old, adv, mask, _ = random_batch(1, B=4, T=6)
    clip = dv.clip_test("ratio", eps=0.2)
    per_token = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip)).per_token_loss
    rows = [sum(per_token[i, j].item() for j in range(6) if mask[i, j]) for i in range(4)]
    counts = [int(mask[i].sum()) for i in range(4)]
    want = {
        "grpo": sum(r / c for r, c in zip(rows, counts)) / 4,
        "bnpo": sum(rows) / sum(counts),
        "dr_grpo": sum(rows) / (4 * 6),
        "dapo": sum(rows) / sum(counts),
    }
    for how, value in want.items():
        got = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip, aggregation=how)).loss
        assert float(got) == pytest.approx(value, rel=1e-12), how
    got = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip, aggregation="dr_grpo"),
                      max_completion_length=10).loss
    assert float(got) == pytest.approx(sum(rows) / 40, rel=1e-12)
    got = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip, aggregation="dapo"),
                      num_items_in_batch=100).loss
    assert float(got) == pytest.approx(sum(rows) / 100, rel=1e-12)


OBJECTIVES = [*[Objective(clip=dv.clip_test(name)) for name in dv.CLIP_TESTS],
              *[Objective(clip=dv.clip_test("kl3"), penalty=pn.penalty(name), beta=0.3) for name in pn.PENALTIES],
              *[Objective(penalty=pn.penalty(name, importance_weight=True), beta=0.3) for name in ("k1", "k2", "k3")],
              Objective(penalty=pn.penalty("mirror", seed=3, init_scale=0.5), beta=0.3), Objective()]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.label)
@pytest.mark.parametrize("dual_clip_c", [None, 1.5])
@pytest.mark.parametrize("aggregation", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_closed_form_gradient_equals_autograd(objective, dual_clip_c, aggregation):
    """`PolicyLossGradient` (the bandit's fast step) against autograd through `policy_loss`. It is set to a
    batch and called at each optimiser step, so it is first set to another batch and called there."""
    objective = Objective(objective.clip, objective.penalty, objective.beta, dual_clip_c, aggregation)
    logp_new, logp_old, adv, mask, logp_ref = random_batch(11, spread=1.0)
    out = objective(logp_new, logp_old, adv, mask, logp_ref=logp_ref)
    new, old, a, m, ref = (x.detach().numpy()[None] for x in (logp_new, logp_old, adv, mask, logp_ref))
    gradient = PolicyLossGradient([objective], aggregation_weights(m[0], aggregation)[None])
    gradient.batch(old - 0.3, -a, ref)(old)
    fast = gradient.batch(old, a, ref)(new)
    assert abs(fast.grad[0] - grads(out, logp_new).numpy()).max() < 1e-12
    assert (fast.masked_low[0] == out.masked_low.numpy()).all()
    assert (fast.masked_high[0] == out.masked_high.numpy()).all()
    if objective.clip is not None:
        assert out.masked_region.any()
    if dual_clip_c is not None:
        assert out.dual_clip.any()


def test_stacked_closed_form_gradient_equals_each_alone():
    """R objectives in one `PolicyLossGradient` (the bandit's runs side by side): row r is objectives[r] alone,
    with mixed clip tests (and none), penalties, dual-clip and aggregations; and with one shared penalty."""
    mixed = [Objective(o.clip, o.penalty, o.beta, c, agg)
             for o, c, agg in zip(OBJECTIVES, [None, 1.5] * 20, ["grpo", "bnpo", "dr_grpo", "dapo"] * 10)]
    shared = [Objective(dv.clip_test(name), pn.penalty("k3"), 0.3, 2.0, agg)
              for name, agg in zip(dv.CLIP_TESTS, ["grpo", "dr_grpo", "bnpo"] * 10)]
    logp_new, logp_old, adv, mask, logp_ref = (x.detach().numpy() for x in random_batch(5, spread=1.0))
    for objectives in (mixed, shared):
        runs = len(objectives)
        weights = np.stack([aggregation_weights(mask, o.aggregation) for o in objectives])
        rows = [np.stack([x] * runs) for x in (logp_new, logp_old, adv, logp_ref)]
        rows[0] = rows[0] + 0.1 * np.arange(runs)[:, None, None]  # a different point per run
        stacked = PolicyLossGradient(objectives, weights).batch(rows[1], rows[2], rows[3])(rows[0])
        for r, objective in enumerate(objectives):
            alone = PolicyLossGradient([objective], weights[r:r + 1]).batch(*(x[r:r + 1] for x in rows[1:]))(rows[0][r:r + 1])
            assert np.array_equal(stacked.grad[r], alone.grad[0]), objective.label
            assert np.array_equal(stacked.masked_low[r], alone.masked_low[0])
            assert np.array_equal(stacked.masked_high[r], alone.masked_high[0])


@pytest.mark.parametrize("name", ["fkl", "rkl", "ufkl", "urkl"])
def test_rpg_reinforce_and_differentiable_forms_have_the_same_gradient(name):
    """RPG Proposition 4.1, on the full RPG loss (reward part unclipped, as in RPG Tables 1–2)."""
    logp_new, logp_old, adv, mask, _ = random_batch(3, spread=0.3)
    beta = 0.3  # large so that the penalty's share of the gradient is visible
    diff = policy_loss(logp_new, logp_old, adv, mask, Objective(penalty=pn.penalty(name), beta=beta))
    rf = policy_loss(logp_new, logp_old, adv, mask, Objective(penalty=pn.penalty(f"{name}_rf"), beta=beta))
    g_diff, g_rf = grads(diff, logp_new), grads(rf, logp_new)
    assert torch.allclose(g_diff, g_rf, rtol=1e-10, atol=1e-13)
    # and against RPG's written REINFORCE loss −sg(w A + β g(w)) log π (grpo mean)
    w = (logp_new - logp_old).exp().detach()
    weight = {"fkl": torch.ones_like(w), "rkl": -w * (w.log() + 1), "ufkl": -(w - 1), "urkl": -w * w.log()}[name]
    per_token = -(w * adv[:, None] + beta * weight) * logp_new
    ref = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    (g_ref,) = torch.autograd.grad(ref, logp_new)
    assert torch.allclose(g_rf, g_ref, rtol=1e-10, atol=1e-13)
    assert torch.equal(diff.penalty, rf.penalty)  # the value shown is the same divergence


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "prob_l2", "mirror"])
def test_reference_penalties_enter_the_loss_with_beta(name):
    logp_new, logp_old, adv, mask, logp_ref = random_batch(5)
    base = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("ratio")))
    pen = pn.penalty(name)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("ratio"), penalty=pen, beta=0.5),
                      logp_ref=logp_ref)
    value = pen.value(logp_new, logp_old, logp_ref)
    expected = base.loss + 0.5 * ((value * mask).sum(1) / mask.sum(1)).mean()
    assert float(out.loss) == pytest.approx(float(expected), rel=1e-12)
    assert torch.allclose(out.penalty, (value * mask).detach())


def test_k3_penalty_gradient_in_log_prob():
    # docs/theory.md §2.3: ∂/∂log p of GRPO's k3 is 1 − p_ref/p, of ProbL2 2p(p − p_ref)
    for p, p_ref, k3_slope, l2_slope in ((0.5, 0.4, 0.2, 0.1), (0.01, 0.008, 0.2, 4e-5)):
        lp = torch.tensor([math.log(p)], dtype=F64, requires_grad=True)
        ref = torch.tensor([math.log(p_ref)], dtype=F64)
        (g3,) = torch.autograd.grad(pn.penalty("k3").value(lp, lp, ref).sum(), lp)
        (g2,) = torch.autograd.grad(pn.penalty("prob_l2").value(lp, lp, ref).sum(), lp)
        assert float(g3) == pytest.approx(k3_slope, rel=1e-12)
        assert float(g2) == pytest.approx(l2_slope, rel=1e-12)


def test_no_clip_is_plain_importance_weighted_surrogate():
    logp_new, logp_old, adv, mask, _ = random_batch(2)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(aggregation="bnpo"))
    w = (logp_new - logp_old).exp()
    ref = (-(w * adv[:, None]) * mask).sum() / mask.sum()
    assert float(out.loss) == pytest.approx(float(ref), rel=1e-12)
    assert out.clip_value is None and not out.outside.any()


def test_padding_is_ignored():
    logp_new, logp_old, adv, mask, _ = random_batch(4)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("kl3")))
    noisy = logp_new.detach().clone()
    noisy[mask == 0] = -30.0  # garbage on padding must not change anything
    out2 = policy_loss(noisy.requires_grad_(), logp_old, adv, mask, Objective(clip=dv.clip_test("kl3")))
    assert float(out.loss) == pytest.approx(float(out2.loss), rel=1e-12)
    assert not out2.outside[mask == 0].any()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes_and_devices(device, dtype):
    logp_new, logp_old, adv, mask, logp_ref = (x.detach().to(device=device, dtype=dtype) for x in random_batch(6))
    logp_new.requires_grad_()
    for clip in (dv.clip_test("kl3"), dv.clip_test("prob_tv"), dv.clip_test("kl1")):
        out = policy_loss(logp_new, logp_old, adv, mask,
                          Objective(clip=clip, penalty=pn.penalty("mirror"), beta=0.1, dual_clip_c=3.0,
                                    aggregation="dr_grpo"),
                          logp_ref=logp_ref)
        g = grads(out, logp_new)
        assert out.loss.dtype == dtype and g.dtype == dtype and out.loss.device.type == device
        assert torch.isfinite(out.loss) and torch.isfinite(g).all()
    ref64 = policy_loss(*(x.detach().double().cpu() for x in (logp_new, logp_old, adv, mask)),
                        Objective(clip=dv.clip_test("kl3"))).loss
    got = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=dv.clip_test("kl3"))).loss
    assert float(got) == pytest.approx(float(ref64), rel=1e-5 if dtype == torch.float32 else 1e-12)


def test_bad_arguments_are_refused_with_the_typed_error():
    logp_new, logp_old, adv, mask, _ = random_batch(0)
    with pytest.raises(dv.DivvizInputError, match="unknown aggregation 'sum'"):
        policy_loss(logp_new, logp_old, adv, mask, Objective(aggregation="sum"))
    with pytest.raises(dv.DivvizInputError, match="parameter 'c'"):
        policy_loss(logp_new, logp_old, adv, mask, Objective(dual_clip_c=0.5))
    with pytest.raises(dv.DivvizInputError, match="needs reference log-probs"):
        policy_loss(logp_new, logp_old, adv, mask, Objective(penalty=pn.penalty("k3"), beta=0.1))


def test_overshoot_counts_tokens_past_the_bound_their_advantage_pushes_toward():
    """By hand, ratio ε = 0.2 ([0.8, 1.2]): A > 0 ending at w = 1.3 overshot; A > 0 at 0.7 did not (it went the other
    way); A < 0 at 0.7 overshot; A < 0 at 1.3 did not; a padded token never counts."""
    from divviz.metrics import overshoot

    ratio = torch.tensor([[1.3, 0.7, 2.0], [0.7, 1.3, 1.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    assert overshoot(ratio, adv, mask, dv.clip_test("ratio", eps=0.2), ratio) == 2 / 4
    assert overshoot(ratio, adv, mask, None, ratio) == 0.0


@pytest.mark.parametrize("clip", [*dv.CLIP_TESTS, None])
def test_the_bandits_overshoot_equals_the_engines(clip):
    """PolicyLossGradient.overshoot (numpy, the bandit) against metrics.overshoot (torch, the engine) on the same
    random tokens, for every clip test (prob_tv's bounds depend on π_old)."""
    from divviz.metrics import overshoot

    g = np.random.default_rng(3)
    logp_old = np.log(g.uniform(0.01, 1.0, (1, 64, 1)))
    logp_after = logp_old + g.normal(0, 0.4, logp_old.shape)
    adv = g.normal(size=(1, 64))
    test = None if clip is None else dv.clip_test(clip)
    gradient = PolicyLossGradient([Objective(clip=test)], aggregation_weights(np.ones((64, 1)), "grpo")[None])
    counted = gradient.batch(logp_old, adv).overshoot(logp_after).mean()
    t = lambda x: torch.as_tensor(x[0])  # noqa: E731
    want = overshoot(t(np.exp(logp_after - logp_old)), t(adv), torch.ones(64, 1, dtype=torch.float64), test,
                     t(np.exp(logp_old)))
    assert counted == pytest.approx(want) and (clip is None) == (want == 0)


def test_two_penalties_add_with_their_own_coefficients():
    """GBMPO's prob_l2kl (aligntune's ProbL2KLGRPOTrainer: PPO + β·k3 + λ·(π_θ − π_ref)²): the loss is the one-penalty
    loss plus λ times the second penalty aggregated alike, the gradient likewise, and the bandit's closed form
    equals autograd."""
    logp_new, logp_old, adv, mask = random_token_batch(11, completions=5, length=4)
    logp_ref = (logp_old + 0.3 * torch.randn(5, 4, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
                ).clamp(max=-1e-3)
    logp_new.requires_grad_()
    both = Objective(clip=dv.clip_test("ratio"), penalty=pn.penalty("k3"), beta=0.04,
                     second_penalty=pn.penalty("prob_l2"), second_beta=0.1, aggregation="dr_grpo")
    one = Objective(clip=dv.clip_test("ratio"), penalty=pn.penalty("k3"), beta=0.04, aggregation="dr_grpo")
    l2 = Objective(clip=dv.clip_test("ratio"), penalty=pn.penalty("prob_l2"), beta=0.1, aggregation="dr_grpo")
    plain = Objective(clip=dv.clip_test("ratio"), aggregation="dr_grpo")
    outs = [o(logp_new, logp_old, adv, mask, logp_ref) for o in (both, one, l2, plain)]
    assert outs[0].loss.item() == pytest.approx((outs[1].loss + outs[2].loss - outs[3].loss).item(), rel=1e-12)
    grads = [torch.autograd.grad(out.loss, logp_new)[0] for out in outs]
    torch.testing.assert_close(grads[0], grads[1] + grads[2] - grads[3], rtol=1e-12, atol=1e-15)
    assert both.label == "ratio ε=0.2 + 0.04·k3 + 0.1·prob_l2" and both.needs_ref
    weights = aggregation_weights(mask.numpy(), "dr_grpo")[None]
    fast = PolicyLossGradient([both], weights).batch(logp_old.numpy()[None], adv.numpy()[None], logp_ref.numpy()[None])
    np.testing.assert_allclose(fast(logp_new.detach().numpy()[None]).grad[0], grads[0].numpy(), rtol=1e-12, atol=1e-15)


def test_the_off_policy_sequence_mask_is_trls_and_acts_on_the_policy_term_only():
    """TRL 1.16's `get_off_policy_mask` (DeepSeek-V3.2) with π_old as the sampling policy: policy_loss drops exactly
    its completions from the policy term, keeps the penalty on them, and the bandit's closed form agrees."""
    from trl import GRPOTrainer

    logp_new, logp_old, adv, mask = random_token_batch(5, completions=12, length=6, spread=0.8)
    logp_ref = logp_old - 0.2
    logp_new.requires_grad_()
    trl_mask = GRPOTrainer.get_off_policy_mask(advantages=adv[:, None], per_token_logps=logp_new,
                                               sampling_per_token_logps=logp_old, mask=mask, off_policy_threshold=0.1)
    assert 0 < trl_mask.sum() < len(trl_mask)
    masked = Objective(clip=dv.clip_test("kl3"), penalty=pn.penalty("k3"), beta=0.1, off_policy_mask_threshold=0.1)
    weighted = Objective(clip=dv.clip_test("kl3"), penalty=pn.penalty("k3"), beta=0.1)
    ours = masked(logp_new, logp_old, adv, mask, logp_ref)
    theirs = weighted(logp_new, logp_old, adv, mask, logp_ref, weight=trl_mask)
    assert ours.loss.item() == pytest.approx(theirs.loss.item(), rel=1e-12)
    grad = torch.autograd.grad(ours.loss, logp_new)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(theirs.loss, logp_new)[0], rtol=1e-12, atol=1e-15)
    assert masked.label == "kl3 δ=0.05 + 0.1·k3 OPSM δ=0.1"
    weights = aggregation_weights(mask.numpy(), "grpo")[None]
    fast = PolicyLossGradient([masked], weights).batch(logp_old.numpy()[None], adv.numpy()[None], logp_ref.numpy()[None])
    np.testing.assert_allclose(fast(logp_new.detach().numpy()[None]).grad[0], grad.numpy(), rtol=1e-12, atol=1e-15)


def test_the_off_policy_mask_reads_the_sampling_policy_where_one_is_given():
    """With a sampler's log-probs (vLLM's in TRL, divviz's lagging or low-precision sampler), TRL's mask judges π_θ
    against them, not against π_old: policy_loss(logp_sampling=…) drops TRL's completions for that sampling policy,
    which are not those for π_old here; LossOutput.policy_weight is that mask times the weight, on every token."""
    from trl import GRPOTrainer

    logp_new, logp_old, adv, mask = random_token_batch(6, completions=12, length=6, spread=0.3)
    logp_sampling = logp_old + 0.6 * torch.randn(logp_old.shape, generator=torch.Generator().manual_seed(1),
                                                 dtype=logp_old.dtype)
    trl_mask = GRPOTrainer.get_off_policy_mask(advantages=adv[:, None], per_token_logps=logp_new,
                                               sampling_per_token_logps=logp_sampling, mask=mask,
                                               off_policy_threshold=0.1)
    for_old = GRPOTrainer.get_off_policy_mask(advantages=adv[:, None], per_token_logps=logp_new,
                                              sampling_per_token_logps=logp_old, mask=mask, off_policy_threshold=0.1)
    assert not torch.equal(trl_mask, for_old) and 0 < trl_mask.sum() < len(trl_mask)
    weight = torch.rand(logp_old.shape, generator=torch.Generator().manual_seed(2), dtype=logp_old.dtype)
    masked = Objective(clip=dv.clip_test("ratio"), off_policy_mask_threshold=0.1)
    ours = masked(logp_new, logp_old, adv, mask, weight=weight, logp_sampling=logp_sampling)
    theirs = Objective(clip=dv.clip_test("ratio"))(logp_new, logp_old, adv, mask, weight=weight * trl_mask)
    assert ours.loss.item() == pytest.approx(theirs.loss.item(), rel=1e-12)
    # exact on any CPU: both sides multiply the same float64 weight by 0s and 1s, and nothing else
    torch.testing.assert_close(ours.policy_weight, weight * trl_mask * mask, rtol=0, atol=0)
    assert Objective(clip=dv.clip_test("ratio"))(logp_new, logp_old, adv, mask).policy_weight is None


def test_a_mirror_map_from_an_explicit_phi():
    """GBMPO's φ in aligntune's layout [v, w, b, a, c] rebuilds a seeded map to a few ulps; the default φ is the generalised
    KL; hostile φ texts and files are refused, each with its reason."""
    from divviz.catalogue.mirror import MirrorMap, phi_map, phi_text

    seeded = MirrorMap.random(3, 0.05)
    phi = np.concatenate([seeded.v.numpy().ravel(), seeded.w.numpy().ravel(), seeded.b.numpy().ravel(),
                          [seeded.a, seeded.c]])
    text = " ".join(f"{x:.17g}" for x in phi)
    new, ref = torch.tensor([-0.7, -2.0], dtype=torch.float64), torch.tensor([-0.9, -1.5], dtype=torch.float64)
    # the same map rebuilt from 17-digit text: equal up to how the two sets of tensors are laid out for torch's
    # kernels, a few ulps at most
    torch.testing.assert_close(pn.penalty("mirror_phi", phi=text).value(new, None, ref), seeded.bregman(new, ref),
                               rtol=1e-15, atol=0)
    y, y0 = new.exp(), ref.exp()
    torch.testing.assert_close(pn.penalty("mirror_phi").value(new, None, ref), y * (y / y0).log() - (y - y0),
                               rtol=1e-12, atol=1e-15)
    state = json.dumps({"best_phi": phi.tolist()}).encode()
    assert phi_map(phi_text(state, "es_state.json")).a == pytest.approx(seeded.a, rel=1e-15)
    buffer = io.BytesIO()
    np.save(buffer, phi)
    assert phi_map(phi_text(buffer.getvalue(), "phi.npy")).c == pytest.approx(seeded.c, rel=1e-8)
    hostile = [("1 2 3", "needs 380 numbers"), (" ".join(["0.1"] * 379 + ["nan"]), "number 380 is nan"),
               (" ".join(["0.1"] * 379 + ["-1"]), "must be finite and ≥ 0"),
               (" ".join(["0.1"] * 379 + ["__import__"]), "'__import__', which is not a number"),
               ("9" * 20_000, "characters long")]
    for bad, says in hostile:
        with pytest.raises(pn.DivvizInputError, match=says):
            pn.penalty("mirror_phi", phi=bad)
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for source, name, says in ((pickled.getvalue(), "phi.npy", "not a readable .npy"),
                               (b"\xff\xfe\x00", "phi.txt", "neither a .npy array nor text"),
                               (b'{"weights": 1}', "phi.json", "no list of numbers")):
        with pytest.raises(pn.DivvizInputError, match=says):
            phi_text(source, name)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_prefix_weights_are_the_rows_of_the_masks_weights(aggregation):
    """Completions whose masks are their first n tokens (an imported step's): `prefix_weights` gives each row's
    weight equal to `aggregation_weights` on the padded mask, to the bit, an empty completion included."""
    lengths = [3, 0, 7, 1, 7, 2]
    mask = np.array([[1.0] * n + [0.0] * (7 - n) for n in lengths])  # padded to the longest, as a step is
    for width in (None, 12):  # dr_grpo's max_completion_length, or the mask's width
        full = aggregation_weights(mask, aggregation, width)
        rows = prefix_weights(lengths, aggregation, width)
        for row, n in enumerate(lengths):
            assert np.array_equal(full[row, :n], np.full(n, rows[row])) and not full[row, n:].any()
