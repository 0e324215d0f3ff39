"""divviz's losses inside verl 0.9.1 (`divviz.verl`): verl loads divviz's plugin itself, and verl's own dispatch
(`get_policy_loss_fn`) on a divviz loss mode equals verl's built-in vanilla loss for PPO's box, and divviz's
`policy_loss` under verl's aggregation for a clip test, a surrogate and a penalty — loss, gradient, clip fractions —
on CPU tensors, as verl's own CPU tests call it. verl's GPU trainer is not run here."""

import os
import subprocess
import sys

import pytest
import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
from verl.workers.config.actor import ActorConfig

from divviz.catalogue.divergences import clip_test
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import penalty
from divviz.catalogue.surrogates import surrogate
from divviz.losses import Objective, policy_loss
from divviz.verl.policy_loss import register

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")


def config(**kwargs) -> ActorConfig:
    return ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, rollout_n=1, **kwargs)


def batch(seed: int = 0):
    """A batch where both clips and verl's dual-clip (A < 0, w > 3) bind, with one completion cut short."""
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(4, 7, generator=g, dtype=torch.float64)
    new = old + 0.6 * torch.randn(4, 7, generator=g, dtype=torch.float64)
    new[0, 0] = old[0, 0] + 1.5  # w ≈ 4.5
    adv = torch.randn(4, 7, generator=g, dtype=torch.float64)
    adv[0, 0] = -1.0
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[2, 4:] = False
    return old, new, adv, mask


def dispatch(mode: str, old, new, adv, mask, agg: str, cfg=None, weights=None):
    """verl's dispatch on its own signature: (loss, gradient with respect to log_prob, metrics)."""
    new = new.clone().requires_grad_()
    loss, metrics = get_policy_loss_fn(mode)(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                            loss_agg_mode=agg, config=cfg or config(), rollout_is_weights=weights)
    return loss, torch.autograd.grad(loss, new)[0], metrics


def test_verl_loads_divvizs_plugin_in_a_fresh_process():
    """Importing verl registers every catalogue clip test and the spellings in $DIVVIZ_VERL_OBJECTIVES; a spelling
    that is no objective stops the import with divviz's message."""
    code = ("import verl; from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; "
            "print(sorted(k for k in R if k.startswith('divviz:')))")
    env = {**os.environ, "DIVVIZ_VERL_OBJECTIVES": "kl3:delta=0.02;none,surrogate=cispo"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    names = out.stdout
    assert "'divviz:kl3'" in names and "'divviz:clip_higher'" in names and "'divviz:kl3:delta=0.02'" in names
    assert "'divviz:none,surrogate=cispo'" in names
    with pytest.raises(DivvizInputError, match="delta"):
        register("kl3:delta=-1")
    with pytest.raises(DivvizInputError, match="needs a reference policy"):
        register("ratio,penalty=k3,beta=0.1")


@pytest.mark.parametrize("agg", MODES)
def test_divviz_ratio_in_verl_is_verls_vanilla_loss(agg):
    old, new, adv, mask = batch()
    weights = 0.5 + torch.rand(4, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cfg = config(clip_ratio=0.2, clip_ratio_c=3.0, global_batch_info={"dp_size": 2, "batch_num_tokens": 50,
                                                                       "global_batch_size": 8})
    ours = dispatch("divviz:ratio", old, new, adv, mask, agg, cfg, weights)
    theirs = dispatch("vanilla", old, new, adv, mask, agg, cfg, weights)
    assert ours[0].item() == pytest.approx(theirs[0].item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-12, atol=1e-15)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert ours[2][key] == pytest.approx(theirs[2][key], rel=1e-6), key
    assert theirs[2]["actor/pg_clipfrac_lower"] > 0  # the dual-clip bound somewhere


@pytest.mark.parametrize("mode, kwargs", [
    ("divviz:kl3:delta=0.02", {"clip": clip_test("kl3", delta=0.02), "dual_clip_c": 3.0}),
    ("divviz:none,surrogate=cispo", {"surrogate": surrogate("cispo")}),
    ("divviz:clip_higher,penalty=rkl,beta=0.1", {"clip": clip_test("clip_higher"), "penalty": penalty("rkl"),
                                                 "beta": 0.1, "dual_clip_c": 3.0}),
], ids=["clip test", "surrogate", "penalty"])
@pytest.mark.parametrize("agg, ours", [("token-mean", "bnpo"), ("seq-mean-token-mean", "grpo")])
def test_verls_dispatch_on_a_divviz_loss_equals_policy_loss(mode, kwargs, agg, ours):
    register(mode.removeprefix("divviz:"))
    old, new, adv, mask = batch(2)
    loss, grad, metrics = dispatch(mode, old, new, adv, mask, agg)
    x = new.clone().requires_grad_()
    out = policy_loss(x, old, adv, mask.to(torch.float64), Objective(aggregation=ours, **kwargs))
    expected_grad = torch.autograd.grad(out.loss, x)[0]
    tolerance = {"rel": 0.0, "abs": 1e-8} if agg == "seq-mean-token-mean" else {"rel": 1e-12, "abs": 1e-15}
    assert loss.item() == pytest.approx(out.loss.item(), **tolerance)  # verl's seq-mean adds 1e-8 to each count
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-8)
    tokens = mask.sum().item()
    assert metrics["divviz/clip_ratio/low_mean"] == pytest.approx((out.masked_low & mask).sum().item() / tokens)
    assert metrics["divviz/clip_ratio/high_mean"] == pytest.approx((out.masked_high & mask).sum().item() / tokens)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(((out.masked_low | out.masked_high) & mask).sum().item()
                                                         / tokens)
    per_token = agg_loss(loss_mat=out.per_token_loss, loss_mask=mask, loss_agg_mode=agg)
    assert loss.item() == pytest.approx(per_token.item(), rel=1e-12)
