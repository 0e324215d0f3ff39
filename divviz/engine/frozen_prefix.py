"""The frozen prefix once per batch: with only the last N of a model's L blocks trained, the hidden states entering
block b = L − N depend on the frozen weights and the tokens alone, so a step computes them once per rollout batch and
every other forward of the step runs only the trained blocks, the final norm and the output layer from them:

    h = blocks[0:b](embed(x))              once per batch, no grad                      (`frozen_prefix`)
    z = lm_head(norm(blocks[b:L](h))) / τ  π_before, each of the μ × K training forwards, the reference's log-probs,
                                           the after-update forward, the same-batch comparison  (`FrozenPrefix.logits`)

Both halves keep `rollout.completion_logits`'s shape of work: each distinct prompt once with a KV cache, the
completions (less their last token) on top of it. The blocks are called as transformers' `LlamaModel.forward` calls
them (one causal mask for the cache's layer, the rotary embedding once per call), so the logits are the full
forward's to rounding (tests/engine/test_frozen_prefix.py states the tolerances); the prompts' logits are taken at
their last position only, where the full forward computes the output layer at every position. The reference shares
the prefix: it is a frozen copy of the start policy, whose frozen blocks are the policy's, forever.

Why a forward of its own rather than the hidden states the sampler saw: the sampler is not always the trained policy
(a lagging or lower-precision π_roll, `sampler.py`), and it computes each token alone while every forward of the step
takes the batch at once; one prefix for all of them keeps the first mini-batch's ratios exactly 1 by construction.

Which models: a decoder with `embed_tokens`, `layers`, `norm` and `rotary_emb`, full attention in every layer and
its first b blocks and embeddings frozen (the Llama family: SmolLM2, the built-in model with `trainable_blocks`); any
other model, and every run that trains all its blocks, takes the full forward as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from divviz.engine.rollout import Rollout, cache_argument, linear_weights_cast, prompt_runs

DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


def first_trained_block(model, trainable_blocks: int) -> int | None:
    """b = L − N, the first trained block, where the frozen prefix applies (see the module's docstring); else None."""
    if trainable_blocks <= 0 or not hasattr(model, "lm_head"):
        return None
    decoder = model.get_decoder()
    if not all(hasattr(decoder, part) for part in DECODER_PARTS):
        return None
    if any(kind != "full_attention" for kind in getattr(decoder.config, "layer_types", None) or ()):
        return None
    first = len(decoder.layers) - trainable_blocks
    frozen = [decoder.embed_tokens, *decoder.layers[:max(first, 0)]]
    if first <= 0 or any(p.requires_grad for part in frozen for p in part.parameters()):
        return None
    return first


def blocks(model, hidden: torch.Tensor, start: int, stop: int | None, attention_mask: torch.Tensor,
           positions: torch.Tensor, cache) -> torch.Tensor:
    """Blocks [start, stop) of the decoder over `hidden` (B, S, H), as `LlamaModel.forward` runs them: the causal mask
    of the cache's layer `start` (its past tokens and the 2-D `attention_mask` over past and present), the rotary
    embedding of `positions` (B, S), each block adding its keys and values to `cache`."""
    from transformers.masking_utils import create_causal_mask

    decoder = model.get_decoder()
    mask = create_causal_mask(decoder.config, hidden, attention_mask, cache, positions, layer_idx=start)
    rotary = decoder.rotary_emb(hidden, position_ids=positions)
    for block in decoder.layers[start:stop]:
        hidden = block(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary, use_cache=True,
                       **{cache_argument(model): cache})
    return hidden


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@dataclass
class FrozenPrefix:
    """The hidden states entering the first trained block `first` over a rollout batch (see the module's docstring)."""

    first: int
    prompt: torch.Tensor  # (N, P, H) at every prompt position (left padding included, as the full forward has it)
    completion: torch.Tensor  # (N, T − 1, H) at each completion token fed back (every one but the last)
    head: torch.Tensor | None = None  # the frozen output layer's weight in autocast's precision, cast once (`head_cast`)

    def __getitem__(self, rows: torch.Tensor) -> FrozenPrefix:
        """The same prefix restricted to the completions `rows` (as `Rollout.rows`)."""
        return FrozenPrefix(self.first, self.prompt[rows], self.completion[rows], self.head)

    def output_layer(self, model, hidden: torch.Tensor) -> torch.Tensor:
        """`model.lm_head(hidden)`, with the weight cast once per batch where `head_cast` made one."""
        if self.head is None:
            return model.lm_head(hidden)
        return torch.nn.functional.linear(hidden, self.head, model.lm_head.bias)

    def logits(self, model, rollout: Rollout, temperature: float, autocast) -> torch.Tensor:
        """(N, T, V) tempered logits of `rollout`'s completions under `model` (with grad where its trained blocks
        have it), from this prefix: `rollout.completion_logits`, less the frozen blocks."""
        decoder = model.get_decoder()
        distinct, inverse = prompt_runs(rollout.prompt_ids, rollout.prompt_mask)
        mask = rollout.prompt_mask[distinct]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = new_cache(model)
        with autocast():
            hidden = blocks(model, self.prompt[distinct], self.first, None, mask, positions, cache)
            logits = [self.output_layer(model, decoder.norm(hidden[:, -1:]))[inverse]]
        t = rollout.completion_ids.shape[1]
        if t > 1:
            cache.reorder_cache(inverse)
            attention = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids[:, :-1])], dim=1)
            after = positions[inverse, -1:] + 1 + torch.arange(t - 1, device=positions.device)
            with autocast():
                hidden = blocks(model, self.completion, self.first, None, attention, after, cache)
                logits.append(self.output_layer(model, decoder.norm(hidden)))
        return torch.cat(logits, dim=1).float().div_(temperature)  # in place: one (N, T, V) tensor fewer


def frozen_prefix(model, rollout: Rollout, autocast, trainable_blocks: int) -> FrozenPrefix | None:
    """The hidden states entering `model`'s first trained block over `rollout` (no grad, the frozen linear layers'
    weights cast once for the call as the sampler casts them, `rollout.linear_weights_cast`); None where the model
    trains every block or is not of the family the module's docstring names."""
    first = first_trained_block(model, trainable_blocks)
    if first is None:
        return None
    embed = model.get_decoder().embed_tokens
    distinct, inverse = prompt_runs(rollout.prompt_ids, rollout.prompt_mask)
    mask = rollout.prompt_mask[distinct]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model)
    t = rollout.completion_ids.shape[1]
    head = head_cast(model, autocast)  # before `linear_weights_cast`, which holds every layer cast for its call only
    with torch.no_grad(), linear_weights_cast(model, autocast), autocast():
        prompt = blocks(model, embed(rollout.prompt_ids[distinct]), 0, first, mask, positions, cache)[inverse]
        if t == 1:
            return FrozenPrefix(first, prompt, prompt[:, :0], head)
        cache.reorder_cache(inverse)
        attention = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids[:, :-1])], dim=1)
        after = positions[inverse, -1:] + 1 + torch.arange(t - 1, device=positions.device)
        completion = blocks(model, embed(rollout.completion_ids[:, :-1]), 0, first, attention, after, cache)
    return FrozenPrefix(first, prompt, completion, head)


def head_cast(model, autocast) -> torch.Tensor | None:
    """The output layer's weight in the precision autocast computes it in, cast once for the batch; None where the
    layer trains or nothing is cast (float32).

    Autocast casts a linear layer's float32 weight at every call: for SmolLM2's tied 49,152 × 576 output layer that
    is 16 casts a learn step (two in each forward: π_before's, the K training forwards', the after-update one), 8–32
    ms each on a 2-core CPU. The weight is frozen (tied to the frozen embeddings), so one cast serves the whole
    step, and `Tensor.to` rounds as autocast does: the logits are the same to the bit. The policy's and the
    reference's frozen output layers hold the same values (the reference is a copy of the start policy), so one cast
    serves both."""
    weight = model.lm_head.weight
    with autocast():
        device = weight.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if weight.requires_grad or dtype is None or weight.dtype == dtype:
        return None
    return weight.detach().to(dtype)
