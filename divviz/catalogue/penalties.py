"""Penalties, the catalogue's family added to the loss as β · value: GRPO's k1/k2/k3 toward the reference (with RPG's
importance weight and verl's straight-through and abs forms), GBMPO's Bregman penalties and RPG's regularisers toward
π_old. Per token and from log-probabilities only; `penalty(name, **params)` checks the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from divviz.catalogue.estimators import array_ops, k1, k2, k3
from divviz.catalogue.mirror import GENERALISED_KL_PHI, PHI_UPLOAD, phi_map, random_mirror_map
from divviz.catalogue.params import (CatalogueEntry, Configured, DivvizInputError, Param, by_name, check_name,
                                     check_params)

IMPORTANCE_WEIGHT = Param("importance_weight", False, kind="bool",
                          doc="multiply by w = π_θ/π_old, RPG §3.5's correction of GRPO's estimator")


@dataclass(frozen=True)
class PenaltyEntry(CatalogueEntry):
    """A per-token penalty. `value` is the divergence estimate shown to the user; `loss_term`, when
    given, is what enters the loss instead (REINFORCE-style forms: a stop-gradient weight × log π).
    `slope` is the loss term's derivative in log π_θ, in closed form, for numpy arrays (the bandit's
    fast gradient; tests/loss/test_losses.py checks it against autograd of `loss_term`)."""

    params: tuple[Param, ...]
    value: Callable  # (logp_new, logp_old, logp_ref, params) -> per-token value
    slope: Callable  # (logp_new, logp_old, logp_ref, params) -> ∂ loss_term / ∂ logp_new, numpy
    loss_term: Callable | None = None
    needs_ref: bool = True
    check: Callable | None = None  # (params) -> None, raising DivvizInputError: what a Param cannot say
    family: str = field(default="penalty", init=False)


@dataclass(frozen=True)
class Penalty(Configured):
    """A penalty with checked parameters."""

    def value(self, logp_new, logp_old, logp_ref=None):
        self._need_ref(logp_ref)
        return self.entry.value(logp_new, logp_old, logp_ref, self.params)

    def loss_term(self, logp_new, logp_old, logp_ref=None):
        self._need_ref(logp_ref)
        term = self.entry.loss_term or self.entry.value
        return term(logp_new, logp_old, logp_ref, self.params)

    def slope(self, logp_new, logp_old, logp_ref=None):
        """∂ loss_term / ∂ log π_θ per token, numpy arrays in and out."""
        self._need_ref(logp_ref)
        return self.entry.slope(logp_new, logp_old, logp_ref, self.params)

    def _need_ref(self, logp_ref):
        if self.entry.needs_ref and logp_ref is None:
            raise DivvizInputError(f"penalty '{self.name}' needs reference log-probs (logp_ref)")


def _grpo_estimator(estimator, derivative):
    """k_i of r = π_ref/π_θ (GRPO's direction, RPG §2.2), optionally × w = π_θ/π_old (RPG §3.5), optionally with
    k2's gradient (verl's straight-through "k1+"/"k3+" modes: sg(k_i) + k2 − sg(k2)).

    With y = log r = log π_ref − log π_θ the slope in log π_θ is −k_i'(y), and with the weight
    ∂(w k_i)/∂log π_θ = w (k_i(y) − k_i'(y)). `derivative` is k_i'(y); straight-through puts k2'(y) = y in its place.
    Returns (value, slope, loss_term)."""

    def value(new, old, ref, p):
        out = estimator(ref - new)
        return out * array_ops(new).exp(new - old) if p["importance_weight"] else out

    def loss_term(new, old, ref, p):
        if not p["straight_through"]:
            return value(new, old, ref, p)
        y = ref - new
        out = estimator(y).detach() + k2(y) - k2(y).detach()
        return out * (new - old).exp() if p["importance_weight"] else out

    def slope(new, old, ref, p):
        y = ref - new
        d = y if p["straight_through"] else derivative(y)
        return np.exp(new - old) * (estimator(y) - d) if p["importance_weight"] else -d

    return value, slope, loss_term


STRAIGHT_THROUGH = Param("straight_through", False, kind="bool",
                         doc="the estimator's value with k2's gradient (verl's k1+/k3+ modes)")
REFERENCE_OPTIONS = (IMPORTANCE_WEIGHT, STRAIGHT_THROUGH)


def _reference_penalty(name, title, latex, doc, estimator, derivative) -> "PenaltyEntry":
    value, slope, loss_term = _grpo_estimator(estimator, derivative)
    return PenaltyEntry(name, title, latex, doc, REFERENCE_OPTIONS, value, slope, loss_term=loss_term)


def _rpg(regulariser, weight):
    """RPG's regulariser of w = π_θ/π_old (reference = previous iterate, RPG §3.2) in two forms:
    differentiable (`regulariser`, RPG Table 1) and REINFORCE-style −sg(g(w))·log π_θ (RPG Table 2),
    whose gradients agree (RPG Proposition 4.1): both have the slope −g(w) in log π_θ."""

    def value(new, old, ref, p):
        return regulariser(new - old)

    def reinforce(new, old, ref, p):
        return -weight((new - old).detach()) * new

    def slope(new, old, ref, p):
        return -weight(new - old)

    return value, reinforce, slope


def _exp(x):
    return array_ops(x).exp(x)


RPG_REGULARISERS = {  # name: (title, differentiable loss term in lw = log w, KL part g of the REINFORCE weight, latex)
    "fkl": ("RPG forward KL", lambda lw: -lw, lambda lw: array_ops(lw).ones_like(lw),
            r"\mathrm{KL}(\pi_{\mathrm{old}}\|\pi_\theta):\; -\log w_t", r"g(w)=1"),
    "rkl": ("RPG reverse KL", lambda lw: _exp(lw) * lw, lambda lw: -_exp(lw) * (lw + 1),
            r"\mathrm{KL}(\pi_\theta\|\pi_{\mathrm{old}}):\; w_t\log w_t", r"g(w)=-w(\log w+1)"),
    "ufkl": ("RPG unnormalised forward KL", k3, lambda lw: -array_ops(lw).expm1(lw),
             r"\mathrm{UKL}(\pi_{\mathrm{old}}\|\pi_\theta):\; w_t-1-\log w_t", r"g(w)=-(w-1)"),
    "urkl": ("RPG unnormalised reverse KL", lambda lw: _exp(lw) * (lw - 1), lambda lw: -_exp(lw) * lw,
             r"\mathrm{UKL}(\pi_\theta\|\pi_{\mathrm{old}}):\; w_t\log w_t - w_t", r"g(w)=-w\log w"),
}


def _rpg_entries():
    for name, (title, reg, weight, latex, latex_g) in RPG_REGULARISERS.items():
        value, reinforce, slope = _rpg(reg, weight)
        yield PenaltyEntry(
            name, f"{title} (differentiable)", latex,
            "RPG Table 1 surrogate (Zhang et al., ICLR 2026); the divergence is to π_old, the sampling "
            f"policy. Same gradient as {name}_rf.", (), value, slope, needs_ref=False)
        yield PenaltyEntry(
            f"{name}_rf", f"{title} (REINFORCE-style)", rf"-\,\mathrm{{sg}}(g(w_t))\log\pi_\theta,\; {latex_g}",
            f"RPG Table 2: stop-gradient weight times log π_θ; the value shown is {name}'s, the loss "
            f"term is the REINFORCE form. Same gradient as {name} (RPG Prop. 4.1).",
            (), value, slope, loss_term=reinforce, needs_ref=False)


PENALTIES: dict[str, PenaltyEntry] = by_name(
    _reference_penalty(
        "k1", "k1 to reference (GRPO direction)",
        r"\log\pi_\theta-\log\pi_{\mathrm{ref}}",
        "k1 of r = π_ref/π_θ; unbiased for KL(π_θ‖π_ref) only when tokens come from π_θ.",
        k1, lambda y: -np.ones_like(y)),
    _reference_penalty(
        "k2", "k2 to reference (GRPO direction)",
        r"\tfrac12(\log\pi_{\mathrm{ref}}-\log\pi_\theta)^2",
        "k2 of r = π_ref/π_θ; half of GBMPO's log-L2 variant.",
        k2, lambda y: y),
    _reference_penalty(
        "k3", "k3 to reference (GRPO's KL penalty)",
        r"r_t-1-\log r_t,\; r_t=\pi_{\mathrm{ref}}/\pi_\theta",
        "GRPO's penalty (TRL's `beta`): k3 with the ratio flipped relative to the kl3 clip test. "
        "importance_weight=1 gives RPG's corrected estimator w·k3(r).",
        k3, np.expm1),
    _reference_penalty(
        "abs", "|log-ratio| to reference",
        r"|\log\pi_\theta-\log\pi_{\mathrm{ref}}|",
        "verl's 'abs' KL penalty (core_algos.py kl_penalty): the absolute log-ratio, an L1 pull toward the "
        "reference with a slope of ±1 in log π.",
        abs, np.sign),
    PenaltyEntry(
        "prob_l2", "GBMPO ProbL2",
        r"(\pi_\theta(a_t|s_t)-\pi_{\mathrm{ref}}(a_t|s_t))^2",
        "Bregman divergence of h = ‖p‖² on the sampled token (GBMPO code). Its slope in log p is "
        "2p(p − p_ref): rare tokens are left almost free, confident ones anchored.",
        (), lambda new, old, ref, p: (new.exp() - ref.exp()) ** 2,
        lambda new, old, ref, p: 2 * np.exp(new) * (np.exp(new) - np.exp(ref))),
    PenaltyEntry(
        "mirror", "GBMPO neural mirror map",
        r"D_h(\pi_\theta\|\pi_{\mathrm{ref}})=h(\pi_\theta)-h(\pi_{\mathrm{ref}})"
        r"-\psi(\pi_{\mathrm{ref}})(\pi_\theta-\pi_{\mathrm{ref}})",
        "Bregman divergence of a random non-negative 126-unit mirror map ψ = ∇h (divviz.catalogue.mirror).",
        (Param("seed", 0, 0, 2**31 - 1, high_open=False, kind="int", doc="seed of the 380 weights",
               typical=(0, 99, 1)),
         Param("init_scale", 0.01, 1e-12, 1.0, high_open=False,  # a subnormal scale rounds every weight to 0
               doc="weights drawn uniformly from [0, init_scale]")),
        lambda new, old, ref, p: random_mirror_map(p["seed"], p["init_scale"]).bregman(new, ref),
        lambda new, old, ref, p: random_mirror_map(p["seed"], p["init_scale"]).bregman_slope(new, ref)),
    PenaltyEntry(
        "mirror_phi", "GBMPO mirror map from a given φ",
        r"D_h(\pi_\theta\|\pi_{\mathrm{ref}}),\ h\ \text{from}\ \varphi\in\mathbb{R}^{380}_{\ge 0}",
        "The same Bregman divergence with the 380 numbers of ψ given, e.g. the best φ of GBMPO's evolution "
        "strategies (aligntune's layout: 126 v, 126 w, 126 b, a, c). The default φ is the generalised KL "
        "(only c = 1).",
        (Param("phi", GENERALISED_KL_PHI, kind="text", upload=PHI_UPLOAD,
               doc="380 non-negative numbers, or on the CLI phi=@FILE (.npy, a JSON list, or an ES state with "
                   "best_phi)"),),
        lambda new, old, ref, p: phi_map(p["phi"]).bregman(new, ref),
        lambda new, old, ref, p: phi_map(p["phi"]).bregman_slope(new, ref),
        check=lambda p: phi_map(p["phi"])),
    *_rpg_entries(),
)


def penalty(name: str, **params) -> Penalty:
    entry = PENALTIES[check_name(name, "penalty", PENALTIES)]
    params = check_params(name, entry.params, params)
    if entry.check is not None:
        entry.check(params)
    return Penalty(entry, params)
