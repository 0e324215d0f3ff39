"""A page's controls as URL query parameters, so that a view can be shared as a link.

Every control value is a string in the URL (`?m=ratio,kl3&kl3.delta=0.05`). Decoding checks the value the
same way the catalogue does (a `Param`'s range, or the list of options); a bad value is reported and
replaced by the default, never raised into the page. No Streamlit here: `divviz/ui.py` binds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from divviz.divergences import CLIP_TESTS, PENALTIES
from divviz.params import DivvizInputError, Param
from divviz.safetext import quoted


@dataclass(frozen=True)
class Control:
    """One control: a number (`param`), one of `options`, or several of them (`multi`)."""

    name: str
    default: object
    param: Param | None = None
    options: tuple[str, ...] | None = None
    multi: bool = False

    def decode(self, text: str):
        if self.param is not None:
            value = self.param.check(text, "link")
            low, high, _ = self.param.slider_range()
            if self.param.kind != "bool" and not low <= value <= high:
                raise DivvizInputError(f"link: '{self.name}' = {quoted(text, 40)} is outside the controls' range "
                                       f"[{low:g}, {high:g}]")
            return value
        items = list(dict.fromkeys(t for t in text.split(",") if t)) if self.multi else [text]  # repeats merged
        unknown = [t for t in items if t not in self.options]
        if unknown:
            raise DivvizInputError(f"link: '{self.name}' has unknown value {quoted(unknown[0], 40)}; "
                                   f"known: {', '.join(self.options)}")
        return items if self.multi else items[0]

    def encode(self, value) -> str:
        if self.multi:
            return ",".join(value)
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, float):
            return f"{value:.10g}"
        return str(value)


def read_query(controls: list[Control], query: Mapping[str, str]) -> tuple[dict, list[str]]:
    """Values for the controls found in `query`, and one message per value that could not be used."""
    values, problems = {}, []
    for control in controls:
        if control.name in query:
            try:
                values[control.name] = control.decode(query[control.name])
            except DivvizInputError as err:
                problems.append(str(err))
            else:
                if control.multi and len(values[control.name]) < len([t for t in query[control.name].split(",") if t]):
                    problems.append(f"link: '{control.name}' names a value more than once; each is shown once")
    return values, problems


def write_query(controls: list[Control], values: Mapping[str, object]) -> dict[str, str]:
    """The query string dict for `values`: only controls away from their default, so links stay short."""
    return {c.name: c.encode(values[c.name]) for c in controls
            if c.name in values and c.encode(values[c.name]) != c.encode(c.default)}


def measure_param_controls(families=("clip",)) -> list[Control]:
    """A control `NAME.PARAM` for every parameter of every catalogue entry in `families`."""
    pools = {"clip": CLIP_TESTS, "penalty": PENALTIES}
    return [Control(f"{entry.name}.{p.name}", p.default, param=p)
            for family in families for entry in pools[family].values() for p in entry.params]
