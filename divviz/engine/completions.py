"""Whole completions with every token's facts, for the step inspector: one JSON record per step in a run folder's
`completions/`, the same format whoever trains the run.

A record holds the first `inspect_prompts` prompts of the step, each with its G completions: the text, reward and
advantage, and per token its id, its piece as the tokenizer decodes it alone, the tokenizer's raw piece and whether
it is a special token, and the facts of the last inner step of the update:

    pi_old   π_old of the sampled token          ratio    w = π_θ/π_old at the last inner step (what the loss saw)
    pi_new   π after the update                  adv      the advantage A
    measure  the clip test's value (None: none)  state    `losses.TOKEN_STATES` code
    penalty  the penalty's value (None: none)    pi_ref   π_ref (None without a reference)
    loss     the token's loss ℓ_t                weight   its aggregation weight ∂L/∂ℓ_t (so Σ weight·loss = L)

Numbers are kept to 7 significant digits (float32's precision). A record stays within `byte_cap` bytes of JSON:
completions are added in order until the next would pass it, and `omitted` counts the ones left out.
"""

from __future__ import annotations

import json
import math
from numbers import Real
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the app reads records without importing torch
    import torch

    from divviz.losses import LossOutput

FACTS = ("pi_old", "pi_new", "ratio", "adv", "measure", "state", "penalty", "pi_ref", "loss", "weight")
BYTE_CAP, MAX_BYTES = 262_144, 67_108_864  # a record's default cap, and the largest cap a run may set


def token_pieces(tokenizer, ids: list[int]) -> dict[str, list]:
    """Each token alone: its decoded text (a byte-fallback or partial UTF-8 piece decodes to U+FFFD), the
    tokenizer's raw piece (e.g. "Ġthe", "<0xE2>") and whether it is a special token."""
    special = set(tokenizer.all_special_ids)
    raw = tokenizer.convert_ids_to_tokens(ids)
    return {"id": list(ids), "piece": tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False),
            "raw": [str(r) for r in raw], "special": [i in special for i in ids]}


def _numbers(x, n: int) -> list | None:
    """The first n values of a tensor or array, to 7 significant digits (None for a non-finite one)."""
    if x is None:
        return None
    values = x[:n].detach().float().cpu().tolist() if hasattr(x, "detach") else np.asarray(x[:n], float).tolist()
    return [float(f"{v:.7g}") if math.isfinite(v) else None for v in values]


def step_record(*, step: int, tokenizer, prompts: list[str], texts: list[str], rewards: "torch.Tensor",
                adv: "torch.Tensor", completion_ids: "torch.Tensor", mask: "torch.Tensor", out: "LossOutput",
                logp_old: "torch.Tensor", logp_after: "torch.Tensor", logp_ref: "torch.Tensor | None",
                weight: np.ndarray, group_size: int, byte_cap: int = BYTE_CAP) -> dict:
    """The record of rows 0 … len(logp_after) − 1 of a step (whole groups of `group_size` completions, in order).
    `out`, `logp_old`, `adv`, `mask`, `logp_ref` and `weight` are the whole batch's; `logp_after` the inspected
    rows' log-probs after the update."""
    rows = len(logp_after)
    state = out.token_state()
    record = {"step": step, "byte_cap": byte_cap, "omitted": 0, "groups": []}
    size = len(json.dumps(record))
    for i in range(rows):
        n = int(mask[i].sum())
        ids = completion_ids[i, :n].tolist()
        facts = {
            "pi_old": _numbers(logp_old[i].exp(), n), "pi_new": _numbers(logp_after[i].exp(), n),
            "ratio": _numbers(out.ratio[i], n), "adv": _numbers(adv[i].expand(n) if adv.dim() == 1 else adv[i], n),
            "measure": _numbers(out.measure[i] if out.measure is not None else None, n),
            "state": state[i, :n].tolist(), "penalty": _numbers(out.penalty[i] if out.penalty is not None else None, n),
            "pi_ref": _numbers(logp_ref[i].exp() if logp_ref is not None else None, n),
            "loss": _numbers(out.per_token_loss[i], n), "weight": _numbers(weight[i], n),
        }
        completion = {"text": texts[i], "reward": float(rewards[i]), "advantage": float(adv[i].flatten()[0]),
                      "tokens": {**token_pieces(tokenizer, ids), **facts}}
        if i % group_size == 0:
            group = {"prompt": prompts[i], "completions": []}
            added = len(json.dumps(group)) + 2
        else:
            added = 0
        added += len(json.dumps(completion)) + 2
        if size + added > byte_cap:
            record["omitted"] = rows - i
            break
        if i % group_size == 0:
            record["groups"].append(group)
        record["groups"][-1]["completions"].append(completion)
        size += added
    return record


def check_record(record: object, name: str) -> dict:
    """`record` if it is what `step_record` writes (types, lengths, clip-state codes), else ValueError naming the
    first fault: a record read from a run folder is outside text."""
    def need(ok: bool, why: str) -> None:
        if not ok:
            raise ValueError(f"{name}: {why}")

    def number(x) -> bool:
        return isinstance(x, Real) and not isinstance(x, bool)

    need(isinstance(record, dict) and isinstance(record.get("groups"), list), "not a record of completions")
    for g, group in enumerate(record["groups"]):
        need(isinstance(group, dict) and isinstance(group.get("prompt"), str)
             and isinstance(group.get("completions"), list), f"group {g} is not a prompt with completions")
        for c, completion in enumerate(group["completions"]):
            where = f"group {g}, completion {c}"
            need(isinstance(completion, dict) and isinstance(completion.get("text"), str)
                 and number(completion.get("reward")) and number(completion.get("advantage"))
                 and isinstance(completion.get("tokens"), dict), f"{where} lacks its text, reward or tokens")
            tokens = completion["tokens"]
            ids = tokens.get("id")
            need(isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids),
                 f"{where}: token ids are not integers")
            for key, kind in (("piece", str), ("raw", str), ("special", bool)):
                need(isinstance(tokens.get(key), list) and len(tokens[key]) == len(ids)
                     and all(isinstance(x, kind) for x in tokens[key]), f"{where}: '{key}' does not match the ids")
            for fact in FACTS:
                values = tokens.get(fact)
                need(values is None or (isinstance(values, list) and len(values) == len(ids)
                                        and all(v is None or number(v) for v in values)),
                     f"{where}: '{fact}' is not one number per token")
            need(isinstance(tokens.get("state"), list) and all(v in range(5) for v in tokens["state"]),
                 f"{where}: a clip state is not one of {len(range(5))} codes")
    return record
