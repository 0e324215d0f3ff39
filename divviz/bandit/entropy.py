"""Why the bandit's entropy moves: the first-order entropy change of an update, and which samples cause it.

For a softmax policy π = softmax(z) with entropy H = −Σ π log π, ∂H/∂z_j = −π_j (log π_j + H), so a change Δz of
the logits changes the entropy, to first order, by

    ΔH ≈ −Σ_j π_j (log π_j + H) Δz_j = −Cov_{a∼π}(log π(a), Δz(a))

(Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv 2505.22617,
Lemma 1; a constant added to Δz changes nothing, as Σ_j π_j (log π_j + H) = 0).

A plain gradient step on the bandit's loss is θ ← θ − lr Σ_i g_i (e_{a_i} − π), g_i = ∂loss/∂log π(a_i): a sum over
the samples, so its first-order entropy change is a sum over them too. Sample i's share is

    ΔH_i = lr g_i [π_{a_i} (log π_{a_i} + H) − Σ_j π_j² (log π_j + H)]

and summing it by clip state says which samples lowered the entropy and which raised it. A sample the constraint
masked (g_i = 0 but for a penalty's slope) would have had the unclipped surrogate's slope −A_i w_i (its aggregation
weight and importance weight included): what it *would* have done, had the constraint let it through, is the
same formula with that slope (Park et al. 2025, "Clip-Low Increases Entropy and Clip-High Decreases Entropy in
Reinforcement Learning of Large Language Models", arXiv 2509.26114: masking A < 0 samples below l removes
entropy-lowering steps, masking A > 0 samples above u removes entropy-raising ones).

With μ optimiser steps each step is attributed at its own π; with SGD and μ = 1 the shares add up to the predicted
change of the whole update exactly. With Adam, the shares are those of the loss gradient's own step (lr × g), not
of Adam's rescaled one, and do not add up to the observed change.
"""

from __future__ import annotations

import numpy as np

ATTRIBUTION = ("entropy/from_inside", "entropy/from_masked_low", "entropy/from_masked_high",
               "entropy/would_masked_low", "entropy/would_masked_high")
ENTROPY_HISTORY = ("entropy/change", "entropy/change_predicted", *ATTRIBUTION)


def entropy(logp: np.ndarray, p: np.ndarray) -> np.ndarray:
    """H = −Σ π log π of each row, (R,)."""
    return -(p * logp).sum(axis=-1)


def predicted_change(logp: np.ndarray, p: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The first-order entropy change −Cov_π(log π, Δz) of each row's logits moving by `delta`, (R,)."""
    return -(p * (logp + entropy(logp, p)[:, None]) * delta).sum(axis=-1)


def sample_shares(logp: np.ndarray, p: np.ndarray, flat_actions: np.ndarray, lr: float) -> np.ndarray:
    """Each sample's first-order entropy change per unit of slope in a plain step of size `lr`:
    ΔH_i / g_i = lr [π_a (log π_a + H) − Σ_j π_j² (log π_j + H)], (R, n, 1); logp, p: (R, K); flat_actions: indices
    into the (R, K) arrays raveled, (R, n, 1)."""
    h = -np.einsum("rk,rk->r", p, logp)
    squared = p * p
    lead = np.einsum("rk,rk->r", squared, logp) + h * squared.sum(axis=-1)
    at = p.reshape(-1)[flat_actions] * (logp.reshape(-1)[flat_actions] + h[:, None, None])
    at -= lead[:, None, None]
    at *= lr
    return at


def attribute(logp: np.ndarray, p: np.ndarray, flat_actions: np.ndarray, slope: np.ndarray, would: np.ndarray,
              low: np.ndarray, high: np.ndarray, lr: float) -> np.ndarray:
    """One optimiser step's first-order entropy change by clip state, (R, 5) in `ATTRIBUTION`'s order: caused by the
    samples inside (or pulled back), masked low (A < 0, w < l) and masked high (A > 0, w > u), and what the masked ones
    would have caused with the unclipped slope `would` (one (R, n) product per column: the bandit steps hundreds
    of runs at once, so it is written in few numpy calls)."""
    per_slope = sample_shares(logp, p, flat_actions, lr)[..., 0]
    states = np.stack([low[..., 0], high[..., 0]], axis=-1).astype(np.float64)  # (R, n, 2)
    caused = np.einsum("rn,rns->rs", per_slope * slope[..., 0], states)
    unclipped = np.einsum("rn,rns->rs", per_slope * would[..., 0], states)
    total = np.einsum("rn,rn->r", per_slope, slope[..., 0])
    return np.column_stack([total - caused.sum(axis=1), caused, unclipped])
