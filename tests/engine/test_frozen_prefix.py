"""The frozen prefix once per batch (`engine/frozen_prefix.py`): the trained blocks run from the hidden states kept at
the first trained block give the full forward's logits (float32 here on the built-in model, float32 and bfloat16 on
SmolLM2 in test_real_model.py), the first mini-batch's ratios stay exactly 1, a μ = 2, K = 8 step and a step with a
reference penalty train as the full forward trains them, and models outside the family take the full forward."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from divviz.engine import grpo
from divviz.engine.config import RunConfig
from divviz.engine.frozen_prefix import first_trained_block, frozen_prefix, head_cast
from divviz.engine.grpo import grpo_step, make_batch, make_trainer, update
from divviz.engine.minibatch import minibatch_rows
from divviz.engine.rollout import completion_logits, completion_logps

FLOAT32 = dict(rtol=1e-5, atol=1e-6)  # measured here: |Δ logit| ≤ 2e-6 (the built-in model), ≤ 4e-5 (SmolLM2)


def trainer(**settings):
    """The built-in model with its last block of two trained: the first block is the frozen prefix."""
    return make_trainer(RunConfig.make(task="reverse", prompts=8, group_size=4, seed=3, trainable_blocks=1,
                                       **settings))


def test_the_trained_block_from_the_prefix_gives_the_full_forwards_logits():
    tr = trainer()
    batch = make_batch(tr, 0)
    assert batch.prefix is not None and batch.prefix.first == 1
    rollout, keep = batch.rollout, batch.rollout.completion_mask > 0
    with torch.no_grad():
        full = completion_logits(tr.model, rollout, tr.cfg.temperature, tr.autocast)
        tail = completion_logits(tr.model, rollout, tr.cfg.temperature, tr.autocast, batch.prefix)
        rows = torch.tensor([0, 5, 6, 30])
        part = completion_logits(tr.model, rollout.rows(rows), tr.cfg.temperature, tr.autocast, batch.prefix[rows])
    torch.testing.assert_close(tail[keep], full[keep], **FLOAT32)
    torch.testing.assert_close(part[keep[rows]], full[rows][keep[rows]], **FLOAT32)


def test_the_first_minibatch_is_on_policy_to_the_bit_from_the_prefix():
    tr = trainer(mu=1, minibatches=4, lr=1e-2)
    batch = make_batch(tr, 0)
    done = update(tr, batch, tr.objective, None, 0)
    first = minibatch_rows(32, 4, tr.cfg.seed * 104_729)[0]
    keep = batch.rollout.completion_mask[first] > 0
    assert torch.equal(done.out.ratio[first][keep], torch.ones(int(keep.sum())))
    assert done.fractions["kl/k3_by_minibatch/1"] == 0.0 and done.fractions["kl/k3_by_minibatch/2"] > 0


def bfloat16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_the_frozen_output_layer_is_cast_once_a_batch_and_gives_autocasts_logits_to_the_bit():
    """Under bfloat16 autocast the prefix holds the output layer's weight cast once; the logits and the trained
    block's gradients from it are those of autocast casting the weight at every call, to the bit."""
    tr = trainer()
    rollout = make_batch(tr, 0).rollout
    prefix = frozen_prefix(tr.model, rollout, bfloat16, 1)
    assert prefix.head is not None and torch.equal(prefix.head, tr.model.lm_head.weight.to(torch.bfloat16))
    rows = torch.tensor([0, 5, 6, 30])
    assert prefix[rows].head is prefix.head
    trained = [p for p in tr.model.parameters() if p.requires_grad]
    for part, once in ((rollout, prefix), (rollout.rows(rows), prefix[rows])):
        grads = []
        for way in (once, replace(once, head=None)):
            tr.model.zero_grad(set_to_none=True)
            logits = way.logits(tr.model, part, 0.7, bfloat16)
            (logits * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
            grads.append((logits.detach(), [p.grad.clone() for p in trained]))
        assert torch.equal(grads[0][0], grads[1][0])
        assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_nothing_is_cast_in_float32_or_where_the_output_layer_trains():
    tr = trainer()
    assert frozen_prefix(tr.model, make_batch(tr, 0).rollout, tr.autocast, 1).head is None  # float32
    tr.model.lm_head.weight.requires_grad_(True)
    assert head_cast(tr.model, bfloat16) is None


def full_forward(monkeypatch):
    """The step as it ran before the prefix: every forward through every block."""
    monkeypatch.setattr(grpo, "frozen_prefix", lambda *args: None)


@pytest.mark.parametrize("settings", [
    dict(mu=2, minibatches=8),
    dict(mu=1, minibatches=2, penalty="k3", beta=0.04),  # the reference's log-probs from the prefix too
])
def test_a_step_from_the_prefix_trains_as_the_full_forward_does(monkeypatch, settings):
    """The same metrics and the same policy after the step, to float32's rounding as Adam carries it (measured, μ = 2,
    K = 8: relative |Δ| ≤ 1e-6 in the loss and the gradient's norm, 5.5e-5 in k3, 1.2e-7 in π_old, 1.03e-3 in π_new
    after the sixteen updates). The policy is compared by its probabilities, not weight by weight: Adam moves a weight
    by up to ±lr whatever its gradient's size, so the rounding of a gradient that is a sum of terms cancelling to
    near zero (the attention's query and key weights here) moves its step, and so π_new, far more than the rounding
    of the forward moves the logits."""
    fast = trainer(**settings)
    slow = copy.deepcopy(fast)
    with_prefix = grpo_step(fast, 0)
    full_forward(monkeypatch)
    without = grpo_step(slow, 0)
    for key in ("loss", "kl", "clip_ratio/region_mean", "entropy", "reward", "grad_norm", "kl/k3"):
        if key in without.metrics:
            assert with_prefix.metrics[key] == pytest.approx(without.metrics[key], rel=1e-4, abs=1e-6), key
    np.testing.assert_allclose(with_prefix.tokens["pi_old"], without.tokens["pi_old"], rtol=1e-6, atol=1e-7)
    for fact in ("pi_new", "ratio"):
        np.testing.assert_allclose(with_prefix.tokens[fact], without.tokens[fact], rtol=3e-3, atol=1e-6, err_msg=fact)


def test_the_reference_shares_the_policys_prefix():
    tr = trainer(penalty="k3", beta=0.04)
    batch = make_batch(tr, 0)
    with torch.no_grad():
        want = completion_logps(tr.reference, batch.rollout, tr.cfg.temperature, tr.autocast)
        got = completion_logps(tr.reference, batch.rollout, tr.cfg.temperature, tr.autocast, prefix=batch.prefix)
    torch.testing.assert_close(got, want, **FLOAT32)


def test_a_model_outside_the_family_or_training_every_block_takes_the_full_forward():
    tr = trainer()
    assert first_trained_block(tr.model, 1) == 1
    assert first_trained_block(tr.model, 0) is None  # every parameter trains
    assert first_trained_block(tr.model, 2) is None  # both blocks train: nothing is frozen but the embeddings
    assert make_batch(make_trainer(RunConfig.make(task="reverse", prompts=2, group_size=2)), 0).prefix is None
    unfrozen = copy.deepcopy(tr.model)
    unfrozen.get_decoder().layers[0].requires_grad_(True)
    assert first_trained_block(unfrozen, 1) is None  # the prefix would not be frozen
    sliding = copy.deepcopy(tr.model)
    sliding.get_decoder().config.layer_types = ["sliding_attention", "full_attention"]
    assert first_trained_block(sliding, 1) is None
    assert frozen_prefix(sliding, make_batch(tr, 0).rollout, tr.autocast, 1) is None
