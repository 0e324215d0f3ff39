"""A chosen measure with its parameters, spelled `NAME` or `NAME:param=value:…` (`kl3:delta=0.0177`).

Pages, links and the CLI pick lists of such instances, so the same measure can be compared with itself at
several settings (kl3 δ = 0.0177 vs 0.0231 vs 0.05). One spelling everywhere: a link's `m=`, the CLI's
`--measure`, a preset. Only parameters away from their default are written, so links stay short. A typed formula
is a text parameter, escaped so that it cannot split the list: `formula:f=max(w%2C 1/w) - 1:delta=0.1`.
"""

from __future__ import annotations

import urllib.parse

from divviz.catalogue.divergences import ClipTest, clip_test, get_entry
from divviz.catalogue.params import Configured
from divviz.catalogue.params import DivvizInputError, parse_assignments
from divviz.catalogue.penalties import penalty, Penalty
from divviz.safetext import quoted
from divviz.catalogue.surrogates import Surrogate, surrogate

MAX_SPEC_CHARACTERS = 700  # a typed formula (≤ 200 characters) with its escapes fits


def parse(text: str, family: str = "clip") -> ClipTest | Penalty | Surrogate:
    """`kl3:delta=0.05` -> the configured clip test (or penalty); parameters checked by the catalogue. A text
    parameter's value is unescaped (`spell` escapes %, : and ,)."""
    text = str(text).strip()
    if len(text) > MAX_SPEC_CHARACTERS:
        raise DivvizInputError(f"a measure is at most {MAX_SPEC_CHARACTERS} characters; got {quoted(text)}")
    name, *assignments = text.split(":")
    params = parse_assignments(assignments)
    entry = get_entry(name, family)
    for p in entry.params:
        if p.kind == "text" and p.name in params:
            params[p.name] = unescape(params[p.name])
    return configure(name, params, family)


def escape(text: str) -> str:
    """A text value written into a spelling: the characters that separate measures and parameters escaped."""
    return text.replace("%", "%25").replace(":", "%3A").replace(",", "%2C")


def unescape(text: str) -> str:
    return urllib.parse.unquote(text)


def configure(name: str, params: dict, family: str = "clip") -> ClipTest | Penalty | Surrogate:
    return {"clip": clip_test, "penalty": penalty, "surrogate": surrogate}[family](name, **params)


def spell(measure: Configured | Surrogate) -> str:
    """The inverse of `parse`: the name, then each parameter that differs from its default."""
    parts = [measure.name]
    for p in measure.entry.params:
        value = measure.params[p.name]
        if value != p.default:
            shown = {"bool": lambda v: int(v), "text": escape}.get(p.kind, lambda v: format(v, ".10g"))(value)
            parts.append(f"{p.name}={shown}")
    return ":".join(parts)


def unique_labels(labels: list[str]) -> list[str]:
    """Legend labels made distinct: a label met again gets " (2)", " (3)", …"""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
