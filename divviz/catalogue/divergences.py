"""The catalogue: every divergence measure divviz knows, in one registry.

Three families, all per token and from log-probabilities only (no vocabulary sums):

- **clip tests**, defined here (the per-token trust region of Wu et al. 2026's unified framework, docs/theory.md
  §1.2): a predicate C_t on the token's measure value; a token that fails it is clipped. Each test's feasible
  set in the ratio w = π_θ/π_old is an interval [l, u] ∋ 1 (u may be ∞), given by `bounds`.
- **penalties** toward a reference policy, added to the loss as β · value (GRPO, GBMPO, RPG): penalties.py.
- **surrogates**, which replace PPO's clipped surrogate (cispo, sapo, …): surrogates.py.

Entries are built by name with `clip_test(name, **params)`, `penalties.penalty(…)`, `surrogates.surrogate(…)`,
which check the parameters. `CATALOGUE` lists all three families for the app and the CLI; `get_entry` finds an
entry in any of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from divviz.catalogue import theory
from divviz.catalogue.estimators import array_ops, k1, k2, k3
from divviz.catalogue.formula import bounds as formula_bounds, checked
from divviz.catalogue.params import (CatalogueEntry, Configured, DivvizInputError, Param, by_name, check_name,
                                     check_params)
from divviz.catalogue.penalties import PENALTIES, PenaltyEntry
from divviz.safetext import quoted
from divviz.catalogue.surrogates import SURROGATES, SurrogateEntry

EPS = Param("eps", 0.2, 0.0, 1.0, low_open=True, high_open=False, trl_name="epsilon", typical=(0.01, 0.6, 0.01),
            doc="half-width of the symmetric ratio box [1−ε, 1+ε]")
EPS_LOW = Param("eps_low", 0.2, 0.0, 1.0, low_open=True, high_open=False, trl_name="epsilon", typical=(0.01, 0.6, 0.01),
                doc="room below 1: l = 1 − ε_low")
EPS_HIGH = Param("eps_high", 0.28, 0.0, low_open=True, trl_name="epsilon_high", typical=(0.01, 1.5, 0.01),
                 doc="room above 1: u = 1 + ε_high (DAPO's clip-higher)")


def _delta(default: float, high: float, doc: str, typical: tuple[float, float, float]) -> Param:
    return Param("delta", default, 0.0, high, low_open=True, high_open=False, doc=doc, typical=typical)


DUAL_CLIP = Param("c", 3.0, 1.0, low_open=True, typical=(1.05, 10.0, 0.05),
                  doc="dual-clip cap: for A < 0 the per-token loss is at most −c·A (Ye et al. 2020; RPG §3.6)")
BETA = Param("beta", 0.0, 0.0, trl_name="beta", typical=(0.0, 1.0, 0.001), doc="penalty coefficient β (λ in GBMPO)")



# ---------------------------------------------------------------------------------------------------
# Clip tests


@dataclass(frozen=True)
class ClipTestEntry(CatalogueEntry):
    """A per-token feasibility test. `value` is the token's measure (from log-probs), `feasible` the
    predicate on it, `bounds` the same set written as a ratio interval (l, u) given π_old."""

    params: tuple[Param, ...]
    value: Callable  # (logp_new, logp_old, params) -> measure value per token
    feasible: Callable  # (value, params) -> bool per token
    bounds: Callable  # (params, pi_old) -> (l, u)
    needs_pi_old: bool | Callable = False  # or (params) -> bool, where the parameters decide
    check: Callable | None = None  # (params) -> None, refusing parameters that are each valid but not together
    family: str = field(default="clip", init=False)


@dataclass(frozen=True)
class ClipTest(Configured):
    """A clip test with checked parameters."""

    def value(self, logp_new, logp_old):
        return self.entry.value(logp_new, logp_old, self.params)

    def feasible(self, logp_new, logp_old):
        return self.entry.feasible(self.value(logp_new, logp_old), self.params)

    @property
    def needs_pi_old(self) -> bool:
        """Whether [l, u] depends on π_old."""
        needs = self.entry.needs_pi_old
        return needs(self.params) if callable(needs) else needs

    def bounds(self, pi_old=None):
        """(l, u): floats, or arrays/tensors shaped like `pi_old` for tests that depend on it."""
        if not self.needs_pi_old:
            return self._constant_bounds
        if pi_old is None:
            raise DivvizInputError(f"{self.name}: its ratio interval depends on π_old; give pi_old in (0, 1]")
        return self.entry.bounds(self.params, checked_pi_old(pi_old, self.name))

    @functools.cached_property
    def _constant_bounds(self) -> tuple[float, float]:  # computed once: kl3's calls SciPy
        return tuple(float(b) for b in self.entry.bounds(self.params, None))


def _at_most_delta(value, p):
    return value <= p["delta"]


def _within_low_high(value, p):
    """The signed measure within [−δ_low, δ_high] (verl's DPPO tests)."""
    return (value >= -p["delta_low"]) & (value <= p["delta_high"])


def _dppo_test(name: str, title: str, latex: str, doc: str, high: float, meanings: tuple[str, str], value,
               bounds) -> ClipTestEntry:
    """One of verl's DPPO tests: a signed measure of the token's change (`value`) within [−δ_low, δ_high], each
    δ in (0, `high`] and meaning what `meanings` say; its ratio interval `bounds(params, π_old)`."""
    return ClipTestEntry(name, title, latex, doc, (_dppo_delta("delta_low", 0.2, high, meanings[0]),
                                                   _dppo_delta("delta_high", 0.2, high, meanings[1])),
                         value, _within_low_high, bounds, needs_pi_old=True)


def _log_ratio(logp_new, logp_old):
    return logp_new - logp_old


def _formula_value(new, old, p):
    """f(w, π_old) of the typed formula, in torch (training) or numpy (the bandit) as the log-probs come."""
    formula, log_ratio = checked(p["f"]), _log_ratio(new, old)
    if hasattr(log_ratio, "detach"):
        return formula.torch(log_ratio.exp(), old.exp())
    return formula.numpy(np.exp(log_ratio), np.exp(old))


def _numpy_bounds(bounds):
    """Bounds computed in numpy (by root-finding) for a numpy π_old; a tensor π_old goes through float64 numpy and
    comes back as tensors on its device, as training needs them."""

    @functools.wraps(bounds)
    def either(p, pi_old):
        if not hasattr(pi_old, "detach"):
            return bounds(p, pi_old)
        import torch

        edges = bounds(p, pi_old.detach().cpu().double().numpy())
        return tuple(torch.as_tensor(edge, dtype=pi_old.dtype, device=pi_old.device) for edge in edges)

    return either


@_numpy_bounds
def _formula_bounds(p, pi_old):
    """[l, u] of f ≤ δ by root-finding (`formula.bounds`)."""
    return formula_bounds(checked(p["f"]), p["delta"], pi_old)


def _prob_tv_bounds(p, pi_old):
    """|π − π_old| ≤ δ ⇔ w ∈ [max(0, 1 − δ/π_old), 1 + δ/π_old]; rare tokens get a wide box."""
    return (1.0 - p["delta"] / pi_old).clip(min=0.0), 1.0 + p["delta"] / pi_old


def _binary_kl(new, old):
    """Signed binary KL of the token's Bernoulli, sign(π − π_old) · KL(Bern(π_old) ‖ Bern(π)), with verl's 1e-8:
    π_old (log π_old − log π) + (1 − π_old) log((1 − π_old + 1e-8)/(1 − π + 1e-8)) (verl's DPPO-Binary-KL)."""
    ops = array_ops(new)
    p, p_old = ops.exp(new), ops.exp(old)
    kl = p_old * (old - new) + (1 - p_old) * ops.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return ops.sign(p - p_old) * kl


@_numpy_bounds
def _binary_kl_bounds(p, pi_old):
    """[l, u] of −δ_low ≤ signed binary KL ≤ δ_high: the KL falls from ∞ to 0 as π rises from 0 to π_old and rises
    from there to π = 1, so each edge is one root, found by bisection (in log π below π_old, 200 halvings; u = 1/π_old
    when even π = 1 is within δ_high)."""
    pi_old = np.asarray(pi_old, dtype=np.float64)
    old = np.log(pi_old)
    below = (np.full_like(old, np.log(1e-300)), old.copy())  # log π: KL > δ_low at the first, ≤ at the second
    above = (np.zeros_like(old), old.copy())  # log π: KL > δ_high at the first (if anywhere), ≤ at the second
    for _ in range(200):
        mid = (below[0] + below[1]) / 2
        inside = -_binary_kl(mid, old) <= p["delta_low"]
        below = (np.where(inside, below[0], mid), np.where(inside, mid, below[1]))
        mid = (above[0] + above[1]) / 2
        inside = _binary_kl(mid, old) <= p["delta_high"]
        above = (np.where(inside, above[0], mid), np.where(inside, mid, above[1]))
    upper = np.where(_binary_kl(np.zeros_like(old), old) <= p["delta_high"], 0.0, above[1])
    return np.exp(below[1] - old), np.exp(upper - old)


def _dppo_delta(name: str, default: float, high: float, doc: str) -> Param:
    return Param(name, default, 0.0, high, low_open=True, high_open=False, doc=doc, typical=(0.005, high / 2, 0.005))


def _estimator_test(name: str, title: str, estimator, bounds, level: Param, latex: str, doc: str) -> ClipTestEntry:
    """A KL test: Schulman's `estimator` (k1, k2 or k3) of the log-ratio at most δ (`level`), whose feasible ratios are
    the interval `bounds(δ)` (docs/theory.md §1.3)."""
    return ClipTestEntry(name, title, latex, doc, (level,), lambda new, old, p: estimator(_log_ratio(new, old)),
                         _at_most_delta, lambda p, pi_old: bounds(p["delta"]))


CLIP_TESTS: dict[str, ClipTestEntry] = by_name(
    ClipTestEntry(
        "ratio", "PPO/GRPO ratio clipping",
        r"1-\varepsilon \le w_t \le 1+\varepsilon,\quad w_t=\pi_\theta/\pi_{\mathrm{old}}",
        "Symmetric box in ratio space (Schulman et al. 2017; GRPO). clip_higher with ε_low = ε_high.",
        (EPS,),
        lambda new, old, p: _log_ratio(new, old).exp(),
        lambda w, p: (w >= 1 - p["eps"]) & (w <= 1 + p["eps"]),
        lambda p, pi_old: (1.0 - p["eps"], 1.0 + p["eps"]),
    ),
    ClipTestEntry(
        "clip_higher", "DAPO clip-higher",
        r"1-\varepsilon_{\mathrm{low}} \le w_t \le 1+\varepsilon_{\mathrm{high}}",
        "Asymmetric box (DAPO, Yu et al. 2025): more room above 1 so unlikely tokens can rise. "
        "Any interval test equals this box with its own (ε_low, ε_high).",
        (EPS_LOW, EPS_HIGH),
        lambda new, old, p: _log_ratio(new, old).exp(),
        lambda w, p: (w >= 1 - p["eps_low"]) & (w <= 1 + p["eps_high"]),
        lambda p, pi_old: (1.0 - p["eps_low"], 1.0 + p["eps_high"]),
    ),
    _estimator_test(
        "kl1", "KL1 test (one-sided)", k1, lambda delta: (np.exp(-np.asarray(delta)), np.full(np.shape(delta), np.inf)),
        _delta(0.2, 50.0, "KL1 level", (0.001, 1.0, 0.001)),
        r"\mathrm{k1}_t=-\log w_t \le \delta \;\Leftrightarrow\; w_t \ge e^{-\delta}",
        "k1 can be negative, so the test bounds the ratio from below only: u = ∞ (docs/theory.md §1.3)."),
    _estimator_test(
        "kl2", "KL2 test", k2, theory.kl2_bounds, _delta(0.05, 50.0, "KL2 level", (0.0005, 0.5, 0.0005)),
        r"\mathrm{k2}_t=\tfrac12(\log w_t)^2 \le \delta \;\Leftrightarrow\; "
        r"e^{-\sqrt{2\delta}} \le w_t \le e^{\sqrt{2\delta}}",
        "Symmetric in log-ratio, so slightly tighter above 1 than KL3 at the same δ (docs/theory.md §5.4)."),
    _estimator_test(
        "kl3", "KL3 test = ATR-GRPO asymmetric clipping", k3, theory.kl3_bounds,
        _delta(0.05, 50.0, "KL3 level δ", (0.0001, 0.5, 0.0001)),
        r"\mathrm{k3}_t=w_t-1-\log w_t \le \delta \;\Leftrightarrow\; "
        r"-W_0(-e^{-1-\delta}) \le w_t \le -W_{-1}(-e^{-1-\delta})",
        "Wu et al. 2026 (ATR-GRPO): k3 of w = π_θ/π_old, i.e. KL(π_old‖π_θ). Not GRPO's k3 penalty, "
        "which flips the ratio (π_ref/π_θ) and would give [1/u_δ, 1/l_δ]."),
    ClipTestEntry(
        "prob_tv", "probability-space test",
        r"|\pi_\theta(a_t|s_t)-\pi_{\mathrm{old}}(a_t|s_t)| \le \delta",
        "A box in probability, not ratio: w ∈ [1 − δ/π_old, 1 + δ/π_old], wide for rare tokens and "
        "tight for likely ones.",
        (_delta(0.1, 1.0, "largest change of the token's probability", (0.005, 0.5, 0.005)),),
        lambda new, old, p: (new.exp() - old.exp()).abs(),
        _at_most_delta,
        _prob_tv_bounds,
        needs_pi_old=True,
    ),
    _dppo_test(
        "dppo_tv", "DPPO binary TV: asymmetric probability box",
        r"-\delta_{\mathrm{low}} \le \pi_\theta(a_t|s_t)-\pi_{\mathrm{old}}(a_t|s_t) \le \delta_{\mathrm{high}}",
        "verl 0.9.1's dppo_tv test (core_algos.py compute_policy_loss_dppo_tv, thresholds clip_ratio_low/high): "
        "prob_tv with its own room on each side, w ∈ [1 − δ_low/π_old, 1 + δ_high/π_old]. verl trains it with "
        "the dppo surrogate.",
        1.0, ("largest fall of the token's probability", "largest rise of the token's probability"),
        lambda new, old, p: new.exp() - old.exp(),
        lambda p, pi_old: ((1.0 - p["delta_low"] / pi_old).clip(min=0.0), 1.0 + p["delta_high"] / pi_old)),
    _dppo_test(
        "dppo_kl", "DPPO binary KL: the token's Bernoulli trust region",
        r"\mathrm{KL}(\mathrm{Bern}(\pi_{\mathrm{old}})\|\mathrm{Bern}(\pi_\theta)) \le "
        r"\delta_{\mathrm{low}}\ (\pi_\theta<\pi_{\mathrm{old}}),\ \delta_{\mathrm{high}}\ (\pi_\theta>\pi_{\mathrm{old}})",
        "verl 0.9.1's dppo_kl test (compute_policy_loss_dppo_kl): the KL between the sampled token's "
        "yes/no distributions under π_old and π_θ, one threshold for each direction. Its measure is that KL "
        "signed by the direction of the change; [l, u] by bisection. verl trains it with the dppo surrogate.",
        50.0, ("largest binary KL when the probability falls", "largest binary KL when the probability rises"),
        lambda new, old, p: _binary_kl(new, old), _binary_kl_bounds),
    ClipTestEntry(
        "formula", "your own measure f(w) ≤ δ",
        r"f(w_t) \le \delta,\quad f \text{ typed: in } w_t=\pi_\theta/\pi_{\mathrm{old}} "
        r"\text{ (and } \pi_{\mathrm{old}}\text{)}",
        "Type a divergence in w (and optionally pi_old): numbers, + - * / **, log, exp, sqrt, abs, log1p, "
        "expm1, tanh, sinh, cosh, min, max, e, pi. It must be 0 at w = 1, ≥ 0, falling below 1 and rising "
        "above it; [l, u] is found by root-finding. w - 1 - log(w) is kl3, 0.5*log(w)**2 is kl2.",
        (Param("f", "w - 1 - log(w)", kind="text", doc="the divergence f(w), e.g. w - 1 - log(w) or abs(log(w))"),
         _delta(0.05, 50.0, "level δ of the typed measure", (0.0005, 0.5, 0.0005))),
        _formula_value,
        _at_most_delta,
        _formula_bounds,
        needs_pi_old=lambda p: checked(p["f"]).uses_pi_old,
        check=lambda p: checked(p["f"]),
    ),
)


def checked_pi_old(pi_old, owner: str):
    """A tensor as it is (the loss's π_old = exp(log π_old), which may underflow to 0); a number, list or array as
    float64 numpy, refused unless every value is in (0, 1]."""
    if isinstance(pi_old, torch.Tensor):
        return pi_old
    try:
        values = np.asarray(pi_old, dtype=np.float64)
    except (TypeError, ValueError):
        raise DivvizInputError(f"{owner}: pi_old must be a number or an array of numbers in (0, 1]; "
                               f"got {quoted(pi_old)}") from None
    if not ((values > 0) & (values <= 1)).all():
        bad = values[~((values > 0) & (values <= 1))].flat[0]
        raise DivvizInputError(f"{owner}: pi_old is a probability in (0, 1]; got {float(bad)!r}")
    return values


CATALOGUE: dict[str, ClipTestEntry | PenaltyEntry | SurrogateEntry] = {**CLIP_TESTS, **PENALTIES, **SURROGATES}


FAMILIES = {"clip": CLIP_TESTS, "penalty": PENALTIES, "surrogate": SURROGATES}  # the catalogue by family


def get_entry(name: str, family: str | None = None) -> ClipTestEntry | PenaltyEntry | SurrogateEntry:
    """The catalogue entry called `name` (optionally only from one family), or a clear error."""
    pool = CATALOGUE if family is None else FAMILIES[family]
    kind = {"clip": "clip test", "penalty": "penalty", "surrogate": "surrogate", None: "measure"}[family]
    if family is None and isinstance(name, str) and name not in pool:  # too long for one line: its clip tests
        raise DivvizInputError(f"unknown measure {quoted(name)}; clip tests: {', '.join(FAMILIES['clip'])} "
                               "(`divviz catalogue` lists the penalties and surrogates too)")
    return pool[check_name(name, kind, pool)]


def clip_test(name: str, **params) -> ClipTest:
    entry = get_entry(name, "clip")
    params = check_params(name, entry.params, params)
    if entry.check is not None:
        entry.check(params)
    return ClipTest(entry, params)


def check_dual_clip(c) -> float | None:
    """None (no cap) or a checked c > 1."""
    return None if c is None else DUAL_CLIP.check(c, "dual_clip")


def check_beta(beta) -> float:
    return BETA.check(beta, "penalty")
