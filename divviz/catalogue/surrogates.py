"""Surrogates: the policy term ℓ_t of the loss, the catalogue's third family beside clip tests and penalties.

Without a surrogate, `policy_loss` uses PPO's clipped surrogate −min(w A, clip_C(w) A) with the objective's clip
test C (losses.py). Each entry here replaces it. All of them have a gradient of one shape,

    ∂ℓ_t/∂log π_θ = −A · γ_t,        γ_t the surrogate's *gradient weight*,

so what a surrogate does is read off γ against the ratio (PPO: γ = w inside the region, 0 where the test masks):

    cispo     γ = clip(w, lo, hi)                    −sg(clip(w, lo, hi)) A log π   (MiniMax-M1; TRL lo=0, hi=ε_high;
                                                                                      verl lo=1−ε_low, hi=1+ε_high)
    sapo      γ = 4 σ(τ(w−1)) (1 − σ(τ(w−1))) w      −(4/τ) σ(τ(w−1)) A, τ = τ_pos if A > 0 else τ_neg (SAPO)
    vespo     γ = φ(W) = e^{λ + k log W − λ W}       −sg(φ(W)) A log π, W the sequence's ratio Π_t w_t (VESPO)
    gpg       γ = 1                                  −A log π (GPG: REINFORCE, no ratio)
    icepop    γ = w on [lo, hi], else 0              −sg(w [lo ≤ w ≤ hi]) A log π (IcePop; verl's bypass mode)
    dppo      γ = min(w, c) where the test keeps     −sg(min(w, c)) A log π on unmasked tokens (verl's DPPO losses)
                the token, else 0
    geo_mean  γ_t = s_i / |o_i|, unmasked tokens     −Ā_i s_i, s_i = exp(mean_t clip-min(log w_t)) (GMPO)

A few add a term that A does not scale, so the primitive is the slope ∂ℓ/∂log π_θ, and γ = −slope/A:

    dro       slope −A + β log w                     −(A log π − β/2 (log w)²) (verl's DRO)
    kl_cov    slope −A w + κ sgn(log w) on the k     −w A + κ |log w| on the k tokens of largest Cov(A, log π)
              tokens it picks                        (Cui et al. 2025; verl)
    clip_cov  PPO's slope, 0 on the k tokens drawn   PPO's surrogate × [not drawn] (Cui et al. 2025; verl)
              among those with Cov in (lb, ub)
    rpg_<kl>  slope −(w A + β g(w̄)) where the clip   RPG's Algorithm 2: the KL part g of RPG's REINFORCE weight
              keeps the token, else 0                inside the clipped advantage (RPG's own code)

Soft surrogates (cispo, sapo, vespo, gpg, icepop, dro, kl_cov) have no clip test: γ is the constraint. dppo, geo_mean,
clip_cov and rpg_<kl> take the objective's clip test (its interval [l, u]) and mask with it as PPO does. Formulas are
TRL 1.16's `_compute_loss`, verl 0.9.1's `core_algos.compute_policy_loss_*` and RPG's
`compute_policy_loss_reinforce`; tests/loss/test_trl.py, tests/loss/test_verl.py and tests/loss/test_rpg.py check them against that
code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import torch

from divviz.catalogue.params import CatalogueEntry, Configured, Param, by_name, check_name, check_params
from divviz.catalogue.penalties import RPG_REGULARISERS

LEVELS = ("token", "sequence")  # TRL's importance_sampling_level: w_t, or the sequence's geometric-mean ratio (GSPO)


@dataclass(frozen=True)
class SurrogateInputs:
    """What a surrogate's term reads (torch, (B, T) unless said): the log-ratio (B, T), or (B, 1) at sequence level,
    with its gradient; logp_new with its gradient; A ((B, 1) or (B, T)); the float mask; the clip test's (l, u) and
    `unmasked` (no token masked by it), or None without a test."""

    log_ratio: torch.Tensor
    logp_new: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    bounds: tuple | None
    unmasked: torch.Tensor | None
    selected: torch.Tensor | None = None  # the tokens a batch-selecting surrogate picked (`SurrogateEntry.select`)


@dataclass(frozen=True)
class SurrogateEntry(CatalogueEntry):
    """One surrogate: `term` gives the per-token loss ℓ (torch, with its gradient); `slope` gives ∂ℓ/∂log π_θ in
    numpy from (w, A, params, unmasked, selected, the test's bounds), the bandit's step and the explorer's curves (tests
    check it against autograd). `select`, for the batch-selecting ones (clip_cov, kl_cov), picks their tokens from
    the whole batch (torch, detached; `random` if it draws from torch's global generator, as verl does).
    `clip` says whether it takes the objective's clip test ("needs"), refuses one ("none"); `sequence` whether it
    may run at TRL's sequence importance-sampling level; `own_level` that it is sequence-level by itself."""

    source: str
    params: tuple[Param, ...]
    term: Callable  # (SurrogateInputs, params) -> ℓ, (B, T) or (B, 1)
    slope: Callable  # (w, adv, params, unmasked, selected, bounds) -> ∂ℓ/∂log π_θ, numpy
    clip: str = "none"
    sequence: bool = False
    own_level: bool = False
    select: Callable | None = None  # (SurrogateInputs, params) -> bool (B, T)
    random: bool = False
    family: str = field(default="surrogate", init=False)


@dataclass(frozen=True)
class Surrogate(Configured):
    """A surrogate with checked parameters; its label names only the parameters away from their defaults."""

    @property
    def label(self) -> str:
        shown = " ".join(f"{p.name}={self.params[p.name]:.4g}" for p in self.entry.params
                         if self.params[p.name] != p.default)
        return f"{self.name} {shown}".strip()

    def term(self, inputs: SurrogateInputs) -> torch.Tensor:
        if self.entry.select is not None:
            inputs = replace(inputs, selected=self.entry.select(inputs, self.params))
        return self.entry.term(inputs, self.params)

    def slope(self, w, adv, unmasked=None, selected=None, bounds=(0.0, np.inf)) -> np.ndarray:
        """∂ℓ/∂log π_θ for one-token completions; `unmasked`: not masked by the clip test; `selected`: picked by
        a batch-selecting surrogate (default: all unmasked, none selected); `bounds`: the clip test's (l, u)."""
        w, adv = np.asarray(w, dtype=np.float64), np.asarray(adv, dtype=np.float64)
        unmasked = np.ones(np.shape(w), dtype=bool) if unmasked is None else unmasked
        selected = np.zeros(np.shape(w), dtype=bool) if selected is None else selected
        return self.entry.slope(w, adv, self.params, unmasked, selected, bounds)

    def selected(self, logp_new: np.ndarray, logp_old: np.ndarray, adv: np.ndarray, mask: np.ndarray,
                 unmasked: np.ndarray) -> np.ndarray | None:
        """The tokens a batch-selecting surrogate picks in one (B, T) batch, by the same `select` as training (numpy in
        and out); None for the others."""
        if self.entry.select is None:
            return None
        as_torch = lambda x: torch.as_tensor(np.ascontiguousarray(x, dtype=np.float64))  # noqa: E731
        inputs = SurrogateInputs(as_torch(logp_new - logp_old), as_torch(logp_new), as_torch(adv), as_torch(mask),
                                 None, as_torch(unmasked))
        return self.entry.select(inputs, self.params).numpy()

    def weight(self, w, adv, unmasked=None, selected=None, bounds=(0.0, np.inf)) -> np.ndarray:
        """γ(w) = −(∂ℓ/∂log π_θ)/A for one-token completions (A ≠ 0; the explorer draws A = ±1)."""
        return -self.slope(w, adv, unmasked, selected, bounds) / np.asarray(adv, dtype=np.float64)


def _gamma(weight: Callable) -> Callable:
    """The slope −A γ of a surrogate given by its gradient weight γ(w, A, params, unmasked)."""
    return lambda w, adv, p, unmasked, selected, bounds: -adv * weight(w, adv, p, unmasked)


def _cispo(s: SurrogateInputs, p):
    weight = s.log_ratio.exp().clamp(p["lo"], p["hi"]).detach()
    return -weight * s.adv * s.logp_new


def by_sign(condition, if_true: float, if_false: float, like):
    """`if_true` where `condition`, else `if_false`, as numbers of `like`'s kind and dtype (numpy or torch)."""
    if isinstance(like, torch.Tensor):
        return torch.where(condition, torch.full_like(like, if_true), torch.full_like(like, if_false))
    return np.where(condition, if_true, if_false)


def _sapo_tau(adv, p):
    return by_sign(adv > 0, p["tau_pos"], p["tau_neg"], adv)


def _sapo(s: SurrogateInputs, p):
    tau = _sapo_tau(s.adv, p)
    return -torch.sigmoid(tau * (s.log_ratio.exp() - 1)) * 4 / tau * s.adv


def _sapo_weight(w, adv, p, unmasked):
    gate = 1 / (1 + np.exp(-_sapo_tau(adv, p) * (w - 1)))
    return 4 * gate * (1 - gate) * w


VESPO_FLOOR = math.log(1e-8)  # TRL's lower clamp of the sequence's log-ratio


def vespo_phi(log_w_seq, adv, p):
    """φ(W) = exp(λ + k log W − λ W) with W the sequence's ratio, log W clamped to [log 1e-8, 20], (k, λ) by the
    sign of A (A ≥ 0: k_pos, λ_pos), λ ≥ 1e-4; NaN/inf → 0 (TRL 1.16's `get_gamma_weights`). numpy or torch."""
    xp = torch if isinstance(log_w_seq, torch.Tensor) else np
    log_w = xp.clip(log_w_seq, VESPO_FLOOR, 20.0)
    positive, like = adv >= 0, log_w + adv * 0  # `like`: the numbers k and λ fill, shaped as log W and A broadcast
    k = by_sign(positive, p["k_pos"], p["k_neg"], like)
    lam = by_sign(positive, max(p["lambda_pos"], 1e-4), max(p["lambda_neg"], 1e-4), like)
    phi = xp.exp(lam + k * log_w - lam * xp.exp(log_w))
    return xp.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)


def vespo_sequence_phi(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, p) -> torch.Tensor:
    """φ(W) of each completion, W = Π_t w_t over its tokens (each log w_t clamped to ±20, as TRL), (B, 1), detached."""
    with torch.no_grad():
        return vespo_phi((log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True), adv, p)


def _vespo(s: SurrogateInputs, p):
    return -vespo_sequence_phi(s.log_ratio, s.adv, s.mask, p) * s.adv * s.logp_new


def _dppo(s: SurrogateInputs, p):
    weight = s.log_ratio.exp().clamp(max=p["c"]).detach()
    return -s.adv * weight * s.logp_new * s.unmasked


def _geo_mean(s: SurrogateInputs, p):
    """GMPO: the token's log-ratio clipped to [log l, log u] on the side A pushes toward (sign-aware min, as PPO's),
    averaged over the completion; ℓ_i = −Ā_i exp(mean), one value per completion, (B, 1)."""
    lower, upper = (torch.as_tensor(b, dtype=s.log_ratio.dtype).log() for b in s.bounds)
    sign = torch.sign(s.adv)
    clipped = s.log_ratio.clamp(lower, upper)
    picked = sign * torch.minimum(sign * s.log_ratio, sign * clipped)
    length = s.mask.sum(-1, keepdim=True).clamp(min=1)  # verl adds 1e-8, which its bool mask's count loses
    ratio = ((picked * s.mask).sum(-1, keepdim=True) / length).exp()
    adv = (s.adv * s.mask).sum(-1, keepdim=True) / length if s.adv.shape[-1] > 1 else s.adv
    return -adv * ratio


def _dro(s: SurrogateInputs, p):
    """DRO: −(A log π − β/2 (log w)²), a REINFORCE term with a squared log-ratio pull back toward π_old."""
    return -(s.adv * s.logp_new - 0.5 * p["beta"] * s.log_ratio ** 2)


def _covariance(s: SurrogateInputs) -> torch.Tensor:
    """verl's per-token covariance of advantage and log-prob over the batch's unmasked tokens,
    (A_t − mean A)(log π_t − mean log π), plain means over the tokens the mask keeps (detached)."""
    valid = s.mask > 0
    adv, logp = s.adv.expand_as(s.logp_new).detach(), s.logp_new.detach()
    count = valid.sum().clamp(min=1)
    return (adv - adv[valid].sum() / count) * (logp - logp[valid].sum() / count)


def _top_covariance(s: SurrogateInputs, p) -> torch.Tensor:
    """kl_cov's tokens: the k = max(1, ⌊n · ratio⌋) unmasked tokens of largest covariance (torch.topk, by row)."""
    valid = s.mask > 0
    selected = torch.zeros_like(valid)
    count = int(valid.sum())
    if count:
        top = torch.topk(_covariance(s)[valid], max(1, int(count * p["ratio"]))).indices
        selected[valid.nonzero(as_tuple=True)[0][top], valid.nonzero(as_tuple=True)[1][top]] = True
    return selected


def _kl_cov(s: SurrogateInputs, p):
    """KL-Cov: −w A on every token, plus coef·|log w| on the tokens of largest covariance."""
    return -s.adv * s.log_ratio.exp() + p["coef"] * s.log_ratio.abs() * s.selected


def _random_covariance_band(s: SurrogateInputs, p) -> torch.Tensor:
    """clip_cov's tokens: min(max(1, ⌊n · ratio⌋), #candidates) drawn without replacement (torch.randperm on torch's
    global generator, as verl) among the unmasked tokens whose covariance lies in (lb, ub) and whose gradient PPO's clip
    does not already mask."""
    valid = (s.mask > 0) & (s.unmasked > 0)
    covariance = _covariance(s)
    candidates = ((covariance > p["lb"]) & (covariance < p["ub"]) & valid).nonzero()
    selected = torch.zeros_like(valid)
    if len(candidates):
        number = max(int(p["ratio"] * float(s.mask.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:min(number, len(candidates))]]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


def _clip_cov(s: SurrogateInputs, p):
    """Clip-Cov: PPO's clipped surrogate with the test's [l, u], and no loss at all on the chosen tokens."""
    ratio = s.log_ratio.exp()
    lower, upper = (torch.as_tensor(b, dtype=ratio.dtype, device=ratio.device) for b in s.bounds)
    clipped = torch.minimum(torch.maximum(ratio, lower), upper)
    return -torch.minimum(ratio * s.adv, clipped * s.adv) * ~s.selected


def _clip_cov_slope(w, adv, p, unmasked, selected, bounds):
    return -adv * w * unmasked * ~selected


def _kl_cov_slope(w, adv, p, unmasked, selected, bounds):
    return -adv * w + p["coef"] * np.sign(np.log(w)) * selected


def _rpg_algorithm_2(g: Callable) -> tuple[Callable, Callable]:
    """RPG's Algorithm 2 with the KL part g of its REINFORCE weight (RPG Table 2): the effective advantage
    A′ = A + β g(w̄)/w, w̄ = clip(w, l, u), inside the clip; ℓ = −sg(w) A′ log π there, so ∂ℓ/∂log π = −(w A + β g(w̄)).
    A > 0 keeps w < u; A ≤ 0 keeps l ≤ w < c; elsewhere the ratio is replaced by the bound it crossed (u, l or c)
    and log π is detached: no gradient, the KL term's included. Term for term RPG's `compute_policy_loss_reinforce`
    with kl_type `rpg_rf_<kl>_clip_ppo` (verl/trainer/ppo/core_algos.py of complex-reasoning/RPG)."""
    def term(s: SurrogateInputs, p):
        lower, upper = (torch.as_tensor(b, dtype=s.log_ratio.dtype, device=s.log_ratio.device) for b in s.bounds)
        w = s.log_ratio.exp()
        kl = (p["beta"] * g(torch.minimum(torch.maximum(w, lower), upper).log())).detach()
        logp, fixed = s.logp_new, s.logp_new.detach()
        inside = (s.adv * logp + kl / w.detach() * logp) * w.detach()
        above = torch.where(w < upper, inside, s.adv * fixed * upper - kl * fixed)
        below = torch.where(w < lower, s.adv * fixed * lower - kl * fixed, inside)
        below = torch.where(w < p["c"], below, s.adv * fixed * p["c"] + kl * fixed)
        return -torch.where(s.adv > 0, above, below)

    def slope(w, adv, p, unmasked, selected, bounds):
        lower, upper = bounds
        inside = np.where(adv > 0, w < upper, (w >= lower) & (w < p["c"]))
        return -(adv * w + p["beta"] * g(np.log(np.clip(w, lower, upper)))) * inside

    return term, slope


def _rpg_entries():
    for kl, (title, _, g, latex, latex_g) in RPG_REGULARISERS.items():
        term, slope = _rpg_algorithm_2(g)
        yield SurrogateEntry(
            f"rpg_{kl}", f"RPG Algorithm 2, {title}: the KL inside the clipped advantage",
            rf"-\,\mathrm{{sg}}(w_t)\,A'\log\pi_\theta,\ A'=A+\beta\,g(\bar w_t)/w_t,\ {latex_g}",
            f"RPG's REINFORCE-style loss with its clip (Zhang et al., ICLR 2026, Algorithm 2): the {kl} term β·g "
            "enters the advantage that the clip test and dual-clip c judge, so a clipped token loses its KL "
            f"gradient too — unlike the additive form, PPO's surrogate + β·{kl}_rf, where the KL always acts.",
            f"RPG core_algos.py compute_policy_loss_reinforce(kl_type='rpg_rf_{kl}_clip_ppo', kl_loss_coef=β, "
            "clip_ratio_c=c); its box is clip_higher with clip_ratio_low/high",
            (Param("beta", 1e-4, 0.0, typical=(0.0, 1.0, 1e-4), doc="β, the KL coefficient (RPG's kl_loss_coef)"),
             Param("c", 3.0, 1.0, low_open=True, typical=(1.05, 20.0, 0.05),
                   doc="dual-clip cap for A ≤ 0 (RPG's clip_ratio_c)")),
            term, slope, clip="needs")


RATIO_SHARE = "share of the batch's unmasked tokens it picks, at least 1 (verl's {name}, default 2e-4)"
LO = Param("lo", 0.0, 0.0, 1.0, high_open=False, typical=(0.0, 1.0, 0.01),
           doc="lowest weight (TRL: 0; verl: 1 − ε_low)")
HI = Param("hi", 5.0, 1.0, trl_name="epsilon_high", typical=(1.0, 10.0, 0.05), doc="highest weight (TRL: epsilon_high; verl: 1 + ε_high)")
TAU_MIN = 1e-6  # SAPO's term is 4/τ·σ(τ(w − 1)): below this its value nears float32's range (4/τ overflows at τ ≈ 1e-38)
TAU_POS = Param("tau_pos", 1.0, TAU_MIN, trl_name="sapo_temperature_pos", typical=(0.05, 5.0, 0.05), doc="gate temperature for A > 0")
TAU_NEG = Param("tau_neg", 1.05, TAU_MIN, trl_name="sapo_temperature_neg", typical=(0.05, 5.0, 0.05), doc="gate temperature for A ≤ 0")


def _vespo_params():
    return (Param("k_pos", 2.0, 0.0, trl_name="vespo_k_pos", typical=(0.0, 6.0, 0.1), doc="shape k for A ≥ 0"),
            Param("lambda_pos", 3.0, 0.0, trl_name="vespo_lambda_pos", typical=(0.0, 6.0, 0.1), doc="rate λ for A ≥ 0"),
            Param("k_neg", 3.0, 0.0, trl_name="vespo_k_neg", typical=(0.0, 6.0, 0.1), doc="shape k for A < 0"),
            Param("lambda_neg", 2.0, 0.0, trl_name="vespo_lambda_neg", typical=(0.0, 6.0, 0.1), doc="rate λ for A < 0"))


SURROGATES: dict[str, SurrogateEntry] = by_name(
    SurrogateEntry(
        "cispo", "CISPO: clipped importance-sampling weight",
        r"-\,\mathrm{sg}(\mathrm{clip}(w_t,\,lo,\,hi))\,A\,\log\pi_\theta",
        "Keeps every token's gradient and clips only its weight (MiniMax-M1, 2025): a token past the box still "
        "learns, at the capped weight.",
        "TRL 1.16 grpo_trainer.py loss_type='cispo' (lo = 0, hi = epsilon_high); verl core_algos.py "
        "compute_policy_loss_cispo (lo = 1 − clip_ratio_low, hi = 1 + clip_ratio_high)",
        (LO, HI), _cispo, _gamma(lambda w, adv, p, unmasked: np.clip(w, p["lo"], p["hi"])), sequence=True),
    SurrogateEntry(
        "sapo", "SAPO: soft sigmoid gate",
        r"-\tfrac{4}{\tau}\,\sigma(\tau(w_t-1))\,A,\quad \tau=\tau_{+}\ (A>0),\ \tau_{-}\ (A\le 0)",
        "A smooth trust region (Gao et al. 2025, SAPO): the gradient weight 4σ(1−σ)w is w near 1 and fades "
        "away from it instead of dropping to 0 at a bound.",
        "TRL 1.16 loss_type='sapo' (sapo_temperature_pos/neg); verl compute_policy_loss_sapo (tau_pos/tau_neg, "
        "always seq-mean-token-mean)",
        (TAU_POS, TAU_NEG), _sapo, _gamma(_sapo_weight), sequence=True),
    SurrogateEntry(
        "vespo", "VESPO: gamma weight of the sequence's ratio",
        r"-\,\mathrm{sg}(\varphi(W_i))\,A\,\log\pi_\theta,\ \varphi(W)=e^{\lambda+k\log W-\lambda W},"
        r"\ W_i=\textstyle\prod_t w_t",
        "Sequence-level: every token of a completion gets φ of the completion's whole ratio W (product of its "
        "token ratios), φ(1) = 1 and φ → 0 for W far from 1 on either side.",
        "TRL 1.16 loss_type='vespo', GRPOTrainer.get_gamma_weights (vespo_k_pos/neg, vespo_lambda_pos/neg)",
        _vespo_params(), _vespo, _gamma(lambda w, adv, p, unmasked: vespo_phi(np.log(w), adv, p)), own_level=True),
    SurrogateEntry(
        "gpg", "GPG: plain policy gradient",
        r"-A\,\log\pi_\theta",
        "REINFORCE with the group's advantage and no ratio at all (Chu et al. 2025, GPG): γ = 1 whatever w.",
        "verl core_algos.py compute_policy_loss_gpg (and compute_policy_loss_reinforce)",
        (), lambda s, p: -s.adv * s.logp_new, _gamma(lambda w, adv, p, unmasked: np.ones_like(w))),
    SurrogateEntry(
        "dppo", "DPPO: REINFORCE on the tokens the test keeps",
        r"-\,\mathrm{sg}(\min(w_t,c))\,A\,\log\pi_\theta\cdot[C_t\text{ or pulled back}]",
        "verl's DPPO losses: the clip test masks as PPO's does (A > 0 above u, A < 0 below l), but a unmasked "
        "token's loss is REINFORCE-style with the weight min(w, c). With the dppo_tv or dppo_kl clip test this "
        "is verl's dppo_tv / dppo_kl.",
        "verl core_algos.py compute_policy_loss_dppo_tv / compute_policy_loss_dppo_kl (c = clip_ratio_c)",
        (Param("c", 3.0, 1.0, low_open=True, typical=(1.05, 20.0, 0.05), doc="largest weight (clip_ratio_c)"),),
        _dppo, _gamma(lambda w, adv, p, unmasked: np.minimum(w, p["c"]) * unmasked), clip="needs"),
    SurrogateEntry(
        "icepop", "IcePop: REINFORCE weighted by w, zero outside [lo, hi]",
        r"-\,\mathrm{sg}(w_t\,[lo\le w_t\le hi])\,A\,\log\pi_\theta",
        "A token's REINFORCE weight is its ratio while lo ≤ w ≤ hi and 0 outside, whatever the sign of A (Ring-1T's "
        "IcePop; verl's rollout correction 'lo_hi' in bypass mode, where π_old is the rollout policy). Its "
        "truncated sibling, TIS, min(w, hi), is cispo with lo = 0.",
        "verl rollout_corr_helper.compute_rollout_correction_weights(rollout_is='token', threshold 'lo_hi') with "
        "compute_policy_loss_bypass_mode(loss_type='reinforce')",
        (Param("lo", 0.5, 0.0, 1.0, high_open=False, typical=(0.0, 1.0, 0.01), doc="lowest ratio with a gradient"),
         Param("hi", 2.0, 1.0, typical=(1.0, 10.0, 0.05), doc="highest ratio with a gradient")),
        lambda s, p: -(s.log_ratio.exp() * ((s.log_ratio.exp() >= p["lo"]) & (s.log_ratio.exp() <= p["hi"]))
                       ).detach() * s.adv * s.logp_new,
        _gamma(lambda w, adv, p, unmasked: w * ((w >= p["lo"]) & (w <= p["hi"])))),
    SurrogateEntry(
        "geo_mean", "GMPO: geometric mean of clipped token ratios",
        r"-\bar A_i\,\exp\!\big(\tfrac{1}{|o_i|}\textstyle\sum_t \mathrm{sgn}(A)\min(\mathrm{sgn}(A)\log w_t,"
        r"\ \mathrm{sgn}(A)\,\mathrm{clip}(\log w_t,\log l,\log u))\big)",
        "Sequence-level (Zhao et al. 2025, GMPO): the completion's ratio is the geometric mean of its token "
        "ratios, each clipped in log space to the test's [l, u] on the side A pushes toward; one loss per "
        "completion. verl's eps bound the log-ratio: its (ε_low, ε_high) is the box [e^−ε_low, e^ε_high].",
        "verl core_algos.py compute_policy_loss_geo_mean (loss_agg_mode ignored: mean over completions)",
        (), _geo_mean, _gamma(lambda w, adv, p, unmasked: w * unmasked), clip="needs", own_level=True),
    SurrogateEntry(
        "dro", "DRO: REINFORCE with a squared log-ratio pull toward π_old",
        r"-\big(A\,\log\pi_\theta-\tfrac{\beta}{2}\,(\log w_t)^2\big)",
        "No ratio in the policy term and no clip: the constraint is a quadratic penalty on log w, whose slope "
        "β log w pulls every token back toward π_old, harder the further it went (Tang et al. 2025, tapered "
        "off-policy REINFORCE / DRO).",
        "verl core_algos.py compute_policy_loss_dro (policy_loss.dro_beta, which verl requires > 0)",
        (Param("beta", 0.1, 0.0, low_open=True, typical=(0.01, 5.0, 0.01), doc="β of the squared log-ratio "
               "(verl's dro_beta)"),),
        _dro, lambda w, adv, p, unmasked, selected, bounds: -adv + p["beta"] * np.log(w)),
    SurrogateEntry(
        "kl_cov", "KL-Cov: a |log w| penalty on the tokens of largest covariance",
        r"-w_t A+\kappa\,|\log w_t|\cdot[t\in\mathrm{top}_k\ \mathrm{Cov}(A,\log\pi)]",
        "Batch-selecting (Cui et al. 2025, The Entropy Mechanism of RL for LLMs): unclipped −w A everywhere, and "
        "on the k tokens whose advantage and log-prob covary most — those that drive entropy down — a KL-like "
        "penalty κ|log w|. Which tokens depends on the whole batch, so the explorer draws both kinds.",
        "verl core_algos.py compute_policy_loss_kl_cov (kl_cov_ratio, ppo_kl_coef)",
        (Param("ratio", 2e-4, 0.0, 1.0, low_open=True, high_open=False, typical=(1e-4, 0.5, 1e-4),
               doc=RATIO_SHARE.format(name="kl_cov_ratio")),
         Param("coef", 0.1, 0.0, typical=(0.0, 5.0, 0.01), doc="κ, the penalty's coefficient (ppo_kl_coef)")),
        _kl_cov, _kl_cov_slope, select=_top_covariance),
    SurrogateEntry(
        "clip_cov", "Clip-Cov: detach random tokens of high covariance",
        r"-\min(w_tA,\ \mathrm{clip}(w_t,l,u)A)\cdot[t\notin\mathrm{rand}_k\{\mathrm{lb}<"
        r"\mathrm{Cov}(A,\log\pi)<\mathrm{ub}\}]",
        "Batch-selecting (Cui et al. 2025): PPO's clipped surrogate with the objective's clip test, except on k "
        "tokens drawn at random among those whose covariance lies in (lb, ub), which get no gradient at all. "
        "The draw uses torch's global generator (as verl), so a bandit run would depend on the runs beside it: "
        "it trains in the lab and on the CLI, not in the bandit.",
        "verl core_algos.py compute_policy_loss_clip_cov (clip_cov_ratio, clip_cov_lb, clip_cov_ub; its box "
        "is the ratio test clip_higher with clip_ratio_low/high)",
        (Param("ratio", 2e-4, 0.0, 1.0, low_open=True, high_open=False, typical=(1e-4, 0.5, 1e-4),
               doc=RATIO_SHARE.format(name="clip_cov_ratio")),
         Param("lb", 1.0, typical=(-5.0, 10.0, 0.05), doc="lower end of the covariance band (clip_cov_lb)"),
         Param("ub", 5.0, typical=(-5.0, 20.0, 0.05), doc="upper end of the covariance band (clip_cov_ub)")),
        _clip_cov, _clip_cov_slope, clip="needs", select=_random_covariance_band, random=True),
    *_rpg_entries(),
)


def get_surrogate(name: str) -> SurrogateEntry:
    return SURROGATES[check_name(name, "surrogate", SURROGATES)]


def surrogate(name: str, **params) -> Surrogate:
    entry = get_surrogate(name)
    return Surrogate(entry, check_params(name, entry.params, params))
