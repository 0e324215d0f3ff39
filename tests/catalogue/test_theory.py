"""theory.py and estimators.py against docs/theory.md §5 (scipy lambertw, cross-checked there with mpmath
to 30 digits) and against independent oracles (scipy.special.kl_div / rel_entr, the δ → 0 series)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import kl_div, rel_entr

from divviz.catalogue import theory
from divviz.catalogue.estimators import k1, k2, k3


def printed(x) -> float:
    """x rounded to the 6 significant digits theory.md prints: the table agrees to its last digit."""
    return float(f"{float(x):.6g}")


def same6(got, want):
    return [printed(g) for g in np.atleast_1d(got)] == [printed(v) for v in np.atleast_1d(want)]

# docs/theory.md §5.1: δ, l_δ, u_δ (6 significant digits)
KL3_TABLE = [
    (0.001, 0.955943, 1.04539),
    (0.005, 0.903305, 1.10336),
    (0.01, 0.865165, 1.14817),
    (0.02, 0.813105, 1.21355),
    (0.03, 0.774629, 1.26534),
    (0.05, 0.716189, 1.35040),
    (0.1, 0.616817, 1.51622),
    (0.2, 0.493239, 1.77225),
    (0.5, 0.301710, 2.35768),
]


@pytest.mark.parametrize("delta, lower, upper", KL3_TABLE)
def test_kl3_bounds_match_table(delta, lower, upper):
    l, u = theory.kl3_bounds(delta)
    # the table prints 6 significant digits, so compare at that precision; 1e-6 relative below
    assert same6(l, lower) and same6(u, upper)


def test_kl3_bounds_to_1e6_relative_at_probe_values():
    # docs/theory.md §5.8 recipe values, printed there to more digits
    assert theory.kl3_bounds(0.05) == pytest.approx((0.7161894551693, 1.350403255977), rel=1e-12)
    eps_low, eps_high = theory.kl3_equivalent_box(0.05)
    assert same6([eps_low, eps_high, eps_high / eps_low], [0.283811, 0.350403, 1.23464])
    l, u = theory.kl3_bounds(0.05)
    assert same6([math.log(l), math.log(u)], [-0.333811, 0.300403])


def test_kl3_bounds_at_zero_and_vectorised():
    assert theory.kl3_bounds(0.0) == (1.0, 1.0)
    l, u = theory.kl3_bounds(np.array([0.0, 0.02, 0.1]))
    assert l.shape == (3,) and u[0] == 1.0
    assert l[1:] == pytest.approx([0.813105, 0.616817], rel=5e-6)
    with pytest.raises(ValueError):
        theory.kl3_bounds(-0.1)
    with pytest.raises(ValueError):
        theory.kl3_bounds(float("nan"))


@settings(max_examples=300, deadline=None)
@given(delta=st.floats(1e-12, 200.0))
def test_boundary_identity_ln_b_equals_b_minus_1_minus_delta(delta):
    for b in theory.kl3_bounds(delta):
        rhs = b - 1 - delta
        assert math.log(b) == pytest.approx(rhs, abs=1e-12 * max(1.0, abs(rhs)))


@settings(max_examples=400, deadline=None)
@given(w=st.floats(1e-6, 1e3), delta=st.floats(1e-8, 20.0))
def test_k3_test_iff_inside_interval(w, delta):
    l, u = theory.kl3_bounds(delta)
    inside = l <= w <= u
    value = float(k3(np.log(w)))
    # away from the boundary the two must agree exactly; at it, within rounding
    if abs(value - delta) > 1e-12 * max(1.0, delta):
        assert (value <= delta) == inside


def test_small_delta_against_series_and_scipy_branch_point_trap():
    # SciPy's lambertw with its default tol returns u ≈ 1 + 3δ near the branch point (style.md §3)
    for delta in (1e-12, 1e-9, 3e-9, 1e-6):
        l, u = theory.kl3_bounds(delta)
        sl, su = theory.kl3_bounds_series(delta)
        s = math.sqrt(2 * delta)
        assert abs(u - su) < 10 * s**6 + 1e-15 and abs(l - sl) < 10 * s**6 + 1e-15
        assert u - 1 == pytest.approx(s, rel=s)  # leading order √(2δ), not 3δ


def test_series_leading_order_accuracy():
    # docs/theory.md §5.1: 1 ± √(2δ) + 2δ/3 is good to ~2e-4 at δ = 0.02 and ~3e-3 at δ = 0.1
    for delta, tol in ((0.02, 3e-4), (0.1, 3e-3)):
        l2, u2 = theory.kl3_bounds_series(delta, order=2)
        l, u = theory.kl3_bounds(delta)
        assert abs(l2 - l) < tol and abs(u2 - u) < tol
    assert same6(theory.kl3_bounds_series(0.02, order=2), (0.813333, 1.21333))
    assert same6(theory.kl3_bounds_series(0.1, order=2), (0.619453, 1.51388))


def test_asymmetry_directions():
    # room above 1 is larger in ratio space, smaller in log-ratio space (docs/theory.md §1.3)
    l, u = theory.kl3_bounds(0.05)
    assert u - 1 > 1 - l
    assert abs(math.log(l)) > math.log(u)


# docs/theory.md §5.2
def test_match_ppo_and_dapo_boxes_to_kl3():
    ppo = theory.match_box_to_kl3(0.2, 0.2)
    dapo = theory.match_box_to_kl3(0.2, 0.28)
    assert same6(ppo["delta_low"], 0.0231436) and same6(ppo["interval_low"], (0.800000, 1.23084))
    assert same6(ppo["delta_high"], 0.0176784) and same6(ppo["interval_high"], (0.823562, 1.20000))
    assert same6(dapo["delta_high"], 0.0331399) and same6(dapo["interval_high"], (0.764154, 1.28000))
    # the edges themselves come back to 1e-12
    assert ppo["interval_low"][0] == pytest.approx(0.8, rel=1e-12)
    assert dapo["interval_high"][1] == pytest.approx(1.28, rel=1e-12)
    # neither box is a KL3 level set
    assert ppo["delta_low"] != pytest.approx(ppo["delta_high"], rel=0.1)


def test_matching_round_trips():
    for delta in (0.01, 0.05, 0.3):
        eps_low, eps_high = theory.kl3_equivalent_box(delta)
        m = theory.match_box_to_kl3(eps_low, eps_high)
        assert m["delta_low"] == pytest.approx(delta, rel=1e-12)
        assert m["delta_high"] == pytest.approx(delta, rel=1e-12)


# docs/theory.md §5.3
@pytest.mark.parametrize("w, v1, v2, v3", [
    (0.8, 0.223144, 0.0248965, 0.0231436),
    (0.9, 0.105361, 0.00555042, 0.00536052),
    (1.1, -0.0953102, 0.00454202, 0.00468982),
    (1.2, -0.182322, 0.0166206, 0.0176784),
    (1.28, -0.246860, 0.0304699, 0.0331399),
])
def test_estimators_table(w, v1, v2, v3):
    lr = np.log(w)
    assert same6([k1(lr), k2(lr), k3(lr)], [v1, v2, v3])


@settings(max_examples=200, deadline=None)
@given(w=st.floats(1e-8, 1e8))
def test_estimators_against_scipy_oracles(w):
    lr = np.log(w)
    assert float(k3(lr)) == pytest.approx(kl_div(1.0, w), rel=1e-9, abs=1e-15)
    assert float(k1(lr)) == pytest.approx(rel_entr(1.0, w), rel=1e-9, abs=1e-15)
    assert float(k2(lr)) >= 0 and float(k3(lr)) >= 0


def test_k3_keeps_precision_near_one():
    lr = 1e-9
    assert float(k3(np.float64(lr))) == pytest.approx(lr * lr / 2, rel=1e-6)


# docs/theory.md §5.4: the inverse-direction trap and the KL2 box
@pytest.mark.parametrize("delta, kl2, inverse", [
    (0.02, (0.818731, 1.22140), (0.824029, 1.22985)),
    (0.05, (0.728893, 1.37194), (0.740520, 1.39628)),
    (0.1, (0.639407, 1.56395), (0.659534, 1.62123)),
])
def test_alternative_conventions(delta, kl2, inverse):
    assert same6(theory.kl2_bounds(delta), kl2)
    assert same6(theory.kl3_inverse_bounds(delta), inverse)
    assert theory.kl3_bounds(delta) != pytest.approx(inverse, rel=1e-3)


def test_logit_view_round_trip_and_reachability():
    p = np.array([0.01, 0.3, 0.7, 0.9])
    l, u = theory.kl3_bounds(0.05)
    d_min, d_max = theory.logit_shift_bounds(l, u, p)
    assert np.allclose(theory.ratio_from_logit_shift(d_min, p), l, rtol=1e-12)
    finite = np.isfinite(d_max)
    assert np.allclose(theory.ratio_from_logit_shift(d_max[finite], p[finite]), u, rtol=1e-12)
    # w < 1/p always, so a token with p ≥ 1/u can never hit the upper clip (docs/theory.md §1.4)
    assert np.array_equal(~finite, p >= 1 / u)
    # the threshold numbers of docs/theory.md §1.4
    assert 1 / theory.kl3_bounds(0.02)[1] == pytest.approx(0.8240, abs=5e-5)
    # the room grows with p: a looser top favours already-likely tokens
    assert np.all(np.diff(d_max[finite]) > 0)


def test_every_citation_of_the_theory_resolves_to_a_section_of_docs_theory_md():
    """The code and tests cite `docs/theory.md §n`; each such section is a heading of docs/theory.md, and no file
    cites a theory.md outside the repository."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    theory = (root / "docs" / "theory.md").read_text()
    sections = set(re.findall(r"^#+ §(\d+(?:\.\d+)?) ", theory, re.M))
    cited = {}
    for path in [*root.glob("divviz/**/*.py"), *root.glob("app_pages/*.py"), *root.glob("tests/**/*.py"),
                 *root.glob("scripts/*.py"), *root.glob("bench/*.py")]:
        text = path.read_text()
        for match in re.finditer(r"(\S*)theory\.md(?:'s)?\s+§(\d+(?:\.\d+)?)", text):
            assert match[1].endswith("docs/"), f"{path.name} cites {match[0]!r}: docs/theory.md is the one"
            cited.setdefault(match[2], path.name)
    assert len(cited) >= 15 and not {n: f for n, f in cited.items() if n not in sections}


def test_docs_theory_md_tables_are_what_divviz_computes():
    """§5.1's KL3 boxes and §5.2's matched edges, read from docs/theory.md, against `theory.kl3_bounds` (6 digits)."""
    import re
    from pathlib import Path

    from divviz.catalogue import theory

    text = (Path(__file__).resolve().parents[2] / "docs" / "theory.md").read_text()
    box = text.split("### §5.1")[1].split("###")[0]
    rows = [[float(v.replace("−", "-")) for v in line.strip("|").split("|")] for line in box.splitlines()
            if re.match(r"\| \d", line)]
    assert len(rows) == 8
    for delta, low, high, *_ in rows:
        assert theory.kl3_bounds(delta) == (pytest.approx(low, rel=1e-5), pytest.approx(high, rel=1e-5))
    matched = text.split("### §5.2")[1].split("###")[0]
    for edge, delta in ((0.8, 0.0231436), (1.2, 0.0176784), (1.28, 0.0331399)):
        assert f"| {delta} |" in matched and theory.kl3_delta_at_ratio(edge) == pytest.approx(delta, rel=1e-5)
