"""Rollout corrections: weights and masks for tokens sampled by a rollout policy π_roll that is not the policy
being trained (an inference engine in another precision, a copy some updates behind), as verl 0.9.1 computes them in
its decoupled mode (`trainer/ppo/rollout_corr_helper.py`; verl cites Yao et al., "Off-policy RL",
fengyao.notion.site/off-policy-rl, and Liu, Li et al., "When Speed Kills Stability", richardli.xyz/rl-collapse).

With log ρ_t = log π_old(t) − log π_roll(t) (π_old: the trained policy before the update, which the loss's ratio
divides by):

    weights   token:     ρ_t = exp(clamp(log ρ_t, ±20))   sequence: Π_t ρ_t = exp(clamp(Σ_t log ρ_t, ±20)) on every
                                                           token of the completion
              TIS "u":   min(ρ, u)                        IcePop "l_u": ρ where l ≤ ρ ≤ u, else 0
              batch_normalize: divided by their mean over the batch's tokens (token) or completions (sequence)
    rejection a statistic of k1 = −log ρ, k2 = ½(log ρ)² or k3 = ρ − 1 − log ρ, per token (token_kX) or per
              completion (seq_sum_kX, seq_mean_kX, seq_max_kX), in the loss when within its threshold: k1 in
              [log l, log u] ("l_u"; one number u means l = 1/u), k2 and k3 at most u; several options
              (comma-separated, with one threshold each or one for all) must all keep a token.

`RolloutCorrection` is one such setting under verl's names (`RolloutCorrectionConfig`); `apply` gives the weights,
which enter `losses.policy_loss` as its `weight` (detached), the mask, which replaces the loss's (a rejected token
leaves the loss and its normaliser), and verl's diagnostics under its "rollout_corr/" names. divviz's engine has a
π_roll ≠ π_old when its sampler runs in lower precision or some steps behind (`engine/sampler.py`). verl's bypass
mode, where π_old is π_roll, makes token TIS and IcePop the surrogates `cispo` (lo = 0) and `icepop`.
tests/loss/test_verl.py checks the weights, masks and metrics against verl's own vectors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from divviz.catalogue.estimators import ESTIMATORS
from divviz.catalogue.params import CatalogueEntry, DivvizInputError, Param, by_name
from divviz.safetext import quoted, unknown

LEVELS = ("token", "sequence")
REDUCTIONS = ("token", "seq_sum", "seq_mean", "seq_max")
OPTIONS = tuple(f"{r}_{k}" for r in REDUCTIONS for k in ESTIMATORS if (r, k) != ("seq_max", "k1"))  # verl's 11
SAFETY_BOUND = 20.0  # verl's: log-ratios are clamped to ±20 before exp
# a simulated sampler's precision (the engine's and the bandit's): "same" is the trained policy's own
SAMPLER_DTYPES = {"same": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The numbers behind verl's threshold strings, as the app's sliders set them (verl's typical ranges: TIS u 1.5–5 per
# token, 2–10 per completion)
TIS_CAP = Param("tis_u", 2.0, 0.0, low_open=True, typical=(1.05, 10.0, 0.05), doc="TIS: the weight is min(ρ, u)")
ICEPOP_LOW = Param("icepop_l", 0.5, 0.0, 1.0, low_open=True, high_open=False, typical=(0.05, 1.0, 0.05),
                   doc="IcePop: ρ where it lies in [l, u], else 0")
ICEPOP_HIGH = Param("icepop_u", 2.0, 1.0, typical=(1.05, 10.0, 0.05), doc="IcePop: ρ where it lies in [l, u], else 0")
RS_RATIO_LOW = Param("rs_l", 0.5, 0.0, 1.0, low_open=True, high_open=False, typical=(0.05, 1.0, 0.05),
                     doc="k1 rejection: in the loss where a token's (or completion's) statistic is in [log l, log u]")
RS_RATIO_HIGH = Param("rs_u", 2.0, 1.0, typical=(1.05, 10.0, 0.05),
                      doc="k1 rejection: in the loss where a token's (or completion's) statistic is in [log l, log u]")
RS_BOUND = Param("rs_bound", 0.05, 0.0, low_open=True, typical=(0.0001, 1.0, 0.0001),
                 doc="k2/k3 rejection: in the loss where the statistic is at most this")


@dataclass(frozen=True)
class CorrectionEntry(CatalogueEntry):
    """One of verl's rollout corrections as the catalogue and the Training lab show it: a run option, not a loss."""

    source: str
    params: tuple[Param, ...]
    flags: str  # how `divviz train` asks for it
    sibling: str
    how: str  # how it differs from `sibling`


HELPER = "verl 0.9.1 trainer/ppo/rollout_corr_helper.py"
CORRECTIONS = by_name(
    CorrectionEntry("TIS token", "truncated importance weight per token", r"\min(\rho_t,\,u)\cdot\ell_t",
                    "Each token's policy term times its weight ρ_t = π_old/π_roll, capped at u: the mismatch is undone "
                    "where it is small, and no token's weight passes u.",
                    f"{HELPER}, compute_rollout_correction_weights(rollout_is='token'); Yao et al., "
                    "fengyao.notion.site/off-policy-rl", (TIS_CAP,),
                    "--rollout-is token --rollout-is-threshold U", "IcePop token",
                    "keeps a capped weight u where IcePop drops the token (weight 0)"),
    CorrectionEntry("TIS sequence", "truncated importance weight per completion",
                    r"\min\big(\textstyle\prod_t \rho_t,\,u\big)\cdot\ell_t",
                    "Every token of a completion times the completion's weight Π_t ρ_t, capped at u: unbiased for the "
                    "sequence before the cap, with a variance that grows with the length.",
                    f"{HELPER}, compute_rollout_correction_weights(rollout_is='sequence')", (TIS_CAP,),
                    "--rollout-is sequence --rollout-is-threshold U", "TIS token",
                    "one weight per completion, the product of its tokens' ρ, instead of one per token"),
    CorrectionEntry("IcePop token", "masked importance weight per token",
                    r"\rho_t\,[l\le\rho_t\le u]\cdot\ell_t",
                    "Each token's policy term times ρ_t while l ≤ ρ_t ≤ u, and 0 outside: tokens the sampler saw "
                    "very differently are left out instead of capped.",
                    f"{HELPER}, compute_rollout_correction_weights(rollout_is='token', threshold 'l_u'); IcePop "
                    "(Ring-1T)", (ICEPOP_LOW, ICEPOP_HIGH),
                    "--rollout-is token --rollout-is-threshold L_U", "TIS token",
                    "zero outside [l, u] where TIS caps at u; also drops ρ below l"),
    CorrectionEntry("IcePop sequence", "masked importance weight per completion",
                    r"\textstyle\prod_t\rho_t\,\big[l\le\prod_t\rho_t\le u\big]\cdot\ell_t",
                    "Every token of a completion times Π_t ρ_t while it lies in [l, u], else 0.",
                    f"{HELPER}, compute_rollout_correction_weights(rollout_is='sequence', threshold 'l_u')",
                    (ICEPOP_LOW, ICEPOP_HIGH), "--rollout-is sequence --rollout-is-threshold L_U", "IcePop token",
                    "judges the completion's product of ratios, not each token"),
    CorrectionEntry("rejection", "rejection by a divergence of π_old from π_roll",
                    r"k_1=-\log\rho,\ k_2=\tfrac12(\log\rho)^2,\ k_3=\rho-1-\log\rho",
                    "Tokens (token_kX) or whole completions (seq_sum_kX, seq_mean_kX, seq_max_kX) whose statistic "
                    "passes its bound leave the loss and its normaliser: k1 must lie in [log l, log u], k2 and k3 "
                    "stay at most the bound. Several options together must all keep a token. It measures the same "
                    "k1/k2/k3 as the clip tests, but of the sampler's ratio, and drops instead of clipping.",
                    f"{HELPER}, compute_rollout_rejection_mask; Liu, Li et al., richardli.xyz/rl-collapse",
                    (RS_RATIO_LOW, RS_RATIO_HIGH, RS_BOUND),
                    "--rollout-rs OPTION[,OPTION…] --rollout-rs-threshold T[,T…]", "IcePop token",
                    "takes the token out of the loss's normaliser too, where IcePop's zero weight keeps it counted"),
    CorrectionEntry("bypass", "verl's bypass mode: π_old is the sampler's", r"w_t=\pi_\theta/\pi_{roll}",
                    "The loss's π_old is π_roll itself (no forward of the trained policy for it), so the loss's own "
                    "ratio and clip correct the mismatch. verl's bypass losses are then surrogates: REINFORCE with "
                    "token TIS is cispo (lo = 0), with IcePop it is icepop, PPO's clip is the ratio box.",
                    "verl 0.9.1 core_algos.py compute_policy_loss_bypass_mode", (), "--bypass-mode", "TIS token",
                    "divides by π_roll inside the loss instead of weighing a loss that divides by π_old"),
)


def is_threshold(threshold) -> tuple[float | None, float]:
    """(l, u) of verl's `rollout_is_threshold`: a number or "u" is TIS (l None), "l_u" IcePop; refused in one line
    unless 0 < l < u, finite."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
        raise DivvizInputError(f"rollout_is_threshold {quoted(threshold)}: write u (TIS), or l_u (IcePop)")
    parts = str(threshold).strip().split("_")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2):
        raise DivvizInputError(f"rollout_is_threshold {quoted(threshold)}: write u (TIS), or l_u (IcePop)")
    low, high = (None, numbers[0]) if len(numbers) == 1 else numbers
    if not (math.isfinite(high) and high > 0 and (low is None or (math.isfinite(low) and 0 < low < high))):
        raise DivvizInputError(f"rollout_is_threshold {quoted(threshold)}: need u > 0 (TIS) or 0 < l < u (IcePop), "
                               "finite")
    return low, high


def rs_options(options: str, thresholds) -> list[tuple[str, float, float]]:
    """verl's `rollout_rs` and `rollout_rs_threshold` as [(option, low, high)]: each option once, in order, with its
    threshold (one per option, or one for all); for k1 the bounds on the ratio (l_u, or u with l = 1/u), else
    (0, u). Refused in one line when an option is unknown or a threshold is not a positive number."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    for name in names:
        if name not in OPTIONS:
            raise DivvizInputError(unknown("rejection option", name, OPTIONS))
    if not names:
        raise DivvizInputError("rollout_rs names no rejection option; e.g. token_k1 or seq_mean_k3")
    limits = [t.strip() for t in str(thresholds).split(",") if t.strip()] if thresholds is not None else []
    if len(limits) == 1:
        limits = limits * len(names)
    if len(limits) != len(names):
        raise DivvizInputError(f"rejection options {quoted(options)} need one threshold each or one for all; got "
                               f"{quoted(thresholds)}")
    parsed = []
    for name, limit in zip(names, limits):
        try:
            numbers = [float(p) for p in limit.split("_")]
        except ValueError:
            numbers = []
        k1 = name.endswith("k1")
        if len(numbers) == 2 and k1:
            low, high = numbers
        elif len(numbers) == 1:
            low, high = (1 / numbers[0] if numbers[0] > 0 else math.nan, numbers[0]) if k1 else (0.0, numbers[0])
        else:
            low = high = math.nan
        if not (math.isfinite(low) and math.isfinite(high) and high > 0 and (0 < low <= high or not k1)):
            raise DivvizInputError(f"rejection threshold {quoted(limit)} for {name}: need " +
                                   ("l_u with 0 < l ≤ u, or u > 0" if k1 else "a number u > 0"))
        parsed.append((name, low, high))
    return parsed


def _mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def rollout_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token", threshold=2.0,
                    batch_normalize: bool = False, with_metrics: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's `compute_rollout_correction_weights`: truncated (TIS) or masked (IcePop) importance weights of π_old
    over π_roll, per token or per completion, zero on padding, detached; and verl's statistics of them (before the
    batch normalisation; none without `with_metrics`): rollout_is_mean/max/min/std, rollout_is_eff_sample_size
    (1 / mean of (w/mean w)² with w capped at u), rollout_is_ratio_fraction_high/low (raw ρ above u, below l or 1/u),
    and for IcePop rollout_is_oob_ratio, with batch normalisation rollout_is_batch_norm_factor."""
    if level not in LEVELS:
        raise DivvizInputError(f"unknown rollout-correction level {quoted(level)}; choose token or sequence")
    low, high = is_threshold(threshold)
    with torch.no_grad():
        if level == "token":
            judged = log_ratio  # what the high/low shares judge: each token's log ρ, or each completion's Σ log ρ
            raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask
        else:
            judged = (log_ratio * mask).sum(-1, keepdim=True)
            raw = judged.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(mask) * mask
        weights = raw.clamp(max=high) if low is None else torch.where((raw >= low) & (raw <= high), raw, 0.0)
        floor = 1 / high if low is None else low
        metrics = _weight_metrics(weights, raw, judged, mask, level, floor, high) if with_metrics else {}
        if low is not None and with_metrics:
            metrics["rollout_is_oob_ratio"] = float(_mean(((raw < low) | (raw > high)).to(mask.dtype), mask))
        if batch_normalize:
            if level == "token":
                mean = _mean(weights, mask)
            else:
                rows = mask.sum(-1) > 0
                mean = ((weights * mask).sum(-1)[rows] / mask.sum(-1)[rows]).mean()
            if with_metrics:
                metrics["rollout_is_batch_norm_factor"] = float(mean) if mean > 1e-8 else 1.0
            weights = weights / mean if mean > 1e-8 else weights
    return weights * mask, metrics


def _weight_metrics(weights, raw, judged, mask, level: str, floor: float, high: float) -> dict[str, float]:
    """verl's `compute_is_metrics` (its per-completion breakdowns left out)."""
    if level == "token":
        active = mask > 0
        metrics = {"rollout_is_max": float(weights[active].max()), "rollout_is_min": float(weights[active].min()),
                   "rollout_is_ratio_fraction_high": float(_mean((raw > high).to(mask.dtype), mask)),
                   "rollout_is_ratio_fraction_low": float(_mean((raw < floor).to(mask.dtype), mask))}
    else:
        metrics = {"rollout_is_max": math.exp(min(float(judged.max()), SAFETY_BOUND)),
                   "rollout_is_min": math.exp(float(judged.min())),
                   "rollout_is_ratio_fraction_high": float((judged > math.log(high)).float().mean()),
                   "rollout_is_ratio_fraction_low": float((judged < math.log(floor)).float().mean())}
    capped = weights.clamp(0.0, high)
    mean = _mean(capped, mask)
    variance = _mean(capped.square(), mask) - mean.square()
    metrics.update(rollout_is_mean=float(_mean(weights, mask)),
                   rollout_is_std=float(variance.clamp(min=0).sqrt()) if mask.sum() > 1 else 0.0,
                   rollout_is_eff_sample_size=float(1 / _mean((capped / (mean + 1e-8)).square(), mask)))
    return metrics


def rejection_statistic(log_ratio: torch.Tensor, mask: torch.Tensor, option: str) -> torch.Tensor:
    """What verl's rejection `option` (e.g. "token_k1", "seq_mean_k3") compares with its threshold: the estimator
    (k1, k2 or k3 of ρ) per token (B, T), or summed, averaged or maxed over each completion's tokens (B, 1)."""
    reduction, _, statistic = option.rpartition("_")
    value = ESTIMATORS[statistic](log_ratio) * mask
    if reduction == "seq_sum":
        return value.sum(-1, keepdim=True)
    if reduction == "seq_mean":
        return value.sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + 1e-8)
    if reduction == "seq_max":
        return torch.where(mask > 0, value, -math.inf).amax(-1, keepdim=True)
    return value


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, options: str, thresholds,
                   with_metrics: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's `compute_rollout_rejection_mask`: `mask` with the rejected tokens (or whole completions) zeroed, for
    `options` such as "token_k1" or "token_k1,seq_mean_k3" and `thresholds` ("0.7_1.5,0.06"); and verl's shares of
    what was rejected (none without `with_metrics`): rollout_rs_masked_fraction (tokens),
    rollout_rs_seq_masked_fraction (completions with a rejected token), and the same per option
    (rollout_rs_<option>_masked_fraction, …_seq_masked_fraction)."""
    parsed = rs_options(options, thresholds)
    with torch.no_grad():
        log_ratio = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        active = mask > 0
        keep, metrics = active.clone(), {}
        for name, low, high in parsed:
            value = rejection_statistic(log_ratio, mask, name)
            within = (value >= math.log(low)) & (value <= math.log(high)) if name.endswith("k1") else value <= high
            within = within.expand_as(mask)
            if with_metrics:
                metrics.update(_rejected(f"rollout_rs_{name}_", within, active, mask, active.any(-1)))
            keep &= within
        if with_metrics:
            metrics.update(_rejected("rollout_rs_", keep, active, mask, torch.ones_like(active[:, 0])))
    return mask * keep, metrics


def _rejected(prefix: str, within: torch.Tensor, active: torch.Tensor, mask: torch.Tensor,
              rows: torch.Tensor) -> dict[str, float]:
    """The share of tokens, and of the completions in `rows`, that lose a token to the rejection (verl counts the
    completions of one option among those with tokens, and those of all options together among all)."""
    rejected = active & ~within
    return {f"{prefix}masked_fraction": float(_mean(rejected.to(mask.dtype), mask)),
            f"{prefix}seq_masked_fraction": float(rejected.any(-1)[rows].float().mean())}


def offpolicy_metrics(logp_old: torch.Tensor, logp_roll: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's `compute_offpolicy_metrics`, how far π_roll is from π_old on the sampled tokens: kl = mean(log π_roll −
    log π_old) and k3_kl = mean(ρ − 1 − log ρ) over tokens (KL(π_roll‖π_old), the first unbiased, the second ≥ 0);
    the perplexities training_ppl and rollout_ppl (the batch's mean of each completion's exp(−mean log π)) and their
    logs; log_ppl_diff = mean log π_roll − mean log π_old per completion (its mean, mean |·|, max, min); ppl_ratio,
    the mean of its exp; chi2_token = mean ρ² − 1 and chi2_seq = mean over completions of (Π ρ)² − 1."""
    with torch.no_grad():
        per_row = lambda x: (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # noqa: E731
        mean_old, mean_roll = per_row(logp_old), per_row(logp_roll)
        log_ratio = logp_old - logp_roll
        diff = mean_roll - mean_old
        clamped = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        sequence = (log_ratio * mask).sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        return {"training_ppl": float((-mean_old).exp().mean()), "training_log_ppl": float((-mean_old).mean()),
                "kl": float(_mean(-log_ratio, mask)), "k3_kl": float(_mean(ESTIMATORS["k3"](log_ratio), mask)),
                "rollout_ppl": float((-mean_roll).exp().mean()), "rollout_log_ppl": float((-mean_roll).mean()),
                "log_ppl_diff": float(diff.mean()), "log_ppl_abs_diff": float(diff.abs().mean()),
                "log_ppl_diff_max": float(diff.max()), "log_ppl_diff_min": float(diff.min()),
                "ppl_ratio": float(diff.exp().mean()), "chi2_token": float(_mean((2 * clamped).exp(), mask) - 1),
                "chi2_seq": float((2 * sequence).exp().mean() - 1)}


@dataclass(frozen=True)
class Correction:
    """What a `RolloutCorrection` makes of one batch."""

    weight: torch.Tensor | None  # (B, T) importance weights for the policy term, None without rollout_is
    mask: torch.Tensor  # (B, T) the completion mask less the rejected tokens
    metrics: dict[str, float]  # verl's names, with its "rollout_corr/" prefix


@dataclass(frozen=True)
class RolloutCorrection:
    """One rollout-correction setting under verl's `RolloutCorrectionConfig` names, checked when built: importance
    weights (`rollout_is` "token" or "sequence", None for none; `rollout_is_threshold` u for TIS or "l_u" for IcePop;
    `rollout_is_batch_normalize`) and rejection (`rollout_rs`, comma-separated options, None for none;
    `rollout_rs_threshold`). `rollout_is_threshold` is kept as a number for TIS and as "l_u" for IcePop."""

    rollout_is: str | None = None
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | None = None

    def __post_init__(self):
        if self.rollout_is is not None and self.rollout_is not in LEVELS:
            raise DivvizInputError(f"unknown rollout_is {quoted(self.rollout_is)}; choose token, sequence or none")
        low, high = is_threshold(self.rollout_is_threshold)
        exact = lambda x: repr(x).removesuffix(".0")  # noqa: E731 — every digit kept: "0.5_2", "0.123456789_2"
        object.__setattr__(self, "rollout_is_threshold", high if low is None else f"{exact(low)}_{exact(high)}")
        if not isinstance(self.rollout_is_batch_normalize, bool):
            raise DivvizInputError("rollout_is_batch_normalize must be true or false")
        if self.rollout_rs is not None:
            parsed = rs_options(self.rollout_rs, self.rollout_rs_threshold)
            object.__setattr__(self, "rollout_rs", ",".join(name for name, _, _ in parsed))
            object.__setattr__(self, "rollout_rs_threshold", str(self.rollout_rs_threshold).replace(" ", ""))
        elif self.rollout_rs_threshold is not None:
            raise DivvizInputError("rollout_rs_threshold was given without rollout_rs; choose an option or drop it")

    @property
    def active(self) -> bool:
        """Whether it changes the loss (weights or rejection), not only measures the mismatch."""
        return self.rollout_is is not None or self.rollout_rs is not None

    @property
    def label(self) -> str:
        """"TIS token u=2", "IcePop sequence [0.5, 2]", "RS token_k1 0.5_2", joined; "" when inactive."""
        parts = []
        if self.rollout_is is not None:
            low, high = is_threshold(self.rollout_is_threshold)
            parts.append(f"TIS {self.rollout_is} u={high:g}" if low is None else
                         f"IcePop {self.rollout_is} [{low:g}, {high:g}]")
            if self.rollout_is_batch_normalize:
                parts.append("normalised")
        if self.rollout_rs is not None:
            parts.append(f"RS {self.rollout_rs} {self.rollout_rs_threshold}")
        return " ".join(parts)

    def apply(self, logp_old: torch.Tensor, logp_roll: torch.Tensor, mask: torch.Tensor) -> Correction:
        """The weights, the mask and verl's "rollout_corr/" metrics (`offpolicy_metrics` and, where on, those of
        `rollout_weights` and `rejection_mask`) for a batch sampled by π_roll, whose π_old is `logp_old`."""
        log_ratio = (logp_old - logp_roll).detach() * mask
        metrics, weight = offpolicy_metrics(logp_old.detach(), logp_roll, mask), None
        if self.rollout_is is not None:
            weight, weighed = rollout_weights(log_ratio, mask, self.rollout_is, self.rollout_is_threshold,
                                              self.rollout_is_batch_normalize)
            metrics.update(weighed)
        if self.rollout_rs is not None:
            mask, rejected = rejection_mask(log_ratio, mask, self.rollout_rs, self.rollout_rs_threshold)
            metrics.update(rejected)
        return Correction(weight, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()})
