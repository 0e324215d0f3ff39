"""The closed-form gradient of `losses.policy_loss` in numpy, for many objectives at once: the softmax bandit's step.
tests/loss/test_losses.py and tests/loss/test_surrogates.py check it against autograd through `policy_loss`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from divviz.catalogue.aggregation import aggregation_weights
from divviz.losses import Objective
from divviz.catalogue.params import DivvizInputError


@dataclass
class LossGradient:
    """∂loss/∂logp_new and TRL's clip flags of one batch, numpy arrays shaped (B, T)."""

    grad: np.ndarray
    masked_low: np.ndarray
    masked_high: np.ndarray


class PolicyLossGradient:
    """The gradient of `policy_loss` with respect to logp_new, in closed form (numpy, float64), for R objectives
    at once: the softmax bandit's step.

        gradient = PolicyLossGradient(objectives, weights)   # once: what the objectives fix
        gradient.batch(logp_old, adv, logp_ref)              # each batch: what its μ optimiser steps share
        gradient(logp_new)                                   # each step -> LossGradient

    Arrays carry a leading run axis, (R, B, T), and `objectives[r]` applies to row r, so that several bandit
    runs side by side cost one call per step. weights: ∂loss/∂ℓ_t = `aggregation_weights(mask, aggregation)`
    of each run's aggregation, zero on padding; adv: (R, B) or (R, B, T).

    Per token, the slope of ℓ_t in log π_θ is

        ∂ℓ_t/∂log π_θ = −A_i w_t · [t keeps its gradient] + β · ∂penalty_t/∂log π_θ

    because ∂w/∂log π_θ = w and a clipped or dual-capped token's surrogate is a detached constant
    (module docstring). The aggregation is linear in ℓ, so ∂loss/∂ℓ_t is a fixed weight per token:
    grpo 1/(B·|o_i|), bnpo and dapo 1/Σmask, dr_grpo 1/(B·T),
    luspo 1/B, token_sum 1. Which tokens keep their gradient is read
    off the clip test's interval [l, u] (equal to its predicate, tests/catalogue/test_catalogue.py); no test is
    [0, ∞). Dual-clip caps ℓ = |A| max(w, l) at c|A| for A < 0; since l ≤ 1 < c, the cap binds exactly
    where w > c.

    tests/loss/test_losses.py checks it against autograd through `policy_loss` for every catalogue entry, with
    and without dual-clip, under every aggregation, alone and stacked; it is ~10× faster on tiny tensors.
    """

    def __init__(self, objectives: list[Objective], weights: np.ndarray):
        self.objectives, self.base_weights = objectives, weights
        self.weights, self.active = weights, weights > 0
        self.clips = any(o.clip is not None for o in objectives)
        self.bounds_need_pi_old = any(o.clip is not None and o.clip.needs_pi_old for o in objectives)
        if self.clips and not self.bounds_need_pi_old:
            self.lower, self.upper = self._clip_bounds(None)
        if not self.clips:
            self.lower, self.upper = 0.0, np.inf
        self.capped = any(o.dual_clip_c is not None for o in objectives)
        if self.capped:
            self.cap = self._per_run([np.inf if o.dual_clip_c is None else o.dual_clip_c for o in objectives])
        self.ratio_capped = any(o.ratio_cap is not None for o in objectives)
        if self.ratio_capped:
            self.ratio_cap = self._per_run([np.inf if o.ratio_cap is None else o.ratio_cap for o in objectives])
        self.masks_off_policy = any(o.off_policy_mask_threshold is not None for o in objectives)
        if self.masks_off_policy:
            thresholds = [o.off_policy_mask_threshold for o in objectives]
            self.off_policy = self._per_run([np.inf if t is None else t for t in thresholds])
        self.surrogates = [(r, o.surrogate) for r, o in enumerate(objectives) if o.surrogate is not None]
        drawn = [s.name for _, s in self.surrogates if s.entry.random]
        if drawn:
            raise DivvizInputError(f"{drawn[0]} picks its tokens at random from torch's global generator, so a bandit "
                                   "run would depend on the runs beside it; train it in the lab or with divviz train")
        sequence_level = any(o.importance_sampling_level == "sequence" or (o.surrogate and o.surrogate.entry.own_level)
                             for o in objectives)
        if sequence_level and weights.shape[-1] != 1:
            raise DivvizInputError("the closed-form gradient takes sequence-level objectives only for one-token "
                                   "completions (the bandit's), where the sequence's ratio is the token's")
        # (rows, penalty, β): one call for all runs when they share their penalties, else one per run
        terms = [o.penalties for o in objectives]
        if terms.count(terms[0]) == len(terms):
            self.penalties = [(slice(None), penalty, beta) for penalty, beta in terms[0]]
        else:
            self.penalties = [(r, penalty, beta) for r, pairs in enumerate(terms) for penalty, beta in pairs]

    def _per_run(self, values):
        """One float or one array like a row of π_old per run -> (R, 1, 1) or (R, B, T)."""
        if all(isinstance(v, float) for v in values):
            return np.array(values).reshape((-1,) + (1,) * (self.weights.ndim - 1))
        return np.stack(np.broadcast_arrays(*values))

    def _clip_bounds(self, pi_old):
        bounds = [(0.0, np.inf) if o.clip is None else o.clip.bounds(pi_old[r] if o.clip.needs_pi_old else None)
                  for r, o in enumerate(self.objectives)]
        return tuple(self._per_run(side) for side in zip(*bounds))

    def batch(self, logp_old, adv, logp_ref=None, weight=None, mask=None, logp_sampling=None) -> "PolicyLossGradient":
        """Take the batch whose optimiser steps come next; returns self. `weight` (R, B, T) multiplies the policy term
        (`policy_loss`'s weight); `mask` (R, B, T), where given, replaces the batch's mask, so the aggregation weighs
        the tokens it keeps (a rollout correction's rejection); `logp_sampling` is the sampling policy that the
        off-policy mask judges (default π_old)."""
        adv = adv[..., None] if adv.ndim == logp_old.ndim - 1 else adv
        self.logp_old, self.logp_ref = logp_old, logp_ref
        self.rho, self.logp_sampling = weight, logp_old if logp_sampling is None else logp_sampling
        self.weights = self.base_weights
        if mask is not None:  # the runs whose mask lost a token weigh the ones left anew
            changed = np.flatnonzero(((mask > 0) != (self.base_weights > 0)).any(axis=tuple(range(1, mask.ndim))))
            if changed.size:
                self.weights = self.base_weights.copy()
                for r in changed:
                    self.weights[r] = aggregation_weights(mask[r], self.objectives[r].aggregation)
        self.active = self.weights > 0
        self.adv = adv
        self.surrogate_slope = -adv * self.weights  # times γ (PPO: w) for the tokens that keep their gradient
        self.negative, self.positive = (adv < 0) & self.active, (adv > 0) & self.active
        if self.bounds_need_pi_old:
            self.lower, self.upper = self._clip_bounds(np.exp(logp_old))
        if not self.clips:
            self.unclipped = np.zeros(self.surrogate_slope.shape, dtype=bool)
        return self

    def __call__(self, logp_new) -> LossGradient:
        w = np.exp(logp_new - self.logp_old)
        slope = self.surrogate_slope * w
        if self.clips:
            masked_low = (w < self.lower) & self.negative
            masked_high = (w > self.upper) & self.positive
            slope[masked_low | masked_high] = 0.0
        else:
            masked_low = masked_high = self.unclipped
        if self.capped:
            slope[(w > self.cap) & self.negative] = 0.0
        if self.ratio_capped:  # −δ A is taken: A > 0 past δ, A < 0 past δ and u (`_clipped_surrogate`)
            slope[(w > self.ratio_cap) & (self.positive | (self.negative & (w > self.upper)))] = 0.0
        for r, surrogate in self.surrogates:
            unmasked = ~(masked_low[r] | masked_high[r])
            selected = surrogate.selected(logp_new[r], self.logp_old[r], self.adv[r], self.active[r], unmasked)
            bounds = tuple(b[r] if np.ndim(b) else b for b in (self.lower, self.upper))
            slope[r] = self.weights[r] * surrogate.slope(w[r], self.adv[r], unmasked, selected, bounds)
        if self.masks_off_policy:  # `losses.off_policy_sequence_mask`, on the policy term only
            kl = ((self.logp_sampling - logp_new) * self.active).sum(-1, keepdims=True) / np.maximum(
                self.active.sum(-1, keepdims=True), 1)
            slope *= (self.adv >= 0) | (kl <= self.off_policy)
        if self.rho is not None:
            slope *= self.rho
        for rows, penalty, beta in self.penalties:
            ref = None if self.logp_ref is None else self.logp_ref[rows]
            slope[rows] += beta * self.weights[rows] * penalty.slope(logp_new[rows], self.logp_old[rows], ref)
        return LossGradient(slope, masked_low, masked_high)

    def unclipped_slope(self, logp_new) -> np.ndarray:
        """Each token's slope had no clip, cap or mask taken its gradient away: the surrogate's −A w (its
        aggregation weight and importance weight ρ included), no penalty: what a masked token would have pushed
        (`bandit.entropy`)."""
        slope = self.surrogate_slope * np.exp(logp_new - self.logp_old)
        return slope if self.rho is None else slope * self.rho

    def overshoot(self, logp_after) -> np.ndarray:
        """The tokens an update carried past the bound their advantage pushes toward (`metrics.overshoot`): w
        after the update above u where A > 0, below l where A < 0; (R, B, T) bool, all False without a clip."""
        if not self.clips:
            return np.zeros(self.surrogate_slope.shape, dtype=bool)
        w = np.exp(logp_after - self.logp_old)
        return ((w > self.upper) & self.positive) | ((w < self.lower) & self.negative)

    def past_upper(self, logp) -> np.ndarray:
        """The positive-advantage tokens whose ratio is above u at `logp`; (R, B, T) bool, all False without a clip."""
        if not self.clips:
            return np.zeros(self.surrogate_slope.shape, dtype=bool)
        return (np.exp(logp - self.logp_old) > self.upper) & self.positive
