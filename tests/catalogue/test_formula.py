"""formula.py: typed divergences against theory.py's closed forms, numpy against torch, hostile input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from divviz.catalogue import theory
from divviz.catalogue.formula import MAX_CHARACTERS, bounds, check, parse
from divviz.catalogue.params import DivvizInputError

DELTAS = (0.0177, 0.05, 0.2, 1.0, 5.0)


@pytest.mark.parametrize("delta", DELTAS)
def test_kl3_formula_bounds_match_closed_form(delta):
    lower, upper = bounds(parse("w - 1 - log(w)"), delta)
    want_lower, want_upper = theory.kl3_bounds(delta)
    assert abs(lower - want_lower) < 1e-10 and abs(upper - want_upper) < 1e-10


@pytest.mark.parametrize("delta", DELTAS)
def test_kl2_formula_bounds_match_closed_form(delta):
    lower, upper = bounds(parse("0.5*log(w)**2"), delta)
    want_lower, want_upper = theory.kl2_bounds(delta)
    assert abs(lower - want_lower) < 1e-10 and abs(upper - want_upper) < 1e-10


@pytest.mark.parametrize("text, delta, want", [
    ("abs(log(w))", 0.2, (math.exp(-0.2), math.exp(0.2))),
    ("max(w, 1/w) - 1", 0.5, (1 / 1.5, 1.5)),
    ("(w - 1)**2 / 2", 0.08, (0.6, 1.4)),
    ("(w - 1)**2 / 2", 5.0, (0.0, 1 + math.sqrt(10))),  # f ≤ δ all the way down to w → 0
    ("abs(1 - 1/w)", 2.0, (1 / 3, math.inf)),  # f < 1 for every w > 1
])
def test_bounds_of_simple_formulas(text, delta, want):
    lower, upper = bounds(parse(text), delta)
    assert lower == pytest.approx(want[0], abs=1e-12) and upper == pytest.approx(want[1], rel=1e-12)


def test_probability_space_formula_gives_bounds_per_pi_old():
    pi_old = np.array([[1e-3, 0.2, 0.3], [0.5, 1.0, 0.3]])
    lower, upper = bounds(parse("abs(w - 1)*pi_old"), 0.2, pi_old=pi_old)
    assert lower.shape == upper.shape == pi_old.shape
    np.testing.assert_allclose(lower, np.maximum(0.0, 1 - 0.2 / pi_old), atol=1e-12)
    np.testing.assert_allclose(upper, 1 + 0.2 / pi_old, rtol=1e-12)


def test_pi_old_for_a_formula_without_it_gives_arrays_of_its_shape():
    lower, upper = bounds(parse("abs(log(w))"), 0.1, pi_old=[0.2, 0.7])
    np.testing.assert_allclose(lower, [math.exp(-0.1)] * 2, rtol=1e-14)
    np.testing.assert_allclose(upper, [math.exp(0.1)] * 2, rtol=1e-14)


def test_parse_normalises_text_and_sees_pi_old():
    formula = parse("  w-1 -log( w )  ")
    assert formula.text == "w - 1 - log(w)" and not formula.uses_pi_old
    assert parse("abs(w-1)*pi_old").uses_pi_old


@pytest.mark.parametrize("text", [
    "w - 1 - log(w)", "0.5*log(w)**2", "abs(log(w))", "(w - 1)**2 / 2", "max(w, 1/w) - 1",
    "abs(w - 1)*pi_old", "min(w, 2, pi) + sqrt(w) * e - log1p(w) + expm1(-w)**-2",
    "tanh(w) + sinh(-w) / cosh(+w) - w**0.5",
])
def test_torch_backend_equals_numpy_backend(text):
    formula = parse(text)
    rng = np.random.default_rng(0)
    w = np.exp(rng.normal(scale=2.0, size=200))
    pi_old = rng.uniform(0.01, 1.0, size=200)
    want = formula.numpy(w, pi_old)
    got = formula.torch(torch.tensor(w, dtype=torch.float64), torch.tensor(pi_old, dtype=torch.float64))
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13, atol=1e-15)


def test_torch_gradient_of_kl3_in_log_ratio_is_w_minus_1():
    log_w = torch.linspace(-3.0, 3.0, 101, dtype=torch.float64, requires_grad=True)
    parse("w - 1 - log(w)").torch(torch.exp(log_w)).sum().backward()
    np.testing.assert_allclose(log_w.grad.numpy(), np.expm1(log_w.detach().numpy()), rtol=0, atol=1e-12)


HOSTILE = [
    ('__import__("os")', "function '__import__'"),
    ("().__class__", "attribute access"),
    ("lambda: 0", "lambda"),
    ("w**10**10", "exponent"),
    ("w**17", "exponent 17 is too large"),
    ("w**--2", "exponent"),
    ("w" * 10_000, "too long"),
    ("1/0", "does not use the ratio w"),
    ("w - 1 + 1/0", "not finite at w = 1"),
    ("w - 2", "must be 0 at w = 1"),
    ("log(w)", "negative at w ="),
    ("-log(w)", "negative at w ="),
    ("(w - 1)**0.5", "not finite"),
    ("(w-1)**2*(w-3)**2", "not one interval"),
    ("sin(w)", "function 'sin'"),
    ("w.real", "attribute access"),
    ("w[0]", "indexing"),
    ('"abc"', "string"),
    ("True", "constant True"),
    ("1j", "complex"),
    ("1e999 * w", "too large"),
    ("", "empty"),
    ("   ", "empty"),
    ("w if w else 1", "if-expression"),
    ("w == 1", "comparison"),
    ("x + 1", "name 'x'"),
    ("log + w", "without a call"),
    ("w % 2", "operator"),
    ("log(w, 2)", "exactly 1 argument"),
    ("max(w)", "at least 2 arguments"),
    ("log(w=1)", "keyword"),
    ("max(*w)", "starred"),
    ("exp(exp(exp(w)))", "must be 0 at w = 1"),
    ("w - 1 - log(w", "not a valid expression"),
    ("w\x00", "not a valid expression"),
    ("-" * 40 + "w", "nested too deeply"),
    ("+".join(["w"] * 60), "too complex"),
    (None, "must be text"),
    (3, "must be text"),
]


@pytest.mark.parametrize("text, says", HOSTILE, ids=[repr(text)[:30] for text, _ in HOSTILE])
def test_hostile_or_broken_formula_is_refused_in_one_line(text, says):
    with pytest.raises(DivvizInputError) as info:
        formula = parse(text)
        check(formula)
        bounds(formula, 0.1)
    message = str(info.value)
    assert "\n" not in message and says in message
    assert len(message) < MAX_CHARACTERS + 200


def test_pi_old_is_needed_where_the_formula_uses_it():
    formula = parse("abs(w - 1)*pi_old")
    for call in (lambda: bounds(formula, 0.1), lambda: formula.numpy(2.0), lambda: formula.torch(torch.ones(2))):
        with pytest.raises(DivvizInputError, match="needs a value of pi_old"):
            call()


@pytest.mark.parametrize("delta", [0.0, -1.0, math.nan, math.inf, "big", None])
def test_bad_delta_is_refused(delta):
    with pytest.raises(DivvizInputError, match="δ must be finite numbers > 0"):
        bounds(parse("w - 1 - log(w)"), delta)


@pytest.mark.parametrize("pi_old", [0.0, 1.5, -0.1, math.nan, "p", [0.5, [0.1, 0.2]]])
def test_bad_pi_old_is_refused(pi_old):
    with pytest.raises(DivvizInputError, match=r"pi_old must be probabilities in \(0, 1\]"):
        bounds(parse("abs(w - 1)*pi_old"), 0.1, pi_old=pi_old)


# --- the typed formula as the catalogue's `formula` clip test: loss, bandit, engine, CLI --------------------------

from divviz import cli  # noqa: E402
from divviz.bandit.grpo import run_bandit  # noqa: E402
from divviz.bandit.setting import BanditConfig  # noqa: E402
from divviz.catalogue import divergences as dv  # noqa: E402
from divviz.catalogue.instances import parse as parse_measure, spell  # noqa: E402
from divviz.loss_grids import random_token_batch  # noqa: E402
from divviz.losses import Objective, policy_loss  # noqa: E402
from divviz.runs import store  # noqa: E402


@pytest.mark.parametrize("text, twin", [
    ("w - 1 - log(w)", ("kl3", {})), ("0.5*log(w)**2", ("kl2", {})),
    ("abs(w - 1)*pi_old", ("prob_tv", {})),  # |π − π_old| = π_old·|w − 1|
])
@pytest.mark.parametrize("delta", [0.0177, 0.1])
def test_a_formula_trains_as_its_catalogue_twin(text, twin, delta):
    """policy_loss under the typed formula equals it under the catalogue's own test: loss, gradient, masks (float64)."""
    name, _ = twin
    typed, own = dv.clip_test("formula", f=text, delta=delta), dv.clip_test(name, delta=delta)
    logp_new, logp_old, adv, mask = random_token_batch(3, 16, 12, 0.6)
    outs, grads = [], []
    for test in (typed, own):
        x = logp_new.clone().requires_grad_()
        out = policy_loss(x, logp_old, adv, mask, Objective(clip=test, dual_clip_c=3.0))
        outs.append(out)
        grads.append(torch.autograd.grad(out.loss, x)[0])
    assert 0 < outs[1].grad_masked.float().mean() < 1  # the batch masks some tokens and not others
    torch.testing.assert_close(outs[0].loss, outs[1].loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)
    for fact in ("outside", "masked_low", "masked_high", "dual_clip"):
        assert torch.equal(getattr(outs[0], fact), getattr(outs[1], fact)), fact
    torch.testing.assert_close(outs[0].clip_value, outs[1].clip_value, rtol=1e-12, atol=1e-14)
    assert typed.needs_pi_old == own.entry.needs_pi_old


def test_a_formula_runs_in_the_bandit_as_kl3_does():
    runs = [run_bandit(BanditConfig(), Objective(clip=test)) for test in
            (dv.clip_test("formula", delta=0.05), dv.clip_test("kl3", delta=0.05))]
    for key in runs[1].history:
        np.testing.assert_allclose(runs[0].history[key], runs[1].history[key], rtol=1e-12, atol=1e-14, err_msg=key)


def test_a_formula_is_spelled_so_that_a_link_carries_it():
    test = dv.clip_test("formula", f="max(w, 1/w) - 1", delta=0.5)
    spelled = spell(test)
    assert spelled == "formula:f=max(w%2C 1/w) - 1:delta=0.5"  # the comma cannot split a link's list
    assert parse_measure(spelled) == test and test.label == "formula max(w, 1/w) - 1 δ=0.5"
    with pytest.raises(DivvizInputError, match="a lambda"):
        parse_measure("formula:f=lambda%3A 0")


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_bounds_of_a_formula_are_kl3s(capsys):
    code, out, _ = run_cli(capsys, "bounds", "--formula", "w - 1 - log(w)", "--param", "delta=0.05", "--json")
    typed = json.loads(out)
    _, out, _ = run_cli(capsys, "bounds", "--measure", "kl3", "--param", "delta=0.05", "--json")
    own = json.loads(out)
    assert code == 0 and set(typed) == set(own) and typed["measure"] == "formula"
    assert abs(typed["lower"] - own["lower"]) < 1e-10 and abs(typed["upper"] - own["upper"]) < 1e-10


@pytest.mark.parametrize("command", ["bounds", "train"])
@pytest.mark.parametrize("text, says", [(t, s) for t, s in HOSTILE if isinstance(t, str) and t.strip()][::3]
                         + [("w - 1 - log(w)", "'delta' must be")])
def test_cli_refuses_a_broken_formula_in_one_line(capsys, tmp_path, command, text, says):
    extra = ["--runs-dir", str(tmp_path), "--steps", "1"] if command == "train" else []
    delta = "nan" if says.startswith("'delta'") else "0.05"
    code, out, err = run_cli(capsys, command, f"--formula={text}", "--param", f"delta={delta}", *extra)
    assert code == 2 and out == "" and err.count("\n") == 1 and says in err, err
    assert not list(tmp_path.iterdir())  # nothing was started


def test_divviz_trains_a_formula(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "train", "--formula", "abs(log(w))", "--param", "delta=0.1", "--steps", "2",
                           "--prompts", "2", "--group-size", "4", "--max-new-tokens", "6", "--runs-dir", str(tmp_path))
    assert code == 0 and out.startswith("done")
    (run,) = store.list_runs(tmp_path)
    assert run.config["clip"] == "formula" and run.config["clip_params"] == {"f": "abs(log(w))", "delta": 0.1}
    assert all(math.isfinite(row[key]) for row in store.read_metrics(run.folder)
               for key in ("loss", "clip_ratio/region_mean", "kl/k3", "entropy"))
