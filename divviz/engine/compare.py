"""Same-batch comparison: several objectives applied to the *same* rollouts from the *same* weights.

No training framework offers this view. For the chosen step's prompts, completions are sampled once from the
start policy; then for each objective the start weights are restored and μ optimisation steps are taken on
that batch. What differs between the results is only the objective: which tokens it clipped, how far it moved
each token's probability, where the mass went, and how the policy's entropy on those contexts changed.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from divviz.engine.config import RunConfig
from divviz.engine.frozen_prefix import FrozenPrefix
from divviz.engine.grpo import Trainer, make_batch, make_optimiser, make_trainer, update
from divviz.engine.step_metrics import inspected_record, inspected_rows, update_metrics
from divviz.engine.rollout import Rollout, completion_logits, token_logps
from divviz.losses import Objective
from divviz.metrics import entropy_change, entropy_covariance


@dataclass
class Comparison:
    label: str
    metrics: dict[str, float]  # clip fractions, KL of the update, mass shift, entropy and top-1 change, entropy/…
    pi_old: np.ndarray  # completion tokens, flattened
    pi_new: np.ndarray
    ratio: np.ndarray  # at the last optimiser step
    state: np.ndarray  # 0 inside, 1 masked low, 2 masked high, 3 dual-clip
    record: dict  # the first `inspect_prompts` prompts' completions, every token's facts (`completions.step_record`)


@dataclass
class Positions:
    """The policy at every sampled position: (N, T) log-prob of the sampled token and top-1 mass of the full
    next-token distribution, and its tempered logits (N, T, V) (`metrics.entropy_change` reads the entropy there)."""

    logp: torch.Tensor
    top1: torch.Tensor
    logits: torch.Tensor


def positions(model, rollout: Rollout, temperature: float, autocast, prefix: FrozenPrefix | None = None) -> Positions:
    """`model`'s `Positions` on the rollout's completions (no gradient; from the batch's frozen prefix where given)."""
    with torch.no_grad():
        logits = completion_logits(model, rollout, temperature, autocast, prefix)
        top1 = (logits.max(-1).values - logits.logsumexp(-1)).exp()  # max_v π(v) = exp(max logit − log Σ exp)
        return Positions(token_logps(logits, rollout), top1 * rollout.completion_mask, logits)


def same_batch(cfg: RunConfig, settings: list[tuple[str, RunConfig | Objective]], step: int = 0,
               trainer: Trainer | None = None, weights: Path | None = None,
               progress: Callable[[int, int, str], None] | None = None) -> list[Comparison]:
    """Apply each (label, setting) to step `step`'s batch, all from the same weights: `cfg`'s start model, or a
    checkpoint saved by a run (`weights`, a safetensors file). A setting is an objective (under `cfg`'s rollout
    correction), or a run config whose objective, rollout correction and bypass mode apply; `cfg` says the rest.
    `progress(done, total, text)` hears of each part as it ends: the sampling, then each setting's update."""
    say = progress or (lambda done, total, text: None)
    started = time.perf_counter()
    tr = trainer or make_trainer(cfg)
    # π_ref, the run's start policy, for a penalty: the weights the comparison starts from, unless they are a
    # checkpoint's (then the start weights, kept before the checkpoint loads)
    reference = None if weights is None else tr.reference or copy.deepcopy(tr.model).eval().requires_grad_(False)
    if weights is not None:
        from safetensors.torch import load_model

        load_model(tr.model, str(weights), device=str(tr.device))
        if tr.sampler is not None:
            tr.sampler.reset(tr.model)
    start_weights = copy.deepcopy(tr.model.state_dict())
    batch = make_batch(tr, step)
    say(1, len(settings) + 1, f"sampled the batch in {time.perf_counter() - started:.0f} s")
    mask = batch.rollout.completion_mask
    measure = partial(positions, rollout=batch.rollout, temperature=cfg.temperature, autocast=tr.autocast,
                      prefix=batch.prefix)
    before = measure(tr.model)
    logp_old = before.logp
    logp_ref = logp_old if reference is None else measure(reference).logp
    active = mask > 0
    results = []
    for label, setting in settings:
        run = setting if isinstance(setting, RunConfig) else replace(cfg, objective=setting)
        objective = run.objective
        tr.model.load_state_dict(start_weights)
        tr.optimiser = make_optimiser(tr.model, cfg)
        done = update(tr, batch, objective, logp_ref, step, correction=run.correction(), bypass=run.bypass_mode)
        out = done.out
        after = measure(tr.model)
        logp_after = after.logp
        metrics = {**done.fractions, **update_metrics(batch.rollout, logp_old, logp_after, None),
                   **entropy_change(before.logits, after.logits, mask),
                   **entropy_covariance(logp_old, batch.adv, done.mask, out.clip_state(), objective.dual_clip_c is not None),
                   "top1_change": float(((after.top1 - before.top1) * mask).sum() / mask.sum()),
                   "masked_share": float(out.grad_masked[active].float().mean()),
                   "rejected_share": float((done.mask[active] == 0).float().mean())}
        state = out.clip_state()
        record = inspected_record(cfg, tr.tokenizer, objective, batch, done, logp_after,
                                  logp_ref if objective.penalties else None, step,
                                  rows=max(inspected_rows(cfg), cfg.group_size))  # ≥ 1 group, side by side
        results.append(Comparison(label, metrics, logp_old.exp()[active].cpu().numpy(),
                                  logp_after.exp()[active].cpu().numpy(), out.ratio[active].cpu().numpy(),
                                  state[active].cpu().numpy(), record))
        say(len(results) + 1, len(settings) + 1, f"updated under {label} ({time.perf_counter() - started:.0f} s so far)")
    tr.model.load_state_dict(start_weights)
    return results
