"""What a GRPO step measured, computed after the algorithm (`grpo.py`) from the facts it left: the metrics row (TRL's
names, `metrics.GLOSSARY`), a bounded sample of per-token facts for the scatter plots, and the step inspector's
record of whole completions (`completions.step_record`).

    during the update   each optimiser step's clip fractions (`StepTally`), averaged over the μ × K steps
    before the step     the completions it measures (`measured_rows`), of which the update keeps ENTROPY_ROWS'
                        full distributions as its forwards pass them
    after the update    one no-grad forward on at most AFTER_ROWS completions (`after_rows`): the KL of the update,
                        where probability mass moved, the entropy's change at ENTROPY_ROWS of them (full distributions
                        before and after) and the clip's overshoot
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from divviz.catalogue.aggregation import aggregation_weights
from divviz.catalogue.estimators import k1, k2, k3
from divviz.engine.batch import Batch, Update
from divviz.engine.completions import step_record
from divviz.engine.rollout import Rollout
from divviz.losses import LossOutput, Objective
from divviz.metrics import PI_OLD_BINS, bin_labels, clip_fractions, entropy_covariance, overshoot

if TYPE_CHECKING:  # the step's own types, for the reader; grpo.py imports this module
    from divviz.engine.config import RunConfig

TOKEN_SAMPLE = 256  # per-token facts kept per step for the scatter plots
AFTER_ROWS = 256  # completions re-scored after the update for the KL and mass metrics (all, in small batches)
ENTROPY_ROWS = 32  # of those, the completions whose full distributions before and after give entropy/change (a
# (rows, T, vocabulary) copy of the logits is kept through the update: 150 MB for SmolLM2 at 24 tokens)


@dataclass
class StepTally:
    """The optimiser steps of one update as they happen: clip fractions averaged over all `steps` of them, each
    step's own region fraction and k3 of its ratios when there are several mini-batches (`by_minibatch`), the
    gradient norms, and the last pass's (rows, LossOutput) per mini-batch."""

    steps: int
    by_minibatch: bool
    fractions: dict[str, float] = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)
    last_pass: list[tuple[torch.Tensor, LossOutput]] = field(default_factory=list)

    def add(self, position: int, out: LossOutput, mask: torch.Tensor, log_ratio: torch.Tensor,
            grad_norm: float) -> None:
        """Optimiser step `position` (1 … K in the first pass, K + 1 … 2K in the second, …): its loss output, the
        loss's mask and the log-ratios log π_θ − log π_old it trained on."""
        measured = clip_fractions(out, mask)
        for key, value in measured.items():
            self.fractions[key] = self.fractions.get(key, 0.0) + value / self.steps
        if self.by_minibatch:
            self.fractions[f"clip_ratio/region_mean_by_minibatch/{position}"] = measured["clip_ratio/region_mean"]
            self.fractions[f"kl/k3_by_minibatch/{position}"] = masked_mean(k3(log_ratio), mask)
        self.grad_norms.append(grad_norm)


def inspected_rows(cfg: RunConfig) -> int:
    """How many completions the step inspector keeps whole: the first `inspect_prompts` prompts' groups."""
    return min(cfg.inspect_prompts, cfg.prompts) * cfg.group_size


def after_rows(n: int, inspected: int, step: int) -> torch.Tensor:
    """The completions re-scored after the update: the inspected ones (rows 0 … inspected − 1), then a subset of
    the others seeded by the step, AFTER_ROWS in all (every row when the batch is that small)."""
    others = torch.randperm(n - inspected, generator=torch.Generator().manual_seed(step))
    return torch.cat([torch.arange(inspected), inspected + others[:max(AFTER_ROWS - inspected, 0)].sort().values])


@dataclass
class MeasuredRows:
    """The completions a step's metrics look at, chosen before the step (`measured_rows`): `after`, those re-scored
    after the update, and the first ENTROPY_ROWS of them, whose tempered logits before the update (`before`,
    (ENTROPY_ROWS, T, V)) the update's forwards leave here as they pass them (`keep`), for the entropy's change."""

    after: torch.Tensor
    before: torch.Tensor | None = None

    @property
    def entropy(self) -> torch.Tensor:
        return self.after[:ENTROPY_ROWS]

    def keep(self, rows: torch.Tensor, logits: torch.Tensor) -> None:
        """Keep the (len(rows), T, V) tempered `logits` of the completions `rows` that are among the entropy rows."""
        place = {int(row): i for i, row in enumerate(self.entropy.tolist())}
        for j, row in enumerate(rows.tolist()):
            if row in place:
                if self.before is None:  # not zeroed: the update's mini-batches cover every row, so each is written
                    self.before = logits.new_empty((len(place), *logits.shape[1:]))
                self.before[place[row]] = logits[j].detach()


def measured_rows(cfg: RunConfig, n: int, step: int, device: torch.device) -> MeasuredRows:
    """Step `step`'s measured rows of its n completions (`after_rows`), before the update has kept anything."""
    return MeasuredRows(after_rows(n, inspected_rows(cfg), step).to(device))


def step_metrics(cfg: RunConfig, objective: Objective, batch: Batch, done: Update, seen: torch.Tensor,
                 rescored: Rollout, logp_after: torch.Tensor, logp_ref: torch.Tensor | None, changed: dict[str, float],
                 step: int, elapsed: float) -> dict[str, float]:
    """Step `step`'s (0-based) metrics row: rewards, the update's clip fractions and rollout correction, the KL and
    mass shift of the update on the completions `seen` (their rollout `rescored` after it: `logp_after`), the
    entropy, its change (`changed`) and its covariance, loss, gradient norm and time."""
    rollout, rewards, logp_old = batch.rollout, batch.rewards, done.logp_old
    grouped = rewards.view(cfg.prompts, cfg.group_size)
    return {
        "step": step + 1,
        "reward": float(rewards.mean()),
        "reward_std": float(grouped.std(dim=1).mean()),
        "frac_reward_zero_std": float((grouped.std(dim=1) == 0).float().mean()),
        "accuracy": float(np.mean(batch.correct)),
        "completions/mean_length": float(rollout.completion_mask.sum(1).mean()),
        **done.fractions,
        **(done.correction.metrics if done.correction else {}),
        **update_metrics(rescored, logp_old[seen], logp_after, None if logp_ref is None else logp_ref[seen]),
        "clip_ratio/overshoot_mean": overshoot((logp_after - logp_old[seen]).exp(), batch.adv[seen],
                                               rescored.completion_mask, objective.clip, logp_old[seen].exp()),
        "entropy": masked_mean(rollout.entropy, rollout.completion_mask),  # over every completion
        **changed,
        **entropy_covariance(logp_old, batch.adv, done.mask, done.out.clip_state(), objective.dual_clip_c is not None),
        "top1_mass": masked_mean(rollout.top1, rollout.completion_mask),
        "loss": float(done.out.loss.detach()),
        "grad_norm": float(np.mean(done.grad_norms)),
        "step_time": elapsed,
        "tokens_per_s": float(rollout.completion_mask.sum()) / elapsed,
    }


def update_metrics(rollout: Rollout, logp_old, logp_after, logp_ref) -> dict[str, float]:
    """KL of the update (k1/k2/k3 of w = π_after/π_old) and to the reference (GRPO's direction,
    r = π_ref/π), and where probability mass moved, binned by π_old."""
    mask = rollout.completion_mask
    log_ratio = (logp_after - logp_old) * mask
    metrics = {
        "kl/k1": masked_mean(k1(log_ratio), mask),
        "kl/k2": masked_mean(k2(log_ratio), mask),
        "kl/k3": masked_mean(k3(log_ratio), mask),
    }
    if logp_ref is not None:
        ref_ratio = (logp_ref - logp_after) * mask
        metrics.update({f"kl_ref/{name}": masked_mean(fn(ref_ratio), mask) for name, fn in
                        (("k1", k1), ("k2", k2), ("k3", k3))})
    pi_old, change = logp_old.exp()[mask > 0], (logp_after.exp() - logp_old.exp())[mask > 0]
    tokens = max(int(pi_old.numel()), 1)
    index = torch.bucketize(pi_old, torch.tensor(PI_OLD_BINS[1:-1], device=pi_old.device), right=True)
    per_bin = torch.zeros(len(PI_OLD_BINS) - 1, device=pi_old.device).index_add_(0, index, change.float())
    metrics.update({f"mass_shift/{label}": float(v) / tokens for label, v in zip(bin_labels(), per_bin)})
    gained = change.clamp(min=0)
    metrics["mass_to_argmax"] = float(gained[rollout.was_argmax[mask > 0]].sum() / gained.sum().clamp(min=1e-12))
    return metrics


def token_sample(batch: Batch, done: Update, seen: torch.Tensor, rescored: Rollout, logp_after: torch.Tensor,
                 seed: int) -> dict[str, np.ndarray]:
    """Up to TOKEN_SAMPLE of the tokens of the completions `seen` that the loss trains on (a rollout correction may have
    rejected some): π_old, the ratio at the last optimiser step, π after the update, the advantage and the clip state
    (0 inside, 1 masked low, 2 masked high, 3 dual-clip)."""
    out, logp_old = done.out.rows(seen), done.logp_old[seen]
    rows, cols = (done.mask[seen] > 0).nonzero(as_tuple=True)
    chosen = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))[:TOKEN_SAMPLE].sort().values
    rows, cols = rows[chosen.to(rows.device)], cols[chosen.to(rows.device)]
    pick = lambda x: x[rows, cols].detach().float().cpu().numpy()  # noqa: E731
    return {
        "pi_old": pick(logp_old.exp()), "ratio": pick(out.ratio), "pi_new": pick(logp_after.exp()),
        "adv": batch.adv[seen][rows].detach().float().cpu().numpy(), "state": pick(out.clip_state()).astype(np.int8),
        "was_argmax": pick(rescored.was_argmax).astype(bool), "completion": rows.cpu().numpy().astype(np.int32),
        "position": cols.cpu().numpy().astype(np.int32),
    }


def inspected_record(cfg: RunConfig, tokenizer, objective: Objective, batch: Batch, done: Update, logp_after,
                     logp_ref, step: int, rows: int | None = None):
    """The step inspector's record (`completions.step_record`) of the first `rows` completions (default: the
    `inspect_prompts` prompts' groups; None when that is none) under `objective`, with the sampler's π_roll where
    the batch may be off-policy."""
    rows = inspected_rows(cfg) if rows is None else rows
    if not rows:
        return None
    mask = batch.rollout.completion_mask
    weight = aggregation_weights(done.mask.cpu().numpy(), objective.aggregation, cfg.max_new_tokens)
    size = cfg.group_size
    groups = [(batch.prompts[start], list(range(start, start + size))) for start in range(0, rows, size)]
    prompt_ids = [ids[keep > 0].tolist() for ids, keep in zip(batch.rollout.prompt_ids[:rows:size],
                                                                  batch.rollout.prompt_mask[:rows:size])]
    return step_record(step=step + 1, tokenizer=tokenizer, groups=groups, texts=batch.texts, prompt_ids=prompt_ids,
                       rewards=batch.rewards, adv=batch.adv, completion_ids=batch.rollout.completion_ids, mask=mask,
                       out=done.out, logp_old=done.logp_old, logp_after=logp_after, logp_ref=logp_ref, weight=weight,
                       byte_cap=cfg.inspect_bytes, loss_mask=None if done.correction is None else done.mask,
                       entropy=batch.rollout.entropy, top1=batch.rollout.top1,
                       logp_roll=None if done.correction is None else batch.rollout.logp, minibatch=done.minibatch)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))
