"""Streamlit glue shared by the pages: controls bound to the URL, catalogue widgets, charts with downloads,
and the one place where an error becomes a message instead of a traceback."""

from __future__ import annotations

import contextlib
import os
import re
import secrets

import streamlit as st

from divviz.catalogue import instances

from divviz.views import explorer
from divviz.catalogue.aggregation import AGGREGATIONS, BASELINES, SCALE_REWARDS
from divviz.catalogue.divergences import BETA, DUAL_CLIP, FAMILIES
from divviz.engine.config import RUN_PARAMS
from divviz.engine.models import model_defaults, model_settings
from divviz.engine.runner import Viewer
from divviz.catalogue.formula import MAX_CHARACTERS
from divviz.losses import OFF_POLICY_MASK, Objective, RATIO_CAP
from divviz.app.ownership import browser_id, is_teacher_key
from divviz.catalogue.params import DivvizInputError, Param
from divviz.catalogue.penalties import penalty, PENALTIES
from divviz.catalogue.rollout_correction import (ICEPOP_HIGH, ICEPOP_LOW, OPTIONS as RS_OPTIONS, RS_BOUND, RS_RATIO_HIGH,
                                       RS_RATIO_LOW, SAMPLER_DTYPES, TIS_CAP)
from divviz.views.figures import Chart
from divviz.safetext import literal, shorten
from divviz.catalogue.surrogates import LEVELS
from divviz.app.urlstate import Control, measure_param_controls, read_query, write_query

PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def key(page: str, name: str) -> str:
    return f"{page}:{name}"


def bind_controls(page: str, controls: list[Control]) -> None:
    """Before the widgets are drawn: give each control's widget its value — from the link on the page's
    first run in this session, else the value it last had here, else its default: the chosen model's setting's
    (`suited_settings`) where the page has a model control, so that a link naming SmolLM2 and nothing else runs
    SmolLM2's own settings."""
    saved = st.session_state.setdefault(f"_saved:{page}", {})
    first_visit = f"_linked:{page}" not in st.session_state
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
        _renew_measure_widgets(page, name)


def preset_buttons(page: str, presets: dict[str, dict]) -> None:
    """One sidebar button per named preset."""
    with st.sidebar:
        st.subheader("Presets")
        for name, values in presets.items():
            st.button(name, on_click=apply_preset, args=(page, values), width="stretch")


def number(page: str, control: Control, label: str, help: str | None = None, where=st):
    """A slider (or toggle) for a numeric control, with the range of its `Param`."""
    return slider_for(control.param, key(page, control.name), label, help, where)


TINY_STEP = 1e-4  # a parameter stepped finer than this spans decades: a number box in scientific notation


def slider_for(p: Param, widget_key: str, label: str, help: str | None = None, where=st):
    """A slider (toggle, text box, file upload) with the range of `p`, bound to session key `widget_key`."""
    if p.upload is not None:
        return upload_for(p, widget_key, where)
    if p.kind == "bool":
        return where.toggle(label, key=widget_key, help=help or p.doc)
    if p.kind == "text":
        return where.text_input(label, key=widget_key, help=help or p.doc, max_chars=MAX_CHARACTERS)
    low, high, step = p.slider_range()
    if p.kind == "int":
        return where.slider(label, int(low), int(high), step=int(step), key=widget_key, help=help or p.doc)
    if step < TINY_STEP:  # a rate over decades (a learning rate from 1e-6): typed, shown as 5.00e-05, not 0.0000
        return where.number_input(label, float(low), float(high), step=float(step), key=widget_key,
                                  help=help or p.doc, format="%.2e")
    return where.slider(label, float(low), float(high), step=float(step), key=widget_key,
                        help=help or p.doc, format="%.4f" if step < 0.001 else "%.3f")


def choice(page: str, control: Control, label: str, help: str | None = None, where=st, labels=None, **callback):
    fmt = (lambda x: labels.get(x, x)) if labels else str
    if control.multi:
        return where.multiselect(label, control.options, key=key(page, control.name), help=help, format_func=fmt,
                                 **callback)
    return where.selectbox(label, control.options, key=key(page, control.name), help=help, format_func=fmt, **callback)


def lazy_tabs(page: str, control: Control, applies: dict[str, bool]):
    """Tabs of which only the open one is drawn (`st.tabs(on_change="rerun")`, the page drawing only into the tab it
    gets back), so that a control change redraws that tab's charts and not every chart of the page (each Plotly
    chart costs the browser 0.1–0.2 s to draw). The tabs are the control's options but those `applies` says
    do not apply now; the open tab is one of the page's controls, so it travels in the link. Returns the open tab's
    label and its container."""
    labels = [label for label in control.options if applies.get(label, True)]
    widget_key = key(page, control.name)
    if st.session_state.get(widget_key) not in labels:  # a tab that does not apply now (no penalty chosen): the first
        st.session_state[widget_key] = labels[0]
    tabs = st.tabs(labels, key=widget_key, on_change="rerun")
    shown = next((label for label, tab in zip(labels, tabs) if tab.open), labels[0])
    return shown, tabs[labels.index(shown)]


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


def _renew_measure_widgets(page: str, name: str = "m") -> None:
    """After the list of measures `name` changed shape: new widget keys, which take their values from the list (the
    old version's keys are dropped)."""
    old = st.session_state.get(key(page, f"{name}_version"), 0)
    for stale in [k for k in st.session_state if str(k).startswith(f"{page}:{name}{old}.")]:
        del st.session_state[stale]
    st.session_state[key(page, f"{name}_version")] = old + 1


def _edit_measures(page: str, name: str, action: str, index: int | None = None) -> None:
    """Add (from the "Add a measure" box), duplicate or remove one measure of the list (a widget callback)."""
    specs = list(st.session_state[key(page, name)])
    if action == "add":
        added = st.session_state.pop(key(page, f"{name}_add"), None)
        if added:
            specs.append(added)
    elif action == "duplicate":
        specs.insert(index + 1, specs[index])
    else:
        del specs[index]
    st.session_state[key(page, name)] = specs
    _renew_measure_widgets(page, name)


def measure_list(page: str, control: Control, title: str) -> list:
    """The page's list of clip tests or surrogates (a `Control` of family "clip" or "surrogate"), each with its
    parameters: one expander per entry with its sliders, Duplicate and Remove, then a box to add another. The same
    entry may appear several times. The list lives in the session as spelled entries (`instances.spell`); the returned
    ones carry the sliders' values."""
    name = control.name
    specs = st.session_state[key(page, name)]
    version = st.session_state.get(key(page, f"{name}_version"), 0)
    chosen = [instances.parse(spec, control.family) for spec in specs]
    widget = [{p.name: f"{page}:{name}{version}.{i}.{p.name}" for p in m.entry.params} for i, m in enumerate(chosen)]
    for measure, keys in zip(chosen, widget):  # a slider's value, else the list's
        for p in measure.entry.params:
            st.session_state.setdefault(keys[p.name], measure.params[p.name])
    current, refused = [], {}
    for i, (measure, keys) in enumerate(zip(chosen, widget)):
        try:
            current.append(instances.configure(measure.name, {p: st.session_state[k] for p, k in keys.items()},
                                               control.family))
        except DivvizInputError as err:  # a typed formula that is refused: keep the list's last good one
            current.append(measure)
            refused[i] = err
    labels = instances.unique_labels([m.label for m in current])
    st.caption(title)
    for i, (measure, keys, label) in enumerate(zip(current, widget, labels)):
        with st.expander(label, expanded=len(current) <= 3 or i in refused):
            for p in measure.entry.params:
                slider_for(p, keys[p.name], p.name)
            if i in refused:
                st.error(f"{literal(str(refused[i]))} — still shown: {literal(measure.label)}", icon=":material/error:")
            st.caption(measure.entry.doc)
            row = st.container(horizontal=True)
            row.button("Duplicate", key=f"{page}:{name}{version}.{i}:dup", icon=":material/content_copy:",
                       on_click=_edit_measures, args=(page, name, "duplicate", i))
            row.button("Remove", key=f"{page}:{name}{version}.{i}:del", icon=":material/close:",
                       on_click=_edit_measures, args=(page, name, "remove", i))
    noun = "surrogate" if control.family == "surrogate" else "measure"
    st.selectbox(f"Add a {noun}", list(FAMILIES[control.family]),
                 index=None, key=key(page, f"{name}_add"), placeholder=f"add a {noun}…", on_change=_edit_measures,
                 args=(page, name, "add"), help="the same entry may be added again with other parameters")
    st.session_state[key(page, name)] = [instances.spell(m) for m in current]
    return current


def penalty_widgets(page: str, name: str, controls: dict[str, Control]):
    """Sliders for the chosen penalty's parameters (in an expander), then the configured penalty."""
    entry = PENALTIES[name]
    with st.expander(f"{name}: {entry.title}", expanded=True):
        values = {p.name: number(page, controls[f"{name}.{p.name}"], p.name) for p in entry.params}
        st.caption(entry.doc)
    return penalty(name, **values)


def _take_upload(p: Param, widget_key: str) -> None:
    """An uploaded file becomes the parameter's text, or a message in the page (an `on_change` callback)."""
    upload = st.session_state.get(f"{widget_key}:file")
    if upload is None:
        return
    try:
        st.session_state[widget_key] = p.upload.parse(upload.getvalue(), upload.name)
    except DivvizInputError as err:
        st.session_state[f"{widget_key}:refused"] = str(err)
    else:
        st.session_state.pop(f"{widget_key}:refused", None)


def upload_for(p: Param, widget_key: str, where=st) -> str:
    """A text parameter taken from an uploaded file (`Param.upload`); returns the text in use."""
    where.file_uploader(p.upload.label, type=list(p.upload.types), key=f"{widget_key}:file", help=p.doc,
                        on_change=_take_upload, args=(p, widget_key))
    refused = st.session_state.get(f"{widget_key}:refused")
    if refused:
        where.error(f"{literal(refused)} — still using the previous {p.upload.what}", icon=":material/error:")
    text = st.session_state[widget_key]
    with contextlib.suppress(DivvizInputError):
        where.caption(p.upload.describe(text))
    return text


def objective_controls(tests: list[str], beta: float) -> list[Control]:
    """The controls of `objective_widgets`, with the page's default clip tests and β."""
    return [Control("m", tests, family="clip"), Control("s", [], family="surrogate"),
            Control("pen", "none", options=("none", *PENALTIES)), Control("beta", beta, param=BETA),
            Control("pen2", "none", options=("none", *PENALTIES)), Control("beta2", 0.1, param=BETA),
            Control("dual", False, param=Param("dual", False, kind="bool", doc="cap the loss of A < 0 tokens at −c·A")),
            Control("c", 3.0, param=DUAL_CLIP),
            Control("cap_on", False, param=Param("cap_on", False, kind="bool", doc=RATIO_CAP.doc)),
            Control("cap", RATIO_CAP.default, param=RATIO_CAP),
            Control("opsm_on", False, param=Param("opsm_on", False, kind="bool", doc=OFF_POLICY_MASK.doc)),
            Control("opsm", OFF_POLICY_MASK.default, param=OFF_POLICY_MASK),
            Control("level", "token", options=LEVELS), Control("agg", "grpo", options=AGGREGATIONS),
            *measure_param_controls(("penalty",))]


def correction_controls(default: list[str]) -> list[Control]:
    """The controls of `correction_widgets`: the corrections to compare (`default` at first) and their parameters."""
    return [Control("rc", default, options=tuple(explorer.ROLLOUT_VARIANTS), multi=True),
            *[Control(p.name, p.default, param=p) for p in (TIS_CAP, ICEPOP_LOW, ICEPOP_HIGH, RS_RATIO_LOW,
                                                            RS_RATIO_HIGH, RS_BOUND)],
            Control("rs_option", "token_k1", options=RS_OPTIONS),
            Control("rc_norm", False, param=Param("rc_norm", False, kind="bool",
                                                  doc="verl's rollout_is_batch_normalize: weights divided by their "
                                                      "batch mean"))]


def rollout_controls(lag: Param) -> list[Control]:
    """The controls of `rollout_widgets`, with the page's parameter for the sampler's lag."""
    return [Control("rollout_dtype", "same", options=tuple(SAMPLER_DTYPES)),
            Control("rollout_lag", lag.default, param=lag), *correction_controls(["none"])]


def correction_widgets(page: str, controls: dict[str, Control]) -> list[dict]:
    """verl's rollout corrections to compare, with the parameters of those chosen: one dict of run-config keys each
    (`explorer.rollout_variant`)."""
    names = choice(page, controls["rc"], "Corrections to compare (one run each)",
                   help="; ".join(f"{k}: {v}" for k, v in explorer.ROLLOUT_VARIANTS.items()))
    values = {"tis_u": TIS_CAP.default, "icepop": (ICEPOP_LOW.default, ICEPOP_HIGH.default),  # for those not shown
              "rs_option": controls["rs_option"].default, "rs_ratio": (RS_RATIO_LOW.default, RS_RATIO_HIGH.default),
              "rs_bound": RS_BOUND.default, "normalize": False}
    if any(n.startswith("TIS") for n in names):
        values["tis_u"] = number(page, controls["tis_u"], "TIS cap u")
    if any(n.startswith("IcePop") for n in names):
        values["icepop"] = (number(page, controls["icepop_l"], "IcePop l"),
                            number(page, controls["icepop_u"], "IcePop u"))
    if any(n.startswith(("TIS", "IcePop")) for n in names):
        values["normalize"] = number(page, controls["rc_norm"], "Normalise the weights to mean 1 (verl)")
    if "rejection" in names:
        values["rs_option"] = choice(page, controls["rs_option"], "Rejection statistic")
        if values["rs_option"].endswith("k1"):
            values["rs_ratio"] = (number(page, controls["rs_l"], "kept for ratio bounds from l"),
                                  number(page, controls["rs_u"], "to u"))
        else:
            values["rs_bound"] = number(page, controls["rs_bound"], f"kept while {values['rs_option']} ≤")
    return [explorer.rollout_variant(name, **values) for name in names]


def rollout_widgets(page: str, controls: dict[str, Control], precision_help: str,
                    lag_label: str) -> tuple[dict, list[dict]]:
    """The rollout block of the Training lab and the bandit: the sampler's precision and lag (one for all runs), and
    the rollout corrections to compare (one run each; none chosen is one run without). Returns the shared config keys
    and one dict of run-config keys per correction."""
    shared = {"rollout_dtype": choice(page, controls["rollout_dtype"], "Sampler precision", help=precision_help),
              "rollout_lag": number(page, controls["rollout_lag"], lag_label)}
    return shared, correction_widgets(page, controls) or [{}]


SCALE_REWARDS_CONTROL = Control("scale_rewards", "group", options=SCALE_REWARDS,
                                aliases=(("0", "none"), ("1", "group")))  # a link may carry the toggle's 0/1


BASELINE_CONTROL = Control("baseline", "group", options=BASELINES)


def advantage_widgets(page: str, controls: dict[str, Control]) -> dict[str, str]:
    """The advantage's baseline and scale: {"baseline": …, "scale_rewards": …}."""
    return {"baseline": choice(page, controls["baseline"], "Advantages: the reward minus the mean of",
                               labels={"group": "its group (GRPO)", "batch": "the whole batch (RPG's batch mean)"}),
            "scale_rewards": choice(page, controls["scale_rewards"], "… divided by the reward std of",
                                    labels={"group": "its group (GRPO)",
                                            "batch": "the whole batch (TRL's scale_rewards='batch')",
                                            "none": "nothing (Dr. GRPO, RPG)"})}


def objective_widgets(page: str, controls: dict[str, Control], bandit: bool = False) -> tuple[list[Objective], list[str]]:
    """The sidebar block shared by the bandit and the lab: clip tests and surrogates (one run each), a penalty with
    its β and a second one with its own, dual-clip, TRL's ratio cap and off-policy mask, the importance-sampling
    level and the aggregation. Returns `explorer.compared_objectives`: (objectives, a message for each entry these
    settings refuse)."""
    tests = measure_list(page, controls["m"], "Clip tests under PPO's surrogate (one run each)")
    surrogates = measure_list(page, controls["s"], "Surrogates (one run each; those that mask with a clip test take "
                                                   "the first)")
    pen_name = choice(page, controls["pen"], "Penalty toward the start policy")
    pen = penalty_widgets(page, pen_name, controls) if pen_name != "none" else None
    shared = {"penalty": pen, "beta": number(page, controls["beta"], "β") if pen else 0.0}
    second = choice(page, controls["pen2"], "A second penalty, with its own coefficient",
                    help="GBMPO's prob_l2kl: k3 with β and prob_l2 with λ")
    if second != "none" and second == pen_name:
        st.warning("The second penalty is the first one again: choose another, or raise β.", icon=":material/warning:")
    elif second != "none":
        shared["second_penalty"] = penalty_widgets(page, second, controls)
        shared["second_beta"] = number(page, controls["beta2"], "β₂ (its coefficient)")
    if number(page, controls["dual"], "Dual-clip"):
        shared["dual_clip_c"] = number(page, controls["c"], "dual-clip c")
    if number(page, controls["cap_on"], "Ratio cap δ (TRL's delta)"):
        shared["ratio_cap"] = number(page, controls["cap"], "δ")
    if number(page, controls["opsm_on"], "Off-policy sequence mask (TRL's)"):
        shared["off_policy_mask"] = number(page, controls["opsm"], "mask threshold δ")
    shared["importance_sampling_level"] = choice(page, controls["level"], "Importance sampling (TRL's level)",
                                                 labels={"token": "token (GRPO)", "sequence": "sequence (GSPO)"})
    shared["aggregation"] = choice(page, controls["agg"], "Aggregation (TRL loss_type)")
    return explorer.compared_objectives(tests, surrogates, bandit, **shared)


def show_chart(chart: Chart, name: str, key: str | None = None) -> None:
    """The figure (its toolbar saves a PNG), plus its HTML and the CSV of the numbers drawn. `key`, where the chart's
    name changes with a control: with the same key, the browser updates the chart in place instead of drawing anew."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    config = {**PLOTLY_CONFIG, "toImageButtonOptions": {**PLOTLY_CONFIG["toImageButtonOptions"], "filename": slug}}
    st.plotly_chart(chart.figure, config=config, key=key or f"chart:{slug}")
    row = st.container(horizontal=True)
    figure = chart.export or chart.figure  # every point, where the chart on screen thins a long series
    row.download_button("HTML", lambda: figure.to_html(include_plotlyjs=True), file_name=f"{slug}.html",
                         mime="text/html", key=f"html:{slug}", icon=":material/download:", on_click="ignore")
    row.download_button("CSV", lambda: chart.data.to_csv(index=False), file_name=f"{slug}.csv", mime="text/csv",
                        key=f"csv:{slug}", icon=":material/table:", on_click="ignore")  # both files are made only
    # when clicked: a live chart redraws every 2 s


@contextlib.contextmanager
def shown_errors():
    """Turn any error inside the block into a plain message in the page, never a traceback."""
    try:
        yield
    except DivvizInputError as err:
        st.error(literal(str(err)), icon=":material/error:")
    except Exception as err:  # noqa: BLE001 — a page must not show a traceback, whatever failed
        st.error(f"Something went wrong: {type(err).__name__}: {literal(shorten(str(err), 300))}",
                 icon=":material/error:")


_TEACHERS: set[str] = set()  # browsers that opened a link with the teacher key, for as long as the app runs
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")


def room_mode() -> bool:
    """Students own their runs when the app is served beyond this machine, or $DIVVIZ_ROOM=1, or a teacher key is
    set; an app bound to localhost (the default) has one user, who manages every run."""
    return (st.get_option("server.address") not in LOCAL_ADDRESSES or os.environ.get("DIVVIZ_ROOM") == "1"
            or bool(os.environ.get("DIVVIZ_TEACHER_KEY")))


def viewer() -> Viewer:
    """This browser (`ownership.browser_id` of its Streamlit cookie, else this tab's session) and whether it may
    manage every run: in room mode, the browser that once opened a link with ?teacher=KEY, KEY being
    $DIVVIZ_TEACHER_KEY when the app was started (the key is then removed from the address bar)."""
    who = browser_id(st.context.cookies.get("_streamlit_xsrf")) or st.session_state.setdefault(
        "_tab_identity", secrets.token_hex(8))
    if "teacher" in st.query_params:
        if is_teacher_key(st.query_params["teacher"], os.environ.get("DIVVIZ_TEACHER_KEY")):
            _TEACHERS.add(who)
        del st.query_params["teacher"]
    return Viewer(who, teacher=not room_mode() or who in _TEACHERS)


def ownership_text(me: Viewer) -> str:
    """Who may stop or delete a run, said for the mode the app is in (`room_mode`)."""
    if not room_mode():
        return ("This app is served to this machine only, so it has one user: any of its browsers can stop or "
                "delete any run.")
    return ("In this workshop room only the browser that started a run, or the teacher, can stop or delete it"
            + (" (this browser is the teacher's)." if me.teacher else "."))
