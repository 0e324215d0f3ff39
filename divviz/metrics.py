"""Metrics computed from a step's facts, in one place (never inside the loss).

Names follow TRL's `GRPOTrainer` logs where TRL has one; `GLOSSARY` gives each a one-line meaning that
the app uses for chart titles and hover text.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from divviz.losses import LossOutput

# Edges of the π_old bins for mass reallocation: rare tokens on the left, confident ones on the right.
PI_OLD_BINS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)

GLOSSARY = {
    "reward": "mean reward of the sampled completions",
    "expected_reward": "exact expected reward Σ π(a) r(a) of the current policy",
    "entropy": "mean entropy −Σ π log π of the sampling distribution, in nats",
    "clip_ratio/low_mean": "share of tokens with w < l and A < 0: the lower clip binds (TRL)",
    "clip_ratio/high_mean": "share of tokens with w > u and A > 0: the upper clip binds (TRL)",
    "clip_ratio/region_mean": "low + high: share of tokens whose gradient the clip removes (TRL)",
    "clip_ratio/overshoot_mean": "share of tokens the update carried past the bound their advantage pushes toward "
                                 "(A > 0 above u, A < 0 below l), measured after the update: what the clip did not stop",
    "clip_ratio/first_step_past_high": "share of the A > 0 samples already above u after the first optimiser step: "
                                       "when it is large, the learning rate decides more than the clip test",
    "initial_top_moved": "Σ |π − π_0| over the actions most likely at the start (top 10%): how far they moved",
    "initial_rare_moved": "Σ |π − π_0| over the actions least likely at the start (bottom half)",
    "accuracy": "share of completions the task's checker accepts",
    "kl": "exact KL(π_old ‖ π_new) of the update, summed over actions",
    "kl/k1": "mean −log w over completion tokens, w = π_new/π_old after the update",
    "kl/k2": "mean ½(log w)² over completion tokens",
    "kl/k3": "mean w − 1 − log w over completion tokens (unbiased for KL(π_old ‖ π_new))",
    "mass_to_argmax": "share of the probability gained that went to tokens that were already the argmax",
    "tokens_per_s": "completion tokens generated per second of the whole step",
    "runs_training": "runs of this runs folder training when the step ended, this one included: what shared its time",
    "top1_mass": "probability of the currently most likely action",
    "initial_top_mass": "probability mass on the actions that were most likely at the start (top 10%)",
    "mass_shift": "change in probability summed over actions, binned by the probability they had before",
    "divviz/measure_mean": "mean of the clip test's own measure per token (e.g. k3 for kl3), at each optimiser step",
    "divviz/grad_masked_mean": "share of tokens whose gradient through w is masked (clipped or dual-capped)",
    "divviz/outside_mean": "share of tokens outside the clip test's region, whatever their advantage",
    "divviz/outside_last_mean": "the same at the last of the μ optimiser steps (after μ − 1 updates)",
    "entropy/change": "the update's change of the mean entropy over the sampled positions, from the full "
                      "distributions before and after it (same prefixes), in nats",
    "entropy/change_predicted": "the first-order prediction −Cov_π(log π, Δz) of that change, Δz the logits' change "
                                "(Cui et al. 2025, arXiv 2505.22617)",
    "entropy/cov_inside": "Σ over the tokens inside the region (or pulled back) of (log π_old − mean)(A − mean) / "
                          "tokens: the tokens that drive entropy down when positive (Cui et al. 2025)",
    "entropy/cov_masked_low": "the same over the tokens masked low (A < 0, w < l)",
    "entropy/cov_masked_high": "the same over the tokens masked high (A > 0, w > u)",
    "entropy/cov_dual": "the same over the dual-clip tokens (A < 0 past the cap c)",
    "entropy/from_inside": "bandit: first-order entropy change per update caused by the samples inside (exact with SGD)",
    "entropy/from_masked_low": "bandit: the same caused by the samples masked low (only a penalty's slope is left)",
    "entropy/from_masked_high": "bandit: the same caused by the samples masked high",
    "entropy/would_masked_low": "bandit: what the samples masked low would have caused had the constraint let them "
                                "through (Park et al. 2025, arXiv 2509.26114)",
    "entropy/would_masked_high": "bandit: what the samples masked high would have caused had they been let through",
    "rollout_corr/k3_kl": "verl: mean ρ − 1 − log ρ over tokens, ρ = π_old/π_roll: KL(π_roll ‖ π_old), how far the "
                          "sampler is from the policy the loss divides by",
    "rollout_corr/rollout_is_mean": "verl: mean rollout importance weight (after TIS or IcePop)",
    "rollout_corr/rollout_is_eff_sample_size": "verl: 1 / mean (w / mean w)², the weights' effective sample size "
                                               "as a share of the tokens (1: all weights equal)",
    "rollout_corr/rollout_rs_masked_fraction": "verl: share of tokens the rejection took out of the loss",
    "clip_ratio/region_mean_by_minibatch": "clip_ratio/region_mean at each optimiser step of an update, in order "
                                           "(1 … K the first pass's mini-batches, K + 1 … 2K the second's, …; step 1's "
                                           "ratios are exactly 1)",
    "kl/k3_by_minibatch": "mean k3 of w = π_θ/π_old at each optimiser step of an update, before it: how far the "
                          "earlier steps already moved the policy",
    "eval/accuracy": "share of the task's held-out problems answered correctly, sampled at the run's τ "
                     "(a run's own with its Wilson 95% interval)",
    "eval/accuracy_greedy": "the same, answering greedily (the most likely token each time)",
    "stability/max_kl": "the largest k3 KL of the policy to π_old over one update so far (the run's kl/k3)",
    "stability/max_clip": "the largest share of tokens whose gradient the clip removed in one step so far (the "
                          "largest clip_ratio/region_mean)",
    "stability/collapsed": "1 from the step the run collapsed: reward fell below half its peak while an update's KL "
                           "was large, or the entropy fell to a tenth of its start",
    "stability/time_to_collapse": "the step a run collapsed at, its last step if it never did (over seeds: the "
                                  "restricted mean time to collapse)",
}

# Where a TRL run logs what the engine calls otherwise: TRL names each reward function's mean
# rewards/<function>/mean, and divviz's TRL backend passes the task's checker as the function `accuracy`.
METRIC_ALIASES = {"accuracy": "rewards/accuracy/mean"}

SHARES = ("reward", "accuracy", "frac_reward_zero_std", "top1_mass", "initial_top_mass", "expected_reward",
          "mass_to_argmax", "clip_ratio/", "rollout_corr/rollout_rs_masked_fraction")  # in [0, 1] (a prefix: all)
NON_NEGATIVE = ("entropy", "reward_std", "grad_norm", "kl", "kl/k2", "kl/k3", "kl_ref/k2", "kl_ref/k3",
                "completions/mean_length", "step_time", "tokens_per_s", "runs_training",
                "rollout_corr/rollout_is_eff_sample_size")


def metric_range(key: str) -> tuple[float, float]:
    """Where a metric's values can lie: [0, 1] for a share, [0, ∞) for an entropy, a KL (k2, k3, exact), a norm or a
    time; (−∞, ∞) otherwise (k1, a loss, a change). Charts draw bands inside it (`intervals.summarize`)."""
    if any(key == s or (s.endswith("/") and key.startswith(s)) for s in SHARES):
        return 0.0, 1.0
    return (0.0, math.inf) if key in NON_NEGATIVE else (-math.inf, math.inf)


def proportion(successes: int, n: int, level: float = 0.95) -> tuple[float, float, float]:
    """(share, low, high): `successes` of `n` with Wilson's score interval (scipy's `binomtest(...).proportion_ci`),
    which stays inside [0, 1] and is not degenerate at 0 or n successes (Wilson 1927; Agresti & Coull 1998 compare
    it with the Wald interval). n = 0 gives NaN for all three."""
    if n == 0:
        return math.nan, math.nan, math.nan
    interval = stats.binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    return successes / n, float(interval.low), float(interval.high)


def metric(row: dict, key: str, default=float("nan")):
    """A metrics row's value of `key`, under its TRL name where the row has that instead (`METRIC_ALIASES`)."""
    return row.get(key, row.get(METRIC_ALIASES.get(key), default))


def entropy(logp: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """H = −Σ_a π(a) log π(a) over the last dimension, from log-probs (and their exp, when already at hand); an
    action of probability 0 (log π = −∞) adds 0."""
    return -((logp.exp() if probs is None else probs) * logp).nan_to_num().sum(-1)


ENTROPY_CHUNK = 2**18  # float64 values (2 MB) of distributions at a time in `entropy_change`


def entropy_change(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """An update's entropy change at the sampled positions, observed and predicted to first order, from the
    tempered logits before and after it at the same positions, (B, T, V), and the completion mask (B, T):

        entropy/change            = mean_t [H(π_after,t) − H(π_before,t)]
        entropy/change_predicted  = mean_t −Cov_{a∼π_before,t}(log π_before,t(a), Δz_t(a)),  Δz = z_after − z_before

    (Cui et al. 2025, arXiv 2505.22617: ∂H/∂z_a = −π_a (log π_a + H), so ΔH ≈ −Σ_a π_a (log π_a + H) Δz_a; a shift of
    Δz by a constant changes nothing, so the log-softmax's change serves as Δz.) In float64, over the positions the
    mask keeps, ENTROPY_CHUNK values at a time: the sums over the whole (B, T, V) at once, to the last digits, in a
    fifth of the time for SmolLM2's vocabulary, since each chunk's float64 distributions stay in the CPU's cache."""
    keep = mask > 0
    before, after, weight = before[keep], after[keep], mask[keep].double()
    change, predicted = torch.empty_like(weight), torch.empty_like(weight)
    chunk = max(1, ENTROPY_CHUNK // before.shape[-1])  # positions
    for start in range(0, len(weight), chunk):
        at = slice(start, start + chunk)
        z_before, z_after = torch.log_softmax(before[at].double(), -1), torch.log_softmax(after[at].double(), -1)
        p = z_before.exp()
        h_before = entropy(z_before, p)
        change[at] = entropy(z_after) - h_before
        predicted[at] = -(p * (z_before + h_before[:, None]).nan_to_num() * (z_after - z_before).nan_to_num()).sum(-1)
    tokens = mask.sum().clamp(min=1)
    return {"entropy/change": float((change * weight).sum() / tokens),
            "entropy/change_predicted": float((predicted * weight).sum() / tokens)}


COVARIANCE_STATES = {0: "inside", 1: "masked_low", 2: "masked_high", 3: "dual"}  # `LossOutput.clip_state`'s codes


def entropy_covariance(logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, state: torch.Tensor,
                       dual: bool = False) -> dict[str, float]:
    """Who drives the entropy down: the token-level covariance of log π_old(y_t) and A_t over the batch (Cui et al.
    2025, arXiv 2505.22617; Clip-Cov and KL-Cov pick tokens by it), summed by clip state:

        entropy/cov_<state> = Σ_{t in state} (log π_old(y_t) − mean)(A_t − mean) / tokens

    means and tokens over the loss's tokens (`mask`), so the states add up to the batch's covariance. A positive
    term is a confident token pushed up or a rare one pushed down: entropy falls. `state`: `LossOutput.clip_state`
    (B, T); adv (B,) or (B, T); the dual-clip state only where `dual`."""
    adv = adv[:, None].expand_as(logp_old) if adv.dim() == 1 else adv
    keep = mask > 0
    lp, a, s = logp_old[keep].double(), adv[keep].double(), state[keep]
    terms = (lp - lp.mean()) * (a - a.mean()) if lp.numel() else lp
    tokens = max(lp.numel(), 1)
    return {f"entropy/cov_{name}": float(terms[s == code].sum()) / tokens
            for code, name in COVARIANCE_STATES.items() if code != 3 or dual}


def clip_fractions(out: LossOutput, mask: torch.Tensor) -> dict[str, float]:
    """TRL's clip_ratio/low_mean, high_mean and region_mean: shares of completion tokens."""
    tokens = float(mask.sum().clamp(min=1))
    low = float(out.masked_low.sum()) / tokens
    high = float(out.masked_high.sum()) / tokens
    return {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": low + high}


def overshoot(ratio_after: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip, pi_old: torch.Tensor) -> float:
    """Share of completion tokens that the update carried past the bound their advantage pushes toward: w =
    π_after/π_old above u where A > 0, below l where A < 0 ([l, u] = the clip test's interval at π_old; 0 without
    a test). TRL's clip fractions count the tokens the clip stopped during the μ optimiser steps (the first of which
    has w = 1); this counts where they ended. (B, T) tensors; adv (B,) or (B, T)."""
    if clip is None:
        return 0.0
    lower, upper = clip.bounds(pi_old) if clip.needs_pi_old else clip.bounds()
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    past = ((ratio_after > upper) & (adv > 0)) | ((ratio_after < lower) & (adv < 0))
    return float((past & (mask > 0)).sum()) / max(float(mask.sum()), 1.0)


def mass_shift_by_bin(pi_before: np.ndarray, pi_after: np.ndarray, edges=PI_OLD_BINS) -> np.ndarray:
    """Σ (π_after − π_before) over the items whose π_before falls in each bin [edges[i], edges[i+1])."""
    pi_before = np.asarray(pi_before, dtype=np.float64).ravel()
    change = np.asarray(pi_after, dtype=np.float64).ravel() - pi_before
    index = np.clip(np.searchsorted(edges, pi_before, side="right") - 1, 0, len(edges) - 2)
    return np.bincount(index, weights=change, minlength=len(edges) - 1)


def bin_labels(edges=PI_OLD_BINS) -> list[str]:
    return [f"{a:g}–{b:g}" for a, b in zip(edges[:-1], edges[1:])]
