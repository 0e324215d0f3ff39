"""Every numeric parameter of every catalogue entry works at both ends of its declared valid range: the entry builds
with the other parameters' defaults, a clip test's interval is a number or +inf on a π_old grid (never
NaN, lower ≤ 1 ≤ upper), and `policy_loss` with it gives a finite loss and gradient on a float64 and a float32 batch. A range that
declares a value which does not work is a defect of the range or of the formula: this test finds either."""

import math

import numpy as np
import pytest
import torch

from divviz.catalogue.divergences import BETA, DUAL_CLIP, FAMILIES
from divviz.catalogue.instances import configure
from divviz.catalogue.params import DivvizInputError
from divviz.loss_grids import random_token_batch
from divviz.loss_checks import OFF_POLICY_MASK_THRESHOLD, RATIO_CAP
from divviz.losses import Objective

PI_OLD = np.array([1e-12, 1e-4, 0.3, 0.999, 1.0])


def extremes(p) -> list[float]:
    """The smallest and largest values `p.check` accepts (an open end: the next float inside it)."""
    low = p.low if not p.low_open else (np.nextafter(p.low, math.inf) if p.low != 0 else 5e-324)
    high = np.nextafter(p.high, -math.inf) if p.high_open else p.high
    if p.kind == "int":
        low, high = math.ceil(low), math.floor(high)
    return [float(low) if p.kind == "float" else low, float(high) if p.kind == "float" else high]


CASES = [(family, name, p.name, value) for family, entries in FAMILIES.items() for name, entry in entries.items()
         for p in entry.params if p.kind in ("float", "int") for value in extremes(p)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # the explorer's, the engine's
@pytest.mark.parametrize("family,name,param,value", CASES, ids=[f"{n}:{p}={v:g}" for _, n, p, v in CASES])
def test_each_parameter_works_at_both_ends_of_its_range(family, name, param, value, dtype):
    try:
        measure = configure(name, {param: value}, family)
    except DivvizInputError as err:  # with the others' defaults, a value its range declares must build
        pytest.fail(f"{name}: {param}={value} is in its declared range but refused: {err}")
    logp_new, logp_old, adv, mask = (x.to(dtype) for x in random_token_batch(3, completions=6, length=5, spread=0.5))
    logp_ref = logp_old - 0.3
    if family == "clip":
        lower, upper = (np.asarray(b, dtype=float) for b in measure.bounds(PI_OLD if measure.needs_pi_old else None))
        assert not np.isnan(lower).any() and not np.isnan(upper).any(), (lower, upper)
        assert (lower >= 0).all() and (lower <= 1).all() and (upper >= 1).all(), (lower, upper)
        objective = Objective(clip=measure)
    elif family == "penalty":
        objective = Objective(clip=configure("ratio", {}), penalty=measure, beta=0.1)
    else:
        needs_clip = measure.entry.clip == "needs"  # else the surrogate's weight is its own constraint
        objective = Objective(clip=configure("ratio", {}) if needs_clip else None, surrogate=measure)
    logp_new = logp_new.clone().requires_grad_()
    out = objective(logp_new, logp_old, adv, mask, logp_ref=logp_ref, max_completion_length=5)
    (grad,) = torch.autograd.grad(out.loss, logp_new, allow_unused=True)
    assert torch.isfinite(out.loss), out.loss
    assert grad is not None and torch.isfinite(grad).all()  # the loss depends on the policy, finitely


OBJECTIVE_PARAMS = [("beta", BETA), ("dual_clip_c", DUAL_CLIP), ("ratio_cap", RATIO_CAP),
                    ("off_policy_mask_threshold", OFF_POLICY_MASK_THRESHOLD)]
OBJECTIVE_CASES = [(field, value) for field, p in OBJECTIVE_PARAMS for value in extremes(p)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("field,value", OBJECTIVE_CASES, ids=[f"{f}={v:g}" for f, v in OBJECTIVE_CASES])
def test_the_objectives_own_numbers_work_at_both_ends(field, value, dtype):
    """β (with the k3 penalty), the dual-clip c, TRL's ratio cap δ and the off-policy mask's threshold, likewise."""
    extra = {"penalty": configure("k3", {}, "penalty")} if field == "beta" else {}
    objective = Objective(clip=configure("ratio", {}), **extra, **{field: value})
    logp_new, logp_old, adv, mask = (x.to(dtype) for x in random_token_batch(4, completions=6, length=5, spread=0.5))
    logp_new = logp_new.clone().requires_grad_()
    out = objective(logp_new, logp_old, adv, mask, logp_ref=logp_old - 0.3)
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    assert torch.isfinite(out.loss) and torch.isfinite(grad).all()
