"""Re-scoring a recorded step: what another measure would have done to the very tokens a run's update saw.

A step's record (`engine.completions`) keeps, for every token the loss saw, π_old, the ratio w at the last optimiser
step, the advantage A, its aggregation weight and the clip state the run's own measure gave it. Under any other clip test,
`losses.policy_loss` on those same (π_old, w, A) says, with TRL's definitions,

    masked low   w < l(π_old) and A < 0        masked high   w > u(π_old) and A > 0
    outside      w < l or w > u, whatever A     gradient kept  Σ_t a_t |∂ℓ_t/∂log π_t| over the same sum without a
                                                               constraint (a_t the token's aggregation weight)

and which tokens' states differ from the run's own (its recorded states, a pulled-back token counted as inside).
Tokens a rollout correction rejected (state 5) and tokens without a ratio took no part in the loss and are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from divviz.catalogue.params import DivvizInputError
from divviz.engine.completions import REJECTED
from divviz.importers.source import source_of
from divviz.losses import Objective, policy_loss

STATE_NAMES = ("inside", "masked low", "masked high", "dual-clip")


@dataclass
class Tokens:
    """The recorded tokens the loss saw, flattened: where each is (group, completion, position), its piece and facts."""

    where: list[tuple[int, int, int]]
    piece: list[str]
    pi_old: torch.Tensor
    ratio: torch.Tensor
    adv: torch.Tensor
    weight: torch.Tensor
    state: torch.Tensor  # the run's own clip state (0–3)


def recorded_tokens(record: dict) -> Tokens:
    """The tokens of a step's record that the loss saw (a ratio, π_old > 0, not rejected), in record order."""
    rows = []
    for g, group in enumerate(record["groups"]):
        for c, completion in enumerate(group["completions"]):
            t = completion["tokens"]
            for i in range(len(t["id"])):
                ratio, pi_old = (t.get(k)[i] if t.get(k) is not None else None for k in ("ratio", "pi_old"))
                if t["state"][i] == REJECTED or ratio is None or not pi_old or ratio <= 0:
                    continue
                weight = t["weight"][i] if t.get("weight") is not None and t["weight"][i] is not None else 1.0
                rows.append(((g, c, i), t["piece"][i], pi_old, ratio, t["adv"][i], weight, t["state"][i] % 4))
    if not rows:
        raise DivvizInputError("this step's record holds no token that the loss saw (no ratio was recorded)")
    where, piece, *facts = zip(*rows)
    pi_old, ratio, adv, weight, state = (torch.tensor(x, dtype=torch.float64) for x in facts)
    return Tokens(list(where), list(piece), pi_old, ratio, adv, weight, state.long())


def sampled_tokens(folder, step: int) -> Tokens | None:
    """A step's per-token sample (`store.read_tokens`: every token the loss saw, a run's `tokens/step_*.npz`) as
    `rescore` reads it, rejected tokens left out; None where the run kept none for that step. Its places are the
    tokens' indices and its pieces empty (the sample keeps facts, not text)."""
    from divviz.runs import store

    facts = store.read_tokens(folder, step, columns=store.TOKEN_COLUMNS)
    if facts is None or len(facts["ratio"]) == 0:
        return None
    keep = np.asarray(facts["state"]) != REJECTED
    if not keep.any():
        return None
    pi_old, ratio, adv = (torch.as_tensor(np.asarray(facts[k])[keep], dtype=torch.float64)
                          for k in ("pi_old", "ratio", "adv"))
    n = len(ratio)
    return Tokens([(0, 0, i) for i in range(n)], [""] * n, pi_old, ratio, adv, torch.ones(n, dtype=torch.float64),
                  torch.as_tensor(np.asarray(facts["state"])[keep] % 4).long())


def disagreement(tokens: Tokens, other: Objective) -> float:
    """The share of the tokens whose clip state `other` would set otherwise than the run's own measure did (`rescore`'s
    "changed" over its "tokens", without listing them)."""
    logp_old = tokens.pi_old.log()[None]
    out = policy_loss(logp_old + tokens.ratio.log()[None], logp_old, tokens.adv[None], torch.ones_like(logp_old),
                      Objective(clip=other.clip, dual_clip_c=other.dual_clip_c, aggregation="token_sum"))
    return float((out.clip_state()[0] != tokens.state).double().mean())


def rescore(tokens: Tokens, objective: Objective, measure: str) -> dict:
    """`objective`'s verdict on the recorded tokens: shares masked low, masked high and outside, the gradient weight
    kept, and the tokens whose clip state differs from the run's own ([(group, completion, position, piece, the
    run's state, this one's)])."""
    logp_old = tokens.pi_old.log()[None]
    logp_new = (logp_old + tokens.ratio.log()[None]).requires_grad_()
    adv, mask = tokens.adv[None], torch.ones_like(logp_old)
    judged = Objective(clip=objective.clip, dual_clip_c=objective.dual_clip_c, aggregation="token_sum")
    out = policy_loss(logp_new, logp_old, adv, mask, judged)
    slope = torch.autograd.grad(out.loss, logp_new)[0][0].abs()
    free = tokens.ratio * tokens.adv.abs()  # |∂(−A w)/∂log π| = |A| w: the slope without a constraint
    state = out.clip_state()[0]
    n = len(tokens.where)
    changed = [(*tokens.where[k], tokens.piece[k], STATE_NAMES[int(tokens.state[k])], STATE_NAMES[int(state[k])])
               for k in range(n) if int(state[k]) != int(tokens.state[k])]
    unconstrained = float((tokens.weight * free).sum())
    return {"measure": measure, "tokens": n, "masked_low": float(out.masked_low.sum()) / n,
            "masked_high": float(out.masked_high.sum()) / n, "outside": float(out.outside.sum()) / n,
            "gradient_flows": float((tokens.weight * slope).sum()) / unconstrained if unconstrained > 0 else math.nan,
            "changed": len(changed), "changed_tokens": changed}


def measure_objective(spec: str) -> Objective:
    """A clip test's spelling (`kl3:delta=0.02`, as `divviz catalogue` lists them), or `none`, as an objective."""
    from divviz.catalogue import instances
    from divviz.catalogue.divergences import get_entry

    if spec.strip() == "none":
        return Objective()
    if get_entry(spec.split(":")[0].strip()).family != "clip":
        raise DivvizInputError(f"rescore compares clip tests; {spec.split(':')[0]!r} is not one (see divviz catalogue)")
    return Objective(clip=instances.parse(spec))


def rescore_step(folder, step: int, specs: list[str]) -> list[dict]:
    """A run's recorded step re-scored under the run's own measure (first, "(this run)") and each of `specs`."""
    from divviz.runs import store

    kept = store.completion_steps(folder)
    if not kept and (source := source_of(store.read_run(folder).config)):
        raise DivvizInputError(f"run '{folder.name}' has no per-token data to re-score: it was imported from {source}, "
                               "which holds metrics only")
    if step not in kept:
        near = f"; it kept steps {kept[0]}–{kept[-1]} ({len(kept)} of them)" if kept else "; it kept none"
        raise DivvizInputError(f"run '{folder.name}' kept no completions for step {step}{near}")
    try:
        record = store.read_completions(folder, step)
    except store.CorruptRun as err:
        raise DivvizInputError(str(err)) from None
    return rescore_record(record, store.read_run(folder).config,
                          [(spec, measure_objective(spec).clip) for spec in specs])


def coverage(record: dict, config: dict) -> str:
    """Which completions of the step a record holds, hence which tokens a re-score counts: "all 16 completions of
    the step's 4 prompts", or, where the run kept only its first `inspect_prompts` prompts' completions (or its byte
    cap left some out), "the inspected completions only: 8 completions of 2 of the step's 4 prompts (16
    completions) …". An imported run's record holds every prompt its file gives."""
    prompts, kept = len(record["groups"]), sum(len(g["completions"]) for g in record["groups"])
    omitted = int(record.get("omitted") or 0)
    per_step, group_size = config.get("prompts"), config.get("group_size")
    cut = f"; the record's byte cap left out {omitted} more" if omitted else ""
    if not isinstance(per_step, int) or per_step <= prompts:
        return f"{'the' if omitted else 'all'} {kept} completions of the step's {prompts} prompts{cut}"
    whole = f" ({per_step * group_size} completions)" if isinstance(group_size, int) else ""
    return (f"the inspected completions only: {kept} completions of {prompts} of the step's {per_step} prompts{whole}; "
            f"the run keeps its first inspect_prompts = {config.get('inspect_prompts', prompts)} prompts' completions"
            f"{cut}")


def step_coverage(folder, step: int) -> str:
    """`coverage` of a run's recorded step."""
    from divviz.runs import store

    return coverage(store.read_completions(folder, step), store.read_run(folder).config)


def rescore_record(record: dict, config: dict, tests: list) -> list[dict]:
    """A step's record re-scored under the run's own clip test (from its config; first, "(this run)") and each of
    `tests` [(label, clip test or None)]."""
    from divviz.engine.config import objective_from

    tokens = recorded_tokens(record)
    try:
        own = objective_from(config)
    except (DivvizInputError, TypeError, AttributeError):  # a config another writer made: the plain PPO box
        own = measure_objective("ratio")
    measures = [(f"{own.clip.label if own.clip else 'none'} (this run)", own)]
    measures += [(label, Objective(clip=test)) for label, test in tests]
    return [rescore(tokens, objective, label) for label, objective in measures]
