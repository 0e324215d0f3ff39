"""The one policy loss: every training step and every explorer curve goes through `policy_loss`; the
softmax bandit steps with its gradient in closed form, `loss_gradient.PolicyLossGradient` (tested equal to autograd's).

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
docs/theory.md §1.2 calls J_general; for every test in the catalogue the feasible set is an interval [l, u]
∋ 1, so the result equals PPO's clamp on that interval, value and gradient (tests/loss/test_losses.py).
With no clip test the surrogate is the plain −w_t A_i.

Which tokens lose their gradient (docs/theory.md §1.4): A > 0 above u, A < 0 below l, and with dual-clip
A < 0 where the cap binds. TRL's clip fractions count exactly the first two
(`clip_ratio/low_mean`: w < l and A < 0; `clip_ratio/high_mean`: w > u and A > 0).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from divviz.catalogue.aggregation import aggregate, check_aggregation
from divviz.catalogue.divergences import ClipTest, check_beta, check_dual_clip
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import Penalty
from divviz.catalogue.surrogates import Surrogate, SurrogateInputs
from divviz.loss_checks import (check_combination, check_inputs, check_measure, check_normalisers,
                                check_off_policy_mask_threshold, check_ratio_cap)


@dataclass(frozen=True)
class Objective:
    """Everything that picks the loss, checked once, on construction (each parameter and how they combine); used by
    the explorer, the bandit and training alike, through `policy_loss`.

    clip: a configured clip test (`divergences.clip_test`), or None for no clipping.
    surrogate: None for PPO's clipped surrogate, or a configured `surrogates.surrogate`, which replaces it.
    penalty, beta: a configured penalty and its coefficient β ≥ 0 (TRL's `beta`); second_penalty, second_beta:
    another one added as second_beta·its loss term (GBMPO's prob_l2kl adds λ·prob_l2 to β·k3).
    dual_clip_c: None or c > 1. ratio_cap: None or TRL's delta > 1: PPO's unclipped term uses min(w, δ)
    (INTELLECT-2). aggregation: one of `AGGREGATIONS` (`aggregate`).
    importance_sampling_level: "token", or "sequence" for GSPO (Zheng et al. 2025; TRL's option of that name):
    every token of completion i takes the ratio s_i = exp(mean_t log w_t), and the clip test judges s_i. Written as
    GSPO-token (verl's form): log s_i,t = sg(log s_i) + log π_t − sg(log π_t), so a token's gradient is its own; with
    one advantage per completion (TRL's) this is TRL's (B, 1) ratio exactly, with per-token advantages verl's.
    off_policy_mask_threshold: None or TRL's off_policy_mask_threshold δ ≥ 0 (`off_policy_sequence_mask`), applied to
    the policy term as a weight is.
    """

    clip: ClipTest | None = None
    penalty: Penalty | None = None
    beta: float = 0.0
    dual_clip_c: float | None = None
    aggregation: str = "grpo"
    surrogate: Surrogate | None = None
    importance_sampling_level: str = "token"
    ratio_cap: float | None = None
    second_penalty: Penalty | None = None
    second_beta: float = 0.0
    off_policy_mask_threshold: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "beta", check_beta(self.beta))
        object.__setattr__(self, "second_beta", check_beta(self.second_beta))
        object.__setattr__(self, "dual_clip_c", check_dual_clip(self.dual_clip_c))
        object.__setattr__(self, "ratio_cap", check_ratio_cap(self.ratio_cap))
        object.__setattr__(self, "off_policy_mask_threshold",
                           check_off_policy_mask_threshold(self.off_policy_mask_threshold))
        check_aggregation(self.aggregation)
        check_combination(self.clip, self.surrogate, self.importance_sampling_level, self.dual_clip_c, self.ratio_cap)
        for role, given in (("penalty", self.penalty), ("second_penalty", self.second_penalty)):
            check_measure(role, given, Penalty, "penalty")

    @property
    def label(self) -> str:
        if self.surrogate is None:
            parts = [self.clip.label if self.clip else "no clip"]
        else:
            parts = [self.surrogate.label] + (["with", self.clip.label] if self.clip else [])
        if self.importance_sampling_level == "sequence":
            parts.append("(sequence)")
        parts += [f"+ {beta:g}·{penalty.label}" for penalty, beta in self.penalties]
        if self.dual_clip_c is not None:
            parts.append(f"c={self.dual_clip_c:g}")
        if self.ratio_cap is not None:
            parts.append(f"δ_cap={self.ratio_cap:g}")
        if self.off_policy_mask_threshold is not None:
            parts.append(f"OPSM δ={self.off_policy_mask_threshold:g}")
        return " ".join(parts)

    @property
    def penalties(self) -> list[tuple[Penalty, float]]:
        """(penalty, coefficient) of each penalty that acts (its coefficient > 0)."""
        return [(p, b) for p, b in ((self.penalty, self.beta), (self.second_penalty, self.second_beta))
                if p is not None and b > 0]

    def policy_term(self) -> "Objective":
        """The same objective without its penalties: the policy term alone."""
        return replace(self, penalty=None, beta=0.0, second_penalty=None, second_beta=0.0)

    @property
    def needs_ref(self) -> bool:
        """Whether a penalty reads π_ref (training then keeps a frozen copy of the start policy)."""
        return any(p.entry.needs_ref for p in (self.penalty, self.second_penalty) if p is not None)

    def __call__(self, logp_new, logp_old, adv, mask, logp_ref=None, **kwargs) -> "LossOutput":
        """`policy_loss` under this objective."""
        return policy_loss(logp_new, logp_old, adv, mask, self, logp_ref=logp_ref, **kwargs)


def off_policy_sequence_mask(logp_new, logp_old, adv, mask, threshold: float) -> torch.Tensor:
    """1 where a completion stays in the policy term, 0 where it is dropped: A < 0 and its mean KL(π_old‖π_θ) estimate,
    mean_t (log π_old − log π_θ) over its tokens, above δ (DeepSeek-V3.2; TRL 1.16's `get_off_policy_mask`).
    (B, 1) for one advantage per completion, else (B, T); detached."""
    kl = ((logp_old - logp_new.detach()) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    return ((adv >= 0) | (kl <= threshold)).to(mask.dtype)


# token_state's codes; a step record (`engine/completions.py`) adds code 5 for a token that the rollout correction's
# rejection took out of the loss (`token_state` never gives it: such a token is not in the loss's mask)
TOKEN_STATES = ("inside", "masked low", "masked high", "dual-clip", "outside, pulled back", "rejected (rollout)")


@dataclass
class LossOutput:
    """The scalar loss and per-token facts (all (B, T), detached, zero/False on padding)."""

    loss: torch.Tensor
    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    clip_value: torch.Tensor | None  # the clip test's value per token (e.g. k3), None without a test
    outside: torch.Tensor  # fails the clip test, whatever the advantage's sign
    masked_low: torch.Tensor  # w < l and A < 0 (TRL's is_low_clipped)
    masked_high: torch.Tensor  # w > u and A > 0 (TRL's is_high_clipped)
    dual_clip: torch.Tensor  # a cap binds: dual-clip's −c·A (A < 0), or the ratio cap's −δ·A
    grad_masked: torch.Tensor  # no gradient through w: masked_low | masked_high | dual_clip
    pulled_back: torch.Tensor  # fails the test where A ≠ 0 pulls it back toward the region (its gradient flows)
    penalty: torch.Tensor | None  # the penalty's value per token, None without a penalty
    policy_weight: torch.Tensor | None = None  # ρ_t, what multiplies the policy term (`weight` × the off-policy
    # mask), None when nothing does
    token_loss: torch.Tensor | None = None  # ℓ_t × mask with its graph: for a trainer that aggregates the tokens
    # itself (verl's agg_loss, `divviz.verl`); `loss` is `aggregate` of it

    def rows(self, index: torch.Tensor) -> "LossOutput":
        """The per-token facts of the completions in `index` (the scalar loss is kept as it is)."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        return LossOutput(**{k: v if k == "loss" or v is None else v[index] for k, v in picked.items()})

    # the earlier spellings of the clip states (one name per idea, docs/architecture.md), for code written with them
    clipped_low = property(lambda self: self.masked_low)
    clipped_high = property(lambda self: self.masked_high)
    dual_clipped = property(lambda self: self.dual_clip)
    clipped_region = property(lambda self: self.masked_region)

    @property
    def masked_region(self) -> torch.Tensor:
        """Masked low or high: TRL's is_region_clipped = is_low_clipped | is_high_clipped."""
        return self.masked_low | self.masked_high

    def clip_state(self) -> torch.Tensor:
        """Each token's clip state as one code, as the run store keeps it: 0 inside (or its gradient flows),
        1 masked low, 2 masked high, 3 dual-clip."""
        return self.masked_low.long() + 2 * self.masked_high.long() + 3 * self.dual_clip.long()

    def token_state(self) -> torch.Tensor:
        """`clip_state` with the outside tokens that keep their gradient told apart: code 4 when the token fails
        the test on the side its advantage pulls it back from (A > 0 with w < l, A < 0 with w > u; docs/theory.md
        §1.4), so that the gradient moves it toward the region (an outside token with A = 0 stays 0: nothing
        pulls it). Names in `TOKEN_STATES`."""
        return self.clip_state() + 4 * self.pulled_back.long()


def _masked(active: torch.Tensor, logp_new, logp_old, adv, logp_ref, weight, logp_sampling) -> tuple:
    """The inputs with what the mask drops set to 0 (a NaN or -inf there, padding, must not reach the sums as
    0 · NaN), the old and sampling log-probs detached, `adv` as (B, 1) or (B, T), and π_old standing in for the
    sampling policy where none is given."""
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)  # (B, 1)
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    logp_new, logp_old = torch.where(active, logp_new, zero), torch.where(active, logp_old.detach(), zero)
    adv = torch.where(active, adv.to(logp_new.dtype), zero)
    logp_ref = None if logp_ref is None else torch.where(active, logp_ref, zero)
    weight = None if weight is None else torch.where(active, weight.to(logp_new.dtype), zero)
    logp_sampling = logp_old if logp_sampling is None else torch.where(active, logp_sampling.detach(), zero)
    return logp_new, logp_old, adv, logp_ref, weight, logp_sampling


def _log_ratio(objective: Objective, logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor):
    """log w = log π_θ − log π_old per token; GSPO-token's sequence level puts the completion's mean log-ratio s_i
    on every token, with the token's own gradient."""
    log_ratio = logp_new - logp_old
    if objective.importance_sampling_level == "sequence":
        sequence = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = sequence.detach() + logp_new - logp_new.detach()
    return log_ratio


def _with_penalties(objective: Objective, per_token: torch.Tensor, logp_new, logp_old, logp_ref) -> torch.Tensor:
    """The per-token policy term plus β · each penalty's per-token loss term (the objective's first and second)."""
    for penalty, beta in ((objective.penalty, objective.beta), (objective.second_penalty, objective.second_beta)):
        if penalty is not None:
            per_token = per_token + beta * penalty.loss_term(logp_new, logp_old, logp_ref)
    return per_token


def policy_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                objective: Objective = Objective(), *, logp_ref: torch.Tensor | None = None,
                max_completion_length: int | None = None, num_items_in_batch: int | None = None,
                weight: torch.Tensor | None = None, logp_sampling: torch.Tensor | None = None) -> LossOutput:
    """`objective`'s loss and per-token facts for one batch, as the module's docstring writes it (the default
    objective: no clip test, no penalty, the plain surrogate −w A).

    logp_new, logp_old, logp_ref: (B, T) log-probs of the sampled tokens (logp_old/ref carry no grad).
    adv: (B,) advantages, one per completion, or (B, T). mask: (B, T), 1 on completion tokens.
    max_completion_length, num_items_in_batch: Dr. GRPO's length and DAPO's token count (`aggregate`).
    weight: None, or a detached per-token weight ρ ((B, T) or (B, 1)) of the policy term, applied before the
    penalty is added, as TRL 1.16's `_compute_loss` applies its top-entropy token mask and vLLM importance-sampling
    ratio; a surrogate with one term per completion (geo_mean) takes the geometric mean of its tokens' weights, as
    verl's rollout importance weights.
    logp_sampling: the sampling policy's log-probs for the off-policy mask (default π_old; TRL takes vLLM's).
    LossOutput.policy_weight is the product of what multiplies the policy term: `weight` and the off-policy mask.
    """
    if not isinstance(objective, Objective):
        raise DivvizInputError(f"policy_loss: objective must be an Objective(clip=…, …); got a "
                               f"{type(objective).__name__}")
    check_normalisers(max_completion_length, num_items_in_batch)
    check_inputs(logp_new, logp_old, adv, mask, logp_ref, weight, logp_sampling)
    active = mask > 0
    logp_new, logp_old, adv, logp_ref, weight, logp_sampling = _masked(active, logp_new, logp_old, adv, logp_ref,
                                                                       weight, logp_sampling)
    mask = mask.to(logp_new.dtype)
    log_ratio = _log_ratio(objective, logp_new, logp_old, mask)
    ratio = log_ratio.exp()
    clip_value, outside, bounds = _clip_test(objective, logp_new, logp_old, log_ratio)
    masked_low = outside & (ratio < 1) & (adv < 0) & active
    masked_high = outside & (ratio > 1) & (adv > 0) & active
    capped = torch.zeros_like(active)
    if objective.surrogate is None:
        per_token, capped = _clipped_surrogate(ratio, adv, outside, bounds, objective.dual_clip_c, objective.ratio_cap)
        capped = capped & ~masked_high & active
    else:
        unmasked = (~(masked_low | masked_high)).to(logp_new.dtype)
        per_token = objective.surrogate.term(SurrogateInputs(log_ratio, logp_new, adv, mask, bounds, unmasked))
    weight = _policy_weight(objective, weight, per_token, logp_new, logp_sampling, adv, mask)
    if weight is not None:
        per_token = per_token * weight.detach()
    per_token = _with_penalties(objective, per_token, logp_new, logp_old, logp_ref).expand_as(mask)
    outside = outside.expand_as(active) & active
    loss = aggregate(per_token, mask, objective.aggregation, max_completion_length, num_items_in_batch)
    penalty_value = None if objective.penalty is None else objective.penalty.value(logp_new, logp_old, logp_ref)
    return LossOutput(
        loss=loss,
        per_token_loss=(per_token * mask).detach(),
        ratio=(ratio * mask).detach(),
        clip_value=None if clip_value is None else (clip_value * mask).detach(),
        outside=outside,
        masked_low=masked_low,
        masked_high=masked_high,
        dual_clip=capped,
        grad_masked=masked_low | masked_high | capped,
        pulled_back=outside & (adv != 0) & ~(masked_low | masked_high | capped),
        penalty=None if penalty_value is None else penalty_value.detach() * mask,
        policy_weight=None if weight is None else (weight.detach() * mask).expand_as(mask),
        token_loss=per_token * mask,
    )


def _clip_test(objective: Objective, logp_new, logp_old, log_ratio):
    """The clip test's value per token, where it fails, and its interval [l, u] ((None, all False, None) without
    one). At the sequence level it reads the sequence's log-ratio (the tests allowed there are in w alone)."""
    clip = objective.clip
    if clip is None:
        return None, torch.zeros_like(log_ratio, dtype=torch.bool), None
    new, old = (log_ratio, torch.zeros_like(log_ratio)) if objective.importance_sampling_level == "sequence" \
        else (logp_new, logp_old)
    return clip.value(new, old), ~clip.feasible(new, old), clip.bounds(old.exp())


def _policy_weight(objective: Objective, weight, per_token, logp_new, logp_sampling, adv, mask):
    """What multiplies the policy term: `weight` (its tokens' geometric mean where the surrogate has one term per
    completion, GMPO's, as verl's) times TRL's off-policy sequence mask; None where nothing does."""
    if weight is not None and per_token.shape[-1] == 1 and weight.shape[-1] > 1:
        log_mean = ((weight + 1e-10).log() * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
        weight = log_mean.exp()
    if objective.off_policy_mask_threshold is not None:
        sequences = off_policy_sequence_mask(logp_new, logp_sampling, adv, mask, objective.off_policy_mask_threshold)
        weight = sequences if weight is None else weight * sequences
    return weight


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
