"""Whole completions with every token's facts, for the step inspector: one JSON record per step in a run folder's
`completions/`, the same format whoever trains the run.

A record holds the first `inspect_prompts` prompts of the step, each with its token ids as the model saw them
(`prompt_ids`) and its G completions: the text, reward and advantage, and per token its id, its piece as the tokenizer decodes it alone, the tokenizer's raw piece and whether
it is a special token, the mini-batch it trained in (1-based, when the update had several), and the facts of the last
optimiser step of the update (its last pass, in its mini-batch):

    pi_old   π_old of the sampled token          ratio    w = π_θ/π_old at the last optimiser step (as the loss saw it)
    pi_new   π after the update                  adv      the advantage A
    measure  the clip test's value (None: none)  state    `losses.TOKEN_STATES` code
    penalty  the penalty's value (None: none)    pi_ref   π_ref (None without a reference)
    loss     the token's loss ℓ_t                weight   its aggregation weight ∂L/∂ℓ_t (so Σ weight·loss = L)
    rho      ρ_t, what multiplied the policy term (a rollout importance weight, TRL's masks; None: nothing did)
    pi_roll  π_roll, the sampler's probability of the token, where it may differ from π_old (None: on-policy)
    entropy  H of the full next-token distribution the token was drawn from (nats; None where not measured)
    top1     the largest probability in that distribution (None where not measured)

A token that a rollout correction's rejection took out of the loss has state 5 ("rejected (rollout)"), weight 0 and
no ratio, loss, measure, penalty or ρ (the loss did not see it).

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

FACTS = ("pi_old", "pi_new", "ratio", "adv", "measure", "state", "penalty", "pi_ref", "loss", "weight", "rho", "pi_roll",
         "entropy", "top1")
STATES = 6  # `losses.TOKEN_STATES`: code 5, rejected by the rollout correction, is a record's only
REJECTED = STATES - 1  # a token the rollout correction took out of the loss
BYTE_CAP, MAX_BYTES = 262_144, 67_108_864  # a record's default cap, and the largest cap a run may set


def token_pieces(tokenizer, ids: list[int]) -> dict[str, list]:
    """Each token alone: its decoded text (a byte-fallback or partial UTF-8 piece decodes to U+FFFD), the
    tokenizer's raw piece (e.g. "Ġthe", "<0xE2>") and whether it is a special token."""
    special = set(tokenizer.all_special_ids)
    raw = tokenizer.convert_ids_to_tokens(ids)
    return {"id": list(ids), "piece": tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False),
            "raw": [str(r) for r in raw], "special": [i in special for i in ids]}


def _rows(x, rows: list[int]) -> list[list] | None:
    """Rows `rows` of a (B, T) tensor or array as nested Python lists (one transfer per fact), or None."""
    if x is None:
        return None
    if hasattr(x, "detach"):
        return x.detach()[rows].float().cpu().tolist()
    return np.asarray(x, float)[rows].tolist()


def significant(values: list | None, n: int) -> list | None:
    """The first n values to 7 significant digits (None for a non-finite one)."""
    if values is None:
        return None
    return [float(f"{v:.7g}") if math.isfinite(v) else None for v in values[:n]]


def step_record(*, step: int, tokenizer, groups: list[tuple[str, list[int]]], texts, rewards, adv: "torch.Tensor",
                completion_ids: "torch.Tensor", mask: "torch.Tensor", out: "LossOutput", logp_old: "torch.Tensor",
                logp_after: "torch.Tensor | None", logp_ref: "torch.Tensor | None", weight: np.ndarray,
                byte_cap: int = BYTE_CAP, loss_mask: "torch.Tensor | None" = None,
                logp_roll: "torch.Tensor | None" = None, prompt_ids: list[list[int]] | None = None,
                entropy: "torch.Tensor | None" = None, top1: "torch.Tensor | None" = None,
                minibatch: "torch.Tensor | None" = None) -> dict:
    """The record of the completions in `groups`: (prompt, its completions' rows of the batch), in order.

    `out`, `logp_old`, `adv` ((B,) or (B, T)), `mask`, `logp_ref`, `weight`, `completion_ids`, `texts` and
    `rewards` are indexed by the batch's rows; so is `logp_after` (log-probs after the update, at least up to the last
    row kept), or it is None where π after the update is not known (a TRL run makes no such forward). `loss_mask` is the
    loss's mask where a rollout correction rejected tokens of `mask` (the completions'), and `logp_roll` the sampler's
    log-probs where the batch may be off-policy. `prompt_ids` (one list per group) are each prompt's token
    ids as the model saw them (chat template applied), so π_old can be recomputed from the record. `minibatch` (B,)
    is the 0-based mini-batch each completion trained in, when the update had several (recorded 1-based)."""
    rows = [i for _, members in groups for i in members]
    lengths = mask.detach()[rows].sum(-1).long().tolist()
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    rejected = None if loss_mask is None else (mask > 0) & ~(loss_mask > 0)
    unseen = lambda x: x if x is None or rejected is None else x.masked_fill(rejected, float("nan"))  # noqa: E731
    columns = {
        "pi_old": logp_old.exp(), "pi_new": None if logp_after is None else logp_after.exp(),
        "ratio": unseen(out.ratio), "adv": adv.expand_as(mask), "measure": unseen(out.clip_value),
        "penalty": unseen(out.penalty), "pi_ref": None if logp_ref is None else logp_ref.exp(),
        "loss": unseen(out.per_token_loss), "weight": weight, "rho": unseen(out.policy_weight),
        "pi_roll": None if logp_roll is None else logp_roll.exp(), "entropy": entropy, "top1": top1}
    columns = {fact: _rows(x, rows) for fact, x in columns.items()}
    states = _rows(out.token_state() if rejected is None else out.token_state().masked_fill(rejected, REJECTED), rows)
    ids = completion_ids.detach()[rows].tolist()
    pieces = token_pieces(tokenizer, [i for k, n in enumerate(lengths) for i in ids[k][:n]])

    record = {"step": step, "byte_cap": byte_cap, "omitted": 0, "groups": []}
    size, k, start = len(json.dumps(record)), 0, 0
    for g, (prompt, members) in enumerate(groups):
        group = {"prompt": prompt, **({"prompt_ids": list(prompt_ids[g])} if prompt_ids is not None else {}),
                 "completions": []}
        added = len(json.dumps(group)) + 2
        for i in members:
            n = lengths[k]
            facts = {fact: significant(values[k], n) if values is not None else None for fact, values in columns.items()}
            facts["state"] = [int(s) for s in states[k][:n]]
            completion = {"text": texts[i], "reward": float(rewards[i]), "advantage": float(adv[i, 0]),
                          **({"minibatch": int(minibatch[i]) + 1} if minibatch is not None else {}),
                          "tokens": {**{key: part[start:start + n] for key, part in pieces.items()}, **facts}}
            added += len(json.dumps(completion)) + 2
            if size + added > byte_cap:
                record["omitted"] = len(rows) - k
                return record
            if not group["completions"]:
                record["groups"].append(group)
            group["completions"].append(completion)
            size, added, k, start = size + added, 0, k + 1, start + n
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
        ids = group.get("prompt_ids", [])
        need(isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids),
             f"group {g}: prompt_ids are not integers")
        for c, completion in enumerate(group["completions"]):
            where = f"group {g}, completion {c}"
            need(isinstance(completion, dict) and isinstance(completion.get("text"), str)
                 and number(completion.get("reward")) and number(completion.get("advantage"))
                 and isinstance(completion.get("tokens"), dict), f"{where} lacks its text, reward or tokens")
            need("minibatch" not in completion or (isinstance(completion["minibatch"], int)
                                                   and not isinstance(completion["minibatch"], bool)
                                                   and completion["minibatch"] >= 1),
                 f"{where}: its mini-batch is not a positive integer")
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
            need(isinstance(tokens.get("state"), list) and all(v in range(STATES) for v in tokens["state"]),
                 f"{where}: a clip state is not one of {STATES} codes")
    return record
