"""A page's controls and the link: each widget given its value from the link on a page's first visit, else the
value it last had, else its default (a model's own settings where the page has a model control); the link written
back as the controls change; presets."""

from __future__ import annotations

import streamlit as st

from divviz.app.urlstate import Control, read_query, write_query
from divviz.engine.config import RUN_PARAMS
from divviz.engine.models import model_defaults, model_settings
from divviz.safetext import literal


def key(page: str, name: str) -> str:
    return f"{page}:{name}"


def visited(page: str) -> bool:
    """Whether the page has read its link in this session (`bind_controls` does on the first visit)."""
    return f"_linked:{page}" in st.session_state


def bind_controls(page: str, controls: list[Control]) -> None:
    """Before the widgets are drawn: give each control's widget its value — from the link on the page's
    first run in this session, else the value it last had here, else its default: the chosen model's setting's
    (`suited_settings`) where the page has a model control, so that a link naming SmolLM2 and nothing else runs
    SmolLM2's own settings."""
    saved = st.session_state.setdefault(f"_saved:{page}", {})
    first_visit = not visited(page)
    if first_visit:
        from_link, problems = read_query(controls, st.query_params.to_dict(),
                                         lambda values: suited_settings(controls, {**saved, **values}))
        saved.update(from_link)
        for problem in problems:
            st.warning(f"{literal(problem)}.")  # link text is shown, never rendered
        st.session_state[f"_linked:{page}"] = True
    suited = suited_settings(controls, saved)
    for control in controls:
        if key(page, control.name) not in st.session_state:
            default = suited.get(control.name, control.default)
            st.session_state[key(page, control.name)] = saved.get(control.name, default)


def publish_controls(page: str, controls: list[Control]) -> None:
    """After the widgets: remember their values and mirror into the URL those away from their default (the model's
    setting's, where it has one)."""
    saved = st.session_state[f"_saved:{page}"]
    for control in controls:
        if key(page, control.name) in st.session_state:
            saved[control.name] = st.session_state[key(page, control.name)]
    st.query_params.from_dict(write_query(controls, saved, suited_settings(controls, saved)))


def suited_settings(controls: list[Control], values: dict) -> dict:
    """The run settings that suit the model in `values` (its named setting's, else its defaults: `engine/models.py`)
    for the page's controls; {} on a page without a model control."""
    names = {c.name for c in controls}
    if "model" not in names:
        return {}
    model = values.get("model", "builtin")
    named = model_settings(model)
    setting = values.get("setting") if values.get("setting") in named else next(iter(named), None)
    suited = named.get(setting, model_defaults(model))
    return {name: value for name, value in suited.items() if name in names}


def apply_preset(page: str, values: dict) -> None:
    """Set several controls at once (an `on_click`/`on_change` callback, so it runs before the widgets)."""
    for name, value in values.items():
        st.session_state[key(page, name)] = value
    for name in ("m", "s"):  # the lists of clip tests and surrogates
        renew_list_widgets(page, name)


def apply_model_settings(page: str, controls: dict[str, Control]) -> None:
    """When the model or its named setting changes (a widget callback): the settings that suit it (`engine/models.py`:
    the named setting chosen, else the model's defaults) into the page's widgets, and every other setting back to its
    default, so a run of the new model starts sensibly."""
    model = st.session_state[key(page, "model")]
    named = model_settings(model)
    if named and st.session_state.get(key(page, "setting")) not in named:
        st.session_state[key(page, "setting")] = next(iter(named))
    setting = st.session_state.get(key(page, "setting"))
    suited = suited_settings(list(controls.values()), {"model": model, "setting": setting})
    for name in ({p.name for p in RUN_PARAMS} | {"task"}) & set(controls):
        st.session_state[key(page, name)] = suited.get(name, controls[name].default)


def renew_list_widgets(page: str, name: str = "m") -> None:
    """After the list of measures `name` changed shape: new widget keys, which take their values from the list (the
    old version's keys are dropped)."""
    old = st.session_state.get(key(page, f"{name}_version"), 0)
    for stale in [k for k in st.session_state if str(k).startswith(f"{page}:{name}{old}.")]:
        del st.session_state[stale]
    st.session_state[key(page, f"{name}_version")] = old + 1

