"""The drawing layer under the charts: a plotly figure kept as the plain dict it is written as (`Figure`), a chart
with the table behind it (`Chart`), the palette, and layout helpers (panels, lines, shaded spans).

Figures are written as plain dicts and kept as they are: plotly's own objects, even built without validation, cost
~3 ms a figure to build and ~7 ms to turn back into a dict for the browser, and the incremental API (`add_trace`,
`add_vrect`, `make_subplots`) re-validates on every call, 10–100× more; either would break the explorer's 50 ms
budget per control change (bench/explorer.py). tests/pages/test_plots.py validates every figure instead. The template is
left empty so that Streamlit's theme applies.
"""

from __future__ import annotations

import base64
import html
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from divviz.safetext import spreadsheet_safe

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
BASE_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "font": {"size": 14},  # the legend below the x titles
               "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"}, "template": {}}


class Figure(go.Figure):
    """A plotly figure that keeps the plain dict it was written as and hands it out from `to_dict`, which is
    all that Streamlit's `st.plotly_chart`, `to_html` and `plotly.io` read of a figure. Numeric arrays go out
    as plotly.js typed arrays, as plotly's own `to_dict` sends them: base64 float64, several times faster to
    encode than JSON lists of floats."""

    def __init__(self, spec: dict):
        super().__init__()
        self._spec = spec

    def to_dict(self) -> dict:
        return typed_arrays(self._spec)


def typed_arrays(value):
    """A copy of a figure spec with every 1-D numeric numpy array as {"dtype": "f8", "bdata": base64}."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "fiu":
        return {"dtype": "f8", "bdata": base64.b64encode(value.astype("<f8").tobytes()).decode("ascii")}
    if isinstance(value, dict):
        return {key: typed_arrays(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed_arrays(item) for item in value]
    return value


class Chart:
    """A figure, the table of every number drawn at full resolution (`data`), and `export`: the figure with every
    point, where `figure` shows a long series thinned (`thinned`). `data` may be given as a function that makes the
    table, called on first use: a live chart redraws every 2 s, and its table is wanted only when downloaded."""

    def __init__(self, figure: Figure, data: pd.DataFrame | Callable[[], pd.DataFrame], export: Figure | None = None):
        for shown in (figure, export):
            legend_as_text(shown)
        self.figure, self.export, self._data = figure, export, data

    @property
    def data(self) -> pd.DataFrame:
        if callable(self._data):
            self._data = self._data()
        return self._data


def legend_as_text(figure: Figure | None) -> None:
    """Every trace's legend name and group title shown as the text it is: plotly renders a subset of HTML there
    (`<a href>`, `<b>`, `<br>`), and a run's task, a model's name or an imported file's metric may hold some
    (divviz's own names hold none). Escaping what it unescapes first, so a figure shown twice is escaped once."""
    as_text = lambda text: html.escape(html.unescape(text), quote=False)  # noqa: E731
    if isinstance(figure, Figure):  # the plain dict it hands out
        for trace in figure._spec.get("data", ()):
            if isinstance(trace.get("name"), str):
                trace["name"] = as_text(trace["name"])
            title = trace.get("legendgrouptitle")
            if isinstance(title, dict) and isinstance(title.get("text"), str):
                title["text"] = as_text(title["text"])
        return
    for trace in () if figure is None else figure.data:
        if isinstance(trace.name, str):
            trace.name = as_text(trace.name)
        title = getattr(trace, "legendgrouptitle", None)
        if title is not None and isinstance(title.text, str):
            title.text = as_text(title.text)


BUCKETS = 500  # a long series is drawn as 500 buckets' extremes: a panel is about 450 pixels across
GL_POINTS = 3000  # a trace with more points than this is drawn with WebGL


_THINNED: OrderedDict[tuple, tuple[list, np.ndarray]] = OrderedDict()  # (ids of the series, buckets) → (weak
# references to them, indices): a chart redrawn every 2 s thins only the series that are new since (a run that grew)
_THINNED_LOCK = threading.Lock()


def thinned(*series: np.ndarray, buckets: int = BUCKETS) -> np.ndarray:
    """`decimate`'s indices, kept for series that are the very same arrays as the last time they were thinned
    (numpy arrays are not changed in place here: a run's curves are new arrays when it grows)."""
    key = (*map(id, series), buckets)
    with _THINNED_LOCK:  # Streamlit serves each session from its own thread
        known = _THINNED.get(key)
        if known is not None and all(ref() is s for ref, s in zip(known[0], series)):
            _THINNED.move_to_end(key)
            return known[1]
    picks = decimate(*series, buckets=buckets)
    try:
        refs = [weakref.ref(s) for s in series]
    except TypeError:  # a series that is not a numpy array (a list) cannot be referred to weakly: not kept
        return picks
    with _THINNED_LOCK:
        _THINNED[key] = (refs, picks)
        while len(_THINNED) > 4096:  # each entry holds about 1,000 indices: at most about 32 MB
            _THINNED.popitem(last=False)
    return picks


def decimate(*series: np.ndarray, buckets: int = BUCKETS) -> np.ndarray:
    """Indices that keep a long series' shape: the first and last point and, in each of `buckets` equal runs of
    the x axis, the points where any of `series` (a mean, its band's edges) is lowest and highest (per-pixel
    min/max decimation). All indices when the series is short (≤ 2 × buckets points); a NaN is never an extreme.
    Sorted, so a line through them keeps its order."""
    n = len(series[0])
    if n <= 2 * buckets:
        return np.arange(n)
    edges = np.linspace(0, n, buckets + 1).astype(int)
    bucket = np.repeat(np.arange(buckets), np.diff(edges))  # each point's bucket
    keep = [np.array([0, n - 1])]
    for values in series:
        values = np.asarray(values, dtype=np.float64)
        for fill, reduce in ((np.inf, np.minimum), (-np.inf, np.maximum)):
            filled = np.where(np.isnan(values), fill, values)
            extreme = reduce.reduceat(filled, edges[:-1])
            hits = np.flatnonzero(filled == extreme[bucket])  # the first hit in each bucket
            keep.append(hits[np.unique(bucket[hits], return_index=True)[1]])
    return np.unique(np.concatenate(keep))


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def rgba(i: int, alpha: float) -> str:
    hex_color = color(i).lstrip("#")
    r, g, b = (int(hex_color[k:k + 2], 16) for k in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def fmt(x: float) -> str:
    return "∞" if np.isinf(x) else f"{x:.4f}"


def figure(traces: list[dict], layout: dict, shapes: list[dict] = (), annotations: list[dict] = ()) -> Figure:
    full = {**BASE_LAYOUT, **layout, "shapes": list(shapes), "annotations": [*layout.get("annotations", []),
                                                                           *annotations]}
    return Figure({"data": traces, "layout": full})  # tests/pages/test_plots.py validates them


def concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The CSV data of several runs, one block of rows each."""
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def panels(rows: int, cols: int, titles: list[str], gap: float = 0.07) -> tuple[dict, list[list[tuple[str, str]]]]:
    """Axes for a rows × cols grid (like make_subplots, written out): the layout entries and, per panel,
    its (xref, yref) names such as ("x2", "y2")."""
    layout, refs, annotations = {}, [], []
    width, height = (1 - gap * (cols - 1)) / cols, (1 - gap * (rows - 1)) / rows
    for r in range(rows):
        row = []
        for c in range(cols):
            n = r * cols + c + 1
            suffix = "" if n == 1 else str(n)
            x0, y1 = c * (width + gap), 1 - r * (height + gap)
            layout[f"xaxis{suffix}"] = {"domain": [max(0.0, x0), min(1.0, x0 + width)], "anchor": f"y{suffix}"}
            layout[f"yaxis{suffix}"] = {"domain": [max(0.0, y1 - height), min(1.0, y1)], "anchor": f"x{suffix}"}
            if n - 1 < len(titles):
                annotations.append({"text": titles[n - 1], "x": x0 + width / 2, "y": y1, "xref": "paper",
                                    "yref": "paper", "showarrow": False, "yanchor": "bottom", "font": {"size": 14}})
            row.append((f"x{suffix}", f"y{suffix}"))
        refs.append(row)
    layout["annotations"] = annotations
    return layout, refs


def vline(x: float, xref: str = "x", yref: str = "y", **line) -> dict:
    return {"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "xref": xref, "yref": f"{yref} domain",
            "line": {"color": "grey", "dash": "dot", **line}}


def hline(y: float, xref: str = "x", yref: str = "y", **line) -> dict:
    return {"type": "line", "y0": y, "y1": y, "x0": 0, "x1": 1, "yref": yref, "xref": f"{xref} domain",
            "line": {"color": "lightgrey", **line}}


def vrect(x0: float, x1: float, fill: str, xref: str = "x", yref: str = "y", opacity: float = 0.12) -> dict:
    return {"type": "rect", "x0": x0, "x1": x1, "y0": 0, "y1": 1, "xref": xref, "yref": f"{yref} domain",
            "fillcolor": fill, "opacity": opacity, "line": {"width": 0}, "layer": "below"}


def spreadsheet_csv(frame) -> str:
    """`frame` (a DataFrame) as CSV whose every text cell and column name is `safetext.spreadsheet_safe`: what every
    CSV download writes."""
    safe = frame.rename(columns=spreadsheet_safe)
    for column in [c for c in safe.columns if not pd.api.types.is_numeric_dtype(safe[c])]:
        safe[column] = safe[column].map(spreadsheet_safe)
    return safe.to_csv(index=False)
