"""GBMPO's neural mirror map and its Bregman divergence on token probabilities (theory.md §2.4 [CODE]).

The mirror map is a scalar function of a token probability y ∈ (0, 1]:

    ψ(y) = ∇h(y) = Σ_{j=1}^{126} v_j σ_j(w_j y + b_j) + a y + c log y

with 21 units of each of six activations σ ∈ {x³, x², √x, x^{1/3}, log(x + 10⁻³), eˣ}. All of v, w, b,
a, c are ≥ 0 (drawn uniformly from [0, init_scale], then fixed), so every term is non-decreasing in y,
h is convex and the Bregman divergence is ≥ 0:

    D_h(y ‖ y0) = h(y) − h(y0) − ψ(y0) (y − y0)

h is ψ's closed-form antiderivative, unit by unit: ∫σ(w y + b) dy = Σ(w y + b)/w with Σ' = σ, plus
a y²/2 + c (y log y − y). Special cases (theory.md §5.7): only a = 1 gives ½(y − y0)²; only c = 1 gives
the generalised KL y log(y/y0) − (y − y0).

Source: Yuan, Khandoga, Sankarapu 2026, "Beyond KL Divergence" (GBMPO, arXiv 2602.04380), as
implemented in Lexsi-Labs/aligntune. The 380 numbers (126 v + 126 w + 126 b + a + c) are the φ that
GBMPO's evolution strategies search over; divviz draws them from a seed and keeps them fixed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

UNITS_PER_ACTIVATION = 21
_EPS_LOG = 1e-3

# (σ, its antiderivative Σ) for each activation family, on x = w y + b ≥ 0
_ACTIVATIONS = (
    (lambda x: x**3, lambda x: x**4 / 4),
    (lambda x: x**2, lambda x: x**3 / 3),
    (lambda x: x.sqrt(), lambda x: (2.0 / 3.0) * x**1.5),
    (lambda x: x.pow(1.0 / 3.0), lambda x: 0.75 * x.pow(4.0 / 3.0)),
    (lambda x: (x + _EPS_LOG).log(), lambda x: (x + _EPS_LOG) * (x + _EPS_LOG).log() - x),
    (lambda x: x.exp(), lambda x: x.exp()),
)


@dataclass(frozen=True)
class MirrorMap:
    """Fixed non-negative weights of ψ; v, w, b have shape (6, 21); a and c are scalars."""

    v: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    a: float
    c: float

    @staticmethod
    def random(seed: int, init_scale: float) -> "MirrorMap":
        """Uniform [0, init_scale] init of all 380 numbers from `seed` (GBMPO's random init)."""
        g = torch.Generator().manual_seed(seed)
        shape = (len(_ACTIVATIONS), UNITS_PER_ACTIVATION)
        v, w, b = (torch.rand(shape, generator=g, dtype=torch.float64) * init_scale for _ in range(3))
        a, c = (torch.rand(2, generator=g, dtype=torch.float64) * init_scale).tolist()
        return MirrorMap(v, w, b, a, c)

    @staticmethod
    def only(a: float = 0.0, c: float = 0.0) -> "MirrorMap":
        """A map with no neural units: ψ(y) = a y + c log y (the special cases of theory.md §5.7)."""
        zeros = torch.zeros(len(_ACTIVATIONS), UNITS_PER_ACTIVATION, dtype=torch.float64)
        return MirrorMap(zeros, zeros, zeros, a, c)

    def _units(self, y: torch.Tensor, antiderivative: bool) -> torch.Tensor:
        v, w, b = (t.to(y.device) for t in (self.v, self.w, self.b))
        x = w * y.unsqueeze(-1).unsqueeze(-1) + b  # (..., 6, 21)
        pick = 1 if antiderivative else 0
        out = torch.stack([fns[pick](x[..., k, :]) for k, fns in enumerate(_ACTIVATIONS)], dim=-2)
        if antiderivative:  # ∫σ(w y + b) dy = Σ(w y + b)/w; w = 0 makes the unit the constant σ(b)
            w_safe = torch.where(w > 0, w, torch.ones_like(w))
            const = torch.stack([fns[0](b[k]) for k, fns in enumerate(_ACTIVATIONS)])
            out = torch.where(w > 0, out / w_safe, const * y.unsqueeze(-1).unsqueeze(-1))
        return (v * out).sum(dim=(-2, -1))

    def psi(self, y: torch.Tensor, log_y: torch.Tensor) -> torch.Tensor:
        """ψ(y) = ∇h(y)."""
        return self._units(y, antiderivative=False) + self.a * y + self.c * log_y

    def potential(self, y: torch.Tensor, log_y: torch.Tensor) -> torch.Tensor:
        """h(y), the antiderivative of ψ."""
        return self._units(y, antiderivative=True) + self.a * y * y / 2 + self.c * (y * log_y - y)

    def bregman(self, log_y: torch.Tensor, log_y0: torch.Tensor) -> torch.Tensor:
        """D_h(y ‖ y0) from log-probabilities, computed in float64 (h(y) − h(y0) cancels) and cast back."""
        dtype = log_y.dtype
        log_y, log_y0 = log_y.double(), log_y0.double()
        y, y0 = log_y.exp(), log_y0.exp()
        d = self.potential(y, log_y) - self.potential(y0, log_y0) - self.psi(y0, log_y0) * (y - y0)
        return d.to(dtype)


@functools.lru_cache(maxsize=16)
def random_mirror_map(seed: int, init_scale: float) -> MirrorMap:
    return MirrorMap.random(seed, init_scale)
