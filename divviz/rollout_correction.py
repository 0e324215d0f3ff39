"""Rollout corrections: weights and masks for tokens sampled by a rollout policy π_roll that is not the policy
being trained (an inference engine in another precision, a stale copy), as verl 0.9.1 computes them
(`trainer/ppo/rollout_corr_helper.py`).

With log ρ_t = log π_old(t) − log π_roll(t), clamped to [−20, 20]:

    weights   token:     w_t = ρ_t                       sequence: w_t = Π_t ρ_t of the completion (one per row)
              TIS u:     min(w, u)                       IcePop (l, u): w where l ≤ w ≤ u, else 0
              batch_normalize: divided by their mean over the batch's tokens (token) or completions (sequence)
    rejection a statistic of k1 = −log ρ, k2 = ½(log ρ)² or k3 = ρ − 1 − log ρ, per token (token_kX) or per
              completion (seq_sum_kX, seq_mean_kX, seq_max_kX), kept when within its threshold: k1 in [log l, log u]
              ("l_u"; one number u means l = 1/u), k2 and k3 at most u; several options (comma-separated) must all
              keep a token.

They enter `losses.policy_loss` as its `weight` (detached) and its `mask` (rejected tokens leave the loss and its
normaliser). divviz's own engine and bandit sample with the policy they train, so there π_roll = π_old and every
weight is 1; these are for a trainer that has an inference engine beside it. verl's bypass mode, where π_old is
π_roll, makes token TIS and IcePop the surrogates `cispo` (lo = 0) and `icepop`. tests/test_verl.py checks all of this
against verl's own vectors.
"""

from __future__ import annotations

import math

import torch

from divviz.estimators import ESTIMATORS
from divviz.params import DivvizInputError
from divviz.safetext import quoted

LEVELS = ("token", "sequence")
REDUCTIONS = ("token", "seq_sum", "seq_mean", "seq_max")


def _bounds(threshold) -> tuple[float, float]:
    """(l, u) from a float u (TIS: l = 0), a pair, or verl's "l_u" text."""
    if isinstance(threshold, str):
        parts = threshold.split("_")
        if len(parts) != 2:
            raise DivvizInputError(f"rollout threshold {quoted(threshold)}: write u, or l_u")
        threshold = tuple(float(p) for p in parts)
    low, high = (0.0, float(threshold)) if isinstance(threshold, (int, float)) else map(float, threshold)
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low < high):
        raise DivvizInputError(f"rollout threshold ({low:g}, {high:g}): need 0 ≤ l < u, finite")
    return low, high


def rollout_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token", threshold=2.0,
                    batch_normalize: bool = False) -> torch.Tensor:
    """verl's `compute_rollout_correction_weights`: truncated (TIS, a number u) or masked (IcePop, "l_u" or (l, u))
    importance weights of π_old over π_roll, per token or per completion, zero on padding, detached."""
    if level not in LEVELS:
        raise DivvizInputError(f"unknown rollout-correction level {quoted(level)}; choose token or sequence")
    tis = isinstance(threshold, (int, float))
    low, high = _bounds(threshold)
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        if level == "sequence":
            log_ratio = (log_ratio * mask).sum(-1, keepdim=True).clamp(-20.0, 20.0).expand_as(mask)
        raw = log_ratio.exp() * mask
        weights = raw.clamp(max=high) if tis else torch.where((raw >= low) & (raw <= high), raw, torch.zeros_like(raw))
        if batch_normalize:
            if level == "token":
                mean = (weights * mask).sum() / mask.sum().clamp(min=1)
            else:
                rows = mask.sum(-1) > 0
                mean = ((weights * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()
            weights = weights / mean
    return weights * mask


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str, thresholds: str) -> torch.Tensor:
    """verl's `compute_rollout_rejection_mask`: `mask` with the rejected tokens (or whole completions) zeroed.
    `options` such as "token_k1" or "token_k1,seq_mean_k3", `thresholds` one per option ("0.7_1.5,0.06")."""
    names, limits = options.split(","), str(thresholds).split(",")
    if len(names) != len(limits):
        raise DivvizInputError(f"rejection options {quoted(options)} and thresholds {quoted(str(thresholds))} differ in "
                               "number")
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        keep = mask > 0
        for name, limit in zip(names, limits):
            reduction, _, statistic = name.strip().rpartition("_")
            if reduction not in REDUCTIONS or statistic not in ESTIMATORS:
                raise DivvizInputError(f"unknown rejection option {quoted(name)}; e.g. token_k1, seq_mean_k3")
            value = ESTIMATORS[statistic](log_ratio) * mask
            if reduction == "seq_sum":
                value = value.sum(-1, keepdim=True)
            elif reduction == "seq_mean":
                value = value.sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + 1e-8)
            elif reduction == "seq_max":
                value = torch.where(mask > 0, value, torch.full_like(value, -math.inf)).amax(-1, keepdim=True)
            if statistic == "k1":
                parts = [float(p) for p in limit.split("_")]
                low, high = (1 / parts[0], parts[0]) if len(parts) == 1 else parts
                kept = (value >= math.log(low)) & (value <= math.log(high))
            else:
                kept = value <= float(limit)
            keep = keep & kept
    return mask * keep
