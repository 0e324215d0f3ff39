"""GBMPO's neural mirror map and its Bregman divergence on token probabilities (docs/theory.md §2.4 [CODE]).

The mirror map is a scalar function of a token probability y ∈ (0, 1]:

    ψ(y) = ∇h(y) = Σ_{j=1}^{126} v_j σ_j(w_j y + b_j) + a y + c log y

with 21 units of each of six activations σ ∈ {x³, x², √x, x^{1/3}, log(x + 10⁻³), eˣ}. All of v, w, b,
a, c are ≥ 0 (drawn uniformly from [0, init_scale], then fixed), so every term is non-decreasing in y,
h is convex and the Bregman divergence is ≥ 0:

    D_h(y ‖ y0) = h(y) − h(y0) − ψ(y0) (y − y0)

h is ψ's closed-form antiderivative, unit by unit: ∫σ(w y + b) dy = Σ(w y + b)/w with Σ' = σ, plus
a y²/2 + c (y log y − y). Special cases (docs/theory.md §5.7): only a = 1 gives ½(y − y0)²; only c = 1 gives
the generalised KL y log(y/y0) − (y − y0).

Source: Yuan, Khandoga, Sankarapu 2026, "Beyond KL Divergence" (GBMPO, arXiv 2602.04380), as
implemented in Lexsi-Labs/aligntune. The 380 numbers (126 v + 126 w + 126 b + a + c) are the φ that
GBMPO's evolution strategies search over: divviz draws them from a seed, or takes them as given (`phi_map`, in
aligntune's layout, e.g. an ES run's best φ), and keeps them fixed.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass

import numpy as np
import torch

from divviz.catalogue.estimators import array_ops
from divviz.catalogue.params import DivvizInputError, Upload
from divviz.safetext import quoted

UNITS_PER_ACTIVATION = 21
_EPS_LOG = 1e-3


def _log(x):
    return array_ops(x).log(x)


def _exp(x):
    return array_ops(x).exp(x)


# (σ, its antiderivative Σ) for each activation family, on x = w y + b ≥ 0; numpy arrays or torch tensors
_ACTIVATIONS = (
    (lambda x: x**3, lambda x: x**4 / 4),
    (lambda x: x**2, lambda x: x**3 / 3),
    (lambda x: x**0.5, lambda x: (2.0 / 3.0) * x**1.5),
    (lambda x: x ** (1.0 / 3.0), lambda x: 0.75 * x ** (4.0 / 3.0)),
    (lambda x: _log(x + _EPS_LOG), lambda x: (x + _EPS_LOG) * _log(x + _EPS_LOG) - x),
    (_exp, _exp),
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
        """A map with no neural units: ψ(y) = a y + c log y (the special cases of docs/theory.md §5.7)."""
        zeros = torch.zeros(len(_ACTIVATIONS), UNITS_PER_ACTIVATION, dtype=torch.float64)
        return MirrorMap(zeros, zeros, zeros, a, c)

    def _units(self, y, antiderivative: bool):
        """Σ_j v_j σ_j(w_j y + b_j) (or the antiderivatives) for a torch tensor or a numpy array y."""
        xp = array_ops(y)
        v, w, b = (t.to(y.device) if xp is torch else t.numpy() for t in (self.v, self.w, self.b))
        y = y[..., None, None]
        x = w * y + b  # (..., 6, 21)
        pick = 1 if antiderivative else 0
        out = xp.stack([fns[pick](x[..., k, :]) for k, fns in enumerate(_ACTIVATIONS)], -2)
        if antiderivative:  # ∫σ(w y + b) dy = Σ(w y + b)/w; w = 0 makes the unit the constant σ(b)
            w_safe = xp.where(w > 0, w, xp.ones_like(w))
            const = xp.stack([fns[0](b[k]) for k, fns in enumerate(_ACTIVATIONS)])
            out = xp.where(w > 0, out / w_safe, const * y)
        return (v * out).sum((-2, -1))

    def psi(self, y, log_y):
        """ψ(y) = ∇h(y), for torch tensors or numpy arrays."""
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

    def bregman_slope(self, log_y: np.ndarray, log_y0: np.ndarray) -> np.ndarray:
        """∂D_h(y ‖ y0)/∂log y = y (ψ(y) − ψ(y0)), for numpy arrays (h' = ψ, dy/dlog y = y)."""
        y, y0 = np.exp(log_y), np.exp(log_y0)
        return y * (self.psi(y, log_y) - self.psi(y0, log_y0))


@functools.lru_cache(maxsize=16)
def random_mirror_map(seed: int, init_scale: float) -> MirrorMap:
    return MirrorMap.random(seed, init_scale)


PHI_SIZE = 3 * len(_ACTIVATIONS) * UNITS_PER_ACTIVATION + 2  # 380
PHI_MAX_CHARACTERS = 40 * PHI_SIZE  # room for 380 numbers written in full, and nothing like a file's worth more
PHI_MAX_BYTES = 64 * PHI_MAX_CHARACTERS  # a φ file: JSON with its layout, or a .npy
GENERALISED_KL_PHI = " ".join(["0"] * (PHI_SIZE - 1) + ["1"])  # ψ(y) = log y: h(y) = y log y − y


@functools.lru_cache(maxsize=16)
def phi_map(text: str) -> MirrorMap:
    """The mirror map of an explicit φ: 380 non-negative numbers, comma- or space-separated (brackets allowed), in
    aligntune's layout [v (126), w (126), b (126), a, c] (`meta_es/es_utils.phi_to_mirror_params`), units ordered
    by activation as `_ACTIVATIONS`. Raises `DivvizInputError` saying what is wrong."""
    if len(text) > PHI_MAX_CHARACTERS:
        raise DivvizInputError(f"φ is {len(text):,} characters long; 380 numbers need at most {PHI_MAX_CHARACTERS:,}")
    items = [t for t in text.strip().strip("[]").replace(",", " ").split() if t]
    if len(items) != PHI_SIZE:
        raise DivvizInputError(f"φ needs {PHI_SIZE} numbers (126 v, 126 w, 126 b, a, c); got {len(items)}")
    try:
        phi = np.array([float(t) for t in items])
    except ValueError:
        bad = next(t for t in items if not _is_number(t))
        raise DivvizInputError(f"φ has {quoted(bad, 20)}, which is not a number") from None
    if not np.isfinite(phi).all() or (phi < 0).any():
        where = int(np.flatnonzero(~np.isfinite(phi) | (phi < 0))[0])
        raise DivvizInputError(f"φ's number {where + 1} is {phi[where]:g}; every number must be finite and ≥ 0 "
                               "(so that h is convex and the divergence ≥ 0)")
    shape = (len(_ACTIVATIONS), UNITS_PER_ACTIVATION)
    v, w, b = (torch.tensor(phi[i * 126:(i + 1) * 126], dtype=torch.float64).reshape(shape) for i in range(3))
    return MirrorMap(v, w, b, float(phi[378]), float(phi[379]))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def phi_text(source: bytes, name: str) -> str:
    """φ as `phi_map` reads it, from a file's bytes: a .npy array (no pickles), or JSON — a list, or an object with
    "best_phi" or "phi" (aligntune's ES state) — or plain numbers. Raises `DivvizInputError` for anything else."""
    if len(source) > PHI_MAX_BYTES:
        raise DivvizInputError(f"{quoted(name, 60)} is {len(source):,} bytes: too large to be a φ of 380 numbers")
    if name.endswith(".npy"):
        try:
            phi = np.load(io.BytesIO(source), allow_pickle=False)
        except (ValueError, OSError) as err:
            raise DivvizInputError(f"{quoted(name, 60)} is not a readable .npy array ({type(err).__name__})") from None
        return " ".join(f"{x:.9g}" for x in np.ravel(phi).astype(np.float64))
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError:
        raise DivvizInputError(f"{quoted(name, 60)} is neither a .npy array nor text") from None
    try:
        data = json.loads(text)
    except ValueError:
        return text  # plain numbers, checked by phi_map
    if isinstance(data, dict):
        data = data.get("best_phi", data.get("phi"))
    if not isinstance(data, list):
        raise DivvizInputError(f"{quoted(name, 60)} holds JSON but no list of numbers (or \"best_phi\" / \"phi\")")
    return " ".join(str(x) for x in data)


def _checked_phi(source: bytes, name: str) -> str:
    text = phi_text(source, name)
    phi_map(text)
    return text


def _describe_phi(text: str) -> str:
    psi = phi_map(text)
    default = " (the default: the generalised KL)" if text == GENERALISED_KL_PHI else ""
    return f"φ in use: Σv = {float(psi.v.sum()):.4g}, a = {psi.a:.4g}, c = {psi.c:.4g}{default}"


PHI_UPLOAD = Upload("φ", "φ: 380 numbers (.npy, JSON list or ES state, or text)", ("npy", "json", "txt"), _checked_phi,
                    _describe_phi)
