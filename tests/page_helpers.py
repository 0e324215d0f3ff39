"""What the page tests share: opening a page under AppTest, reading its charts, text and tabs, and working its
controls."""

import base64
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from divviz.catalogue.divergences import CLIP_TESTS
from divviz.safetext import WORD_JOINER

APP = str(Path(__file__).resolve().parents[1] / "router.py")


def shown(element) -> str:
    """The text a message shows: its Markdown source with the escapes of `safetext.literal` taken out."""
    return re.sub(r"\\(.)", r"\1", element.value).replace(WORD_JOINER, "")


def open_page(page: str | None = None, query: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if query:
        at.query_params.update(query)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def typed(array) -> np.ndarray:
    """A figure's array as the browser gets it: a plotly.js typed array (base64 float64) or a list."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype="<f8")
    return np.asarray(array, dtype=float)


def specs(at) -> list[str]:
    return [chart.proto.spec for chart in at.get("plotly_chart")]


def titles(at) -> list[str]:
    """The charts' titles, in the page's order."""
    return [json.loads(spec)["layout"]["title"]["text"] for spec in specs(at)]


def open_tab(at, key: str, label: str) -> None:
    """Open a lazy tab (`st.tabs(on_change="rerun")`) as a click on it does, and rerun."""
    at.session_state[key] = label
    at.run()
    assert not at.exception, at.exception


def slider(at, label):
    return next(s for s in at.slider if s.label == label)


def measure_labels(at) -> list[str]:
    return [e.label for e in at.expander if e.label.split(" ")[0] in CLIP_TESTS]


def click(at, label, nth=0):
    [b for b in at.button if b.label == label][nth].click().run()
    assert not at.exception, at.exception


def add_measure(at, name):
    next(s for s in at.selectbox if s.label == "Add a clip test").set_value(name).run()
    assert not at.exception, at.exception
