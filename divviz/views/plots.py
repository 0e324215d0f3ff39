"""The explorer's charts: pure functions from computed data to plotly figures (no Streamlit, no maths beyond
layout) for the Clipping regions and KL3 pages. Each returns a `figures.Chart`: the figure and the table behind it,
so the app can offer both a PNG/HTML of the figure and a CSV of exactly the numbers drawn. The training and bandit
charts are in `run_plots.py`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from divviz.loss_grids import RatioCurves, masked_spans
from divviz.views.figures import Chart, color, figure, fmt, hline, panels, rgba, vline, vrect

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
                       "hovertemplate": f"{label}<br>l = {fmt(lower)}<br>u = {fmt(upper)}<extra></extra>"})
        notes.append({"x": shown, "y": label, "text": f"  [{fmt(lower)}, {fmt(upper)}]", "showarrow": False,
                      "xanchor": "left", "font": {"color": color(i)}})
    layout = {"title": {"text": "Feasible ratio interval [l, u] of each test"}, "showlegend": False,
              "height": 140 + 60 * len(items), "xaxis": {"title": {"text": "ratio w = π_θ / π_old"},
                                                         "range": [0, right * 1.3]},
              "yaxis": {"automargin": True}}
    data = pd.DataFrame([{"measure": lbl, "lower": lo, "upper": up} for lbl, lo, up in items])
    return Chart(figure(traces, layout, [vline(1.0, dash="dash")], notes), data)


def sweep_chart(sweeps: list[dict]) -> Chart:
    """One panel per measure: l and u as its own parameter moves, the current value marked.

    Each sweep: {"label", "param", "values", "lower", "upper", "current"}.
    """
    layout, refs = panels(1, max(1, len(sweeps)), [s["label"] for s in sweeps], gap=0.05)
    traces, shapes, rows = [], [], []
    for i, s in enumerate(sweeps):
        xref, yref = refs[0][i]
        upper = np.where(np.isfinite(s["upper"]), s["upper"], np.nan)
        for name, y, dash in (("u", upper, "solid"), ("l", s["lower"], "dash")):
            traces.append({"type": "scatter", "x": s["values"], "y": y, "mode": "lines", "showlegend": False,
                           "name": f"{s['label']}: {name}", "xaxis": xref, "yaxis": yref,
                           "line": {"color": color(i), "dash": dash, "width": 2.5},
                           "hovertemplate": f"{s['param']} = %{{x:.4g}}<br>{name} = %{{y:.4f}}<extra></extra>"})
        shapes += [vline(s["current"], xref, yref), hline(1.0, xref, yref)]
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": s["param"]}
        if i:
            layout[f"yaxis{yref[1:]}"]["matches"] = "y"
        rows += [{"measure": s["label"], "param": s["param"], "value": v, "lower": lo, "upper": up}
                 for v, lo, up in zip(s["values"], s["lower"], s["upper"])]
    layout["yaxis"]["title"] = {"text": "ratio bound"}
    layout.update(title={"text": "How each interval moves with its parameter (solid u, dashed l; dotted: now)"},
                  height=360)
    return Chart(figure(traces, layout, shapes), pd.DataFrame(rows))


def region_chart(pi_old: np.ndarray, regions: list[tuple[str, np.ndarray, np.ndarray]],
                 marks: list[tuple[str, float, float]] = ()) -> Chart:
    """Feasible band π_new ∈ [l·π_old, min(1, u·π_old)] for each test in the (π_old, π_new) plane, and points
    (label, π_old, π_new) marked on it."""
    traces, data = [], {"pi_old": pi_old}
    for i, (label, lo, hi) in enumerate(regions):
        traces.append({"type": "scatter", "x": pi_old, "y": lo, "mode": "lines", "legendgroup": label,
                       "showlegend": False, "hoverinfo": "skip", "line": {"color": color(i), "width": 1}})
        traces.append({"type": "scatter", "x": pi_old, "y": hi, "mode": "lines", "fill": "tonexty", "name": label,
                       "legendgroup": label, "line": {"color": color(i), "width": 2}, "fillcolor": rgba(i, 0.15),
                       "hovertemplate": f"{label}<br>π_old = %{{x:.3f}}<br>π_new ≤ %{{y:.3f}}<extra></extra>"})
        data[f"{label} lower"], data[f"{label} upper"] = lo, hi
    traces.append({"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines", "name": "π_new = π_old",
                   "line": {"color": "grey", "dash": "dash"}})
    for j, (label, x, y) in enumerate(marks):  # named with where they are: a confident token sits in the (1, 1) corner
        traces.append({"type": "scatter", "x": [x], "y": [y], "mode": "markers", "name": f"{label} ({x:.4g}, {y:.4g})",
                       "cliponaxis": False, "marker": {"symbol": ("star", "circle-open")[j % 2], "size": 14,
                                                       "color": "black", "line": {"color": "white", "width": 1}},
                       "hovertemplate": f"{label}<br>π_old = %{{x:.4g}}<br>π_new = %{{y:.4g}}<extra></extra>"})
    edges = [-0.02, 1.02]  # a little past [0, 1], so that a mark on an edge or corner shows whole
    layout = {"title": {"text": "Feasible region in probability space"}, "height": 520,
              "xaxis": {"title": {"text": "π_old(a|s)"}, "range": edges, "constrain": "domain"},
              "yaxis": {"title": {"text": "π_new(a|s)"}, "range": edges, "scaleanchor": "x", "constrain": "domain"}}
    # square, shrinking the plot in a wide column rather than stretching the probability axis past [0, 1]
    return Chart(figure(traces, layout), pd.DataFrame(data))


def surrogate_chart(curves: list[tuple[str, RatioCurves]]) -> Chart:
    """Clipped surrogate and its slope against the ratio for A = +1 and A = −1; masked zones shaded."""
    layout, refs = panels(2, 2, ["objective −ℓ(w), A = +1", "objective −ℓ(w), A = −1",
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
                strip = vrect(start, end, color(i), xref, yref, opacity=0.55)
                strip.update(y0=0.35 + 0.07 * i, y1=0.40 + 0.07 * i)
                shapes += [strip, vrect(start, end, color(i), xref, yref, opacity=0.05)]
            data[f"{label} objective A={sign:+d}"] = c.surrogate[sign]
            data[f"{label} slope A={sign:+d}"] = c.slope[sign]
            data[f"{label} masked A={sign:+d}"] = c.masked[sign]
    for _, (xref, _) in enumerate(refs[1]):
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": "ratio w"}
    layout.update(height=680, title={"text": "Surrogate and gradient against the ratio"})
    return Chart(figure(traces, layout, shapes), pd.DataFrame(data))


def gradient_weight_chart(ratio: np.ndarray, curves: list[tuple[str, dict[int, np.ndarray]]]) -> Chart:
    """The gradient weight γ(w) of each objective against the ratio, for A = +1 and A = −1 (∂ℓ/∂log π = −A·γ)."""
    layout, refs = panels(1, 2, ["γ(w), A = +1", "γ(w), A = −1"], gap=0.08)
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
    return Chart(figure(traces, layout, [vline(1.0, refs[0][0][0], refs[0][0][1]),
                                          vline(1.0, refs[0][1][0], refs[0][1][1])]), pd.DataFrame(data))


def penalty_chart(ratio: np.ndarray, curves: list[tuple[str, np.ndarray, np.ndarray]], anchor: float) -> Chart:
    """Each penalty's value and the slope of its loss term in log π_θ against r = π_θ/π_anchor."""
    layout, refs = panels(1, 2, ["value", "slope ∂/∂log π_θ (what β multiplies in the gradient)"], gap=0.08)
    traces, data = [], {"ratio": ratio}
    for i, (label, value, slope) in enumerate(curves):
        for col, (ys, what) in enumerate(((value, "value"), (slope, "slope"))):
            xref, yref = refs[0][col]
            traces.append({"type": "scatter", "x": ratio, "y": ys, "mode": "lines", "name": label, "legendgroup": label,
                           "showlegend": col == 0, "xaxis": xref, "yaxis": yref, "line": {"color": color(i), "width": 2.5},
                           "hovertemplate": f"r = %{{x:.3f}}<br>{what} = %{{y:.4g}}<extra>{label}</extra>"})
            data[f"{label} {what}"] = ys
    for xref, _ in refs[0]:
        layout[f"xaxis{xref[1:]}"]["title"] = {"text": f"r = π_θ / π_ref (or π_old), at π_ref = {anchor:g}"}
    layout.update(height=440, title={"text": "Penalties against the ratio to their anchor",
                                     "subtitle": {"text": "a positive slope pushes log π_θ down, toward the anchor"}},
                  margin={**layout.get("margin", {}), "t": 95})  # the subtitle above the panels' own titles
    return Chart(figure(traces, layout, [vline(1.0, *refs[0][0]), vline(1.0, *refs[0][1])]), pd.DataFrame(data))


def correction_chart(rho: np.ndarray, curves: list[tuple[str, np.ndarray]]) -> Chart:
    """Each rollout correction's multiplier on a token's policy term against ρ = π_old/π_roll (log axis)."""
    traces, data = [], {"rho": rho}
    for i, (label, multiplier) in enumerate(curves):
        traces.append({"type": "scatter", "x": rho, "y": multiplier, "mode": "lines", "name": label,
                       "line": {"color": color(i), "width": 2.5, "shape": "hv"},
                       "hovertemplate": f"ρ = %{{x:.3f}}<br>multiplier = %{{y:.4g}}<extra>{label}</extra>"})
        data[label] = multiplier
    layout = {"height": 400, "title": {"text": "Rollout corrections: what multiplies a token's policy term",
                                        "subtitle": {"text": "ρ = π_old/π_roll, the trained policy over the sampler; "
                                                             "0 where the token is dropped or rejected"}},
              "xaxis": {"title": {"text": "ρ = π_old / π_roll"}, "type": "log"},
              "yaxis": {"title": {"text": "multiplier of the policy term"}}}
    return Chart(figure(traces, layout, [vline(1.0)]), pd.DataFrame(data))


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
    return Chart(figure(traces, layout, [hline(0.0)]), pd.DataFrame(data))


def kl3_bounds_chart(deltas: np.ndarray, exact: tuple, series2: tuple, series5: tuple, current: float) -> Chart:
    """Left: l_δ and u_δ from Lambert W against δ, with the series. Right: the series' error, log-log."""
    layout, refs = panels(1, 2, ["bounds (solid: Lambert W; dotted: series to s²; dashed: to s⁵)",
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
    marks = [vline(float(np.log10(current))), vline(float(np.log10(current)), "x2", "y2")]
    return Chart(figure(traces, layout, marks), data)


def k3_level_chart(ratio: np.ndarray, k3_values: np.ndarray, delta: float, bounds: tuple[float, float],
                   boxes: list[tuple[str, float, float]]) -> Chart:
    """k3(w) = w − 1 − log w, the level δ, and where it cuts: the asymmetric interval, with PPO/DAPO boxes."""
    lower, upper = bounds
    traces = [{"type": "scatter", "x": ratio, "y": k3_values, "mode": "lines", "name": "k3(w) = w − 1 − log w",
               "line": {"color": "black", "width": 3}},
              {"type": "scatter", "x": [lower, upper], "y": [delta, delta], "mode": "markers+text",
               "name": f"KL3 interval at δ = {delta:g}", "text": [f"l = {lower:.4f}", f"u = {upper:.4f}"],
               "textposition": ["bottom left", "bottom right"],  # beside the curve, not on it
               "marker": {"color": color(1), "size": 12}}]
    shapes = [vrect(lower, upper, color(1)), hline(delta, color=color(1), dash="dash")]
    for i, (label, lo, hi) in enumerate(boxes):
        shapes += [vline(lo, color=color(i + 2)), vline(hi, color=color(i + 2))]
        traces.append({"type": "scatter", "x": [lo, hi], "y": [0, 0], "mode": "markers", "name": label,
                       "marker": {"color": color(i + 2), "size": 14, "symbol": "diamond"}})
    layout = {"height": 440, "title": {"text": "The KL3 test is a ratio interval, wider above 1 than below"},
              "xaxis": {"title": {"text": "ratio w"}},
              "yaxis": {"title": {"text": "k3(w)"}, "range": [0, max(3 * delta, 0.05)]}}
    return Chart(figure(traces, layout, shapes), pd.DataFrame({"ratio": ratio, "k3": k3_values}))
