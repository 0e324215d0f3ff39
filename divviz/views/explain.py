"""One token's loss explained with its own numbers: `policy_loss` run on that token alone, and its parts.

For a token with π_old, ratio w, advantage A (and π_ref for a penalty), and an objective with clip test [l, u]:

    ℓ = ρ · −min(w·A, clip(w)·A)      clip(w) = w inside the test, else the edge on w's side (l or u)
        [capped at −c·A for A < 0]     dual-clip (RPG §3.3); TRL's ratio cap δ takes min(w, δ)·A first
        + β·penalty [+ β₂·penalty₂]    the penalty terms, as the objective adds them
    ρ: what multiplied the policy term in training (a rollout importance weight, TRL's top-entropy and off-policy
    masks), as the run recorded it; 1 when nothing did
    (a surrogate replaces the min: its own term, and its gradient weight γ = −(∂ℓ/∂log π_θ)/A)
    its weight in the loss: ∂L/∂ℓ (the aggregation's), so the token adds weight·ℓ to L.

Every number comes from `policy_loss` on a 1-token batch (float64): the loss with and without the penalty, the
gradient ∂ℓ/∂log π_θ, the clip state and whether the gradient is masked. The two terms of the min are w·A and
clip(w)·A with clip(w) from the test's own `bounds`; the explanation checks that they give back the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from divviz.losses import TOKEN_STATES, Objective
from divviz.catalogue.params import DivvizInputError

WHY = {  # docs/theory.md §1.4: which side, which sign
    "inside": "w is inside [l, u]: the gradient A·w·∇log π flows",
    "masked low": "A < 0 and w < l: lowering w further would leave the region, so the clipped term l·A wins, it is "
                  "constant in θ, and the gradient is zero",
    "masked high": "A > 0 and w > u: raising w further would leave the region, so the clipped term u·A wins, it is "
                   "constant in θ, and the gradient is zero",
    "dual-clip": "A < 0 and the loss −w·A passed the cap −c·A: the cap wins, it is constant in θ, and the gradient "
                 "is zero",
    "outside, pulled back": "w is outside [l, u] on the side its advantage pulls it away from (A > 0 with w < l, or "
                            "A < 0 with w > u): the unclipped term w·A wins and its gradient moves w back toward "
                            "the region",
}


@dataclass(frozen=True)
class TokenExplanation:
    label: str
    pi_old: float
    ratio: float
    adv: float
    clip_test: str | None  # the clip test's name
    clip_value: float | None  # its value for this token
    threshold: str  # "δ = 0.05" or "ε = 0.2"
    lower: float | None
    upper: float | None
    unclipped: float  # w·A
    clipped: float  # clip(w)·A
    winner: str  # "unclipped", "clipped" or "both" (equal)
    dual_cap: float | None  # −c·A for A < 0 with dual-clip
    policy_loss: float  # ℓ without the penalty
    penalty: str | None  # "β·name [+ β₂·name₂]"
    first_penalty: str | None  # the first penalty's name
    penalty_value: float | None  # its value
    penalty_term: float  # the penalties' loss terms, with their coefficients
    surrogate: str | None  # the surrogate's label, None for PPO's clipped surrogate
    policy_gradient: float  # ∂(ℓ without the penalty)/∂log π_θ
    loss: float  # ℓ
    gradient: float  # ∂ℓ/∂log π_θ
    state: str  # one of TOKEN_STATES
    weight: float | None  # the token's aggregation weight in its batch
    pi_ref: float | None
    rho: float | None = None  # what multiplied the policy term (None: nothing)

    @property
    def masked(self) -> bool:
        return self.state in ("masked low", "masked high", "dual-clip") or self.rho == 0

    @property
    def why(self) -> str:
        if self.rho == 0:
            return "ρ = 0: the run's rollout correction or TRL's mask dropped the policy term, and its gradient"
        if self.surrogate is not None:
            weight = "" if self.adv == 0 else f": γ = −(∂ℓ/∂log π_θ)/A = {-self.policy_gradient / self.adv:.6g}"
            return f"{self.surrogate}'s gradient is its own{weight}"
        if self.adv == 0:
            return "A = 0: the policy term has no gradient, whatever w"
        return WHY[self.state]

    @property
    def contribution(self) -> float | None:
        """weight·ℓ: what this token adds to the batch's loss."""
        return None if self.weight is None else self.weight * self.loss

    def lines(self) -> list[tuple[str, str]]:
        """(what, formula with this token's numbers) rows, for the explainer."""
        g = lambda x: f"{x + 0.0:.6g}"  # noqa: E731 (+ 0.0: a zero gradient prints 0, never -0)
        rows = [("ratio", f"w = π_θ/π_old = {g(self.ratio)}   (π_old = {g(self.pi_old)}, π_θ = "
                          f"{g(self.ratio * self.pi_old)})"), ("advantage", f"A = {g(self.adv)}")]
        if self.clip_test is not None:
            inside = self.lower <= self.ratio <= self.upper
            rows.append(("test", f"{self.clip_test}(w) = {g(self.clip_value)} against {self.threshold}: "
                                 f"w {'inside' if inside else 'outside'} [l, u] = [{g(self.lower)}, {g(self.upper)}]"))
        if self.rho is not None:
            rows.append(("ρ", f"the policy term is multiplied by ρ = {g(self.rho)}: a rollout importance weight or "
                              "TRL's masks, as the run applied them"))
        if self.surrogate is not None:
            rows.append(("surrogate", f"{self.surrogate} replaces PPO's min: its ℓ = {g(self.policy_loss)}, "
                                      f"∂ℓ/∂log π_θ = {g(self.policy_gradient)}"))
        else:
            terms = {"unclipped": f"w·A = {g(self.unclipped)}", "clipped": f"clip(w)·A = {g(self.clipped)}"}
            won = {"both": "equal: either", "unclipped": "w·A wins", "clipped": "clip(w)·A wins"}[self.winner]
            rows.append(("the min", f"min({terms['unclipped']}, {terms['clipped']}) = "
                                    f"{g(min(self.unclipped, self.clipped))}: {won}"))
        if self.dual_cap is not None:
            rows.append(("dual-clip", f"cap −c·A = {g(self.dual_cap)}" + (": binds" if self.state == "dual-clip"
                                                                        else ": does not bind")))
        if self.penalty is not None:
            rows.append(("penalty", f"{self.penalty} = {g(self.penalty_term)}   ({self.first_penalty} = "
                                    f"{g(self.penalty_value)}" + (f", π_ref = {g(self.pi_ref)})" if self.pi_ref
                                                                  is not None else ")")))
        policy = "−c·A (the cap)" if self.state == "dual-clip" else "−min(…)" if self.surrogate is None else \
            self.surrogate
        policy = policy if self.rho is None else f"ρ·({policy})"
        total = f" + {self.penalty} = {g(self.policy_loss)} + {g(self.penalty_term)}" if self.penalty else ""
        rows.append(("loss", f"ℓ = {policy}{total} = {g(self.loss)};  ∂ℓ/∂log π_θ = {g(self.gradient)}"
                             + (" (the penalty's slope included)" if self.penalty else "")))
        if self.rho == 0:
            verdict = "masked (ρ = 0)"
        elif not self.masked:
            verdict = f"flows ({self.state})"
        else:  # a masked state names itself ("masked high"); another says why it masks ("masked (dual-clip)")
            verdict = self.state if self.state.startswith("masked") else f"masked ({self.state})"
        rows.append(("gradient", f"{verdict}: {self.why}"))
        if self.weight is not None:
            rows.append(("weight", f"∂L/∂ℓ = {g(self.weight)}: the token adds {g(self.contribution)} to the loss"))
        return rows


def _one(x: float) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64)


def explain(objective: Objective, pi_old: float, ratio: float, adv: float, *, pi_ref: float | None = None,
            weight: float | None = None, rho: float | None = None, label: str = "") -> TokenExplanation:
    """`objective`'s loss on one token, taken apart (see the module's docstring). With `rho`, the policy term is
    multiplied by it instead of by the objective's off-policy mask (which judges a whole completion; ρ holds its
    verdict)."""
    for name, value in (("π_old", pi_old), ("ratio", ratio)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise DivvizInputError(f"this token's {name} is {value!r}: the explainer needs a positive number")
    if objective.needs_ref and pi_ref is None:
        raise DivvizInputError(f"{objective.label} needs π_ref, which this run did not keep")
    logp_old = _one(math.log(pi_old))
    logp_new = (logp_old + math.log(ratio)).requires_grad_()
    logp_ref = None if pi_ref is None else _one(math.log(pi_ref))
    args = (logp_old, torch.tensor([float(adv)], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64))
    options = {"logp_ref": logp_ref, "max_completion_length": 1}  # one token: every aggregation gives ℓ itself
    if rho is not None:
        objective, options["weight"] = replace(objective, off_policy_mask_threshold=None), _one(rho)
    out = objective(logp_new, *args, **options)
    loss = float(out.loss.detach())
    (gradient,) = torch.autograd.grad(out.loss, logp_new)
    policy_only = objective.policy_term()(logp_new, *args, **options)
    (policy_gradient,) = torch.autograd.grad(policy_only.loss, logp_new)
    w = float(out.ratio)
    lower = upper = clip_value = None
    clipped_ratio, threshold = w, ""
    if objective.clip is not None:
        lower, upper = (float(np.asarray(b)) for b in objective.clip.bounds(np.asarray(pi_old)))
        clip_value = float(out.clip_value)
        threshold = ", ".join(f"{k} = {v:g}" for k, v in objective.clip.params.items())
        if bool(out.outside):
            clipped_ratio = upper if w > 1 else lower
    unclipped = (w if objective.ratio_cap is None else min(w, objective.ratio_cap)) * adv
    clipped = clipped_ratio * adv
    winner = "both" if unclipped == clipped else "unclipped" if unclipped < clipped else "clipped"
    penalty_value = None if out.penalty is None else float(out.penalty)
    return TokenExplanation(
        label=label or objective.label, pi_old=pi_old, ratio=w, adv=adv,
        clip_test=objective.clip.name if objective.clip else None, clip_value=clip_value, threshold=threshold,
        lower=lower, upper=upper, unclipped=unclipped, clipped=clipped, winner=winner,
        dual_cap=-objective.dual_clip_c * adv if objective.dual_clip_c is not None and adv < 0 else None,
        policy_loss=float(policy_only.loss.detach()),
        penalty=" + ".join(f"{beta:g}·{p.name}" for p, beta in objective.penalties) or None,
        first_penalty=objective.penalty.name if objective.penalty else None,
        penalty_value=penalty_value, penalty_term=loss - float(policy_only.loss.detach()), loss=loss,
        surrogate=objective.surrogate.label if objective.surrogate else None, policy_gradient=float(policy_gradient),
        gradient=float(gradient), state=TOKEN_STATES[int(out.token_state())], weight=weight, pi_ref=pi_ref, rho=rho)


def explain_stored(objective: Objective, tokens: dict, i: int, label: str = "") -> TokenExplanation:
    """The explanation of token `i` of a kept completion (`completions.step_record`'s "tokens")."""
    value = lambda key: None if tokens.get(key) is None else tokens[key][i]  # noqa: E731
    return explain(objective, value("pi_old"), value("ratio"), value("adv"), pi_ref=value("pi_ref"),
                   weight=value("weight"), rho=value("rho"), label=label)

