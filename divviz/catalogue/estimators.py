"""Schulman's single-sample KL estimators k1, k2, k3, written in the log-ratio.

For a sample x ~ q and the ratio w = p(x)/q(x) with log-ratio `log_ratio = log w` (docs/theory.md §0):

    k1 = −log w                 unbiased for KL(q‖p), can be negative
    k2 = ½ (log w)²             ≥ 0, matches KL(q‖p) to second order
    k3 = w − 1 − log w          ≥ 0, = 0 iff w = 1, unbiased for KL(q‖p) because E_q[w] = 1

Which KL they estimate depends on which policy is p and which is q; the callers say which:
- the clip tests of Wu et al. 2026 use w = π_θ/π_old (x ~ π_old), so k3 estimates KL(π_old‖π_θ);
- GRPO's reference penalty flips the ratio, r = π_ref/π_θ, meant for KL(π_θ‖π_ref) (RPG §2.2).

Each function takes a numpy array or a torch tensor (autograd flows through) and returns the same kind.
k3 uses expm1 so that it keeps full relative precision for w near 1, where w − 1 − log w cancels.
Independent oracles: k3(w) = scipy.special.kl_div(1, w) and k1(w) = rel_entr(1, w).
"""

from __future__ import annotations

import numpy as np
import torch


def array_ops(x):
    """The module whose functions fit `x`: torch for a tensor, numpy otherwise."""
    return torch if isinstance(x, torch.Tensor) else np


def k1(log_ratio):
    """k1 = −log w."""
    return -log_ratio


def k2(log_ratio):
    """k2 = ½ (log w)²."""
    return 0.5 * log_ratio * log_ratio


def k3(log_ratio):
    """k3 = w − 1 − log w, computed as expm1(log w) − log w."""
    return array_ops(log_ratio).expm1(log_ratio) - log_ratio


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}
