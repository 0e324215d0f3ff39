"""A page's controls as URL query parameters, so that a view can be shared as a link.

Every control value is a string in the URL (`?m=ratio,kl3:delta=0.0177,kl3:delta=0.05`). Decoding checks the
value the same way the catalogue does (a `Param`'s range, or the list of options); a bad value is reported and
replaced by the default, never raised into the page. No Streamlit here: `divviz/app/page_state.py` binds it.

A list of measures is spelled as `divviz.catalogue.instances` spells one, comma-separated. Links made before measures
could repeat wrote `m=ratio,kl3&kl3.delta=0.05`; such a `NAME.PARAM` still sets the parameter of a bare `NAME`
in the list, so old links open as they did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from divviz.catalogue import instances
from divviz.catalogue.divergences import FAMILIES
from divviz.catalogue.params import DivvizInputError, Param
from divviz.safetext import one_of, quoted


@dataclass(frozen=True)
class Control:
    """One control: a number (`param`), one of `options`, several of them (`multi`), or a list of measures of a
    catalogue `family` ("clip"), each spelled as `instances.spell` writes it."""

    name: str
    default: object
    param: Param | None = None
    options: tuple[str, ...] | None = None
    multi: bool = False
    family: str | None = None
    aliases: tuple[tuple[str, str], ...] = ()  # (old spelling, option) that older links wrote

    def decode(self, text: str):
        if self.family is not None:
            return list(dict.fromkeys(instances.spell(m) for m in decode_measures(self.name, text, self.family)))
        if self.param is not None:
            try:
                value = self.param.check(text, "link")
            except DivvizInputError:
                value = None
            in_range(self, value, text)
            return value
        text = dict(self.aliases).get(text, text)
        items = list(dict.fromkeys(t for t in text.split(",") if t)) if self.multi else [text]  # repeats merged
        unknown = [t for t in items if t not in self.options]
        if unknown:
            raise DivvizInputError(f"link: '{self.name}' has unknown value {quoted(unknown[0], 40)}; "
                                   f"choose {one_of(self.options)}")
        return items if self.multi else items[0]

    def encode(self, value) -> str:
        if self.multi or self.family is not None:
            return ",".join(value)
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, float):
            return f"{value:.10g}"
        return str(value)


def decode_measures(name: str, text: str, family: str) -> list:
    """The measures of a link's list, each parameter also within its slider's range (what the page can show)."""
    measures = []
    for item in (t for t in text.split(",") if t):
        try:
            measure = instances.parse(item, family)
        except DivvizInputError as err:
            raise DivvizInputError(f"link: '{name}' has {quoted(item, 40)}, which is refused: {err}") from None
        for p in measure.entry.params:
            in_range(Control(f"{measure.name}:{p.name}", p.default, param=p), measure.params[p.name],
                     measure.params[p.name])
        measures.append(measure)
    return measures


def in_range(control: Control, value, text) -> None:
    """Refuse a link's value the page's control cannot take (None: not even a valid value), in one message naming
    the one range the control takes — and, where divviz accepts a wider one elsewhere, that one and why."""
    param = control.param
    if param.kind == "text" or (param.kind == "bool" and value is not None):
        return
    if param.kind == "bool":
        raise DivvizInputError(f"link: '{control.name}' must be {param.range_text()}; got {quoted(text, 40)}")
    low, high, _ = param.slider_range()
    if value is not None and low <= value <= high:
        return
    takes = f"{'an integer' if param.kind == 'int' else 'a number'} in [{low:g}, {high:g}]"
    wider = ((low, high) != (param.low, param.high)
             and f" (the control's range; divviz takes {param.range_text().split(' in ')[-1]} where it is typed, "
                 "e.g. `divviz train`)")
    raise DivvizInputError(f"link: '{control.name}' must be {takes}{wider or ''}; got {quoted(text, 40)}")


MAX_LINK_ENTRIES = 12  # measures one link may list: a page draws or trains each of them


def read_query(controls: list[Control], query: Mapping[str, str],
               defaults: Callable[[dict], Mapping[str, object]] = lambda values: {}) -> tuple[dict, list[str]]:
    """Values for the controls found in `query`, and one message per value that could not be used as it is,
    each saying what the page does instead: the default, named (`defaults` of the values read where it has the
    control, e.g. a model page's setting's: `ui.suited_settings`; else the control's own), or a repeat shown once."""
    values, problems, refused = {}, [], []
    for control in controls:
        if control.name in query:
            try:
                values[control.name] = control.decode(query[control.name])
            except DivvizInputError as err:
                refused.append((control, err))
            else:
                given = [t for t in query[control.name].split(",") if t]
                if (control.multi or control.family) and len(values[control.name]) < len(given):
                    problems.append(f"link: '{control.name}' names a value more than once; each is shown once")
                if control.family and len(values[control.name]) > MAX_LINK_ENTRIES:
                    problems.append(f"link: '{control.name}' lists {len(values[control.name])} entries; the first "
                                    f"{MAX_LINK_ENTRIES} are shown (a page compares at most {MAX_LINK_ENTRIES} at a "
                                    "time: each one trains or draws its own curves on the shared CPU)")
                    values[control.name] = values[control.name][:MAX_LINK_ENTRIES]
        if control.family is not None:
            legacy = read_legacy_params(control, values.get(control.name, control.default), query, problems)
            if legacy != values.get(control.name, control.default):
                values[control.name] = legacy
    used = defaults(values)
    problems += [f"{err}. Using the default instead: {control.encode(used.get(control.name, control.default))}"
                 for control, err in refused]
    return values, problems


def read_legacy_params(control: Control, spelled: list[str], query: Mapping[str, str], problems: list[str]) -> list:
    """An old link's `NAME.PARAM=value` applied to each bare `NAME` of the list (see the module docstring)."""
    out, legacy_controls = [], [c for c in measure_param_controls((control.family,)) if c.name in query]
    for spec in spelled:
        if ":" in spec:
            out.append(spec)
            continue
        given = {}
        for legacy in legacy_controls:
            if legacy.name.startswith(f"{spec}."):
                try:
                    given[legacy.param.name] = legacy.decode(query[legacy.name])
                except DivvizInputError as err:
                    problems.append(f"{err}. Using its default instead: {legacy.encode(legacy.default)}")
        out.append(instances.spell(instances.configure(spec, given, control.family)))
    return out


def write_query(controls: list[Control], values: Mapping[str, object],
                defaults: Mapping[str, object] | None = None) -> dict[str, str]:
    """The query string dict for `values`: only controls away from their default (`defaults`' where it names one,
    e.g. the chosen model's settings), so links stay short."""
    defaults = defaults or {}
    return {c.name: c.encode(values[c.name]) for c in controls
            if c.name in values and c.encode(values[c.name]) != c.encode(defaults.get(c.name, c.default))}


def measure_param_controls(families=("clip",)) -> list[Control]:
    """A control `NAME.PARAM` for every parameter of every catalogue entry in `families`."""
    return [Control(f"{entry.name}.{p.name}", p.default, param=p)
            for family in families for entry in FAMILIES[family].values() for p in entry.params]
