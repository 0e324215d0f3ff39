"""Sampling completions with a KV cache, and the log-probs of completions under a policy.

Both use the tempered policy softmax(logits / τ), as TRL does, so the ratio in the loss compares the
distributions that were actually sampled from. Both run each distinct prompt once (`prefill`; a batch holds
G copies of each) and the completions on top of its KV cache.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from dataclasses import dataclass, fields

import torch

from divviz.metrics import entropy


@dataclass
class Rollout:
    """A batch of prompts and sampled completions; all completion tensors are (N, T)."""

    prompt_ids: torch.Tensor  # (N, P), left-padded
    prompt_mask: torch.Tensor  # (N, P)
    completion_ids: torch.Tensor  # (N, T), padded after <eos>
    completion_mask: torch.Tensor  # (N, T) float: 1 up to and including <eos>
    logp: torch.Tensor  # (N, T) log-prob of each sampled token under the sampling policy
    entropy: torch.Tensor  # (N, T) entropy of the sampling distribution at each step
    top1: torch.Tensor  # (N, T) probability of the most likely token at each step
    was_argmax: torch.Tensor  # (N, T) bool: the sampled token was the most likely one

    def rows(self, index: torch.Tensor) -> "Rollout":
        """The same rollout restricted to the completions in `index`."""
        return Rollout(*(getattr(self, f.name)[index] for f in fields(self)))


def encode_prompts(prompt_ids: list[list[int]], pad_id: int, group_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask for each prompt's ids (`prompts.prompt_ids`) repeated `group_size` times in
    consecutive rows (each prompt padded once)."""
    ids, mask = left_pad(prompt_ids, pad_id, device)
    return ids.repeat_interleave(group_size, dim=0), mask.repeat_interleave(group_size, dim=0)


def decode_completions(tokenizer, rollout: "Rollout") -> list[str]:
    """The completion texts, without special tokens (one batched call). The mask is 1 on a prefix of each row."""
    lengths = rollout.completion_mask.sum(1).long().tolist()
    rows = [row[:n] for row, n in zip(rollout.completion_ids.tolist(), lengths)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(seq) for seq in sequences])
    width = int(lengths.max())
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (N, width), True on the tokens
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    ids[mask] = torch.tensor([t for seq in sequences for t in seq], dtype=torch.long)  # row-major fill
    return ids.to(device), mask.long().to(device)


@functools.cache
def _cache_argument(kind: type) -> str:
    return "cache" if "cache" in inspect.signature(kind.forward).parameters else "past_key_values"


def cache_argument(model) -> str:
    """The name under which `model`'s forward takes a KV cache: `cache` from transformers 5.2x on (which warns on
    every call given the old name), `past_key_values` before."""
    return _cache_argument(type(model))


def kv_cache(out):
    """The KV cache a forward returned, under either name (`cache_argument`)."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


def prompt_runs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct, inverse): the first row of each run of equal rows of (ids, mask), and each row's run, so that
    `x[distinct][inverse]` gives every row's x from the distinct prompts' (one host sync: how many there are)."""
    rows = torch.cat([prompt_ids, prompt_mask], dim=1)
    first = torch.ones(len(rows), dtype=torch.bool, device=rows.device)  # row i starts a run of equal rows
    first[1:] = (rows[1:] != rows[:-1]).any(dim=1)
    return first.nonzero().squeeze(1), first.cumsum(0) - 1


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, autocast):
    """One forward over the prompts with the KV cache: (cache, last-position logits, next position), all (N, ...).

    The G copies of a prompt sit in consecutive rows (`encode_prompts`), so the forward runs once per run of
    equal rows of (ids, mask) and the cache and logits are repeated to the N rows (`Cache.reorder_cache`, an
    index_select, so gradients flow back to the shared prompt computation). Same values as a forward over all
    N rows."""
    distinct, inverse = prompt_runs(prompt_ids, prompt_mask)
    ids, mask = prompt_ids[distinct], prompt_mask[distinct]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding is invisible to the model
    with autocast():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = kv_cache(out)
    cache.reorder_cache(inverse)
    return cache, out.logits[inverse, -1], positions[inverse, -1:] + 1


def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, eos_id: int, pad_id: int,
           max_new_tokens: int, temperature: float, generator: torch.Generator | None, autocast=None,
           greedy: bool = False) -> Rollout:
    """Sample up to `max_new_tokens` tokens per prompt with the model's KV cache (with `greedy`, take the most
    likely token each time instead: greedy decoding, the generator unused).

    Rows that have produced <eos> leave the batch (their cache rows are dropped), so each decoding step runs
    only the completions still being written; their later columns are padding (mask 0). The loop waits for the
    device once per decoded token: for the rows that go on, as indices, which also drop the finished ones. Under
    autocast the linear layers' weights are cast once for the whole call (`linear_weights_cast`) rather than at every
    model call."""
    return sample_ways(model, prompt_ids, prompt_mask, (greedy,), eos_id=eos_id, pad_id=pad_id,
                       max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                       autocast=autocast)[0]


def sample_ways(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, ways: tuple[bool, ...], *, eos_id: int,
                pad_id: int, max_new_tokens: int, temperature: float, generator: torch.Generator | None,
                autocast=None) -> list[Rollout]:
    """`sample` of the same prompts once per way (False: sampled at τ, True: greedy), in that order, from one
    prefill: each way decodes from its own copy of the prompts' KV cache and logits, so each rollout is the one
    `sample` alone gives, to the bit, and the generator is drawn from in the same order (the held-out evaluation
    answers the same problems both ways: one prefill instead of two, about half of a 64-problem sampling call). A
    distribution that is not finite (a diverged policy's) raises NonFiniteLoss once the decoding is done."""
    n, device = prompt_ids.shape[0], prompt_ids.device
    # the outputs made outside inference mode: the loss indexes with them
    columns = [_Columns(n, max_new_tokens, pad_id, device) for _ in ways]
    autocast = autocast or contextlib.nullcontext
    with torch.inference_mode(), linear_weights_cast(model, autocast):  # inference mode: no autograd bookkeeping
        start = prefill(model, prompt_ids, prompt_mask, autocast)
        rollouts = []
        for i, (greedy, out) in enumerate(zip(ways, columns)):
            cache, logits, position = start if i == len(ways) - 1 else copy.deepcopy(start)
            width = _decode(model, out, cache, logits, position, prompt_mask, eos_id=eos_id,
                            max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                            autocast=autocast, greedy=greedy)
            rollouts.append(out.rollout(prompt_ids, prompt_mask, width))
    if not torch.isfinite(torch.cat([r.logp.flatten() for r in rollouts])).all().item():  # once a call, not a token
        raise NonFiniteLoss("the sampler's probabilities became NaN/inf: the policy's logits are not finite")
    return rollouts


def _decode(model, out: "_Columns", cache, logits: torch.Tensor, position: torch.Tensor, attention: torch.Tensor, *,
            eos_id: int, max_new_tokens: int, temperature: float, generator: torch.Generator | None, autocast,
            greedy: bool) -> int:
    """Fill `out` token by token from the prompts' prefill (cache, last logits, next position; the cache is
    extended in place) and return how many columns were written."""
    live = torch.arange(len(logits), device=logits.device)  # the rows still being written, in batch order
    for t in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        token = out.write(live, t, logp_all, generator, greedy)
        going = (token != eos_id).nonzero().squeeze(1)  # the one host sync: how many rows go on
        if t + 1 == max_new_tokens or len(going) == 0:
            break
        if len(going) < len(live):
            live, token, attention, position = live[going], token[going], attention[going], position[going]
            cache.reorder_cache(going)
        attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=1)
        with autocast():
            step = model(input_ids=token[:, None], attention_mask=attention, position_ids=position,
                         use_cache=True, **{cache_argument(model): cache})
        cache, logits, position = kv_cache(step), step.logits[:, -1], position + 1
    return t + 1


@contextlib.contextmanager
def linear_weights_cast(model, autocast):
    """While sampling: each `nn.Linear`'s weight and bias held in the precision `autocast` would cast them to.

    Autocast casts a linear layer's float32 weight to bfloat16 at every call and caches the cast only for weights
    that require grad, and only until its region ends: a decoded token re-cast every frozen block, 0.8 GB of memory
    traffic a token for SmolLM2-135M, about a third of the sampler's time on this CPU (bench/sampler.py).
    `Tensor.to` rounds as autocast does, and a linear layer under autocast given bfloat16 weights casts nothing
    more, so every logit is the same to the bit (tests/engine/test_sampling.py). Only the layers' own references
    change, for the duration: an embedding tied to the output layer keeps its float32 weight, and the trained
    parameters are the same objects after. Without autocast (float32, or a sampler already in its own precision)
    nothing changes."""
    with autocast():
        device = next(model.parameters()).device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dtype != dtype]
    if dtype is None or not linears:
        yield
        return
    held = [(m, m.weight, m.bias) for m in linears]
    try:
        for m, weight, bias in held:
            m.weight = torch.nn.Parameter(weight.detach().to(dtype), requires_grad=False)
            if bias is not None:
                m.bias = torch.nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        yield
    finally:
        for m, weight, bias in held:
            m.weight, m.bias = weight, bias


class NonFiniteLoss(RuntimeError):
    """The policy's numbers became NaN/inf (its loss, its log-probs or the distribution it samples from): the run
    stops as failed, keeping the metrics so far."""


def inverse_cdf_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` (N, V) by inverse transform sampling (docs/theory.md §7): the first v with
    F(v) ≥ u · F(V), F the running sum of the row's probabilities in float64 and u ~ U(0, 1] one number a row from
    `generator`. A token of probability 0 is never drawn (u · F(V) > 0, and F does not rise over it); the draw is one
    cumulative sum and one binary search a row, where `torch.multinomial` draws one exponential per vocabulary entry,
    serially on a CPU. A row that is not finite (a diverged policy's) draws its last token, with a log-prob of NaN."""
    cdf = probs.double().cumsum(-1)
    u = 1.0 - torch.rand((len(probs), 1), dtype=torch.float64, generator=generator, device=probs.device)
    token = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1)
    return token.clamp_(max=probs.shape[-1] - 1)  # a NaN row finds no v: its last, whose log-prob `sample_ways` refuses


class _Columns:
    """The sampler's per-token outputs, (N, max_new_tokens), filled column by column for the live rows."""

    def __init__(self, n: int, width: int, pad_id: int, device):
        self.ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
        self.mask, self.logp, self.entropy, self.top1 = (torch.zeros(n, width, device=device) for _ in range(4))
        self.argmax = torch.zeros(n, width, dtype=torch.bool, device=device)

    def write(self, rows: torch.Tensor, t: int, logp_all: torch.Tensor, generator: torch.Generator | None,
              greedy: bool = False) -> torch.Tensor:
        """Sample column t for `rows` from log π = `logp_all` (or take its argmax, `greedy`) and record the token, its
        log-prob, the entropy H = −Σ π log π, the top-1 mass max π and whether the token was the argmax; returns the
        tokens."""
        probs = logp_all.exp()
        top1, argmax = probs.max(dim=-1)
        token = argmax if greedy else inverse_cdf_draw(probs, generator)
        self.ids[rows, t] = token
        self.mask[rows, t] = 1.0
        self.logp[rows, t] = logp_all.gather(1, token[:, None]).squeeze(1)
        self.entropy[rows, t] = entropy(logp_all, probs)
        self.top1[rows, t] = top1
        self.argmax[rows, t] = token == argmax
        return token

    def rollout(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, width: int) -> Rollout:
        return Rollout(prompt_ids, prompt_mask, self.ids[:, :width], self.mask[:, :width], self.logp[:, :width],
                       self.entropy[:, :width], self.top1[:, :width], self.argmax[:, :width])


def completion_logits(model, rollout: Rollout, temperature: float, autocast, prefix=None) -> torch.Tensor:
    """(N, T, V) tempered logits z / τ of the distributions the completion tokens were drawn from (with grad).

    Position t is predicted by the prompt's last position (t = 0) or by completion token t − 1: the prompts
    run once per distinct prompt (`prefill`), the completions (less their last token) on top of that cache. Given
    the batch's `frozen_prefix.FrozenPrefix` of these rows, only `model`'s trained blocks run, from it."""
    if prefix is not None:
        return prefix.logits(model, rollout, temperature, autocast)
    cache, first, position = prefill(model, rollout.prompt_ids, rollout.prompt_mask, autocast)
    logits = [first[:, None]]
    t = rollout.completion_ids.shape[1]
    if t > 1:
        attention = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids[:, :-1])], dim=1)
        positions = position + torch.arange(t - 1, device=position.device)
        with autocast():
            out = model(input_ids=rollout.completion_ids[:, :-1], attention_mask=attention, position_ids=positions,
                        use_cache=True, **{cache_argument(model): cache})
        logits.append(out.logits)
    return torch.cat(logits, dim=1).float().div_(temperature)  # in place: one (N, T, V) tensor fewer


def completion_logps(model, rollout: Rollout, temperature: float, autocast, with_entropy: bool = False,
                     prefix=None):
    """(N, T) log-probs of the sampled completion tokens under `model`'s tempered policy (with grad); with
    `with_entropy`, also each position's entropy under that policy (N, T), detached, as TRL computes it for its
    top-entropy mask; from the batch's frozen prefix where given (`completion_logits`)."""
    return token_logps(completion_logits(model, rollout, temperature, autocast, prefix), rollout, with_entropy)


def token_logps(logits: torch.Tensor, rollout: Rollout, with_entropy: bool = False):
    """`completion_logps` from the tempered logits `completion_logits` gave."""
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(2, rollout.completion_ids[:, :, None]).squeeze(2) * rollout.completion_mask
    if not with_entropy:
        return logp
    with torch.no_grad():
        return logp, entropy(logp_all) * rollout.completion_mask
