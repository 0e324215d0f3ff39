"""Surrogates, GSPO's sequence level, TRL's ratio cap and the new aggregations and clip tests, against autograd and
hand-written formulas (float64); their refusals. TRL's and verl's own code are the oracle in test_trl.py and
test_verl.py."""

import numpy as np
import pytest
import torch

from divviz.catalogue import divergences as dv
from divviz.catalogue.aggregation import aggregation_weights
from divviz.cli import main
from divviz.loss_grids import gradient_weight
from divviz.bandit.loss_gradient import PolicyLossGradient
from divviz.losses import Objective, policy_loss
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.surrogates import SURROGATES, surrogate

F64 = torch.float64
RATIOS = np.geomspace(0.05, 20.0, 301)


def objective_for(name: str, **params) -> Objective:
    """The surrogate alone, or with kl3 where it masks with a clip test."""
    needs = SURROGATES[name].clip == "needs"
    return Objective(clip=dv.clip_test("kl3", delta=0.05) if needs else None, surrogate=surrogate(name, **params))


def random_rows(seed: int, batch: int = 6, tokens: int = 5, spread: float = 0.5):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(batch, tokens, generator=g, dtype=F64) * 3 - 0.05
    logp_new = (logp_old + spread * torch.randn(batch, tokens, generator=g, dtype=F64)).clamp(max=-1e-3)
    adv = torch.randn(batch, generator=g, dtype=F64)
    mask = (torch.arange(tokens)[None] < torch.tensor([5, 3, 1, 4, 5, 2])[:batch, None]).to(F64)
    return logp_new.requires_grad_(), logp_old, adv, mask


PER_TOKEN = [name for name, entry in SURROGATES.items() if entry.select is None]
SELECTING = [name for name, entry in SURROGATES.items() if entry.select is not None]


@pytest.mark.parametrize("name", PER_TOKEN)
def test_each_surrogates_closed_form_weight_is_its_autograd_gradient(name):
    """γ(w) as `Surrogate.weight` writes it (numpy, the bandit's and the docs') equals −(∂ℓ/∂log π)/A by autograd
    through policy_loss, for A = ±1 over w from 0.05 to 20, with kl3's mask for those that take a test."""
    objective = objective_for(name)
    got = gradient_weight(objective, RATIOS, pi_old=0.3)
    bounds = (0.0, np.inf) if objective.clip is None else objective.clip.bounds()
    for sign in (+1, -1):
        masked = (RATIOS > bounds[1]) if sign > 0 else (RATIOS < bounds[0])
        want = objective.surrogate.weight(RATIOS, np.full_like(RATIOS, sign), ~masked, None, bounds)
        np.testing.assert_allclose(got[sign], want, rtol=1e-12, atol=1e-15)
    at_one = objective.surrogate.weight(1.0, 1.0, None, None, bounds)
    assert np.isclose(got[+1][np.argmin(abs(RATIOS - 1))], at_one, rtol=1e-12)


@pytest.mark.parametrize("name", SELECTING)
def test_batch_selecting_surrogates_closed_form_is_autograd_on_the_tokens_they_pick(name):
    """kl_cov and clip_cov on a (B, T) batch with padding: ∂loss/∂log π by autograd equals the closed-form slope
    with the tokens their `select` picks (clip_cov's draw repeated from the same seed), and they pick some."""
    objective = Objective(clip=dv.clip_test("ratio") if SURROGATES[name].clip == "needs" else None,
                          surrogate=surrogate(name, ratio=0.2, **({"lb": -0.5, "ub": 0.5} if name == "clip_cov" else {})),
                          aggregation="token_sum")
    logp_new, logp_old, adv, mask = random_rows(3)
    torch.manual_seed(7)
    out = objective(logp_new, logp_old, adv, mask)
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    torch.manual_seed(7)
    arrays = [x.detach().numpy() for x in (logp_new, logp_old, adv[:, None].expand_as(mask), mask, ~out.grad_masked)]
    picked = objective.surrogate.selected(*arrays)
    assert 0 < picked.sum() < mask.sum()
    w = np.exp(arrays[0] - arrays[1])
    want = objective.surrogate.slope(w, arrays[2], arrays[4], picked) * arrays[3]
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-12, atol=1e-15)


def test_clip_cov_is_refused_by_the_bandit_and_says_why():
    with pytest.raises(DivvizInputError, match="clip_cov picks its tokens at random .* train it in the lab"):
        PolicyLossGradient([objective_for("clip_cov")], np.ones((1, 4, 1)))


def test_dro_pulls_back_by_its_log_ratio():
    """DRO's slope is −A + β log w: REINFORCE at w = 1, and a pull toward π_old that grows with |log w|."""
    dro = surrogate("dro", beta=0.5)
    w = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(dro.slope(w, np.zeros(3)), 0.5 * np.log(w), rtol=1e-15)
    np.testing.assert_allclose(dro.weight(w, np.ones(3)), 1 - 0.5 * np.log(w), rtol=1e-15)


def test_soft_weights_have_their_papers_shapes():
    """cispo's weight is w up to its cap and flat past it; sapo's is w·4σ(1−σ), 1 at w = 1 and falling on both sides;
    vespo's φ is 1 at W = 1 and fades to 0 far from it on both sides; gpg's is 1."""
    w = np.array([0.5, 1.0, 2.0, 10.0])
    assert list(surrogate("cispo", hi=2.0).weight(w, np.ones(4))) == [0.5, 1.0, 2.0, 2.0]
    sapo = surrogate("sapo").weight(np.array([0.2, 1.0, 5.0]), np.ones(3))
    assert sapo[1] == pytest.approx(1.0) and sapo[0] < 0.5 and sapo[2] < 0.5
    phi = surrogate("vespo").weight(np.array([0.01, 1.0, 10.0, 10.0]), np.array([1.0, 1.0, 1.0, -1.0]))
    assert phi[1] == pytest.approx(1.0) and (phi[[0, 2, 3]] < 0.01).all()
    assert list(surrogate("gpg").weight(w, -np.ones(4))) == [1.0] * 4


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "luspo", "token_sum"])
def test_the_bandits_closed_form_gradient_takes_every_surrogate(aggregation):
    """`PolicyLossGradient` with surrogates, the sequence level and the ratio cap, runs side by side, on one-token
    completions (the bandit's), equals autograd through policy_loss."""
    g = torch.Generator().manual_seed(4)
    logp_old = -torch.rand(12, 1, generator=g, dtype=F64) * 3 - 0.05
    logp_new = (logp_old + torch.randn(12, 1, generator=g, dtype=F64)).clamp(max=-1e-3).requires_grad_()
    adv, mask = torch.randn(12, generator=g, dtype=F64), torch.ones(12, 1, dtype=F64)
    drawn_at_random = [name for name, entry in SURROGATES.items() if entry.random]
    objectives = [Objective(o.clip, None, 0.0, None, aggregation, o.surrogate)
                  for o in map(objective_for, [n for n in SURROGATES if n not in drawn_at_random])]
    objectives.append(Objective(surrogate=surrogate("kl_cov", ratio=0.3, coef=0.5), aggregation=aggregation))
    objectives += [Objective(clip=dv.clip_test("kl3"), importance_sampling_level="sequence", aggregation=aggregation),
                   Objective(clip=dv.clip_test("clip_higher"), ratio_cap=1.1, aggregation=aggregation),
                   Objective(clip=dv.clip_test("kl3", delta=0.01), ratio_cap=1.5, aggregation=aggregation)]
    weights = np.stack([aggregation_weights(mask.numpy(), aggregation)] * len(objectives))
    old, a = np.stack([logp_old.numpy()] * len(objectives)), np.stack([adv.numpy()] * len(objectives))
    fast = PolicyLossGradient(objectives, weights).batch(old, a)(np.stack([logp_new.detach().numpy()] * len(objectives)))
    for r, objective in enumerate(objectives):
        (grad,) = torch.autograd.grad(objective(logp_new, logp_old, adv, mask).loss, logp_new)
        np.testing.assert_allclose(fast.grad[r], grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=objective.label)


def test_the_closed_form_gradient_refuses_sequence_levels_on_longer_completions():
    with pytest.raises(DivvizInputError, match="one-token completions"):
        PolicyLossGradient([Objective(surrogate=surrogate("vespo"))], np.ones((1, 4, 3)))


def test_gspo_judges_and_weighs_each_completion_by_its_geometric_mean_ratio():
    """GSPO (TRL's importance_sampling_level="sequence"): the loss is mean_i −min(s_i A_i, clip(s_i) A_i) with
    s_i = exp(mean_t log w_t), and its gradient that of the same written with one ratio per completion, (B, 1), as
    TRL writes it; every token of a completion shares its clip state."""
    logp_new, logp_old, adv, mask = random_rows(2)
    box = dv.clip_test("clip_higher", eps_low=0.05, eps_high=0.08)
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=box, importance_sampling_level="sequence"))
    s = (((logp_new - logp_old) * mask).sum(-1) / mask.sum(-1)).exp()
    want = (-torch.minimum(s * adv, s.clamp(0.95, 1.08) * adv)).mean()
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-12)
    (got,), (expected,) = torch.autograd.grad(out.loss, logp_new), torch.autograd.grad(want, logp_new)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-15)
    kept = mask > 0
    for row in range(len(adv)):
        assert out.outside[row][kept[row]].all() or not out.outside[row][kept[row]].any()
    assert 0 < out.outside.any(-1).sum() < len(adv)


def test_the_ratio_cap_is_dual_clip_when_at_least_u_and_masks_rising_tokens_below_u():
    """TRL's delta: with δ ≥ u it is dual-clip with c = δ (loss, gradient, which tokens are capped); with δ < u a
    token with A > 0 and δ < w ≤ u loses its gradient too (the issue's "equals dual-clip only when δ ≥ 1 + ε_high")."""
    logp_new, logp_old, adv, mask = random_rows(7, spread=1.0)  # has tokens of both kinds
    box = dv.clip_test("clip_higher", eps_low=0.2, eps_high=0.28)
    capped = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=box, ratio_cap=1.5))
    dual = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=box, dual_clip_c=1.5))
    assert capped.loss.item() == pytest.approx(dual.loss.item(), rel=1e-12)
    torch.testing.assert_close(*(torch.autograd.grad(o.loss, logp_new)[0] for o in (capped, dual)))
    assert torch.equal(capped.dual_clip, dual.dual_clip) and capped.dual_clip.any()
    low = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=box, ratio_cap=1.05))
    (grad,) = torch.autograd.grad(low.loss, logp_new)
    w = low.ratio
    rising = (w > 1.05) & (w <= 1.28) & (adv[:, None] > 0) & (mask > 0)
    assert rising.any() and (grad[rising] == 0).all() and low.grad_masked[rising].all()


def test_verls_sum_aggregations_against_hand_sums():
    logp_new, logp_old, adv, mask = random_rows(5)
    per_token = policy_loss(logp_new, logp_old, adv, mask).per_token_loss
    rows = per_token.sum(-1)
    assert policy_loss(logp_new, logp_old, adv, mask, Objective(aggregation="luspo")).loss.item() == pytest.approx(
        rows.mean().item(), rel=1e-12)
    assert policy_loss(logp_new, logp_old, adv, mask, Objective(aggregation="token_sum")).loss.item() == pytest.approx(
        rows.sum().item(), rel=1e-12)


@pytest.mark.parametrize("pi_old", [1e-4, 0.01, 0.3, 0.7, 0.99, 1.0])
def test_dppo_kl_interval_is_its_predicate(pi_old):
    """The binary-KL test's [l, u] (bisection) holds exactly the ratios its predicate accepts, on a grid."""
    test = dv.clip_test("dppo_kl", delta_low=0.05, delta_high=0.1)
    lower, upper = (float(b) for b in test.bounds(np.asarray(pi_old)))
    w = np.geomspace(max(lower, 1e-300) / 3, min(upper * 3, 1 / pi_old), 2001)
    w = w[(abs(w / lower - 1) > 1e-9) & (abs(w / upper - 1) > 1e-9) & (w * pi_old < 1)]
    new, old = np.log(w * pi_old), np.full_like(w, np.log(pi_old))
    assert np.array_equal(test.feasible(new, old), (w >= lower) & (w <= upper))
    assert lower < 1 <= upper


@pytest.mark.parametrize("make, says", [
    (lambda: Objective(clip=dv.clip_test("kl3"), surrogate=surrogate("cispo")), "drop the clip test kl3"),
    (lambda: Objective(surrogate=surrogate("dppo")), "masks tokens with a clip test"),
    (lambda: Objective(surrogate=surrogate("sapo"), dual_clip_c=2.0), "dual-clip acts on PPO's clipped surrogate"),
    (lambda: Objective(surrogate=surrogate("gpg"), ratio_cap=2.0), "the ratio cap δ acts on PPO's"),
    (lambda: Objective(surrogate=surrogate("vespo"), importance_sampling_level="sequence"), "has a level of its own"),
    (lambda: Objective(clip=dv.clip_test("prob_tv"), importance_sampling_level="sequence"), "depends on π_old"),
    (lambda: Objective(importance_sampling_level="sentence"), "unknown importance-sampling level 'sentence'"),
    (lambda: Objective(ratio_cap=1.0), "ratio_cap"),
    (lambda: Objective(ratio_cap=float("nan")), "ratio_cap"),
    (lambda: surrogate("ppo2"), "unknown surrogate 'ppo2'"),
    (lambda: surrogate("cispo", hi=0.5), "hi"),
    (lambda: surrogate("sapo", tau_pos=0), "tau_pos"),
])
def test_what_does_not_go_together_is_refused_in_one_message(make, says):
    with pytest.raises(DivvizInputError, match=says):
        make()


def test_the_cli_trains_a_surrogate_and_refuses_a_bad_one(tmp_path, capsys):
    args = ["train", "--steps", "1", "--prompts", "1", "--group-size", "2", "--max-new-tokens", "3",
            "--runs-dir", str(tmp_path), "--now"]
    assert main([*args, "--surrogate", "sapo:tau_neg=2", "--aggregation", "grpo"]) == 0
    assert "done" in capsys.readouterr().out
    assert main([*args, "--surrogate", "cispo", "--measure", "kl3"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert main([*args, "--surrogate", "__import__('os')"]) == 2
    assert "unknown surrogate" in capsys.readouterr().err
