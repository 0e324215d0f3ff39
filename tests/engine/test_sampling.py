"""The KV-cached sampler (`engine/rollout.py`): under bfloat16 autocast its linear layers' weights are cast once per
call instead of at every model call, and every sampled token and per-token fact stays the same to the bit."""

import contextlib

import torch

from divviz.engine import rollout
from divviz.engine.config import RunConfig
from divviz.engine.grpo import make_batch, make_trainer

SMALL = dict(prompts=4, group_size=4, max_new_tokens=8)
FACTS = ("completion_ids", "completion_mask", "logp", "entropy", "top1", "was_argmax")


def test_casting_the_linear_weights_once_samples_what_autocast_casting_at_every_call_samples(monkeypatch):
    tr = make_trainer(RunConfig.make(dtype="bfloat16", seed=3, **SMALL))
    assert tr.dtype == torch.bfloat16
    parameters = dict(tr.model.named_parameters())
    seen = set()  # the weights' precisions the linear layers ran with while sampling
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.add(m.weight.dtype))
             for m in tr.model.modules() if isinstance(m, torch.nn.Linear)]
    cast_once = make_batch(tr, 0).rollout
    assert seen == {torch.bfloat16}
    seen.clear()
    monkeypatch.setattr(rollout, "linear_weights_cast", lambda model, autocast: contextlib.nullcontext())
    cast_per_call = make_batch(tr, 0).rollout
    assert seen == {torch.float32}
    for hook in hooks:
        hook.remove()
    assert all(torch.equal(getattr(cast_once, f), getattr(cast_per_call, f)) for f in FACTS)
    after = dict(tr.model.named_parameters())  # the trained parameters are the same objects, in float32, after
    assert after.keys() == parameters.keys() and all(after[k] is parameters[k] for k in after)
    assert {p.dtype for p in after.values()} == {torch.float32}


def test_without_autocast_the_sampler_casts_nothing():
    tr = make_trainer(RunConfig.make(dtype="float32", **SMALL))
    linear = next(m for m in tr.model.modules() if isinstance(m, torch.nn.Linear))
    weight = linear.weight
    with rollout.linear_weights_cast(tr.model, tr.autocast):
        assert linear.weight is weight
