"""An imported run's steps, checked, and the run folder made from them (the engine's contract, state `done`).

Whatever the source format, a step is prompts with completions, and a completion per-token log-probs under the policy
that sampled it (π_old) and under the policy at the update (π), with its advantages. From those, `policy_loss` under
the run's own clip test (the file's clip ε, else PPO's 0.2) gives every token's ratio, clip state, loss and
aggregation weight, as the engine records them, so that the Runs page, the step inspector, the token scatter and
`divviz rescore` read an imported run like any other. A step the file gives only metrics for (a metrics-only log:
UNIPO's `<algo>_metrics.json`, TRL's trainer_state.json, verl's file logger) is a metrics row and nothing else. The
folder is written under a hidden name and renamed when complete: a file refused half-way leaves nothing behind.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from divviz.catalogue.aggregation import prefix_weights
from divviz.catalogue.divergences import clip_test
from divviz.catalogue.estimators import k1, k2, k3
from divviz.catalogue.params import DivvizInputError
from divviz.engine.completions import BYTE_CAP, check_record, significant
from divviz.losses import Objective
from divviz.runs import store
from divviz.safetext import quoted


@dataclass
class Completion:
    text: str
    reward: float
    ids: list[int]
    pieces: list[str]
    logp_old: list[float]
    logp: list[float]
    adv: list[float]  # per token
    logp_ref: list[float] | None = None
    logp_roll: list[float] | None = None


@dataclass
class Group:
    prompt: str
    completions: list[Completion] = field(default_factory=list)


@dataclass
class Step:
    groups: list[Group] | None  # None: the file has no per-token data for this step
    metrics: dict[str, float]  # the file's own numbers for the step (`names.metrics_row`)
    number: int  # the step's number in the run
    dropped: list[str] = field(default_factory=list)  # the file's values for the step that are not finite numbers


def check_order(number: int, last: int | None, where: str) -> None:
    """Steps come in increasing order, each once; else the fault, naming `where` and both steps."""
    if last is not None and number == last:
        raise DivvizInputError(f"{where}: step {number} again (each step is given once)")
    if last is not None and number < last:
        raise DivvizInputError(f"{where}: step {number} after step {last} (steps out of order)")


def checked_completion(values: dict, where: str, names: dict[str, str] | None = None) -> Completion:
    """A completion whose per-token lists agree in length, with finite log-probs ≤ 0 and finite advantages; else a
    DivvizInputError naming `where` and the first fault, each list by its name in the file (`names`: ours → the
    file's, where they differ)."""
    named = lambda key: (names or {}).get(key, key)  # noqa: E731
    n = len(values["ids"])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in values["ids"]):
        raise DivvizInputError(f"{where}: token ids are not integers")
    if not all(isinstance(p, str) for p in values["pieces"]):
        raise DivvizInputError(f"{where}: the token strings are not text")
    for name in ("pieces", "logp_old", "logp", "adv", "logp_ref", "logp_roll"):
        given = values.get(name)
        if given is None:
            continue
        if not isinstance(given, list) or len(given) != n:
            raise DivvizInputError(f"{where}: '{named(name)}' has "
                                   f"{len(given) if isinstance(given, list) else 'no list of'} values for {n} tokens")
        if name == "pieces":
            continue
        for t, v in enumerate(given):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise DivvizInputError(f"{where}: '{named(name)}' at token {t} is {quoted(v, 30)}, not a finite number")
            if name.startswith("logp") and v > 1e-6:
                raise DivvizInputError(f"{where}: '{named(name)}' at token {t} is {v:g}, above 0: not a "
                                       "log-probability")
    reward = values.get("reward", 0.0)
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise DivvizInputError(f"{where}: its reward is {quoted(reward, 30)}, not a finite number")
    text = values.get("text")
    return Completion(text if isinstance(text, str) else "".join(values["pieces"]), float(reward), values["ids"],
                      values["pieces"], *(values.get(k) for k in ("logp_old", "logp", "adv", "logp_ref", "logp_roll")))


def write_run(steps, config: dict, root: Path, label: str) -> Path:
    """The run folder of `steps` (an iterable, consumed once: a big file is never held whole) under `root`; config
    holds the run's clip test and its `source`, to which the counts are added: steps, those with per-token data,
    values dropped. The status message says what was imported, plainly when nothing was per token."""
    root = store.writable_runs_folder(root)
    final = store.new_run_folder(root, label)
    work = final.with_name(f".importing-{final.name}")
    final.rename(work)
    try:
        objective = Objective(clip=clip_test(config.get("clip", "ratio"), **config.get("clip_params", {})))
        writer, count, per_token, dropped = None, 0, 0, []
        for step in steps:
            if writer is None:
                writer = store.RunWriter(work, {**config, "steps": 0}, 0)
            if step.groups is None:
                writer.append(step.number, {**step.metrics, "step": step.number}, None, [])
            else:
                metrics, tokens, record = score_step(step, objective)
                shown = [(g.prompt, g.completions[0].text, g.completions[0].reward) for g in step.groups[:3]
                         if g.completions]
                writer.append(step.number, metrics, tokens, shown, check_record(record, f"step {step.number}"))
                per_token += 1
            count += 1
            dropped.extend(step.dropped)
        if writer is None:
            raise DivvizInputError("the file holds no step")
        last = writer.status["step"]
        writer.add_to_config({"steps": last, "source": {**config.get("source", {}), "steps": count,
                                                        "per_token_steps": per_token, "dropped": len(dropped)}})
        writer.status.update(steps=last)
        writer.finish("done", summary(count, per_token, dropped))
        work.rename(final)
        return final
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def summary(count: int, per_token: int, dropped: list[str]) -> str:
    """What an import wrote, in a sentence: its steps, which had per-token data, and the values dropped."""
    said = f"imported {count} step{'s' if count != 1 else ''}"
    if per_token == 0:
        said += (" of metrics only: the file has no per-token data, so the step inspector and divviz rescore have "
                 "nothing to show for this run")
    elif per_token < count:
        said += f", {per_token} of them with per-token data (the step inspector's and divviz rescore's steps)"
    if dropped:
        said += (f"; {len(dropped)} value{'s' if len(dropped) != 1 else ''} dropped, not finite numbers (first: "
                 f"{dropped[0]})")
    return said


def padded(rows: list, width: int) -> torch.Tensor:
    """Rows of unequal length as one (len(rows), width) float64 tensor, zero after each row's end, filled row by row:
    time in the tokens, not in completions × the longest (a 20,000-token completion beside 500 short ones)."""
    out = np.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return torch.from_numpy(out)


def similar_lengths(lengths: list[int], spread: int = 2, least: int = 16) -> list[list[int]]:
    """Row indices in groups of similar length, shortest first: a group's longest row at most `spread` × its
    shortest (or `least` tokens), so that a group padded to its longest scores at most about `spread` × its tokens."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if not groups or lengths[i] > max(least, spread * lengths[groups[-1][0]]):
            groups.append([])
        groups[-1].append(i)
    return groups


def score_rows(completions: list, objective: Objective) -> list[dict]:
    """Each completion's tokens scored by `policy_loss` under `objective`: its rows of π_old, ratio, advantage, the
    clip test's measure, per-token loss, clip state (`clip_state`, `token_state`) and log-ratio. Completions of
    similar length are scored together (`similar_lengths`): every one of these is a function of its own row, so the
    time grows with the tokens, not with completions × the longest."""
    scored: list[dict] = [{} for _ in completions]
    for rows in similar_lengths([len(c.ids) for c in completions]):
        part = [completions[i] for i in rows]
        width = max(len(c.ids) for c in part) or 1
        mask = padded([[1.0] * len(c.ids) for c in part], width)
        logp_old, logp = (padded([getattr(c, k) for c in part], width) for k in ("logp_old", "logp"))
        adv = padded([c.adv for c in part], width)
        out = objective(logp, logp_old, adv, mask)
        state, token_state = out.clip_state(), out.token_state()
        for r, (i, c) in enumerate(zip(rows, part)):
            n = len(c.ids)
            scored[i] = {"logp_old": logp_old[r, :n], "ratio": out.ratio[r, :n], "adv": adv[r, :n],
                         "measure": None if out.clip_value is None else out.clip_value[r, :n],
                         "loss": out.per_token_loss[r, :n], "state": state[r, :n], "token_state": token_state[r, :n],
                         "log_ratio": logp[r, :n] - logp_old[r, :n], "low": out.masked_low[r, :n],
                         "high": out.masked_high[r, :n]}
    return scored


def score_step(step: Step, objective: Objective) -> tuple[dict, dict, dict]:
    """A step's metrics row, token sample and inspector record, scored by `policy_loss` under `objective`
    (`score_rows`)."""
    number = step.number
    completions = [c for g in step.groups for c in g.completions]
    if not completions:
        raise DivvizInputError(f"step {number}: no completion")
    scored = score_rows(completions, objective)
    width = max(len(c.ids) for c in completions) or 1
    tokens_seen = max(sum(len(c.ids) for c in completions), 1)
    joined = {k: torch.cat([row[k] for row in scored]) for k in ("logp_old", "ratio", "adv", "state", "log_ratio",
                                                                  "low", "high")}
    low, high = float(joined["low"].sum()) / tokens_seen, float(joined["high"].sum()) / tokens_seen
    metrics = {"reward": float(np.mean([c.reward for c in completions])),  # of the prompts kept, unless the file says
               "clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low + high,
               **{f"kl/{name}": float(fn(joined["log_ratio"]).sum()) / tokens_seen
                  for name, fn in (("k1", k1), ("k2", k2), ("k3", k3))},
               "completions/mean_length": float(np.mean([len(c.ids) for c in completions])),
               **step.metrics, "step": number}  # the file's own numbers (over every rollout) win
    tokens = {"pi_old": joined["logp_old"].exp().float().numpy(), "ratio": joined["ratio"].float().numpy(),
              "adv": joined["adv"].float().numpy(), "state": joined["state"].numpy().astype(np.int8)}
    weight = prefix_weights([len(c.ids) for c in completions], objective.aggregation, width)
    with_ref = all(c.logp_ref is not None for c in completions)  # π_ref shown only where every completion has it
    record = {"step": number, "byte_cap": BYTE_CAP, "omitted": 0, "groups": []}
    row = 0
    for group in step.groups:
        entry = {"prompt": group.prompt, "completions": []}
        for c in group.completions:
            n, facts = len(c.ids), scored[row]
            shown = {"pi_old": facts["logp_old"].exp(), "pi_new": None, "ratio": facts["ratio"], "adv": facts["adv"],
                     "measure": facts["measure"], "penalty": None,
                     "pi_ref": torch.tensor(c.logp_ref, dtype=torch.float64).exp() if with_ref else None,
                     "loss": facts["loss"], "weight": torch.full((n,), weight[row], dtype=torch.float64),
                     "rho": None,
                     "pi_roll": None if c.logp_roll is None else torch.tensor(c.logp_roll).exp(), "entropy": None,
                     "top1": None}
            entry["completions"].append({
                "text": c.text, "reward": c.reward, "advantage": float(np.mean(c.adv)) if c.adv else 0.0,
                "tokens": {"id": list(c.ids), "piece": list(c.pieces), "raw": list(c.pieces), "special": [False] * n,
                           **{k: None if v is None else significant(v.tolist(), n) for k, v in shown.items()},
                           "state": facts["token_state"].tolist()}})
            row += 1
        record["groups"].append(entry)
    return metrics, tokens, record
