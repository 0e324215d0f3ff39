"""A chosen measure with its parameters, spelled `NAME` or `NAME:param=value:…` (`kl3:delta=0.0177`).

Pages, links and the CLI pick lists of such instances, so the same measure can be compared with itself at
several settings (kl3 δ = 0.0177 vs 0.0231 vs 0.05). One spelling everywhere: a link's `m=`, the CLI's
`--measure`, a preset. Only parameters away from their default are written, so links stay short.
"""

from __future__ import annotations

from divviz.divergences import ClipTest, Configured, Penalty, clip_test, penalty
from divviz.params import DivvizInputError, parse_assignments
from divviz.safetext import quoted

MAX_SPEC_CHARACTERS = 200


def parse(text: str, family: str = "clip") -> ClipTest | Penalty:
    """`kl3:delta=0.05` -> the configured clip test (or penalty); parameters checked by the catalogue."""
    text = str(text).strip()
    if len(text) > MAX_SPEC_CHARACTERS:
        raise DivvizInputError(f"a measure is at most {MAX_SPEC_CHARACTERS} characters; got {quoted(text)}")
    name, *assignments = text.split(":")
    return configure(name, parse_assignments(assignments), family)


def configure(name: str, params: dict, family: str = "clip") -> ClipTest | Penalty:
    return clip_test(name, **params) if family == "clip" else penalty(name, **params)


def spell(measure: Configured) -> str:
    """The inverse of `parse`: the name, then each parameter that differs from its default."""
    parts = [measure.name]
    for p in measure.entry.params:
        value = measure.params[p.name]
        if value != p.default:
            parts.append(f"{p.name}={int(value) if p.kind == 'bool' else format(value, '.10g')}")
    return ":".join(parts)


def unique_labels(labels: list[str]) -> list[str]:
    """Legend labels made distinct: a label met again gets " (2)", " (3)", …"""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
