"""Parameters of catalogue entries: their valid ranges and the one error raised for bad input.

Every value a user can type (a slider, a `--param k=v` on the command line, a URL query parameter) goes
through `Param.check`, so a bad value is refused in one place with one message that names the parameter
and its valid range.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from divviz.safetext import quoted, unknown


class DivvizInputError(ValueError):
    """Bad user input: an unknown measure, an unknown or out-of-range parameter, a NaN.

    The message is one line, meant to be shown as it is (CLI exit code 2, an `st.error` in the app).
    """


LARGEST = 1e6  # no parameter is larger in magnitude: past it some terms (4/τ, w^k, β·KL) leave float32's range
UPLOAD_MAX_BYTES = 1 << 20  # as .streamlit/config.toml's maxUploadSize


@dataclass(frozen=True)
class Upload:
    """How a text parameter comes from a file (an upload in the app, K=@FILE on the CLI): what it holds, the uploader's
    label and file types, `parse` (the file's bytes and name -> the checked text, or a `DivvizInputError`) and
    `describe` (the text -> a short caption)."""

    what: str
    label: str
    types: tuple[str, ...]
    parse: Callable[[bytes, str], str]
    describe: Callable[[str], str]


@dataclass(frozen=True)
class Param:
    """One numeric parameter with its default and valid range.

    `kind` is "float", "int", "bool" or "text" (a string, e.g. a typed formula, checked by its owner). The
    range of a number is `low .. high`, each end open or closed; an end left unsaid is ±`LARGEST`.
    `trl_name` is the name TRL's `GRPOConfig` uses for the same knob, where it has one.
    """

    name: str
    default: float | str
    low: float = -LARGEST
    high: float = LARGEST
    low_open: bool = False
    high_open: bool = False
    kind: str = "float"
    doc: str = ""
    trl_name: str | None = None
    typical: tuple[float, float, float] | None = None  # (min, max, step) for a slider; the valid range is wider
    upload: Upload | None = None  # a text parameter the app takes from a file rather than a text box

    def slider_range(self) -> tuple[float, float, float]:
        """(min, max, step) for a slider: `typical` if given, else the valid range (which must be finite)."""
        if self.typical is not None:
            return self.typical
        return self.low, self.high, (self.high - self.low) / 100

    def range_text(self) -> str:
        if self.kind == "text":
            return "text"
        if self.kind == "bool":
            return "0 or 1 (false/true)"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        if self.kind == "int":  # every digit: [0, 2147483647], not [0, 2.14748e+09]
            return f"an integer in {left}{int(self.low)}, {int(self.high)}{right}"
        return f"a finite number in {left}{self.low:g}, {self.high:g}{right}"

    def check(self, value, owner: str) -> float | int | bool:
        """Return `value` converted to this parameter's kind, or raise `DivvizInputError`."""
        where = f"{owner}: parameter '{self.name}'"
        if self.kind == "text":
            if not isinstance(value, str):
                raise DivvizInputError(f"{where} must be text; got {quoted(value)}")
            return value.strip()
        if self.kind == "bool":
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
            elif isinstance(value, (bool, int, float)) and value in (0, 1):
                return bool(value)
            raise DivvizInputError(f"{where} must be {self.range_text()}; got {quoted(value)}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise DivvizInputError(f"{where} must be {self.range_text()}; got {quoted(value)}") from None
        ok = math.isfinite(number)
        ok = ok and (number > self.low if self.low_open else number >= self.low)
        ok = ok and (number < self.high if self.high_open else number <= self.high)
        if self.kind == "int":
            ok = ok and number.is_integer()
        if not ok:
            raise DivvizInputError(f"{where} must be {self.range_text()}; got {quoted(value)}")
        return int(number) if self.kind == "int" else number


def check_name(name, what: str, known) -> str:
    """A catalogue name: text that `known` holds, else one `DivvizInputError` (a built object or a number included)."""
    if not isinstance(name, str):
        raise DivvizInputError(f"a {what} is named by its catalogue name, e.g. 'kl3'; got a {type(name).__name__}")
    if name not in known:
        raise DivvizInputError(unknown(what, name, known))
    return name


@dataclass(frozen=True)
class CatalogueEntry:
    """What every catalogue entry has: its name (what users type), a title, its formula in LaTeX and a line
    that says what it does and where it comes from."""

    name: str
    title: str
    latex: str
    doc: str


def by_name(*entries) -> dict:
    """A catalogue: its entries keyed by their `name`, in the order given."""
    return {entry.name: entry for entry in entries}


def check_params(owner: str, spec: tuple[Param, ...], given: Mapping[str, object]) -> dict:
    """Validate `given` against `spec`, fill defaults, and refuse names that `spec` does not have."""
    known = {p.name: p for p in spec}
    unknown = sorted(set(given) - set(known))
    if unknown:
        names = ", ".join(known) or "none"
        raise DivvizInputError(f"{owner}: unknown parameter {quoted(unknown[0])} (its parameters: {names})")
    return {p.name: p.check(given.get(p.name, p.default), owner) for p in spec}


def parse_assignments(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Turn ["delta=0.05", "eps=0.2"] into {"delta": "0.05", "eps": "0.2"}; values are checked later. A parameter
    given twice is refused (which one was meant cannot be known)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise DivvizInputError(f"expected NAME=VALUE, got {quoted(item)}")
        if name.strip() in out:
            raise DivvizInputError(f"parameter {quoted(name.strip())} is given twice ({quoted(out[name.strip()])} and "
                                   f"{quoted(value.strip())}); give it once")
        out[name.strip()] = value.strip()
    return out


def label(name: str, params: dict) -> str:
    """A short legend label, e.g. "kl3 δ=0.05", "clip_higher ε_low=0.2 ε_high=0.28", "formula w - 1 - log(w) δ=0.05"."""
    shown = {"delta": "δ", "eps": "ε", "eps_low": "ε_low", "eps_high": "ε_high"}

    def part(k, v):
        if isinstance(v, str):  # a typed formula as it is; a long text (a mirror map's φ) by a short digest
            return v if len(v) <= 200 else f"{k}#{hashlib.sha1(v.encode()).hexdigest()[:6]}"
        return (k if v else "") if isinstance(v, bool) else f"{shown.get(k, k)}={v:.4g}"

    return " ".join([name, *[p for p in (part(k, v) for k, v in params.items()) if p]])


@dataclass(frozen=True)
class Configured:
    """A catalogue entry (clip test, penalty or surrogate) with checked parameters: `clip_test(...)`, `penalty(...)`
    and `surrogate(...)` build these."""

    entry: Any  # a ClipTestEntry, PenaltyEntry or SurrogateEntry
    params: dict

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def label(self) -> str:
        return label(self.name, self.params)
