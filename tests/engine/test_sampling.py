"""The KV-cached sampler (`engine/rollout.py`): each token is drawn by the inverse of its cumulative distribution (its
definition, computed here in numpy, and its frequencies against scipy's chi-square test); under bfloat16 autocast its
linear layers' weights are cast once per call instead of at every model call, and every sampled token and per-token
fact stays the same to the bit; its decode loop waits for the device once per decoded token. (Each published run's
step 1 and the whole learn run checked against their published bits: tests/engine/test_grpo_step.py,
scripts/retrain_published.py.)"""

import contextlib

import numpy as np
import pytest
import torch
from scipy import stats

from divviz.engine import grpo, policy, rollout
from divviz.engine.config import RunConfig
from divviz.engine.grpo import make_batch, make_trainer

SMALL = dict(prompts=4, group_size=4, max_new_tokens=8)
FACTS = ("completion_ids", "completion_mask", "logp", "entropy", "top1", "was_argmax")


def test_a_token_is_the_first_whose_cumulative_probability_reaches_u_times_the_total():
    """The first v with F(v) ≥ u · F(V), u ~ U(0, 1] a row: the same u drawn here from the same seed."""
    probs = torch.softmax(torch.randn(500, 1000, generator=torch.Generator().manual_seed(1)) * 4, dim=-1)
    probs[:, ::3] = 0.0  # a third of the tokens never possible, the last one among them
    got = rollout.inverse_cdf_draw(probs, torch.Generator().manual_seed(7)).numpy()
    u = 1.0 - torch.rand((500, 1), dtype=torch.float64, generator=torch.Generator().manual_seed(7)).numpy()
    cdf = np.cumsum(probs.double().numpy(), axis=1)
    assert np.array_equal(got, np.argmax(cdf >= u * cdf[:, -1:], axis=1))
    assert (probs.numpy()[np.arange(500), got] > 0).all()


def test_the_draws_frequencies_are_the_distributions_and_an_impossible_token_never_comes():
    p = torch.tensor([0.0, 0.05, 0.0, 0.5, 0.249, 0.2, 0.001, 0.0])
    n = 200_000
    tokens = rollout.inverse_cdf_draw(p.expand(n, -1).contiguous(), torch.Generator().manual_seed(0)).numpy()
    counts, expected = np.bincount(tokens, minlength=len(p)), n * p.double().numpy() / p.double().sum().item()
    assert counts[expected == 0].sum() == 0
    assert stats.chisquare(counts[expected > 0], expected[expected > 0]).pvalue > 1e-3


def test_a_row_that_is_not_finite_draws_its_last_token_and_the_others_draw_as_alone():
    probs = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(3)), dim=-1)
    alone = rollout.inverse_cdf_draw(probs, torch.Generator().manual_seed(5))
    probs[2] = float("nan")
    drawn = rollout.inverse_cdf_draw(probs, torch.Generator().manual_seed(5))
    assert drawn[2] == 49 and torch.equal(drawn[[0, 1, 3]], alone[[0, 1, 3]])


@pytest.mark.parametrize("greedy", [False, True])
def test_a_diverged_policy_stops_its_sampling_with_one_line(greedy):
    """Weights that became NaN: the sampler says so (NonFiniteLoss, which fails a run with its message) rather than
    returning NaN log-probs or indexing past the vocabulary."""
    tr = make_trainer(RunConfig.make(seed=1, **SMALL))
    with torch.no_grad():
        tr.model.get_output_embeddings().weight.fill_(float("nan"))
    ids, mask = rollout.encode_prompts([[5, 6, 7], [8, 9]], tr.tokenizer.pad_token_id, 2, "cpu")
    with pytest.raises(grpo.NonFiniteLoss, match="the sampler's probabilities became NaN/inf"):
        rollout.sample(tr.model, ids, mask, eos_id=tr.tokenizer.eos_token_id, pad_id=tr.tokenizer.pad_token_id,
                       max_new_tokens=4, temperature=1.0, generator=torch.Generator().manual_seed(0), greedy=greedy)


def test_casting_the_linear_weights_once_samples_what_autocast_casting_at_every_call_samples(monkeypatch):
    """On every CPU: where bfloat16 is not native (divviz refuses it for a run there) torch emulates it, with the
    same casts."""
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)
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


def host_syncs_asked(profiler) -> int:
    """The syncs the code itself asks for: a `nonzero` (its size is read on the host) or a tensor read as a number,
    called from Python or by an index (not those inside an operator, such as multinomial's own checks on a CPU, or
    transformers' mask, which the sampler does not control)."""
    return sum(1 for event in profiler.events() if event.name in ("aten::nonzero", "aten::item")
               and (event.cpu_parent is None or event.cpu_parent.name == "aten::index"))


def test_the_decode_loop_waits_for_the_device_once_per_decoded_token(monkeypatch):
    tr = make_trainer(RunConfig.make(seed=1, **SMALL))
    asked = []

    def counted(*args, **kwargs):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            result = rollout.sample(*args, **kwargs)
        asked.append(host_syncs_asked(profiler))
        return result

    monkeypatch.setattr(grpo, "sample", counted)
    batch = make_batch(tr, 0)
    lengths = batch.rollout.completion_mask.sum(dim=1)
    width = batch.rollout.completion_ids.shape[1]
    assert len(set(lengths.tolist())) > 2  # rows ended at different tokens: the loop dropped rows more than once
    assert asked == [width + 2]  # one a decoded token (which rows go on), one in the prefill (the distinct prompts),
    # one at the end (every log-prob finite)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_both_ways_from_one_prefill_sample_what_each_way_alone_samples(dtype, monkeypatch):
    """The held-out evaluation's sampled and greedy answers from one prefill (`rollout.sample_ways`) against two
    `sample` calls: every token and per-token fact the same to the bit, and the generator left in the same state."""
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)  # emulated where not native: the same code path
    tr = make_trainer(RunConfig.make(dtype=dtype, seed=2, **SMALL))
    ids, mask = make_batch(tr, 0).rollout.prompt_ids, make_batch(tr, 0).rollout.prompt_mask
    kwargs = dict(eos_id=tr.tokenizer.eos_token_id, pad_id=tr.tokenizer.pad_token_id, max_new_tokens=12,
                  temperature=1.0, autocast=tr.autocast)
    alone_generator, shared_generator = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    alone = [rollout.sample(tr.model, ids, mask, generator=alone_generator, greedy=greedy, **kwargs)
             for greedy in (False, True)]
    shared = rollout.sample_ways(tr.model, ids, mask, (False, True), generator=shared_generator, **kwargs)
    for one, other in zip(alone, shared):
        assert all(torch.equal(getattr(one, f), getattr(other, f)) for f in FACTS)
    assert not torch.equal(alone[0].completion_ids, alone[1].completion_ids)  # the two ways do differ
    assert torch.equal(alone_generator.get_state(), shared_generator.get_state())
    # a way's cache is its own: the second greedy way decodes from the prefill, not from the first way's extended cache
    again = rollout.sample_ways(tr.model, ids, mask, (True, True), generator=None, **kwargs)
    assert all(torch.equal(getattr(alone[1], f), getattr(way, f)) for way in again for f in FACTS)
