"""What the explorer pages draw, computed with the training code itself.

Every surrogate and gradient curve here is `losses.policy_loss` evaluated on a grid of ratios in float64,
with gradients from autograd; every interval is the catalogue's `bounds`. Results are plain numpy
arrays; `views/plots.py` turns them into figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from divviz.catalogue import theory
from divviz.catalogue.divergences import ClipTest, clip_test
from divviz.losses import Objective, policy_loss
from divviz.catalogue.penalties import Penalty
from divviz.catalogue.rollout_correction import RolloutCorrection

F64 = torch.float64


@dataclass
class RatioCurves:
    """Surrogate objective −ℓ(w) and its slope d(−ℓ)/dw for one test at A = +1 and A = −1."""

    ratio: np.ndarray  # (N,)
    surrogate: dict[int, np.ndarray]  # sign of A -> (N,)
    slope: dict[int, np.ndarray]  # sign of A -> (N,)
    masked: dict[int, np.ndarray]  # sign of A -> (N,) bool: no gradient through w
    bounds: tuple[float, float]  # (l, u) at this π_old


def ratio_curves(test: ClipTest | None, ratio: np.ndarray, pi_old: float = 0.5,
                 dual_clip_c: float | None = None) -> RatioCurves:
    """Push a grid of ratios through `policy_loss` for A = +1 and A = −1 (one token per row).

    The slope is d(−ℓ)/dw = −(∂ℓ/∂log π_θ) / w, by autograd through the same code that trains.
    """
    n = len(ratio)
    w = torch.as_tensor(np.concatenate([ratio, ratio]), dtype=F64).unsqueeze(1)  # (2N, 1)
    logp_old = torch.full_like(w, float(np.log(pi_old)))
    logp_new = (logp_old + w.log()).requires_grad_()
    adv = torch.cat([torch.ones(n, dtype=F64), -torch.ones(n, dtype=F64)])
    out = policy_loss(logp_new, logp_old, adv, torch.ones_like(w),
                      Objective(clip=test, dual_clip_c=dual_clip_c, aggregation="dr_grpo"), max_completion_length=1)
    (grad,) = torch.autograd.grad(out.loss * (2 * n), logp_new)  # undo the 1/(B·T) of the mean
    surrogate = -out.per_token_loss.squeeze(1).numpy()
    slope = (-grad.squeeze(1) / w.squeeze(1)).numpy()
    masked = out.grad_masked.squeeze(1).numpy()
    halves = {+1: slice(0, n), -1: slice(n, 2 * n)}
    bounds = (0.0, np.inf) if test is None else tuple(float(b) for b in test.bounds(np.asarray(pi_old)))
    return RatioCurves(
        ratio=np.asarray(ratio, dtype=np.float64),
        surrogate={s: surrogate[h] for s, h in halves.items()},
        slope={s: slope[h] for s, h in halves.items()},
        masked={s: masked[h] for s, h in halves.items()},
        bounds=bounds,
    )


def gradient_weight(objective: Objective, ratio: np.ndarray, pi_old: float = 0.5,
                    picked: bool = False) -> dict[int, np.ndarray]:
    """The gradient weight γ(w) = −(∂ℓ/∂log π_θ)/A of an objective's policy term for A = +1 and A = −1, by autograd
    through `policy_loss` on one-token completions (so a sequence-level surrogate's W is the token's w). PPO's γ is w
    inside the region and 0 where the clip test masks; a surrogate's is its own (`surrogates.py`).

    A batch-selecting surrogate (kl_cov, clip_cov) treats the tokens it picks otherwise than the rest, and which it
    picks depends on the whole batch: its γ comes from its closed form (tested equal to autograd), for the tokens it
    picks (`picked`) or for the others."""
    chosen = objective.surrogate
    if chosen is not None and chosen.entry.select is not None:
        lower, upper = objective.clip.bounds(np.asarray(pi_old)) if objective.clip else (0.0, np.inf)
        return {sign: chosen.weight(ratio, np.full_like(ratio, sign), ~((ratio > upper) if sign > 0 else (ratio < lower)),
                                    np.full(ratio.shape, picked)) for sign in (+1, -1)}
    n = len(ratio)
    w = torch.as_tensor(np.concatenate([ratio, ratio]), dtype=F64).unsqueeze(1)
    logp_old = torch.full_like(w, float(np.log(pi_old)))
    logp_new = (logp_old + w.log()).requires_grad_()
    adv = torch.cat([torch.ones(n, dtype=F64), -torch.ones(n, dtype=F64)])
    plain = replace(objective.policy_term(), aggregation="token_sum",  # each token's own gradient (one token: its
                    importance_sampling_level="token")  # level is the sequence's)
    (grad,) = torch.autograd.grad(plain(logp_new, logp_old, adv, torch.ones_like(w)).loss, logp_new)
    weight = (-grad.squeeze(1) / adv).numpy()
    return {+1: weight[:n], -1: weight[n:]}


def penalty_curves(penalty: Penalty, ratio: np.ndarray, anchor: float) -> tuple[np.ndarray, np.ndarray]:
    """A penalty's value and the slope of its loss term ∂/∂log π_θ (closed form, tested against autograd) against
    r = π_θ/π_anchor, with π_anchor both π_ref and π_old (penalties toward the reference read the first, RPG's the
    second); NaN where π_θ would exceed 1."""
    inside = ratio * anchor <= 1.0
    new = np.log(np.where(inside, ratio * anchor, anchor))
    anchor_logp = np.full_like(new, np.log(anchor))
    value = penalty.value(torch.as_tensor(new, dtype=F64), torch.as_tensor(anchor_logp, dtype=F64),
                          torch.as_tensor(anchor_logp, dtype=F64)).numpy()
    slope = penalty.slope(new, anchor_logp, anchor_logp)
    return np.where(inside, value, np.nan), np.where(inside, slope, np.nan)


def masked_spans(ratio: np.ndarray, masked: np.ndarray) -> list[tuple[float, float]]:
    """Contiguous [start, end] ranges of the ratio grid where the gradient is masked, for shading."""
    spans, start = [], None
    for i, m in enumerate(masked):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((float(ratio[start]), float(ratio[i - 1])))
            start = None
    if start is not None:
        spans.append((float(ratio[start]), float(ratio[-1])))
    return spans


def feasible_region(test: ClipTest, pi_old: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The feasible band in the (π_old, π_new) plane: π_new ∈ [l·π_old, min(1, u·π_old)]."""
    pi_old = np.asarray(pi_old, dtype=np.float64)
    lower, upper = test.bounds(pi_old)
    return np.broadcast_to(lower * pi_old, pi_old.shape), np.minimum(1.0, upper * pi_old)


def interval_sweep(test: ClipTest, param: str, values: np.ndarray, pi_old: float = 0.5):
    """(l, u) of `test` as one of its parameters runs over `values` (valid ones), the others held."""
    values = np.asarray(values, dtype=np.float64)
    lower, upper = test.entry.bounds({**test.params, param: values}, np.asarray(pi_old, dtype=np.float64))
    return np.broadcast_to(lower, values.shape).astype(np.float64), np.broadcast_to(upper, values.shape).astype(np.float64)


def logit_room(test: ClipTest, pi_old: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How far the sampled token's logit may move before the test clips, against π_old (§1.5 [INF])."""
    pi_old = np.asarray(pi_old, dtype=np.float64)
    lower, upper = test.bounds(pi_old)
    return theory.logit_shift_bounds(lower, upper, pi_old)


@dataclass
class EquivalenceCheck:
    """KL3 test vs ratio clipping on [l_δ, u_δ], on one random batch."""

    delta: float
    bounds: tuple[float, float]
    tokens: int
    outside: int
    masked: int
    loss_kl3: float
    loss_box: float
    max_abs_loss_diff: float
    max_abs_grad_diff: float
    max_abs_grad: float


def correction_curve(correction: RolloutCorrection, rho: np.ndarray) -> np.ndarray:
    """What a rollout correction multiplies a one-token completion's policy term by, against ρ = π_old/π_roll: its
    importance weight (1 without one), 0 where it rejects the token — `RolloutCorrection.apply` on a batch of such
    completions (for one token the sequence level is the token level; batch normalisation, a mean over the grid,
    means nothing here and is left out)."""
    logp_old = torch.from_numpy(np.log(rho)).to(F64)[:, None]
    out = replace(correction, rollout_is_batch_normalize=False).apply(logp_old, torch.zeros_like(logp_old),
                                                                        torch.ones_like(logp_old))
    weight = torch.ones_like(logp_old) if out.weight is None else out.weight
    return (weight * out.mask)[:, 0].numpy()


def random_token_batch(seed: int, completions: int = 64, length: int = 32, spread: float = 0.5):
    """A reproducible batch of log-probs with ratios on both sides of typical boxes, mixed-sign advantages."""
    g = torch.Generator().manual_seed(seed)
    logp_old = torch.log(torch.rand(completions, length, generator=g, dtype=F64) * 0.98 + 0.01)
    logp_new = (logp_old + spread * torch.randn(completions, length, generator=g, dtype=F64)).clamp(max=0.0)
    adv = torch.randn(completions, generator=g, dtype=F64)
    lengths = torch.randint(1, length + 1, (completions,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(F64)
    return logp_new, logp_old, adv, mask


def kl3_equivalence_check(delta: float, seed: int = 0, completions: int = 64, length: int = 32,
                          aggregation: str = "grpo") -> EquivalenceCheck:
    """Loss and gradient under the KL3 test and under clip_higher on its Lambert-W interval."""
    logp_new, logp_old, adv, mask = random_token_batch(seed, completions, length)
    kl3 = clip_test("kl3", delta=delta)
    lower, upper = kl3.bounds()
    box = clip_test("clip_higher", eps_low=1 - lower, eps_high=upper - 1)
    results = []
    for test in (kl3, box):
        x = logp_new.clone().requires_grad_()
        out = policy_loss(x, logp_old, adv, mask, Objective(clip=test, aggregation=aggregation))
        (g,) = torch.autograd.grad(out.loss, x)
        results.append((out, g))
    (a, ga), (b, gb) = results
    return EquivalenceCheck(
        delta=delta, bounds=(lower, upper), tokens=int(mask.sum()), outside=int(a.outside.sum()),
        masked=int(a.grad_masked.sum()), loss_kl3=a.loss.detach().item(), loss_box=b.loss.detach().item(),
        max_abs_loss_diff=abs(a.loss.detach().item() - b.loss.detach().item()), max_abs_grad_diff=float((ga - gb).abs().max()),
        max_abs_grad=float(ga.abs().max()),
    )
