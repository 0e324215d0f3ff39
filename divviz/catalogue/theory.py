"""Closed forms that the app explains: KL3 bounds, their series, box matching, the logit-space view.

All functions take floats or numpy arrays and work in float64. Sources are docs/theory.md sections; its
provenance tags are kept: [INF] = derived for divviz (and checked numerically there), [3P] = a claim of
Wu et al. 2026 (arXiv 2602.05494) read in a summary.
"""

from __future__ import annotations

import numpy as np
from scipy.special import lambertw

from divviz.catalogue.estimators import k3
from divviz.catalogue.params import DivvizInputError
from divviz.safetext import quoted

SERIES_COEFFS = (1.0, 1.0, 1.0 / 3.0, 1.0 / 36.0, -1.0 / 270.0, 1.0 / 4320.0)
"""w = Σ c_n (±s)^n with s = √(2δ): the KL3 boundary near δ = 0 (docs/theory.md §1.3, from sympy)."""

_SERIES_BELOW = 1e-3  # below this δ the series (error ~ s⁶ ~ 1e-8) seeds Newton; above it, Lambert W


def kl3_bounds(delta):
    """Feasible ratio interval of the KL3 test: the (l, u) with w − 1 − log w ≤ δ ⇔ l ≤ w ≤ u.

    Definition (docs/theory.md §1.3 [INF]; the closed form is ATR-GRPO's, Wu et al. 2026 [3P]):

        l_δ = −W₀(−e^{−1−δ}) ∈ (0, 1],   u_δ = −W₋₁(−e^{−1−δ}) ∈ [1, ∞)

    Parameters: δ ≥ 0, float or array (δ ≤ ~700, beyond which l underflows to 0).
    Returns: (l, u) as floats (or arrays of δ's shape). δ = 0 gives (1, 1) without calling SciPy.

    Branches: the argument lies in (−1/e, 0), where W has two real branches; W₀ ∈ (−1, 0) gives the
    lower edge and W₋₁ < −1 the upper one.

    Possible issues: near δ → 0 the argument approaches W's branch point −1/e, where
    `scipy.special.lambertw` with its default tol returns u ≈ 1 + 3δ instead of 1 + √(2δ) for δ ≲ 3e-9,
    and with tol=1e-15 it can return NaN (seen at δ = 1e-3, SciPy 1.17). So the branch values only
    seed the root, or the series does for δ < 1e-3, and three Newton steps on t = log w,
    h(t) = expm1(t) − t − δ, finish it: the boundary identity log b = b − 1 − δ then holds to ~1e-16. Below
    δ ≈ 1e-32 the series rounds to w = 1 exactly (√(2δ) is under half an ulp of 1), which is the answer in
    float64; Newton is skipped there (its slope expm1(0) = 0), so every δ ≥ 0 gives finite bounds.

    Example (docs/theory.md §5.1): kl3_bounds(0.05) → (0.716189…, 1.350403…), and
    k3(log l) = k3(log u) = 0.05.
    """
    d = checked_levels(delta, "kl3_bounds")
    z = -np.exp(-1.0 - d)
    with np.errstate(all="ignore"):
        series_l, series_u = kl3_bounds_series(d)
        lambert_l = -lambertw(z, 0).real
        lambert_u = -lambertw(z, -1).real
        small = d < _SERIES_BELOW
        bounds = []
        for series, lambert in ((series_l, lambert_l), (series_u, lambert_u)):
            t = np.log(np.where(small, series, lambert))
            for _ in range(3):
                slope = np.expm1(t)  # 0 where the series rounds to w = 1 (δ ≲ 1e-32): nothing left to polish
                step = (slope - t - d) / np.where(slope == 0, 1.0, slope)
                t = np.where((d > 0) & (slope != 0), t - step, t)
            bounds.append(np.exp(t))
    lower, upper = bounds
    if lower.ndim == 0:
        return float(lower), float(upper)
    return lower, upper


def checked_levels(delta, owner: str) -> np.ndarray:
    """δ as float64 numpy, or one `DivvizInputError`: a number or array of numbers, each finite and ≥ 0."""
    try:
        d = np.asarray(delta, dtype=np.float64)
    except (TypeError, ValueError):
        raise DivvizInputError(f"{owner} takes δ ≥ 0 (a number or an array of numbers); got {quoted(delta, 40)}") from None
    if not (np.isfinite(d) & (d >= 0)).all():
        raise DivvizInputError(f"{owner} needs finite δ ≥ 0; got {quoted(delta, 40)}")
    return d


def kl3_bounds_series(delta, order: int = 5):
    """The KL3 bounds to `order` in s = √(2δ): w = 1 ± s + s²/3 ± s³/36 − s⁴/270 ± s⁵/4320 + O(s⁶).

    docs/theory.md §1.3 (series from sympy [INF]). To leading order l ≈ 1 − √(2δ) + 2δ/3 and
    u ≈ 1 + √(2δ) + 2δ/3: the interval is centred above 1 by 2δ/3.
    Returns (l, u) for δ ≥ 0 (floats or arrays).
    """
    s = np.sqrt(2.0 * np.asarray(delta, dtype=np.float64))
    coeffs = SERIES_COEFFS[: order + 1]
    upper = sum(c * s**n for n, c in enumerate(coeffs))
    lower = sum(c * (-s) ** n for n, c in enumerate(coeffs))
    if np.ndim(lower) == 0:
        return float(lower), float(upper)
    return lower, upper


def kl3_delta_at_ratio(ratio):
    """The KL3 level δ whose boundary passes through `ratio`: δ = k3(w) = w − 1 − log w.

    This is the box → δ direction of matching (docs/theory.md §5.2): a PPO/DAPO edge at 0.8 is the KL3
    level 0.0231436, an edge at 1.2 the level 0.0176784, an edge at 1.28 the level 0.0331399.
    """
    try:
        w = np.asarray(ratio, dtype=np.float64)
    except (TypeError, ValueError):
        raise DivvizInputError(f"kl3_delta_at_ratio takes a ratio w > 0; got {quoted(ratio, 40)}") from None
    if not (w > 0).all():
        raise DivvizInputError(f"kl3_delta_at_ratio takes a ratio w > 0; got {quoted(ratio, 40)}")
    return k3(np.log(w))[()]


def kl3_equivalent_box(delta) -> tuple[float, float]:
    """δ → box: (ε_low, ε_high) = (1 − l_δ, u_δ − 1), the DAPO-style box that the KL3 test is.

    In TRL's words, `epsilon = ε_low` and `epsilon_high = ε_high` reproduce the KL3 test at level δ.
    """
    lower, upper = kl3_bounds(delta)
    return 1.0 - lower, upper - 1.0


def match_box_to_kl3(eps_low: float, eps_high: float) -> dict:
    """Match a PPO (ε, ε) or DAPO (ε_low, ε_high) box to KL3 levels, edge by edge (docs/theory.md §5.2).

    Returns the KL3 level through each edge and the KL3 interval at that level:
    {"delta_low", "interval_low", "delta_high", "interval_high"}. A box is a KL3 level set only
    when delta_low == delta_high; PPO's [0.8, 1.2] is not (0.0231 vs 0.0177), nor DAPO's [0.8, 1.28].
    """
    delta_low = float(kl3_delta_at_ratio(1.0 - eps_low))
    delta_high = float(kl3_delta_at_ratio(1.0 + eps_high))
    return {
        "delta_low": delta_low,
        "interval_low": kl3_bounds(delta_low),
        "delta_high": delta_high,
        "interval_high": kl3_bounds(delta_high),
    }


def kl2_bounds(delta):
    """Feasible interval of ½(log w)² ≤ δ: [e^{−√(2δ)}, e^{√(2δ)}], symmetric in log-ratio (§1.3)."""
    s = np.sqrt(2.0 * np.asarray(delta, dtype=np.float64))
    return np.exp(-s)[()], np.exp(s)[()]


def kl3_inverse_bounds(delta):
    """The trap of docs/theory.md §5.4: the k3 test on the *inverse* ratio π_old/π_θ gives [1/u_δ, 1/l_δ].

    That is GRPO's penalty direction; an implementation of KL3 clipping that returns these numbers
    instead of `kl3_bounds` has the ratio upside down.
    """
    lower, upper = kl3_bounds(delta)
    return 1.0 / upper, 1.0 / lower


def ratio_from_logit_shift(shift, pi_old):
    """Ratio of the sampled token when only its logit moves by Δ under a softmax head (§1.5 [INF]).

        w(Δ) = e^Δ / (1 − p + p e^Δ),   p = π_old(a|s);   so w < 1/p always.
    """
    shift = np.asarray(shift, dtype=np.float64)
    p = np.asarray(pi_old, dtype=np.float64)
    return (np.exp(shift) / (1.0 - p + p * np.exp(shift)))[()]


def logit_shift_bounds(lower, upper, pi_old):
    """How far the sampled token's logit may move before a ratio bound [l, u] binds (§1.5 [INF]).

    Inverting w(Δ):  Δ(w) = log( w (1 − p) / (1 − w p) )  for w p < 1.
    Returns (Δ_min, Δ_max). Δ_max = +∞ where p ≥ 1/u: such a likely token can never reach the upper
    clip, which is one way a looser upper bound favours tokens that are already likely.
    Δ_min = −∞ where l = 0.
    """
    p = np.asarray(pi_old, dtype=np.float64)
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        d_min = np.where(lower > 0, np.log(lower * (1 - p) / (1 - lower * p)), -np.inf)
        reachable = upper * p < 1
        d_max = np.where(reachable, np.log(upper * (1 - p) / np.where(reachable, 1 - upper * p, 1.0)), np.inf)
    return d_min[()], d_max[()]
