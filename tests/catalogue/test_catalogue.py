"""The catalogue: intervals, predicates, penalties' spot values (docs/theory.md §5.6, §5.7) and bad input."""

import math

import numpy as np
import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from divviz.catalogue import divergences as dv, penalties as pn
from divviz.catalogue.aggregation import check_aggregation
from divviz.catalogue.kinship import GROUPS, SIBLINGS
from divviz.catalogue.mirror import MirrorMap
from divviz.catalogue.params import DivvizInputError

F64 = torch.float64


def t(x):
    return torch.as_tensor(x, dtype=F64)


def test_every_entry_is_complete():
    for entry in dv.CATALOGUE.values():
        assert entry.title and entry.latex and entry.doc and entry.family in ("clip", "penalty", "surrogate")
        for p in entry.params:
            assert p.doc and p.range_text()


def test_the_kinship_map_places_every_entry_once_beside_a_sibling_of_its_family():
    """The Catalogue page's groups: every entry in exactly one group of its own family, with a sibling that is
    another catalogue entry and a sentence on how it differs."""
    placed = [(name, group.family) for group in GROUPS for name, _, _ in group.members]
    assert sorted(name for name, _ in placed) == sorted(dv.CATALOGUE)
    for name, family in placed:
        sibling, how = SIBLINGS[name]
        assert dv.CATALOGUE[name].family == family and sibling in dv.CATALOGUE and sibling != name and how


@pytest.mark.parametrize("name, params, pi_old, want", [
    ("ratio", {"eps": 0.2}, None, (0.8, 1.2)),
    ("clip_higher", {"eps_low": 0.2, "eps_high": 0.28}, None, (0.8, 1.28)),
    ("kl1", {"delta": 0.1}, None, (math.exp(-0.1), math.inf)),
    ("kl2", {"delta": 0.02}, None, (math.exp(-0.2), math.exp(0.2))),
    ("kl3", {"delta": 0.05}, None, (0.7161894551693, 1.350403255977)),
    ("prob_tv", {"delta": 0.1}, 0.5, (0.8, 1.2)),
    ("prob_tv", {"delta": 0.1}, 0.05, (0.0, 3.0)),
])
def test_bounds(name, params, pi_old, want):
    got = dv.clip_test(name, **params).bounds(None if pi_old is None else np.asarray(pi_old))
    assert [float(b) for b in got] == pytest.approx(want, rel=1e-12)


NAMES_AND_PARAMS = [("ratio", {"eps": 0.2}), ("clip_higher", {"eps_low": 0.15, "eps_high": 0.3}),
                    ("kl1", {"delta": 0.1}), ("kl2", {"delta": 0.05}), ("kl3", {"delta": 0.05}),
                    ("prob_tv", {"delta": 0.1})]


@pytest.mark.parametrize("name, params", NAMES_AND_PARAMS)
@settings(max_examples=150, deadline=None)
@given(w=st.floats(1e-4, 50.0), pi_old=st.floats(1e-4, 1.0))
def test_predicate_iff_interval(name, params, w, pi_old):
    """Each test's own predicate on its own measure ⇔ l ≤ w ≤ u (hypothesis, away from the edge)."""
    test = dv.clip_test(name, **params)
    logp_old = t([math.log(pi_old)])
    logp_new = logp_old + math.log(w)
    lower, upper = (float(b) for b in test.bounds(logp_old.exp()))
    if min(abs(w - lower), abs(w - upper)) > 1e-9 * w:
        assert bool(test.feasible(logp_new, logp_old)) == (lower <= w <= upper)


# docs/theory.md §5.7 (GBMPO) and the k3-penalty column
def test_gbmpo_penalty_spot_values():
    for p_new, p_ref, prob_l2 in ((0.5, 0.4, 0.01), (0.01, 0.008, 4e-6)):
        new, ref = t([math.log(p_new)]), t([math.log(p_ref)])
        assert float(pn.penalty("prob_l2").value(new, new, ref)) == pytest.approx(prob_l2, rel=1e-9)
        assert float(2 * pn.penalty("k2").value(new, new, ref)) == pytest.approx(0.0497930, rel=1e-5)
        assert float(pn.penalty("k3").value(new, new, ref)) == pytest.approx(0.0231436, rel=1e-5)


def test_mirror_map_special_cases():
    y, y0 = t([math.log(0.5)]), t([math.log(0.4)])
    assert float(MirrorMap.only(a=1.0).bregman(y, y0)) == pytest.approx(0.005, rel=1e-12)
    assert float(MirrorMap.only(c=1.0).bregman(y, y0)) == pytest.approx(0.0115718, rel=1e-5)
    # and against the closed forms: ½(y − y0)² and y log(y/y0) − (y − y0)
    assert float(MirrorMap.only(c=1.0).bregman(y, y0)) == pytest.approx(0.5 * math.log(0.5 / 0.4) - 0.1, rel=1e-12)


def test_mirror_potential_is_antiderivative_and_divergence_nonnegative():
    mm = MirrorMap.random(seed=3, init_scale=0.5)
    y = t(np.linspace(0.05, 0.95, 7)).requires_grad_()
    h = mm.potential(y, y.log())
    (grad,) = torch.autograd.grad(h.sum(), y)
    assert torch.allclose(grad, mm.psi(y, y.log()).detach(), rtol=1e-10, atol=1e-12)
    grid = t(np.linspace(0.01, 1.0, 40)).log()
    d = mm.bregman(grid[:, None], grid[None, :])
    assert bool((d >= -1e-12).all()) and torch.allclose(torch.diagonal(d), torch.zeros(40, dtype=F64), atol=1e-12)
    assert MirrorMap.random(3, 0.5).v.equal(mm.v)  # deterministic from the seed


def test_mirror_penalty_entry_uses_seeded_map():
    new, ref = t([math.log(0.5)]), t([math.log(0.4)])
    a = pn.penalty("mirror", seed=1).value(new, new, ref)
    b = pn.penalty("mirror", seed=2).value(new, new, ref)
    assert float(a) > 0 and float(b) > 0 and float(a) != float(b)


# docs/theory.md §5.6: RPG surrogate loss L = −w R + β·reg(w) at w = 1.1, R = 1, β = 1e-4, π_old = 1
@pytest.mark.parametrize("name, loss, weight", [
    ("ufkl", -1.09999953, 1.09999000),
    ("urkl", -1.10009952, 1.09998952),
    ("rkl", -1.09998952, 1.09987952),
    ("fkl", -1.1 - 1e-4 * math.log(1.1), 1.10010000),
])
def test_rpg_spot_values(name, loss, weight):
    beta, w = 1e-4, 1.1
    new, old = t([math.log(w)]).requires_grad_(), t([0.0])
    value = pn.penalty(name).value(new, old).detach()
    assert float(-w + beta * value) == pytest.approx(loss, rel=1e-8)
    # REINFORCE weight = w R + β g(w): read off the loss term's gradient −sg(β g)·∇log π
    rf = pn.penalty(f"{name}_rf").loss_term(new, old)
    (grad,) = torch.autograd.grad(rf.sum(), new)
    assert float(w - beta * grad) == pytest.approx(weight, rel=1e-8)


def test_penalty_needs_reference():
    with pytest.raises(DivvizInputError, match="needs reference log-probs"):
        pn.penalty("k3").value(t([0.0]), t([0.0]))


def test_importance_weighted_k3():
    new, old, ref = t([math.log(0.5)]), t([math.log(0.25)]), t([math.log(0.4)])
    plain = pn.penalty("k3").value(new, old, ref)
    weighted = pn.penalty("k3", importance_weight=True).value(new, old, ref)
    assert float(weighted) == pytest.approx(2.0 * float(plain), rel=1e-12)


# Bad input: one typed error whose message names the parameter and its range
@pytest.mark.parametrize("call, message", [
    (lambda: dv.clip_test("kl3", delta=-0.1), "kl3: parameter 'delta' must be a finite number in (0, 50]; got -0.1"),
    (lambda: dv.clip_test("kl3", delta=0), "parameter 'delta' must be a finite number in (0, 50]; got 0"),
    (lambda: dv.clip_test("kl3", delta=float("nan")), "'delta' must be a finite number in (0, 50]; got nan"),
    (lambda: dv.clip_test("kl3", delta=float("inf")), "got inf"),
    (lambda: dv.clip_test("kl3", delta="abc"), "got 'abc'"),
    (lambda: dv.clip_test("ratio", eps=1.5), "ratio: parameter 'eps' must be a finite number in (0, 1]; got 1.5"),
    (lambda: dv.clip_test("clip_higher", eps_high=0), "'eps_high' must be a finite number in (0, 1e+06]"),
    (lambda: dv.clip_test("prob_tv", delta=2), "prob_tv: parameter 'delta' must be a finite number in (0, 1]"),
    (lambda: dv.clip_test("kl3", eps=0.2), "kl3: unknown parameter 'eps' (its parameters: delta)"),
    (lambda: dv.clip_test("kl4"), "unknown clip test 'kl4'; choose ratio, clip_higher"),
    (lambda: dv.clip_test("k3"), "unknown clip test 'k3'"),
    (lambda: pn.penalty("kl3"), "unknown penalty 'kl3'; choose k1, k2, k3"),
    (lambda: dv.get_entry("nope"), "unknown measure 'nope'"),
    (lambda: pn.penalty("mirror", seed=1.5), "mirror: parameter 'seed' must be an integer in [0, 2147483647]"),
    (lambda: pn.penalty("k3", importance_weight=2), "'importance_weight' must be 0 or 1"),
    (lambda: dv.check_dual_clip(1.0), "dual_clip: parameter 'c' must be a finite number in (1, 1e+06]; got 1.0"),
    (lambda: dv.check_dual_clip(float("nan")), "parameter 'c'"),
    (lambda: dv.check_beta(-1), "penalty: parameter 'beta' must be a finite number in [0, 1e+06]; got -1"),
    (lambda: check_aggregation("mean"), "unknown aggregation 'mean'; choose grpo, bnpo, dr_grpo, dapo"),
    (lambda: dv.clip_test("prob_tv").bounds(), "prob_tv: its ratio interval depends on π_old"),
])
def test_bad_input_messages(call, message):
    with pytest.raises(DivvizInputError) as err:
        call()
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_integer_ranges_print_every_digit():
    """`divviz train --help` and every message give an integer range as integers ([0, 2147483647]), never rounded
    to six significant digits as 2.14748e+09 (which no one can type back)."""
    from divviz.catalogue.params import Param

    assert Param("seed", 0, 0, 2**31 - 1, kind="int").range_text() == "an integer in [0, 2147483647]"
    assert Param("x", 0.5, 0, 1e6, low_open=True).range_text() == "a finite number in (0, 1e+06]"
