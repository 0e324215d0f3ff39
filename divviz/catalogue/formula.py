"""A divergence typed by the user, f(w) in the ratio w (and optionally π_old), as the clip test f(w) ≤ δ.

`parse` reads the text, `check` tests that it is a usable divergence (`checked` does both, once per text),
`bounds` gives the feasible ratio interval {w : f(w) ≤ δ}. Examples: `w - 1 - log(w)` (KL3), `0.5*log(w)**2` (KL2), `abs(log(w))`,
`max(w, 1/w) - 1`, `abs(w - 1)*pi_old` (a test in probability space).

Why no eval: the text comes from a user (a text box, a link), and Python's `eval` runs any code
(`__import__('os')`, `().__class__.__mro__…`), while a harmless-looking `10**10**10` can hang it.
So the text is parsed with `ast.parse(text, mode="eval")` into a syntax tree that is never compiled;
a strict whitelist refuses every node it does not name, and the accepted tree is turned into nested
closures that compute f with numpy (float64) or torch (differentiable).

The whitelist:
    names      w, pi_old, and the constants e and pi
    numbers    finite int and float literals (no bool, complex or string)
    operators  + - * / between expressions, unary + and -, and a ** b where b is a plain number
               (2, -0.5, …) with |b| ≤ 16
    functions  log, exp, sqrt, abs, log1p, expm1, tanh, sinh, cosh (one argument each), and
               min, max (two or more arguments); no keyword or starred arguments
The text has at most MAX_CHARACTERS characters, MAX_NODES expression nodes and depth MAX_DEPTH.
Every refusal is a `DivvizInputError` with a one-line message.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, Callable

import numpy as np
from scipy.optimize.elementwise import bracket_root, find_root

from divviz.catalogue.params import DivvizInputError
from divviz.safetext import quoted

MAX_CHARACTERS = 200
MAX_NODES = 100
MAX_DEPTH = 30
MAX_EXPONENT = 16.0
PI_OLD_GRID = (1e-3, 0.01, 0.1, 0.5, 0.9, 1.0)
"""The π_old values at which `check` tests a formula that uses pi_old."""
NOISE = 1e-12
"""Float noise `check` forgives: absolute, or relative to |f| where that is larger."""

_VARIABLES = ("w", "pi_old")
_CONSTANTS = {"e": math.e, "pi": math.pi}
_UNARY_FUNCTIONS = ("log", "exp", "sqrt", "abs", "log1p", "expm1", "tanh", "sinh", "cosh")
_NARY_FUNCTIONS = ("min", "max")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = (f"only {', '.join(_VARIABLES)}, {', '.join(_CONSTANTS)}, numbers, + - * / **, and "
            f"{', '.join(_UNARY_FUNCTIONS + _NARY_FUNCTIONS)} are")
_DESCRIPTIONS = {
    ast.Attribute: "attribute access", ast.Subscript: "indexing", ast.Lambda: "a lambda",
    ast.Compare: "a comparison", ast.IfExp: "an if-expression", ast.BoolOp: "and/or",
    ast.ListComp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a comprehension", ast.Tuple: "a tuple", ast.List: "a list", ast.Dict: "a dict",
    ast.Set: "a set", ast.NamedExpr: "an assignment", ast.JoinedStr: "an f-string", ast.Starred: "*args",
}

_NUMPY_FUNCTIONS = {
    "log": np.log, "exp": np.exp, "sqrt": np.sqrt, "abs": np.abs, "log1p": np.log1p, "expm1": np.expm1,
    "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
    "min": lambda *args: reduce(np.minimum, args), "max": lambda *args: reduce(np.maximum, args),
}


@dataclass(frozen=True)
class _Env:
    """What a compiled formula evaluates in: its variables, a constant maker, the functions."""

    names: dict[str, Any]
    number: Callable[[float], Any]
    functions: dict[str, Callable]


_Evaluator = Callable[[_Env], Any]


@dataclass(frozen=True)
class Formula:
    """A parsed divergence f(w) (or f(w, π_old)); `text` is the normalised text (`ast.unparse`)."""

    text: str
    uses_pi_old: bool
    _evaluate: _Evaluator = field(repr=False, compare=False)

    def numpy(self, w, pi_old=None) -> np.ndarray:
        """f(w[, π_old]) in float64, broadcast over w and π_old; over/underflow gives inf/nan, no warning."""
        names = {"w": np.asarray(w, dtype=np.float64)}
        if self.uses_pi_old:
            names["pi_old"] = np.asarray(self._needed(pi_old), dtype=np.float64)
        with np.errstate(all="ignore"):
            return self._evaluate(_Env(names, np.float64, _NUMPY_FUNCTIONS))

    def torch(self, w, pi_old=None):
        """f(w[, π_old]) as a torch tensor, differentiable in w (and π_old); constants take w's dtype."""
        import torch

        w = torch.as_tensor(w)
        if not w.is_floating_point():
            w = w.to(torch.float64)
        names = {"w": w}
        if self.uses_pi_old:
            names["pi_old"] = torch.as_tensor(self._needed(pi_old), dtype=w.dtype, device=w.device)
        functions = {
            "log": torch.log, "exp": torch.exp, "sqrt": torch.sqrt, "abs": torch.abs, "log1p": torch.log1p,
            "expm1": torch.expm1, "tanh": torch.tanh, "sinh": torch.sinh, "cosh": torch.cosh,
            "min": lambda *args: reduce(torch.minimum, args), "max": lambda *args: reduce(torch.maximum, args),
        }
        return self._evaluate(_Env(names, lambda c: torch.tensor(c, dtype=w.dtype, device=w.device), functions))

    def _needed(self, pi_old):
        if pi_old is None:
            raise DivvizInputError(f"formula {quoted(self.text)} uses pi_old, so it needs a value of pi_old")
        return pi_old


def parse(text) -> Formula:
    """The `Formula` that `text` spells, refused with a one-line `DivvizInputError` unless whitelisted.

    Only the syntax is checked here; `check` (which `bounds` runs) tests the numbers.
    """
    if not isinstance(text, str):
        raise DivvizInputError(f"formula must be text, like 'w - 1 - log(w)'; got {quoted(text)}")
    text = text.strip()
    if not text:
        raise DivvizInputError("formula is empty; type a divergence in w, like 'w - 1 - log(w)'")
    if len(text) > MAX_CHARACTERS:
        raise DivvizInputError(f"formula is too long: {len(text)} characters (at most {MAX_CHARACTERS})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        reason = " ".join(str(error.msg).split())
        raise DivvizInputError(f"formula {quoted(text)} is not a valid expression ({reason})") from None
    except (ValueError, RecursionError, MemoryError) as error:
        raise DivvizInputError(f"formula {quoted(text)} cannot be read ({type(error).__name__})") from None
    nodes = [node for node in ast.walk(tree) if isinstance(node, ast.expr)]
    if len(nodes) > MAX_NODES:
        raise DivvizInputError(f"formula {quoted(text)} is too complex: {len(nodes)} parts (at most {MAX_NODES})")
    evaluate = _compile(tree.body, text, depth=1)
    names = {node.id for node in nodes if isinstance(node, ast.Name)}
    if "w" not in names:
        raise DivvizInputError(f"formula {quoted(text)} does not use the ratio w")
    return Formula(ast.unparse(tree), "pi_old" in names, evaluate)


def _snippet(text: str, node: ast.AST) -> str:
    """The part of `text` that `node` was parsed from, quoted for a message."""
    return quoted(ast.get_source_segment(text, node) or ast.unparse(node), 40)


def _refuse(text: str, what: str):
    raise DivvizInputError(f"formula {quoted(text)}: {what} is not allowed ({_ALLOWED})")


def _number(node: ast.expr, text: str) -> float:
    """The value of a literal int or float, which must be finite."""
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = {str: "the string", bytes: "the bytes", complex: "the complex number"}.get(type(value), "the constant")
        _refuse(text, f"{kind} {quoted(value, 40)}")
    if not math.isfinite(float(value)):
        _refuse(text, f"the number {_snippet(text, node)} (too large for a float)")
    return float(value)


def _exponent(node: ast.expr, text: str) -> float:
    """b of a ** b: a plain number, possibly signed, with |b| ≤ MAX_EXPONENT."""
    sign, inner = 1.0, node
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign, inner = (-1.0 if isinstance(node.op, ast.USub) else 1.0), node.operand
    if not isinstance(inner, ast.Constant):
        raise DivvizInputError(f"formula {quoted(text)}: the exponent in a ** b must be a plain number "
                               f"like 2 or -0.5; got {_snippet(text, node)}")
    value = sign * _number(inner, text)
    if abs(value) > MAX_EXPONENT:
        raise DivvizInputError(f"formula {quoted(text)}: the exponent {value:g} is too large "
                               f"(|b| ≤ {MAX_EXPONENT:g} in a ** b)")
    return value


def _compile(node: ast.expr, text: str, depth: int) -> _Evaluator:
    """A closure computing `node` in an `_Env`, or `DivvizInputError` for anything off the whitelist."""
    if depth > MAX_DEPTH:
        raise DivvizInputError(f"formula {quoted(text)} is nested too deeply (at most {MAX_DEPTH} levels)")
    depth += 1
    if isinstance(node, ast.Constant):
        value = _number(node, text)
        return lambda env: env.number(value)
    if isinstance(node, ast.Name):
        name = node.id
        if name in _CONSTANTS:
            value = _CONSTANTS[name]
            return lambda env: env.number(value)
        if name in _VARIABLES:
            return lambda env: env.names[name]
        if name in _UNARY_FUNCTIONS + _NARY_FUNCTIONS:
            _refuse(text, f"the function name {quoted(name)} without a call")
        _refuse(text, f"the name {quoted(name, 40)}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        apply, operand = _UNARY[type(node.op)], _compile(node.operand, text, depth)
        return lambda env: apply(operand(env))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _compile(node.left, text, depth), _exponent(node.right, text)
        return lambda env: base(env) ** exponent
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        apply = _BINARY[type(node.op)]
        left, right = _compile(node.left, text, depth), _compile(node.right, text, depth)
        return lambda env: apply(left(env), right(env))
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        _refuse(text, f"the operator in {_snippet(text, node)}")
    if isinstance(node, ast.Call):
        return _compile_call(node, text, depth)
    _refuse(text, f"{_DESCRIPTIONS.get(type(node), type(node).__name__)} {_snippet(text, node)}")


def _compile_call(node: ast.Call, text: str, depth: int) -> _Evaluator:
    if not isinstance(node.func, ast.Name) or node.func.id not in _UNARY_FUNCTIONS + _NARY_FUNCTIONS:
        _refuse(text, f"the function {_snippet(text, node.func)}")
    name = node.func.id
    if node.keywords:
        _refuse(text, f"a keyword argument in {_snippet(text, node)}")
    if any(isinstance(arg, ast.Starred) for arg in node.args):
        _refuse(text, f"a starred argument in {_snippet(text, node)}")
    count = len(node.args)
    if name in _UNARY_FUNCTIONS and count != 1:
        raise DivvizInputError(f"formula {quoted(text)}: {name} takes exactly 1 argument, got {count}")
    if name in _NARY_FUNCTIONS and count < 2:
        raise DivvizInputError(f"formula {quoted(text)}: {name} takes at least 2 arguments, got {count}")
    args = [_compile(arg, text, depth) for arg in node.args]
    return lambda env: env.functions[name](*(arg(env) for arg in args))


def check(formula: Formula, pi_old_grid=PI_OLD_GRID) -> None:
    """Refuse (`DivvizInputError`) a formula that is not a divergence whose level sets are intervals.

    At each π_old of `pi_old_grid` (once if f does not use π_old), on the grid w = 10^[-6 … 6] (4001
    log-spaced points, w = 1 among them), with NOISE forgiven:
        f(1) = 0,   f(w) finite and ≥ 0,   f non-increasing on w ≤ 1 and non-decreasing on w ≥ 1,
    so that every {w : f(w) ≤ δ} is one interval around 1 (as far as the grid can tell).
    """
    grid = np.unique(np.append(np.logspace(-6.0, 6.0, 4001), 1.0))
    one = int(np.searchsorted(grid, 1.0))
    name = f"formula {quoted(formula.text)}"
    for pi_old in (pi_old_grid if formula.uses_pi_old else (None,)):
        where = "" if pi_old is None else f" (at pi_old = {pi_old:g})"
        values = formula.numpy(grid, pi_old)
        if np.isfinite(values[one]) and abs(values[one]) > NOISE:
            raise DivvizInputError(f"{name} must be 0 at w = 1; it is {values[one]:.6g}{where}")
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            at = one if not np.isfinite(values[one]) else bad[0]
            raise DivvizInputError(f"{name} is not finite at w = {grid[at]:.3g} (it is {values[at]}){where}")
        bad = np.flatnonzero(values < -NOISE)
        if bad.size:
            raise DivvizInputError(f"{name} is negative at w = {grid[bad[0]]:.3g} (it is {values[bad[0]]:.3g})"
                                   f"{where}; a divergence must be ≥ 0")
        for sign in (-1, 1):  # each side read outwards from w = 1
            side = values[one::sign]
            tolerance = NOISE * np.maximum(1.0, np.abs(side[:-1]))
            falls = np.flatnonzero(side[1:] < side[:-1] - tolerance)
            if falls.size:
                at = grid[one + sign * int(falls[0])]
                raise DivvizInputError(f"{name}: its level set {{f ≤ δ}} is not one interval: f falls again "
                                       f"at w ≈ {at:.4g}{where}")


@functools.lru_cache(maxsize=256)
def checked(text: str) -> Formula:
    """`parse` then `check`, once per text (the catalogue calls this for every use of a typed formula)."""
    formula = parse(text)
    check(formula)
    return formula


def bounds(formula: Formula, delta, pi_old=None):
    """The feasible interval [l, u] = {w : f(w) ≤ δ} of the test f(w) ≤ δ, for a `check`ed formula.

    l ∈ [0, 1) and u ∈ (1, ∞]: each edge is the root of f(e^t) = δ in t = log w, bracketed by walking out
    from t = 0 (`scipy.optimize.elementwise.bracket_root`) and found by Chandrupatla's method
    (`scipy.optimize.elementwise.find_root`, to 4·eps relative), for every (δ, π_old) at once; l = 0 when
    f ≤ δ down to w = e^−690 ≈ 1e-300, u = inf when f ≤ δ up to w = e^690.
    `delta`: finite numbers > 0. `pi_old` (needed when f uses it): probabilities in (0, 1]. Either may be an
    array; l and u then have their broadcast shape, else they are floats.
    """
    deltas = _numbers(delta, "δ must be finite numbers > 0", lambda x: np.isfinite(x) & (x > 0))
    if pi_old is None:
        if formula.uses_pi_old:
            formula._needed(pi_old)  # refuses, saying why
        probabilities = np.ones(())
    else:
        probabilities = _numbers(pi_old, "pi_old must be probabilities in (0, 1]", lambda x: (x > 0) & (x <= 1))
    shape = np.broadcast_shapes(deltas.shape, probabilities.shape)
    used = probabilities if formula.uses_pi_old else np.ones(())  # f without π_old: one value stands for all
    pairs = np.stack(np.broadcast_arrays(deltas, used), axis=-1).reshape(-1, 2)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    edges = [_edges(formula, unique[:, 0], unique[:, 1], side)[inverse.ravel()] for side in (-1, 1)]
    edges = [np.broadcast_to(edge.reshape(np.broadcast_shapes(deltas.shape, used.shape)), shape) for edge in edges]
    return tuple(float(edge) if not shape else edge.copy() for edge in edges)


def _numbers(given, rule: str, ok) -> np.ndarray:
    """`given` as a float64 array whose every value passes `ok`, else the one-line error saying `rule`."""
    try:
        values = np.asarray(given, dtype=np.float64)
    except (TypeError, ValueError):
        values = np.array(math.nan)
    if not np.all(ok(values)):
        raise DivvizInputError(f"formula bounds: {rule}; got {quoted(given)}")
    return values


T_LIMIT = 690.0  # |log w| searched: w from e^−690 ≈ 1e-300 to e^690 ≈ 1e300


def _edges(formula: Formula, delta: np.ndarray, pi_old: np.ndarray, side: int) -> np.ndarray:
    """The edge of {f ≤ δ} below w = 1 (side −1: l) or above it (side 1: u), one per (δ, π_old)."""
    def excess(t, d, p):  # f − δ at w = e^t; overflow to +inf kept finite so that the bracket can use it
        return np.nan_to_num(formula.numpy(np.exp(t), p) - d, nan=np.nan, posinf=1e300)

    start, limit = (-1e-3, 0.0) if side < 0 else (0.0, 1e-3), side * T_LIMIT
    found = bracket_root(excess, *start, xmin=min(limit, 0.0), xmax=max(limit, 0.0), args=(delta, pi_old))
    edges = np.full(delta.shape, 0.0 if side < 0 else math.inf)
    if np.any((found.status != 0) & (found.status != -1)):  # -1: f ≤ δ as far as the search goes
        at = math.exp(float(found.bracket[0 if side < 0 else 1][found.status < -1][0]))
        raise DivvizInputError(f"formula {quoted(formula.text)} is not a number near w = {at:.3g}, "
                               f"so its level set cannot be bounded")
    ok = found.status == 0
    if ok.any():
        root = find_root(excess, (found.bracket[0][ok], found.bracket[1][ok]), args=(delta[ok], pi_old[ok]))
        edges[ok] = np.exp(root.x)
    return edges
