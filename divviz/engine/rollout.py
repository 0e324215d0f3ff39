"""Sampling completions with a KV cache, and the log-probs of completions under a policy.

Both use the tempered policy softmax(logits / τ), as TRL does, so the ratio in the loss compares the
distributions that were actually sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


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


def encode_prompts(tokenizer, prompts: list[str], group_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask for each prompt repeated `group_size` times (each prompt encoded once)."""
    ids = tokenizer(prompts)["input_ids"]
    return left_pad([seq for seq in ids for _ in range(group_size)], tokenizer.pad_token_id, device)


def decode_completions(tokenizer, rollout: "Rollout") -> list[str]:
    """The completion texts, without special tokens (one batched call)."""
    rows = [row[m > 0].tolist() for row, m in zip(rollout.completion_ids.cpu(), rollout.completion_mask.cpu())]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def left_pad(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(seq) for seq in sequences])
    width = int(lengths.max())
    mask = torch.arange(width)[None, :] >= (width - lengths)[:, None]  # (N, width), True on the tokens
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    ids[mask] = torch.tensor([t for seq in sequences for t in seq], dtype=torch.long)  # row-major fill
    return ids.to(device), mask.long().to(device)


@torch.no_grad()
def sample(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, eos_id: int, pad_id: int,
           max_new_tokens: int, temperature: float, generator: torch.Generator, autocast=None) -> Rollout:
    """Sample up to `max_new_tokens` tokens per prompt with the model's KV cache."""
    n = prompt_ids.shape[0]
    device = prompt_ids.device
    attention = prompt_mask
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with autocast():
        out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1]
    next_position = positions[:, -1:] + 1
    done = torch.zeros(n, dtype=torch.bool, device=device)
    columns = {k: [] for k in ("ids", "mask", "logp", "entropy", "top1", "argmax")}
    for _ in range(max_new_tokens):
        logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
        probs = logp_all.exp()
        token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        token = torch.where(done, torch.full_like(token, pad_id), token)
        top1, argmax = probs.max(dim=-1)
        columns["ids"].append(token)
        columns["mask"].append((~done).float())
        columns["logp"].append(logp_all.gather(1, token[:, None]).squeeze(1))
        columns["entropy"].append(-(probs * logp_all).nan_to_num().sum(-1))
        columns["top1"].append(top1)
        columns["argmax"].append(token == argmax)
        done = done | (token == eos_id)
        if bool(done.all()):
            break
        attention = torch.cat([attention, torch.ones((n, 1), dtype=attention.dtype, device=device)], dim=1)
        with autocast():
            out = model(input_ids=token[:, None], attention_mask=attention, position_ids=next_position,
                        past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
        next_position = next_position + 1
    stacked = {k: torch.stack(v, dim=1) for k, v in columns.items()}
    mask = stacked["mask"]
    return Rollout(prompt_ids, prompt_mask, stacked["ids"], mask, stacked["logp"] * mask, stacked["entropy"] * mask,
                   stacked["top1"] * mask, stacked["argmax"] & (mask > 0))


def completion_logps(model, rollout: Rollout, temperature: float, autocast) -> torch.Tensor:
    """(N, T) log-probs of the sampled completion tokens under `model`'s tempered policy (with grad)."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attention = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids)], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with autocast():
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    p, t = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    logits = logits[:, p - 1:p - 1 + t].float() / temperature  # position i predicts token i + 1
    logp = torch.log_softmax(logits, dim=-1).gather(2, rollout.completion_ids[:, :, None]).squeeze(2)
    return logp * rollout.completion_mask
