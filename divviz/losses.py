"""The one policy loss: every training step and every explorer curve goes through `policy_loss`; the
softmax bandit steps with its gradient in closed form, `PolicyLossGradient` (tested equal to autograd's).

Per token t of completion i (shapes (B, T); B completions, T completion tokens):

    w_t      = exp(logp_new − logp_old)                                   the ratio
    ŵ_t      = w_t if C_t(θ) holds, else the violated bound (l or u), detached      (clip_C, §1.2)
    ℓ_t      = −min(w_t A_i, ŵ_t A_i)                                     clipped surrogate
    ℓ_t      = min(ℓ_t, −c A_i)        where A_i < 0                      dual-clip (optional)
    ℓ_t     *= ρ_t                                                        per-token weight (optional)
    ℓ_t     += β · penalty_t                                              penalty (optional)
    loss     = aggregate(ℓ, mask)                                         grpo / bnpo / dr_grpo / dapo

A surrogate (`surrogates.py`: cispo, sapo, vespo, gpg, dppo, geo_mean) replaces the clipped surrogate's line; GSPO's
sequence level gives every token its completion's geometric-mean ratio; TRL's ratio cap δ puts min(w, δ) in the
first term of the min.

C_t is the clip test's own predicate on its own measure (e.g. k3(w_t) ≤ δ for ATR-GRPO), which
theory.md §1.2 calls J_general; for every test in the catalogue the feasible set is an interval [l, u]
∋ 1, so the result equals PPO's clamp on that interval, value and gradient (tests/test_losses.py).
With no clip test the surrogate is the plain −w_t A_i.

Which tokens lose their gradient (theory.md §1.4): A > 0 above u, A < 0 below l, and with dual-clip
A < 0 where the cap binds. TRL's clip fractions count exactly the first two
(`clip_ratio/low_mean`: w < l and A < 0; `clip_ratio/high_mean`: w > u and A > 0).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from divviz.divergences import ClipTest, check_aggregation, check_beta, check_dual_clip
from divviz.penalties import Penalty
from divviz.params import DivvizInputError, Param
from divviz.safetext import quoted
from divviz.surrogates import LEVELS, Surrogate, SurrogateInputs


@dataclass(frozen=True)
class Objective:
    """Everything that picks the loss: a clip test, a surrogate (None: PPO's clipped surrogate), a penalty with its
    β, a dual-clip cap, TRL's ratio cap δ, the importance-sampling level and an aggregation.

    Built once (parameters and their combination checked on construction), used by the explorer, the bandit and
    training alike.
    """

    clip: ClipTest | None = None
    penalty: Penalty | None = None
    beta: float = 0.0
    dual_clip_c: float | None = None
    aggregation: str = "grpo"
    surrogate: Surrogate | None = None
    importance_sampling_level: str = "token"
    ratio_cap: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "beta", check_beta(self.beta))
        object.__setattr__(self, "dual_clip_c", check_dual_clip(self.dual_clip_c))
        object.__setattr__(self, "ratio_cap", check_ratio_cap(self.ratio_cap))
        check_aggregation(self.aggregation)
        check_combination(self.clip, self.surrogate, self.importance_sampling_level, self.dual_clip_c, self.ratio_cap)

    @property
    def label(self) -> str:
        parts = [self.clip.label if self.clip else "no clip"] if self.surrogate is None or self.clip else []
        if self.surrogate is not None:
            parts.append(self.surrogate.label)
        if self.importance_sampling_level == "sequence":
            parts.append("(sequence)")
        if self.penalty is not None and self.beta > 0:
            parts.append(f"+ {self.beta:g}·{self.penalty.label}")
        if self.dual_clip_c is not None:
            parts.append(f"c={self.dual_clip_c:g}")
        if self.ratio_cap is not None:
            parts.append(f"δ_cap={self.ratio_cap:g}")
        return " ".join(parts)

    def __call__(self, logp_new, logp_old, adv, mask, logp_ref=None, **kwargs) -> "LossOutput":
        return policy_loss(logp_new, logp_old, adv, mask, clip=self.clip, penalty=self.penalty, beta=self.beta,
                           logp_ref=logp_ref, dual_clip_c=self.dual_clip_c, aggregation=self.aggregation,
                           surrogate=self.surrogate, importance_sampling_level=self.importance_sampling_level,
                           ratio_cap=self.ratio_cap, **kwargs)


RATIO_CAP = Param("ratio_cap", 2.0, 1.0, low_open=True, trl_name="delta", typical=(1.05, 10.0, 0.05),
                  doc="TRL's delta (INTELLECT-2): the unclipped term uses min(w, δ), so no token's ratio counts above "
                      "δ; for A < 0 it is dual-clip with c = δ, for A > 0 it binds only when δ < u")


def check_ratio_cap(value) -> float | None:
    return None if value is None else RATIO_CAP.check(value, "ratio_cap")


def check_combination(clip: ClipTest | None, surrogate: Surrogate | None, level: str, dual_clip_c, ratio_cap) -> None:
    """Refuse, in one `DivvizInputError`, what does not go together: a soft surrogate with a clip test (its weight is
    the constraint), dppo/geo_mean without one, dual-clip or the ratio cap with a surrogate (they act on PPO's
    surrogate), the sequence level with a test in π_old or with a surrogate that has its own level."""
    if level not in LEVELS:
        raise DivvizInputError(f"unknown importance-sampling level {quoted(level)}; choose {' or '.join(LEVELS)}")
    if surrogate is not None:
        name = surrogate.name
        if surrogate.entry.clip == "none" and clip is not None:
            raise DivvizInputError(f"the {name} surrogate has no clip test (its gradient weight is the constraint); "
                                   f"drop the clip test {clip.name}")
        if surrogate.entry.clip == "needs" and clip is None:
            raise DivvizInputError(f"the {name} surrogate masks tokens with a clip test; choose one (e.g. kl3)")
        for what, value in (("dual-clip", dual_clip_c), ("the ratio cap δ", ratio_cap)):
            if value is not None:
                raise DivvizInputError(f"{what} acts on PPO's clipped surrogate, not on {name}; drop it")
    if level == "sequence":
        if surrogate is not None and not surrogate.entry.sequence:
            raise DivvizInputError(f"the {surrogate.name} surrogate has a level of its own; the sequence level (GSPO) "
                                   "goes with PPO's surrogate, cispo or sapo")
        if clip is not None and clip.needs_pi_old:
            raise DivvizInputError(f"the clip test {clip.name} depends on π_old, which a sequence has not; the sequence "
                                   "level (GSPO) needs a test in the ratio alone")


TOKEN_STATES = ("inside", "masked low", "masked high", "dual-clip", "outside, pulled back")  # token_state's codes


@dataclass
class LossOutput:
    """The scalar loss and per-token facts (all (B, T), detached, zero/False on padding)."""

    loss: torch.Tensor
    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    measure: torch.Tensor | None  # the clip test's value per token (e.g. k3), None without a test
    outside: torch.Tensor  # fails the clip test, whatever the advantage's sign
    clipped_low: torch.Tensor  # w < l and A < 0 (TRL's is_low_clipped)
    clipped_high: torch.Tensor  # w > u and A > 0 (TRL's is_high_clipped)
    dual_clipped: torch.Tensor  # a cap binds: dual-clip's −c·A (A < 0), or the ratio cap's −δ·A
    grad_masked: torch.Tensor  # no gradient through w: clipped_low | clipped_high | dual_clipped
    pulled_back: torch.Tensor  # fails the test where A ≠ 0 pulls it back toward the region (gradient kept)
    penalty: torch.Tensor | None  # the penalty's value per token, None without a penalty

    def rows(self, index: torch.Tensor) -> "LossOutput":
        """The per-token facts of the completions in `index` (the scalar loss is kept as it is)."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        return LossOutput(**{k: v if k == "loss" or v is None else v[index] for k, v in picked.items()})

    @property
    def clipped_region(self) -> torch.Tensor:
        """TRL's is_region_clipped = is_low_clipped | is_high_clipped."""
        return self.clipped_low | self.clipped_high

    def clip_state(self) -> torch.Tensor:
        """Each token's clip state as one code, as the run store keeps it: 0 inside (or its gradient kept),
        1 clipped low, 2 clipped high, 3 dual-clipped."""
        return self.clipped_low.long() + 2 * self.clipped_high.long() + 3 * self.dual_clipped.long()

    def token_state(self) -> torch.Tensor:
        """`clip_state` with the outside tokens that keep their gradient told apart: code 4 when the token fails
        the test on the side its advantage pulls it back from (A > 0 with w < l, A < 0 with w > u; theory.md
        §1.4), so that the gradient moves it toward the region (an outside token with A = 0 stays 0: nothing
        pulls it). Names in `TOKEN_STATES`."""
        return self.clip_state() + 4 * self.pulled_back.long()


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: ClipTest | None = None,
    penalty: Penalty | None = None,
    beta: float = 0.0,
    logp_ref: torch.Tensor | None = None,
    dual_clip_c: float | None = None,
    aggregation: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: int | None = None,
    weight: torch.Tensor | None = None,
    surrogate: Surrogate | None = None,
    importance_sampling_level: str = "token",
    ratio_cap: float | None = None,
) -> LossOutput:
    """Loss and per-token facts for one batch.

    logp_new, logp_old, logp_ref: (B, T) log-probs of the sampled tokens (logp_old/ref carry no grad).
    adv: (B,) advantages, one per completion, or (B, T). mask: (B, T), 1 on completion tokens.
    clip: a configured clip test (`divergences.clip_test`), or None for no clipping.
    penalty, beta: a configured penalty and its coefficient β ≥ 0 (TRL's `beta`).
    dual_clip_c: None or c > 1. aggregation: one of `AGGREGATIONS` (see `aggregate`).
    weight: None, or a detached per-token weight ρ ((B, T) or (B, 1)) of the policy term, applied before the
    penalty is added, as TRL 1.16's `_compute_loss` applies its off-policy sequence mask, top-entropy token
    mask and vLLM importance-sampling ratio.
    surrogate: None for PPO's clipped surrogate, or a configured `surrogates.surrogate`, which replaces it.
    importance_sampling_level: "token", or "sequence" for GSPO (Zheng et al. 2025; TRL's option of that name):
    every token of completion i takes the ratio s_i = exp(mean_t log w_t), and the clip test judges s_i. Written as
    GSPO-token (verl's form): log s_i,t = sg(log s_i) + log π_t − sg(log π_t), so a token's gradient is its own; with one
    advantage per completion (TRL's) this is TRL's (B, 1) ratio exactly, with per-token advantages it is verl's.
    ratio_cap: None or TRL's delta > 1: PPO's unclipped term uses min(w, δ) (INTELLECT-2).
    """
    beta = check_beta(beta)
    dual_clip_c = check_dual_clip(dual_clip_c)
    ratio_cap = check_ratio_cap(ratio_cap)
    check_aggregation(aggregation)
    check_combination(clip, surrogate, importance_sampling_level, dual_clip_c, ratio_cap)
    check_inputs(logp_new, logp_old, adv, mask, logp_ref, weight)
    active = mask > 0
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)  # (B, 1)
    # what the mask drops takes no part: a NaN or -inf there (padding) must not reach the sums as 0 · NaN
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    logp_new, logp_old = torch.where(active, logp_new, zero), torch.where(active, logp_old.detach(), zero)
    adv = torch.where(active, adv.to(logp_new.dtype), zero)
    logp_ref = None if logp_ref is None else torch.where(active, logp_ref, zero)
    weight = None if weight is None else torch.where(active, weight.to(logp_new.dtype), zero)
    mask = mask.to(logp_new.dtype)

    log_ratio = logp_new - logp_old
    if importance_sampling_level == "sequence":  # GSPO-token: the value s_i on every token, the token's own gradient
        sequence = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = sequence.detach() + logp_new - logp_new.detach()
    ratio = log_ratio.exp()
    if clip is None:
        measure, outside, bounds = None, torch.zeros_like(ratio, dtype=torch.bool), None
    else:
        # at the sequence level the test reads the sequence's log-ratio (tests there are in w alone)
        new, old = (log_ratio, torch.zeros_like(log_ratio)) if importance_sampling_level == "sequence" \
            else (logp_new, logp_old)
        measure = clip.value(new, old)
        outside = ~clip.feasible(new, old)
        bounds = clip.bounds(old.exp())
    clipped_low = outside & (ratio < 1) & (adv < 0) & active
    clipped_high = outside & (ratio > 1) & (adv > 0) & active
    capped = torch.zeros_like(active)
    if surrogate is None:
        per_token, capped = _clipped_surrogate(ratio, adv, outside, bounds, dual_clip_c, ratio_cap)
        capped = capped & ~clipped_high & active
    else:
        kept = (~(clipped_low | clipped_high)).to(logp_new.dtype)
        per_token = surrogate.term(SurrogateInputs(log_ratio, logp_new, adv, mask, bounds, kept))
    if weight is not None:
        per_token = per_token * weight.detach()

    penalty_value = None
    if penalty is not None:
        penalty_value = penalty.value(logp_new, logp_old, logp_ref).detach()
        per_token = per_token + beta * penalty.loss_term(logp_new, logp_old, logp_ref)

    per_token = per_token.expand_as(mask)
    outside = outside.expand_as(active) & active
    loss = aggregate(per_token, mask, aggregation, max_completion_length, num_items_in_batch)
    return LossOutput(
        loss=loss,
        per_token_loss=(per_token * mask).detach(),
        ratio=(ratio * mask).detach(),
        measure=None if measure is None else (measure * mask).detach(),
        outside=outside,
        clipped_low=clipped_low,
        clipped_high=clipped_high,
        dual_clipped=capped,
        grad_masked=clipped_low | clipped_high | capped,
        pulled_back=outside & (adv != 0) & ~(clipped_low | clipped_high | capped),
        penalty=None if penalty_value is None else penalty_value * mask,
    )


def _clipped_surrogate(ratio, adv, outside, bounds, dual_clip_c, ratio_cap):
    """PPO's −min(w A, clip_C(w) A), with the ratio cap in the first term and the dual-clip cap; returns ℓ and
    where a cap binds (ℓ is a constant there)."""
    if bounds is None:
        clipped_ratio = ratio
    else:
        lower, upper = (torch.as_tensor(b, dtype=ratio.dtype, device=ratio.device) for b in bounds)
        clipped_ratio = torch.where(outside, torch.where(ratio > 1, upper, lower).expand_as(ratio).detach(), ratio)
    unclipped = ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)
    per_token = -torch.minimum(unclipped * adv, clipped_ratio * adv)
    capped = torch.zeros_like(per_token, dtype=torch.bool)
    if ratio_cap is not None:  # the capped first term is the one taken: ℓ = −δ A, a constant
        capped = (ratio > ratio_cap) & (unclipped * adv <= clipped_ratio * adv) & (adv != 0)
    if dual_clip_c is not None:
        cap = -dual_clip_c * adv
        capped = capped | ((adv < 0) & (per_token > cap))
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    return per_token, capped


class NonFiniteInput(DivvizInputError):
    """An input of `policy_loss` is NaN or infinite where the mask keeps a token; `name` says which. Training
    rewords it for logp_new: there it means the policy diverged, not that the caller passed bad numbers."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


def check_inputs(logp_new, logp_old, adv, mask, logp_ref=None, weight=None) -> None:
    """`policy_loss`'s inputs, or one `DivvizInputError` saying what is wrong: torch tensors; floating-point
    log-probs and advantages (a weight may also be a bool mask); logp_old, mask and logp_ref shaped like logp_new,
    (B, T) with B, T ≥ 1; adv (B,), (B, 1) or (B, T); weight (B, T) or (B, 1); finite values wherever the mask
    keeps a token (else `NonFiniteInput`)."""
    given = {"logp_new": logp_new, "logp_old": logp_old, "adv": adv, "mask": mask, "logp_ref": logp_ref,
             "weight": weight}
    for name, x in given.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise DivvizInputError(f"policy_loss: {name} is a {type(x).__module__}.{type(x).__name__}; it takes torch "
                                   "tensors (torch.as_tensor converts an array)")
        if x is not None and name not in ("mask", "weight") and not x.is_floating_point():
            raise DivvizInputError(f"policy_loss: {name} must hold floating-point numbers, not {x.dtype}")
    if logp_new.dim() != 2 or 0 in logp_new.shape:
        raise DivvizInputError(f"policy_loss: logp_new must be (B, T) with B, T ≥ 1 (completions × tokens); "
                               f"got shape {tuple(logp_new.shape)}")
    batch, tokens = logp_new.shape
    allowed = {"logp_old": [(batch, tokens)], "mask": [(batch, tokens)], "logp_ref": [(batch, tokens)],
               "adv": [(batch,), (batch, 1), (batch, tokens)], "weight": [(batch, tokens), (batch, 1)]}
    for name, shapes in allowed.items():
        x = given[name]
        if x is not None and tuple(x.shape) not in shapes:
            raise DivvizInputError(f"policy_loss: {name} has shape {tuple(x.shape)}; with logp_new {(batch, tokens)} "
                                   f"it must be {' or '.join(map(str, shapes))}")
    active = mask > 0
    for name in ("logp_new", "logp_old", "logp_ref", "adv", "weight"):
        x = given[name]
        if x is None:
            continue
        bad = ~torch.isfinite(x.detach().reshape(batch, -1).expand(batch, tokens)) & active
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            value = x.detach().reshape(batch, -1).expand(batch, tokens)[row, col].item()
            raise NonFiniteInput(f"policy_loss: {name} is {value} at completion {row}, token {col}, which the mask "
                                 "keeps; only masked positions may hold NaN or inf", name)


@dataclass
class LossGradient:
    """∂loss/∂logp_new and TRL's clip flags of one batch, numpy arrays shaped (B, T)."""

    grad: np.ndarray
    clipped_low: np.ndarray
    clipped_high: np.ndarray


class PolicyLossGradient:
    """The gradient of `policy_loss` with respect to logp_new, in closed form (numpy, float64), for R objectives
    at once: the softmax bandit's step.

        gradient = PolicyLossGradient(objectives, weights)   # once: what the objectives fix
        gradient.batch(logp_old, adv, logp_ref)              # each batch: what its μ inner steps share
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
    off the clip test's interval [l, u] (equal to its predicate, tests/test_catalogue.py); no test is
    [0, ∞). Dual-clip caps ℓ = |A| max(w, l) at c|A| for A < 0; since l ≤ 1 < c, the cap binds exactly
    where w > c.

    tests/test_losses.py checks it against autograd through `policy_loss` for every catalogue entry, with
    and without dual-clip, under every aggregation, alone and stacked; it is ~10× faster on tiny tensors.
    """

    def __init__(self, objectives: list[Objective], weights: np.ndarray):
        self.objectives, self.weights, self.active = objectives, weights, weights > 0
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
        self.surrogates = [(r, o.surrogate) for r, o in enumerate(objectives) if o.surrogate is not None]
        sequence_level = any(o.importance_sampling_level == "sequence" or (o.surrogate and o.surrogate.entry.own_level)
                             for o in objectives)
        if sequence_level and weights.shape[-1] != 1:
            raise DivvizInputError("the closed-form gradient takes sequence-level objectives only for one-token "
                                   "completions (the bandit's), where the sequence's ratio is the token's")
        # (rows, penalty, β·weights): one call for all runs when they share the penalty and β, else one per run
        terms = [(o.penalty, o.beta) for o in objectives]
        if terms[0][0] is not None and terms[0][1] > 0 and terms.count(terms[0]) == len(terms):
            self.penalties = [(slice(None), terms[0][0], terms[0][1] * weights)]
        else:
            self.penalties = [(r, penalty, beta * weights[r]) for r, (penalty, beta) in enumerate(terms)
                              if penalty is not None and beta > 0]

    def _per_run(self, values):
        """One float or one array like a row of π_old per run -> (R, 1, 1) or (R, B, T)."""
        if all(isinstance(v, float) for v in values):
            return np.array(values).reshape((-1,) + (1,) * (self.weights.ndim - 1))
        return np.stack(np.broadcast_arrays(*values))

    def _clip_bounds(self, pi_old):
        bounds = [(0.0, np.inf) if o.clip is None else o.clip.bounds(pi_old[r] if o.clip.needs_pi_old else None)
                  for r, o in enumerate(self.objectives)]
        return tuple(self._per_run(side) for side in zip(*bounds))

    def batch(self, logp_old, adv, logp_ref=None) -> "PolicyLossGradient":
        """Take the batch whose inner steps come next; returns self."""
        adv = adv[..., None] if adv.ndim == logp_old.ndim - 1 else adv
        self.logp_old, self.logp_ref = logp_old, logp_ref
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
            clipped_low = (w < self.lower) & self.negative
            clipped_high = (w > self.upper) & self.positive
            slope[clipped_low | clipped_high] = 0.0
        else:
            clipped_low = clipped_high = self.unclipped
        if self.capped:
            slope[(w > self.cap) & self.negative] = 0.0
        if self.ratio_capped:  # −δ A is taken: A > 0 past δ, A < 0 past δ and u (`_clipped_surrogate`)
            slope[(w > self.ratio_cap) & (self.positive | (self.negative & (w > self.upper)))] = 0.0
        for r, surrogate in self.surrogates:
            kept = ~(clipped_low[r] | clipped_high[r])
            slope[r] = self.surrogate_slope[r] * surrogate.weight(w[r], self.adv[r], kept)
        for rows, penalty, weight in self.penalties:
            ref = None if self.logp_ref is None else self.logp_ref[rows]
            slope[rows] += weight * penalty.slope(logp_new[rows], self.logp_old[rows], ref)
        return LossGradient(slope, clipped_low, clipped_high)

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


def aggregation_weights(mask: np.ndarray, how: str, max_completion_length: int | None = None,
                        num_items_in_batch: float | None = None) -> np.ndarray:
    """∂loss/∂ℓ_t of `aggregate`: each token's weight in the loss."""
    mask = np.asarray(mask, dtype=np.float64)
    if how == "grpo":
        return mask / np.maximum(mask.sum(-1, keepdims=True), 1) / mask.shape[0]
    if how == "dapo" and num_items_in_batch is not None:
        return mask / float(num_items_in_batch)
    if how in ("bnpo", "dapo"):
        return mask / max(mask.sum(), 1)
    if how == "dr_grpo":
        return mask / (mask.shape[0] * (max_completion_length or mask.shape[-1]))
    if how == "luspo":
        return mask / mask.shape[0]
    if how == "token_sum":
        return mask
    raise ValueError(f"unknown aggregation {how!r}")


def group_advantages(rewards, scale: bool):
    """GRPO's group-relative advantages: (groups, G) rewards → r − mean_group, divided by (std_group + 1e-4)
    when `scale` (Shao et al. 2024; TRL's `scale_rewards`; std unbiased, as torch's), left unscaled for
    Dr. GRPO (Liu et al. 2025). Takes a torch tensor or a numpy array (G ≥ 2) and returns the same kind."""
    size = rewards.shape[1]
    adv = rewards - (rewards.sum(1) / size)[:, None]
    if scale:
        std = ((adv * adv).sum(1) / (size - 1)) ** 0.5
        adv = adv / (std[:, None] + 1e-4)
    return adv


def grpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO: mean over each completion's tokens, then mean over completions (Shao et al. 2024)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def bnpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BNPO: sum over all tokens divided by the number of tokens in this batch."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def dr_grpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """Dr. GRPO: sum over all tokens divided by the constant B × max_completion_length (Liu et al. 2025)."""
    return (per_token * mask).sum() / (per_token.shape[0] * max_completion_length)


def dapo_aggregate(per_token: torch.Tensor, mask: torch.Tensor, num_items_in_batch: int | None) -> torch.Tensor:
    """DAPO: token-level mean over the whole global batch (Yu et al. 2025). TRL divides by the tokens of
    all processes and accumulation steps (`num_items_in_batch`); in one process with one step that is
    this batch's token count, i.e. the same number as bnpo."""
    normaliser = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return (per_token * mask).sum() / normaliser


def aggregate(per_token, mask, how: str, max_completion_length: int | None = None,
              num_items_in_batch: int | None = None) -> torch.Tensor:
    """Reduce (B, T) per-token losses to a scalar, as TRL's `loss_type` names them; "luspo" is TRL's mean over
    completions of each one's token sum (verl's seq-mean-token-sum), "token_sum" verl's plain sum of all tokens."""
    if how == "grpo":
        return grpo_aggregate(per_token, mask)
    if how == "bnpo":
        return bnpo_aggregate(per_token, mask)
    if how == "dr_grpo":
        return dr_grpo_aggregate(per_token, mask, max_completion_length or per_token.shape[-1])
    if how == "dapo":
        return dapo_aggregate(per_token, mask, num_items_in_batch)
    if how == "luspo":
        return (per_token * mask).sum(-1).mean()
    if how == "token_sum":
        return (per_token * mask).sum()
    raise ValueError(f"unknown aggregation {how!r}")
