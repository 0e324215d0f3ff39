"""Pure functions from computed data to plotly figures (no Streamlit, no maths beyond layout).

Each returns a `Chart`: the figure and the table behind it, so the app can offer both a PNG/HTML of the
figure and a CSV of exactly the numbers drawn.

Figures are written as plain dicts and kept as they are (`Figure`): plotly's own objects, even built without
validation, cost ~3 ms a figure to build and ~7 ms to turn back into a dict for the browser, and the
incremental API (`add_trace`, `add_vrect`, `make_subplots`) re-validates on every call, 10–100× more; either
would break the explorer's 50 ms budget per control change (bench/explorer.py). tests/test_plots.py
validates every figure instead. The template is left empty so that Streamlit's theme applies.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from divviz.evidence import Summary
from divviz.explore import RatioCurves, masked_spans
from divviz.metrics import GLOSSARY, bin_labels

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
BASE_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "font": {"size": 14},
               "legend": {"orientation": "h", "y": -0.2}, "template": {}}


class Figure(go.Figure):
    """A plotly figure that keeps the plain dict it was written as and hands it out from `to_dict`, which is
    all that Streamlit's `st.plotly_chart`, `to_html` and `plotly.io` read of a figure. Numeric arrays go out
    as plotly.js typed arrays, as plotly's own `to_dict` sends them: base64 float64, several times faster to
    encode than JSON lists of floats."""

    def __init__(self, spec: dict):
        super().__init__()
        self._spec = spec

    def to_dict(self) -> dict:
        return _typed_arrays(self._spec)


def _typed_arrays(value):
    """A copy of a figure spec with every 1-D numeric numpy array as {"dtype": "f8", "bdata": base64}."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "fiu":
        return {"dtype": "f8", "bdata": base64.b64encode(value.astype("<f8").tobytes()).decode("ascii")}
    if isinstance(value, dict):
        return {key: _typed_arrays(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_typed_arrays(item) for item in value]
    return value


@dataclass
class Chart:
    figure: Figure
    data: pd.DataFrame


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _rgba(i: int, alpha: float) -> str:
    hex_color = color(i).lstrip("#")
    r, g, b = (int(hex_color[k:k + 2], 16) for k in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _fmt(x: float) -> str:
    return "∞" if np.isinf(x) else f"{x:.4f}"


def _figure(traces: list[dict], layout: dict, shapes: list[dict] = (), annotations: list[dict] = ()) -> Figure:
    full = {**BASE_LAYOUT, **layout, "shapes": list(shapes), "annotations": [*layout.get("annotations", []),
                                                                           *annotations]}
    return Figure({"data": traces, "layout": full})  # tests/test_plots.py validates them


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The CSV data of several runs, one block of rows each."""
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _panels(rows: int, cols: int, titles: list[str], gap: float = 0.07) -> tuple[dict, list[list[tuple[str, str]]]]:
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


def _vline(x: float, xref: str = "x", yref: str = "y", **line) -> dict:
    return {"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "xref": xref, "yref": f"{yref} domain",
            "line": {"color": "grey", "dash": "dot", **line}}


def _hline(y: float, xref: str = "x", yref: str = "y", **line) -> dict:
    return {"type": "line", "y0": y, "y1": y, "x0": 0, "x1": 1, "yref": yref, "xref": f"{xref} domain",
            "line": {"color": "lightgrey", **line}}


def _vrect(x0: float, x1: float, fill: str, xref: str = "x", yref: str = "y", opacity: float = 0.12) -> dict:
    return {"type": "rect", "x0": x0, "x1": x1, "y0": 0, "y1": 1, "xref": xref, "yref": f"{yref} domain",
            "fillcolor": fill, "opacity": opacity, "line": {"width": 0}, "layer": "below"}


def interval_chart(items: list[tuple[str, float, float]]) -> Chart:
    """Each measure's feasible ratio interval [l, u] as a bar around w = 1 (u = ∞ drawn as an arrow)."""
    right = max([u for _, _, u in items if np.isfinite(u)] + [1.5]) * 1.15
    traces, notes = [], []
    for i, (label, lower, upper) in enumerate(items):
        bounded = bool(np.isfinite(upper))
        shown = upper if bounded else right
        traces.append({"type": "scatter", "x": [lower, shown], "y": [label, label], "mode": "lines+markers",
                       "name": label, "line": {"color": color(i), "width": 14, "dash": "solid" if bounded else "dot"},
                       "marker": {"size": 18, "symbol": ["line-ns", "line-ns" if bounded else "arrow-right"],
                                  "line": {"width": 3, "color": color(i)}},
                       "hovertemplate": f"{label}<br>l = {_fmt(lower)}<br>u = {_fmt(upper)}<extra></extra>"})
        notes.append({"x": shown, "y": label, "text": f"  [{_fmt(lower)}, {_fmt(upper)}]", "showarrow": False,
                      "xanchor": "left", "font": {"color": color(i)}})
    layout = {"title": {"text": "Feasible ratio interval [l, u] of each test"}, "showlegend": False,
              "height": 140 + 60 * len(items), "xaxis": {"title": {"text": "ratio w = π_θ / π_old"},
                                                         "range": [0, right * 1.3]},
              "yaxis": {"automargin": True}}
    data = pd.DataFrame([{"measure": lbl, "lower": lo, "upper": up} for lbl, lo, up in items])
    return Chart(_figure(traces, layout, [_vline(1.0, dash="dash")], notes), data)


def sweep_chart(sweeps: list[dict]) -> Chart:
    """One panel per measure: l and u as its own parameter moves, the current value marked.

    Each sweep: {"label", "param", "values", "lower", "upper", "current"}.
    """
    layout, refs = _panels(1, max(1, len(sweeps)), [s["label"] for s in sweeps], gap=0.05)
    traces, shapes, rows = [], [], []
    for i, s in enumerate(sweeps):
        xref, yref = refs[0][i]
        upper = np.where(np.isfinite(s["upper"]), s["upper"], np.nan)
        for name, y, dash in (("u", upper, "solid"), ("l", s["lower"], "dash")):
            traces.append({"type": "scatter", "x": s["values"], "y": y, "mode": "lines", "showlegend": False,
                           "name": f"{s['label']}: {name}", "xaxis": xref, "yaxis": yref,
                           "line": {"color": color(i), "dash": dash, "width": 2.5},
                           "hovertemplate": f"{s['param']} = %{{x:.4g}}<br>{name} = %{{y:.4f}}<extra></extra>"})
        shapes += [_vline(s["current"], xref, yref), _hline(1.0, xref, yref)]
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": s["param"]}
        if i:
            layout[f"yaxis{yref[1:]}"]["matches"] = "y"
        rows += [{"measure": s["label"], "param": s["param"], "value": v, "lower": lo, "upper": up}
                 for v, lo, up in zip(s["values"], s["lower"], s["upper"])]
    layout["yaxis"]["title"] = {"text": "ratio bound"}
    layout.update(title={"text": "How each interval moves with its parameter (solid u, dashed l; dotted: now)"},
                  height=360)
    return Chart(_figure(traces, layout, shapes), pd.DataFrame(rows))


def region_chart(pi_old: np.ndarray, regions: list[tuple[str, np.ndarray, np.ndarray]],
                 marks: list[tuple[str, float, float]] = ()) -> Chart:
    """Feasible band π_new ∈ [l·π_old, min(1, u·π_old)] for each test in the (π_old, π_new) plane, and points
    (label, π_old, π_new) marked on it."""
    traces, data = [], {"pi_old": pi_old}
    for i, (label, lo, hi) in enumerate(regions):
        traces.append({"type": "scatter", "x": pi_old, "y": lo, "mode": "lines", "legendgroup": label,
                       "showlegend": False, "hoverinfo": "skip", "line": {"color": color(i), "width": 1}})
        traces.append({"type": "scatter", "x": pi_old, "y": hi, "mode": "lines", "fill": "tonexty", "name": label,
                       "legendgroup": label, "line": {"color": color(i), "width": 2}, "fillcolor": _rgba(i, 0.15),
                       "hovertemplate": f"{label}<br>π_old = %{{x:.3f}}<br>π_new ≤ %{{y:.3f}}<extra></extra>"})
        data[f"{label} lower"], data[f"{label} upper"] = lo, hi
    traces.append({"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines", "name": "π_new = π_old",
                   "line": {"color": "grey", "dash": "dash"}})
    for j, (label, x, y) in enumerate(marks):
        traces.append({"type": "scatter", "x": [x], "y": [y], "mode": "markers", "name": label,
                       "marker": {"symbol": ("star", "circle-open")[j % 2], "size": 14, "color": "black"},
                       "hovertemplate": f"{label}<br>π_old = %{{x:.4g}}<br>π_new = %{{y:.4g}}<extra></extra>"})
    layout = {"title": {"text": "Feasible region in probability space"}, "height": 520,
              "xaxis": {"title": {"text": "π_old(a|s)"}, "range": [0, 1]},
              "yaxis": {"title": {"text": "π_new(a|s)"}, "range": [0, 1], "scaleanchor": "x"}}
    return Chart(_figure(traces, layout), pd.DataFrame(data))


def surrogate_chart(curves: list[tuple[str, RatioCurves]]) -> Chart:
    """Clipped surrogate and its slope against the ratio for A = +1 and A = −1; masked zones shaded."""
    layout, refs = _panels(2, 2, ["objective −ℓ(w), A = +1", "objective −ℓ(w), A = −1",
                                  "slope d(−ℓ)/dw, A = +1", "slope d(−ℓ)/dw, A = −1"], gap=0.12)
    traces, shapes, data = [], [], {}
    for i, (label, c) in enumerate(curves):
        data["ratio"] = c.ratio
        for col, sign in ((0, +1), (1, -1)):
            for row, series in ((0, c.surrogate[sign]), (1, c.slope[sign])):
                xref, yref = refs[row][col]
                traces.append({"type": "scatter", "x": c.ratio, "y": series, "mode": "lines", "name": label,
                               "legendgroup": label, "showlegend": row == 0 and col == 0, "xaxis": xref,
                               "yaxis": yref, "line": {"color": color(i), "width": 2.5}})
            for start, end in masked_spans(c.ratio, c.masked[sign]):  # one coloured strip per test
                xref, yref = refs[1][col]
                strip = _vrect(start, end, color(i), xref, yref, opacity=0.55)
                strip.update(y0=0.35 + 0.07 * i, y1=0.40 + 0.07 * i)
                shapes += [strip, _vrect(start, end, color(i), xref, yref, opacity=0.05)]
            data[f"{label} objective A={sign:+d}"] = c.surrogate[sign]
            data[f"{label} slope A={sign:+d}"] = c.slope[sign]
            data[f"{label} masked A={sign:+d}"] = c.masked[sign]
    for _, (xref, _) in enumerate(refs[1]):
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": "ratio w"}
    layout.update(height=680, title={"text": "Surrogate and gradient against the ratio"})
    return Chart(_figure(traces, layout, shapes), pd.DataFrame(data))


def gradient_weight_chart(ratio: np.ndarray, curves: list[tuple[str, dict[int, np.ndarray]]]) -> Chart:
    """The gradient weight γ(w) of each objective against the ratio, for A = +1 and A = −1 (∂ℓ/∂log π = −A·γ)."""
    layout, refs = _panels(1, 2, ["γ(w), A = +1", "γ(w), A = −1"], gap=0.08)
    traces, data = [], {"ratio": ratio}
    for i, (label, weight) in enumerate(curves):
        for col, sign in ((0, +1), (1, -1)):
            xref, yref = refs[0][col]
            traces.append({"type": "scatter", "x": ratio, "y": weight[sign], "mode": "lines", "name": label,
                           "legendgroup": label, "showlegend": col == 0, "xaxis": xref, "yaxis": yref,
                           "line": {"color": color(i), "width": 2.5},
                           "hovertemplate": f"w = %{{x:.3f}}<br>γ = %{{y:.4f}}<extra>{label}</extra>"})
            data[f"{label} weight A={sign:+d}"] = weight[sign]
    for xref, _ in refs[0]:
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": "ratio w (a sequence's ratio for sequence-level ones)"}
    layout.update(height=440, title={"text": "Gradient weight against the ratio",
                                     "subtitle": {"text": "∂ℓ/∂log π = −A·γ(w): 0 means no gradient"}})
    return Chart(_figure(traces, layout, [_vline(1.0, refs[0][0][0], refs[0][0][1]),
                                          _vline(1.0, refs[0][1][0], refs[0][1][1])]), pd.DataFrame(data))


def logit_chart(pi_old: np.ndarray, rooms: list[tuple[str, np.ndarray, np.ndarray]]) -> Chart:
    """How far the sampled token's logit may move before clipping, against π_old (softmax head)."""
    traces, data = [], {"pi_old": pi_old}
    for i, (label, d_min, d_max) in enumerate(rooms):
        for y, dash, show, name in ((d_max, "solid", True, "Δ_max"), (d_min, "dash", False, "Δ_min")):
            traces.append({"type": "scatter", "x": pi_old, "y": np.where(np.isfinite(y), y, np.nan), "mode": "lines",
                           "name": label, "legendgroup": label, "showlegend": show,
                           "line": {"color": color(i), "width": 2.5, "dash": dash},
                           "hovertemplate": f"π_old = %{{x:.3f}}<br>{name} = %{{y:.3f}}<extra>{label}</extra>"})
        data[f"{label} max logit shift"], data[f"{label} min logit shift"] = d_max, d_min
    layout = {"height": 440, "title": {"text": "Logit room before the clip binds",
                                        "subtitle": {"text": "solid: up, dashed: down"}},
              "xaxis": {"title": {"text": "π_old(a|s)"}}, "yaxis": {"title": {"text": "logit shift Δ"}}}
    return Chart(_figure(traces, layout, [_hline(0.0)]), pd.DataFrame(data))


def kl3_bounds_chart(deltas: np.ndarray, exact: tuple, series2: tuple, series5: tuple, current: float) -> Chart:
    """Left: l_δ and u_δ from Lambert W against δ, with the series. Right: the series' error, log-log."""
    layout, refs = _panels(1, 2, ["bounds (solid: Lambert W; dotted: series to s²; dashed: to s⁵)",
                                  "|series − Lambert W|"], gap=0.08)
    traces = []
    for i, (name, (lo, hi), dash) in enumerate((("Lambert W", exact, "solid"), ("series to s²", series2, "dot"),
                                                ("series to s⁵", series5, "dash"))):
        for edge, y, ex in (("u_δ", hi, exact[1]), ("l_δ", lo, exact[0])):
            traces.append({"type": "scatter", "x": deltas, "y": y, "mode": "lines", "name": f"{edge}: {name}",
                           "legendgroup": name, "showlegend": edge == "u_δ",
                           "line": {"color": color(i), "dash": dash, "width": 3 if i == 0 else 2}})
            if i:
                traces.append({"type": "scatter", "x": deltas, "y": np.abs(y - ex), "mode": "lines",
                               "name": f"{edge}: {name}", "legendgroup": name, "showlegend": False,
                               "xaxis": "x2", "yaxis": "y2", "line": {"color": color(i), "dash": dash, "width": 2}})
    layout["xaxis"].update(title={"text": "δ"}, type="log")
    layout["xaxis2"].update(title={"text": "δ"}, type="log")
    layout["yaxis"].update(title={"text": "ratio bound"})
    layout["yaxis2"].update(type="log", exponentformat="power")
    layout.update(height=440, title={"text": "KL3 bounds against δ (s = √(2δ))"})
    data = pd.DataFrame({"delta": deltas, "l_exact": exact[0], "u_exact": exact[1], "l_series2": series2[0],
                         "u_series2": series2[1], "l_series5": series5[0], "u_series5": series5[1]})
    marks = [_vline(float(np.log10(current))), _vline(float(np.log10(current)), "x2", "y2")]
    return Chart(_figure(traces, layout, marks), data)


def k3_level_chart(ratio: np.ndarray, k3_values: np.ndarray, delta: float, bounds: tuple[float, float],
                   boxes: list[tuple[str, float, float]]) -> Chart:
    """k3(w) = w − 1 − log w, the level δ, and where it cuts: the asymmetric interval, with PPO/DAPO boxes."""
    lower, upper = bounds
    traces = [{"type": "scatter", "x": ratio, "y": k3_values, "mode": "lines", "name": "k3(w) = w − 1 − log w",
               "line": {"color": "black", "width": 3}},
              {"type": "scatter", "x": [lower, upper], "y": [delta, delta], "mode": "markers+text",
               "name": f"KL3 interval at δ = {delta:g}", "text": [f"l = {lower:.4f}", f"u = {upper:.4f}"],
               "textposition": ["top left", "top right"], "marker": {"color": color(1), "size": 12}}]
    shapes = [_vrect(lower, upper, color(1)), _hline(delta, color=color(1), dash="dash")]
    for i, (label, lo, hi) in enumerate(boxes):
        shapes += [_vline(lo, color=color(i + 2)), _vline(hi, color=color(i + 2))]
        traces.append({"type": "scatter", "x": [lo, hi], "y": [0, 0], "mode": "markers", "name": label,
                       "marker": {"color": color(i + 2), "size": 14, "symbol": "diamond"}})
    layout = {"height": 440, "title": {"text": "The KL3 test is a ratio interval, wider above 1 than below"},
              "xaxis": {"title": {"text": "ratio w"}},
              "yaxis": {"title": {"text": "k3(w)"}, "range": [0, max(3 * delta, 0.05)]}}
    return Chart(_figure(traces, layout, shapes), pd.DataFrame({"ratio": ratio, "k3": k3_values}))


def bandit_distribution_chart(initial: np.ndarray, rewards: np.ndarray, finals: list[tuple[str, Summary]],
                              max_actions: int = 60) -> Chart:
    """π_0 and each objective's final π over actions (sorted by π_0), the mean over seeds with its interval as
    error bars; rewarded actions (of the first seed, where rewards are random) marked."""
    k = len(rewards)
    shown = np.arange(min(k, max_actions))
    traces = [{"type": "bar", "x": shown, "y": initial[shown], "name": "π_0 (start)", "marker": {"color": "lightgrey"}}]
    data = {"action (rank under π_0)": shown, "reward": rewards[shown], "pi_0": initial[shown]}
    for i, (label, final) in enumerate(finals):
        trace = {"type": "scatter", "x": shown, "y": final.mean[shown], "mode": "lines+markers",
                 "name": f"{label}: final" + (f" (mean of {final.n})" if final.n > 1 else ""), "line": {"color": color(i)}}
        if final.n > 1:
            trace["error_y"] = _error_bars(final, shown)
        traces.append(trace)
        data.update(_summary_columns(f"{label} final", final, shown))
    rewarded = shown[rewards[shown] >= 0.5]
    traces.append({"type": "scatter", "x": rewarded, "y": np.zeros(len(rewarded)), "mode": "markers",
                   "name": "reward ≥ 0.5", "marker": {"symbol": "star", "size": 13, "color": "gold",
                                                      "line": {"color": "black", "width": 1}}})
    title = "Distribution before and after" + (f" (first {max_actions} of {k} actions)" if k > max_actions else "")
    layout = {"height": 440, "title": {"text": title}, "xaxis": {"title": {"text": "action, ranked by π_0"}},
              "yaxis": {"title": {"text": "probability"}}}
    return Chart(_figure(traces, layout), pd.DataFrame(data))


def _error_bars(summary: Summary, pick=slice(None)) -> dict:
    """Plotly's asymmetric error bars from a summary's interval."""
    return {"type": "data", "symmetric": False, "array": summary.high[pick] - summary.mean[pick],
            "arrayminus": summary.mean[pick] - summary.low[pick], "thickness": 1.2, "width": 3}


def _summary_columns(name: str, summary: Summary, pick=slice(None)) -> dict:
    """CSV columns of a summary: the mean, and with several seeds its interval and n."""
    if summary.n < 2:
        return {name: summary.mean[pick]}
    return {name: summary.mean[pick], f"{name} low": summary.low[pick], f"{name} high": summary.high[pick],
            f"{name} n": summary.n}


def history_chart(series: list[tuple[str, dict[str, np.ndarray | Summary]]], metrics: tuple[str, ...], x_title: str,
                  title: str, members: dict[str, list[dict[str, np.ndarray]]] | None = None) -> Chart:
    """Metrics over steps, one panel per metric, one line per run or measure: [(label, {metric: values})]. A
    `Summary` is drawn as its mean with a shaded 95% band; `members` ({label: [one run's {metric: values}]}) are
    drawn thin under their label's line."""
    layout, refs = _panels(1, len(metrics), [m.removeprefix("clip_ratio/") for m in metrics], gap=0.05)
    traces, frames = [], []
    for i, (label, history) in enumerate(series):
        columns, steps = {}, None
        for j, metric in enumerate(metrics):
            xref, yref = refs[0][j]
            value = history[metric]
            summary = value if isinstance(value, Summary) else None
            mean = np.asarray(summary.mean if summary else value, dtype=np.float64)
            steps = np.arange(1, len(mean) + 1)
            axes = {"xaxis": xref, "yaxis": yref, "legendgroup": label}
            for member in (members or {}).get(label, []):
                traces.append({"type": "scatter", "x": steps, "y": np.asarray(member[metric], dtype=np.float64),
                               "mode": "lines", "showlegend": False, "hoverinfo": "skip", **axes,
                               "line": {"color": _rgba(i, 0.35), "width": 1}})
            if summary is not None and summary.n > 1:
                traces += _band(steps, summary, i, axes)
            traces.append({"type": "scatter", "x": steps, "y": mean, "mode": "lines", "name": label,
                           "showlegend": j == 0, **axes, "line": {"color": color(i), "width": 2.5},
                           "hovertemplate": f"{metric}: %{{y:.4f}}<br>{GLOSSARY.get(metric, '')}"
                                            f"<extra>{label}</extra>"})
            columns.update(_summary_columns(metric, summary) if summary else {metric: mean})
        frames.append(pd.DataFrame({"run": label, x_title: steps, **columns}))
    for xref, _ in refs[0]:
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": x_title}
    layout.update(height=380, title={"text": title})
    return Chart(_figure(traces, layout), _concat(frames))


def _band(x: np.ndarray, summary: Summary, i: int, axes: dict) -> list[dict]:
    """A shaded band between a summary's low and high (two traces: the upper edge, then the lower filled to it)."""
    edge = {"type": "scatter", "x": x, "mode": "lines", "line": {"width": 0}, "showlegend": False,
            "hoverinfo": "skip", **axes}
    return [{**edge, "y": summary.high},
            {**edge, "y": summary.low, "fill": "tonexty", "fillcolor": _rgba(i, 0.18)}]


def mass_shift_chart(series: list[tuple[str, Summary]]) -> Chart:
    """Where probability mass went: Σ(π_final − π_0) over actions binned by their π_0 (mean and interval)."""
    return mass_bins_chart(series, "Mass reallocation: Σ Δπ over actions, by the probability they started with",
                           x_title="π_0 of the action", y_title="Σ (π_final − π_0)", bin_column="pi_0 bin",
                           height=400)


CLIP_STATES = {0: ("inside / kept", "#7f7f7f"), 1: ("clipped low (A < 0)", "#1f77b4"),
               2: ("clipped high (A > 0)", "#d62728"), 3: ("dual-clipped", "#ff7f0e")}


def token_scatter(runs: list[tuple[str, dict, tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> Chart:
    """Per-token (π_old, ratio) of one step, coloured by clip state, with each measure's boundary l(π_old),
    u(π_old) drawn over it. runs: [(label, tokens, (pi_grid, lower, upper))]."""
    traces, frames = [], []
    state_names = np.array([name for name, _ in CLIP_STATES.values()])
    for i, (label, tokens, (grid, lower, upper)) in enumerate(runs):
        for state, (name, colour) in CLIP_STATES.items():
            pick = tokens["state"] == state
            if not pick.any():
                continue
            traces.append({"type": "scatter", "x": tokens["pi_old"][pick], "y": tokens["ratio"][pick],
                           "mode": "markers", "name": f"{label}: {name}", "legendgroup": label,
                           "marker": {"color": colour, "size": 6, "opacity": 0.6,
                                      "symbol": ["circle", "diamond", "square", "triangle-up"][i % 4]},
                           "hovertemplate": "π_old %{x:.3f}<br>w %{y:.3f}<extra>" + label + "</extra>"})
        for edge, values in (("u", upper), ("l", lower)):
            traces.append({"type": "scatter", "x": grid, "y": np.where(np.isfinite(values), values, np.nan),
                           "mode": "lines", "name": f"{label}: {edge}(π_old)", "legendgroup": label,
                           "showlegend": edge == "u", "line": {"color": color(i), "width": 2, "dash": "dash"}})
        frames.append(pd.DataFrame({"run": label, "pi_old": tokens["pi_old"], "ratio": tokens["ratio"],
                                    "adv": tokens["adv"], "state": state_names[tokens["state"].astype(int)]}))
    layout = {"height": 480, "title": {"text": "Tokens of one step: π_old against the ratio, with each measure's "
                                               "feasible region"},
              "xaxis": {"title": {"text": "π_old of the sampled token"}, "range": [0, 1]},
              "yaxis": {"title": {"text": "ratio w at the last inner step"}}}
    return Chart(_figure(traces, layout, [_hline(1.0)]), _concat(frames))


def mass_bins_chart(series: list[tuple[str, np.ndarray | Summary]], title: str,
                    x_title: str = "π_old of the sampled token", y_title: str = "Δπ per token",
                    bin_column: str = "pi_old bin", height: int = 380) -> Chart:
    """Bars of a per-π_old-bin quantity, one group per run: [(label, values per bin)]; a `Summary` gets error bars."""
    labels = bin_labels()
    traces, data = [], {bin_column: labels}
    for i, (label, values) in enumerate(series):
        summary = values if isinstance(values, Summary) else None
        trace = {"type": "bar", "x": labels, "y": summary.mean if summary else values, "name": label,
                 "marker": {"color": color(i)}}
        if summary is not None and summary.n > 1:
            trace["error_y"] = _error_bars(summary)
        traces.append(trace)
        data.update(_summary_columns(label, summary) if summary else {label: values})
    layout = {"height": height, "barmode": "group", "title": {"text": title},
              "xaxis": {"title": {"text": x_title}}, "yaxis": {"title": {"text": y_title}}}
    return Chart(_figure(traces, layout, [_hline(0.0, color="grey")]), pd.DataFrame(data))


def probability_shift_scatter(series: list[tuple[str, np.ndarray, np.ndarray]]) -> Chart:
    """π_old against π_new of the same tokens under each objective: above the diagonal, the update raised the
    token. series: [(label, pi_old, pi_new)]."""
    traces, frames = [], []
    for i, (label, before, after) in enumerate(series):
        traces.append({"type": "scatter", "x": before, "y": after, "mode": "markers", "name": label,
                       "marker": {"color": color(i), "size": 5, "opacity": 0.5}})
        frames.append(pd.DataFrame({"objective": label, "pi_old": before, "pi_new": after}))
    traces.append({"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines", "name": "unchanged",
                   "line": {"color": "grey", "dash": "dash"}})
    layout = {"height": 480, "title": {"text": "Each token's probability before and after the update, same batch"},
              "xaxis": {"title": {"text": "π_old"}, "range": [0, 1]},
              "yaxis": {"title": {"text": "π after μ steps"}, "range": [0, 1]}}
    return Chart(_figure(traces, layout), _concat(frames))
