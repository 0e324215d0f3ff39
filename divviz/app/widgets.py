"""The widgets every page uses: a lab page's top, sliders and choices bound to their controls, uploads, charts
with their downloads, lazy tabs, and the one place where an error becomes a message instead of a traceback."""

from __future__ import annotations

import contextlib
import re
import time

import streamlit as st

from divviz.app.page_state import apply_preset, bind_controls, key
from divviz.app.urlstate import Control
from divviz.catalogue.formula import MAX_CHARACTERS
from divviz.catalogue.params import DivvizInputError, Param
from divviz.safetext import literal, shorten
from divviz.views.figures import Chart, spreadsheet_csv


PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def page_top(page: str, controls: list[Control], title: str, intro: str,
             presets: dict[str, dict] | None = None) -> dict[str, Control]:
    """A lab page's top: its title and what it shows, its controls given their values (`bind_controls`) and its
    presets' buttons in the sidebar. Returns the controls by name."""
    st.title(title)
    st.write(intro)
    bind_controls(page, controls)
    if presets:
        preset_buttons(page, presets)
    return {control.name: control for control in controls}


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


MISSING = "—"  # how a table shows a value that does not exist (an interval at n = 1), instead of a grey "None"


def show_table(data, **options) -> None:
    """A data table (sortable, scrolling) without its index, missing values shown as `MISSING`."""
    st.dataframe(data, hide_index=True, placeholder=MISSING, **options)


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
    row.download_button("CSV", lambda: spreadsheet_csv(chart.data), file_name=f"{slug}.csv", mime="text/csv",
                        key=f"csv:{slug}", icon=":material/table:", on_click="ignore")  # both files are made only


    # when clicked: a live chart redraws every 2 s


def working(text: str, every_s: float = 0.2):
    """A progress bar for work the page does in its own thread (the bandit's training), as a `progress(done, total)`
    callback drawn at most every `every_s` seconds. Each drawing is where Streamlit ends a run it was asked to end:
    a closed tab's (its session shut down), so its work stops instead of holding the shared cores, or one the user
    replaced by changing a widget, so the new run begins at once. Returns (callback, bar): empty the bar when done."""
    bar, drawn = st.progress(0.0, text=text), [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - drawn[0] < every_s:
            return
        bar.progress(done / max(total, 1), text=f"{text} {done}/{total}")
        drawn[0] = time.monotonic()

    return progress, bar


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


def published_warnings() -> None:
    """A line for each published grid hidden because a file of it is not what its manifest says
    (`published.damaged_lines`); the other grids and the user's runs are shown as ever."""
    from divviz.runs import published

    for line in published.damaged_lines():
        st.warning(literal(line), icon=":material/report:")
