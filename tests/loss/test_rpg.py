"""divviz against RPG's own code (complex-reasoning/RPG), through reference vectors (tests/data/rpg_reference.json,
written by scripts/rpg_reference.py from RPG's core_algos.py): its Algorithm 2 (the KL term inside the clipped
advantage) and its two advantage baselines, in float64."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from divviz.bandit.loss_gradient import PolicyLossGradient
from divviz.catalogue.aggregation import aggregation_weights, group_advantages
from divviz.catalogue.divergences import clip_test
from divviz.catalogue.penalties import penalty
from divviz.catalogue.surrogates import surrogate
from divviz.losses import Objective

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "rpg_reference.json").read_text())
F64 = torch.float64
AGGREGATIONS = {"token-mean": "bnpo", "seq-mean-token-sum": "luspo", "seq-mean-token-mean": "grpo"}


def rpg_objective(case: dict) -> Objective:
    box = DATA["meta"]["box"]
    return Objective(clip=clip_test("clip_higher", eps_low=box["clip_ratio_low"], eps_high=box["clip_ratio_high"]),
                     surrogate=surrogate(f"rpg_{case['kl']}", beta=case["beta"], c=box["clip_ratio_c"]),
                     aggregation=AGGREGATIONS[case["loss_agg_mode"]])


def batch(name: str) -> list[torch.Tensor]:
    b = DATA["batches"][name]
    return [torch.tensor(b[k], dtype=F64) for k in ("log_prob", "old_log_prob", "advantages", "response_mask")]


@pytest.mark.parametrize("key", list(DATA["policy_loss"]))
def test_rpg_algorithm_2_is_rpgs_reinforce_loss_with_its_clip(key):
    """RPG's compute_policy_loss_reinforce(kl_type='rpg_rf_<kl>_clip_ppo') equals policy_loss with the rpg_<kl>
    surrogate and clip_higher's box: loss and gradient in log π (token-mean: verl's masked_mean adds 1e-8 to the
    token count), and the bandit's closed-form slope equals the same gradient."""
    case = DATA["policy_loss"][key]
    logp_new, logp_old, adv, mask = batch(case["batch"])
    logp_new.requires_grad_()
    objective = rpg_objective(case)
    out = objective(logp_new, logp_old, adv, mask)
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    close = {"rel": 1e-7, "abs": 0} if case["loss_agg_mode"] == "token-mean" else {"rel": 1e-12, "abs": 1e-15}
    assert out.loss.item() == pytest.approx(case["loss"], **close)
    want = torch.tensor(case["grad_log_prob"], dtype=F64)
    torch.testing.assert_close(grad, want, rtol=max(close["rel"], 1e-10), atol=1e-15)
    weights = aggregation_weights(mask.numpy(), objective.aggregation)[None]
    fast = PolicyLossGradient([objective], weights).batch(logp_old.numpy()[None], adv.numpy()[None])(
        logp_new.detach().numpy()[None])
    np.testing.assert_allclose(fast.grad[0], grad.numpy(), rtol=1e-12, atol=1e-15)


def test_the_kl_term_is_dropped_where_the_clip_binds_unlike_the_additive_form():
    """Algorithm 2 against PPO + β·ufkl_rf with dual-clip: on the tokens the clip (or c) holds it has no gradient at
    all, where the additive form keeps β(w − 1); inside the box [l, u] the two agree (elsewhere Algorithm 2's KL reads
    the clipped w̄)."""
    logp_new, logp_old, adv, mask = batch("a")
    logp_new.requires_grad_()
    box = clip_test("clip_higher", eps_low=0.2, eps_high=0.28)
    inside = Objective(clip=box, surrogate=surrogate("rpg_ufkl", beta=0.5, c=3.0), aggregation="token_sum")
    additive = Objective(clip=box, penalty=penalty("ufkl_rf"), beta=0.5, dual_clip_c=3.0, aggregation="token_sum")
    grads = [torch.autograd.grad(o(logp_new, logp_old, adv, mask).loss, logp_new)[0] for o in (inside, additive)]
    w = (logp_new - logp_old).exp().detach()
    held = ((adv > 0) & (w >= 1.28) | (adv <= 0) & ((w < 0.8) | (w >= 3.0))) & (mask > 0)
    assert held.any() and (~held & (mask > 0)).any()
    assert (grads[0][held] == 0).all() and (grads[1][held & (adv != 0)] != 0).all()
    in_box = (w >= 0.8) & (w <= 1.28) & (mask > 0)
    assert in_box.sum() > 5
    torch.testing.assert_close(grads[0][in_box], grads[1][in_box], rtol=1e-12, atol=1e-15)


def test_rpgs_group_mean_and_batch_mean_baselines():
    """RPG's advantage estimators: r − its group's mean, and r − the batch's mean, neither divided by a std."""
    case = DATA["advantages"]
    scores = torch.tensor(case["scores"], dtype=F64).view(3, 4)
    assert group_advantages(scores, "none").flatten().tolist() == pytest.approx(case["group_mean"], rel=1e-15)
    got = group_advantages(scores, "none", baseline="batch")
    assert got.flatten().tolist() == pytest.approx(case["batch_mean"], rel=1e-15, abs=1e-15)
    assert not np.allclose(case["group_mean"], case["batch_mean"])


def test_the_engine_trains_rpg_with_its_batch_mean_baseline(tmp_path):
    """A real run: RPG's Algorithm 2 with the batch-mean baseline and no std; the recorded advantages are each
    reward minus the step's mean reward. The TRL backend, which subtracts group means, refuses the baseline."""
    from divviz.catalogue.params import DivvizInputError
    from divviz.engine.config import RunConfig
    from divviz.runs import store
    from divviz.runs.train import train

    settings = {"task": "reverse", "prompts": 3, "group_size": 4, "steps": 2, "mu": 2, "max_new_tokens": 6,
                "clip": "clip_higher", "surrogate": "rpg_urkl", "surrogate_params": {"beta": 0.1},
                "baseline": "batch", "scale_rewards": "none", "inspect_prompts": 3}
    folder = train(RunConfig.make(**settings), tmp_path)
    assert store.read_run(folder).state == "done"
    for step in store.completion_steps(folder):
        completions = [c for g in store.read_completions(folder, step)["groups"] for c in g["completions"]]
        rewards = np.array([c["reward"] for c in completions])
        assert [c["advantage"] for c in completions] == pytest.approx(rewards - rewards.mean(), abs=1e-6)
    with pytest.raises(DivvizInputError, match="TRL's GRPOTrainer subtracts each group's mean"):
        RunConfig.make(**{**settings, "backend": "trl"})
