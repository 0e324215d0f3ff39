"""The charts of runs: the bandit's and training's curves with their seed bands, mass reallocation, token
scatters. Pure functions from computed data to plotly figures, each a `figures.Chart` (figure and the numbers drawn);
the explorer's charts are in `plots.py`."""

from __future__ import annotations

import html
from collections import Counter

import numpy as np
import pandas as pd

from divviz.evidence.intervals import Summary
from divviz.views.figures import BUCKETS, GL_POINTS, Chart, color, concat, figure, hline, panels, rgba, thinned, vline
from divviz.metrics import GLOSSARY, bin_labels

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
    return Chart(figure(traces, layout), pd.DataFrame(data))


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


PANEL_TITLES = {"rollout_corr/rollout_is_eff_sample_size": "IS eff. sample size", "rollout_corr/rollout_is_mean":
                "IS weight, mean", "rollout_corr/rollout_rs_masked_fraction": "rejected share",
                "rollout_corr/k3_kl": "k3 KL, sampler", "clip_ratio/first_step_past_high": "past u after step 1",
                "clip_ratio/overshoot_mean": "overshoot", "initial_top_mass": "mass of π_0's top"}
SHOWN_IF_NONZERO = ("clip_ratio/first_step_past_high", "rollout_corr/rollout_rs_masked_fraction")  # diagnostics:
# a panel only when something happened (a step past u at once, a rejection), not a flat line at 0 every time


def panel_title(metric: str) -> str:
    """A panel's title short enough for a quarter of the chart's width."""
    return PANEL_TITLES.get(metric, metric.removeprefix("clip_ratio/").removeprefix("rollout_corr/"))


def _nonzero(value) -> bool:
    values = np.asarray(value.mean if isinstance(value, Summary) else value, dtype=np.float64)
    return bool(np.nan_to_num(np.abs(values)).max(initial=0.0) > 0)


def history_chart(series: list[tuple[str, dict[str, np.ndarray | Summary]]], metrics: tuple[str, ...], x_title: str,
                  title: str, members: dict[str, list[dict[str, np.ndarray]]] | None = None,
                  colours: list[int] | None = None) -> Chart:
    """Metrics over steps, one panel per metric, one line per run or measure: [(label, {metric: values})]. A
    `Summary` is drawn as its mean with a shaded 95% band; `members` ({label: [one run's {metric: values}]}) are
    drawn thin under their label's line. `colours`: each series' palette index (default: its place), so that a
    measure keeps its colour in a chart that leaves another one out.

    Means and bands are computed on every step (by the caller); a series longer than 2 × `BUCKETS` steps is drawn
    thinned to each bucket's extremes (`figures.thinned`), with WebGL past `GL_POINTS` points, while the chart's
    data and its HTML export (`Chart.export`) keep every point."""
    metrics = tuple(m for m in metrics if m not in SHOWN_IF_NONZERO or any(_nonzero(h[m]) for _, h in series))
    layout, refs = panels(1, len(metrics), [panel_title(m) for m in metrics], gap=0.05)
    drawn, tables = [], []  # each (series, metric)'s line: its arguments to `_series_traces`; each series' columns
    for k, (label, history) in enumerate(series):
        i = k if colours is None else colours[k]
        columns, steps = {}, None
        for j, metric in enumerate(metrics):
            value = history[metric]
            summary = value if isinstance(value, Summary) else None
            mean = np.asarray(summary.mean if summary else value, dtype=np.float64)
            steps = steps if steps is not None and len(steps) == len(mean) else np.arange(1, len(mean) + 1)
            drawn.append({"label": label, "metric": metric, "colour": i, "first": j == 0, "xref": refs[0][j][0],
                          "yref": refs[0][j][1], "steps": steps, "mean": mean,
                          "band": summary if summary is not None and summary.n > 1 else None,
                          "members": [np.asarray(m[metric], dtype=np.float64) for m in (members or {}).get(label, [])]})
            columns.update(_summary_columns(metric, summary) if summary else {metric: mean})
        tables.append({"run": label, x_title: steps, **columns})
    longest = max((len(line["steps"]) for line in drawn), default=0)
    for xref, _ in refs[0]:  # whole steps: no tick at 1.5; one tick per step while there are few
        layout[f"xaxis{xref[1:]}"].update(title={"text": x_title}, tickformat="d", **({"dtick": 1} if longest <= 12 else {}))
    hidden = coinciding(drawn)
    layout.update(height=380, title={"text": title + (f"<br><sup>{hidden}</sup>" if hidden else "")})
    traces = lambda thin: [t for line in drawn for t in _series_traces(**line, thin=thin)]  # noqa: E731
    thinned_any = any(len(line["steps"]) > 2 * BUCKETS for line in drawn)  # then the export keeps every point
    return Chart(figure(traces(True), layout), lambda: concat([pd.DataFrame(table) for table in tables]),
                 figure(traces(False), layout) if thinned_any else None)


def coinciding(drawn: list[dict]) -> str:
    """A note naming the series whose curves coincide with a later one's in every panel (drawn underneath, they would
    be invisible): "ratio ε=0.2 lies under kl3 δ=0.05 (identical values)", or ""."""
    curves: dict[str, list[np.ndarray]] = {}
    for line in drawn:
        curves.setdefault(line["label"], []).append(line["mean"])
    labels, notes = list(curves), []
    for i, first in enumerate(labels):
        covering = [later for later in labels[i + 1:] if len(curves[later]) == len(curves[first]) and all(
            a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(curves[first], curves[later]))]
        if covering:
            notes.append(f"{html.escape(first)} lies under {html.escape(covering[-1])}")
    return f"{'; '.join(notes)} (identical values)" if notes else ""


MARKED_BELOW = 12  # a mean with at most this many points has a marker at each


def _series_traces(label, metric, colour, first, xref, yref, steps, mean, band, members, thin: bool,
                   dashed: bool = False, notes: list[str] | None = None) -> list[dict]:
    """One series' traces in one panel: its members thin, its band, its mean (dotted if `dashed`: one seed, no
    band; `notes`, one per step, added to its hover); thinned for display if `thin`."""
    axes = {"xaxis": xref, "yaxis": yref, "legendgroup": label}

    def line(x, y, **rest):
        kind = "scattergl" if len(x) > GL_POINTS else "scatter"
        return {"type": kind, "x": x, "y": y, "mode": "lines", **axes, **rest}

    traces = []
    for member in members:
        pick = thinned(member) if thin else slice(None)
        traces.append(line(steps[pick], member[pick], showlegend=False, hoverinfo="skip",
                           line={"color": rgba(colour, 0.35), "width": 1}))
    pick = thinned(mean, *((band.low, band.high) if band is not None else ())) if thin else slice(None)
    if band is not None:  # one closed polygon, along the upper edge and back along the lower (one trace, not two)
        x = steps[pick]
        traces.append(line(np.concatenate([x, x[::-1]]),
                           np.concatenate([np.asarray(band.high)[pick], np.asarray(band.low)[pick][::-1]]),
                           fill="toself", fillcolor=rgba(colour, 0.18), line={"width": 0}, showlegend=False,
                           hoverinfo="skip"))
    sparse = len(steps[pick]) <= MARKED_BELOW  # a few readings (held-out evaluations) show as points on the line
    traces.append(line(steps[pick], mean[pick], name=label, showlegend=first, mode="lines+markers" if sparse else "lines",
                       line={"color": color(colour), "width": 2.5, **({"dash": "dot"} if dashed else {})},
                       hovertemplate=f"{metric}: %{{y:.4f}}{'%{customdata}' if notes else ''}<br>"
                                     f"{GLOSSARY.get(metric, '')}<extra>{label}</extra>",
                       **({"customdata": [notes[i] for i in np.arange(len(steps))[pick]]} if notes else {})))
    return traces


def mass_shift_chart(series: list[tuple[str, Summary]]) -> Chart:
    """Where probability mass went: Σ(π_final − π_0) over actions binned by their π_0 (mean and interval)."""
    return mass_bins_chart(series, "Mass reallocation: Σ Δπ over actions, by the probability they started with",
                           x_title="π_0 of the action", y_title="Σ (π_final − π_0)", bin_column="pi_0 bin",
                           height=400)


CLIP_STATES = {0: ("inside", "#7f7f7f"), 1: ("masked low (A < 0)", "#1f77b4"),
               2: ("masked high (A > 0)", "#d62728"), 3: ("dual-clip", "#ff7f0e")}


SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star", "cross", "pentagon")


def token_scatter(runs: list[tuple[str, str, dict, tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> Chart:
    """Per-token (π_old, ratio) of one step: colour = clip state, marker = measure (its seeds share it), and each
    measure's boundary l(π_old), u(π_old) once, in the measure's colour. The ratio axis is logarithmic, so that a
    token at w ≈ 12 does not flatten the others into a band at 1. The legend says what each colour, marker and
    line is, once. runs: [(measure label, run label, tokens, (pi_grid, lower, upper))]."""
    traces, frames, lines = [], [], []
    state_names = np.array([name for name, _ in CLIP_STATES.values()])
    measures = list(dict.fromkeys(measure for measure, *_ in runs))
    for measure, run, tokens, (grid, lower, upper) in runs:
        j = measures.index(measure)
        for state, (name, colour) in CLIP_STATES.items():
            pick = tokens["state"] == state
            if pick.any():
                traces.append({"type": "scatter", "x": tokens["pi_old"][pick], "y": tokens["ratio"][pick],
                               "mode": "markers", "name": f"{run}: {name}", "showlegend": False,
                               "marker": {"color": colour, "size": 6, "opacity": 0.6,
                                          "symbol": SYMBOLS[j % len(SYMBOLS)]},
                               "hovertemplate": f"π_old %{{x:.3f}}<br>w %{{y:.3f}}<br>{name}<extra>{run}</extra>"})
        if measure not in lines:
            lines.append(measure)
            for edge, values in (("u", upper), ("l", lower)):
                traces.append({"type": "scatter", "x": grid, "y": np.where(np.isfinite(values) & (values > 0), values,
                                                                         np.nan),
                               "mode": "lines", "name": f"{measure}: l and u", "legendgroup": f"bound:{measure}",
                               "showlegend": edge == "u", "line": {"color": color(j), "width": 2, "dash": "dash"}})
        frames.append(pd.DataFrame({"run": run, "measure": measure, "pi_old": tokens["pi_old"],
                                    "ratio": tokens["ratio"], "adv": tokens["adv"],
                                    "state": state_names[tokens["state"].astype(int)]}))
    shown = {int(s) for *_, tokens, _ in runs for s in np.unique(tokens["state"])}
    keys = [{"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name,
             "marker": {"color": colour, "size": 9}} for state, (name, colour) in CLIP_STATES.items() if state in shown]
    keys += [{"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": f"marker: {measure}",
              "marker": {"color": "#555", "size": 9, "symbol": SYMBOLS[j % len(SYMBOLS)]}}
             for j, measure in enumerate(measures)] if len(measures) > 1 else []
    layout = {"height": 480, "title": {"text": "Tokens of one step: π_old against the ratio, with each measure's "
                                               "feasible region"},
              "xaxis": {"title": {"text": "π_old of the sampled token"}, "range": [0, 1]},
              "yaxis": {"title": {"text": "ratio w at the last optimiser step (log scale)"}, "type": "log"}}
    return Chart(figure(keys + traces, layout, [hline(1.0)]), concat(frames))


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
    return Chart(figure(traces, layout, [hline(0.0, color="grey")]), pd.DataFrame(data))


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
    return Chart(figure(traces, layout), concat(frames))


ATTRIBUTION_PARTS = {  # bandit.entropy's shares: (legend, colour, which bar)
    "entropy/from_inside": ("samples inside", "#7f7f7f", "caused"),
    "entropy/from_masked_low": ("masked low (A < 0, w < l)", "#1f77b4", "caused"),
    "entropy/from_masked_high": ("masked high (A > 0, w > u)", "#d62728", "caused"),
    "entropy/would_masked_low": ("masked low, had they been let through", "#9ecae1", "would have"),
    "entropy/would_masked_high": ("masked high, had they been let through", "#fc9272", "would have"),
}


def entropy_attribution_chart(labels: list[str], parts: dict[str, Summary], title: str) -> Chart:
    """Who moves the entropy: per measure, two stacked bars of first-order entropy change per update — what each
    clip state's samples caused, and what the masked ones would have caused unmasked — and the observed change as a
    marker with its 95% interval. parts: {metric of `ATTRIBUTION_PARTS` and "entropy/change": a Summary over seeds,
    one value per measure}."""
    traces, data = [], {"measure": labels}
    for metric, (name, colour, group) in ATTRIBUTION_PARTS.items():
        traces.append({"type": "bar", "x": labels, "y": parts[metric].mean, "name": name, "offsetgroup": group,
                       "legendgroup": group, "marker": {"color": colour},
                       "hovertemplate": f"{name}: %{{y:.3g}}<extra>%{{x}} · {group}</extra>"})
        data.update(_summary_columns(metric, parts[metric]))
    observed = parts["entropy/change"]
    trace = {"type": "scatter", "x": labels, "y": observed.mean, "mode": "markers", "name": "observed ΔH (exact)",
             "marker": {"symbol": "diamond", "size": 12, "color": "black"}}
    if observed.n > 1:
        trace["error_y"] = _error_bars(observed)
    traces.append(trace)
    data.update(_summary_columns("entropy/change", observed))
    layout = {"height": 440, "barmode": "relative", "title": {"text": title},
              "yaxis": {"title": {"text": "entropy change per update (nats)"}}}
    return Chart(figure(traces, layout, [hline(0.0, color="grey")]), pd.DataFrame(data))


EVAL_PANELS = (("eval/accuracy", "sampled at τ"), ("eval/accuracy_greedy", "greedy"))


def step_axis(steps: list[int]) -> dict:
    """An x axis of steps with integer ticks only: a short span (under 10 steps, e.g. one evaluation) gets a tick at
    every step and half a step of room on each side, where plotly would put ticks at fractions and round them into
    repeated labels ("−1 −1 0 1 1"); a longer one plotly's own, whole-numbered."""
    if not steps or max(steps) - min(steps) >= 10:
        return {"tickformat": "d"}
    return {"tickformat": "d", "tick0": 0, "dtick": 1, "range": [min(steps) - 0.5, max(steps) + 0.5]}


def eval_chart(series: list[tuple[str, list[dict]]], collapses: dict[str, list[int]]) -> Chart:
    """Held-out accuracy over training: one panel sampled at τ, one greedy; each run's evaluations as points joined by
    a line, with their Wilson 95% intervals as error bars: [(label, eval rows)], rows with `step` and the `eval/*`
    metrics. `collapses` ({label: steps}) marks where a run collapsed (`engine.stability`) with a dotted line."""
    layout, refs = panels(1, len(EVAL_PANELS), [title for _, title in EVAL_PANELS], gap=0.06)
    traces, shapes, tables = [], [], []
    for i, (label, rows) in enumerate(series):
        steps = np.array([row["step"] for row in rows], dtype=np.int64)
        columns = {"run": label, "step": steps}
        for j, (name, _) in enumerate(EVAL_PANELS):
            value, low, high = (np.array([row.get(f"{name}{end}", np.nan) for row in rows]) for end in ("", "_low", "_high"))
            traces.append({"type": "scatter", "x": steps, "y": value, "mode": "lines+markers", "name": label,
                           "legendgroup": label, "showlegend": j == 0, "xaxis": refs[0][j][0], "yaxis": refs[0][j][1],
                           "line": {"color": color(i), "width": 1.5}, "marker": {"size": 7},
                           "error_y": {"type": "data", "symmetric": False, "array": high - value,
                                       "arrayminus": value - low, "thickness": 1.2, "width": 4},
                           "hovertemplate": f"{name}: %{{y:.3f}} after %{{x}} steps<extra>{label}</extra>"})
            columns.update({name: value, f"{name} low": low, f"{name} high": high})
            shapes += [vline(step, xref=refs[0][j][0], yref=refs[0][j][1], color=color(i))
                       for step in collapses.get(label, [])]
        tables.append(pd.DataFrame(columns))
    every = [row["step"] for _, rows in series for row in rows]
    for xref, yref in refs[0]:
        layout[f"xaxis{xref[1:]}"].update(title={"text": "step (updates done)"}, **step_axis(every))
        layout[f"yaxis{yref[1:]}"].update(range=[0, 1])
    layout.update(height=360, title={"text": "Held-out accuracy (problems never trained on): a run's Wilson 95% "
                                              "interval, or n runs' mean and band; dotted: a collapse"})
    return Chart(figure(traces, layout, shapes), lambda: concat(tables))


def minibatch_chart(series: list[tuple[str, dict[str, np.ndarray]]]) -> Chart:
    """The clip fraction and the KL of the policy to π_old at each optimiser step of an update, in order (1 … K the
    first pass's mini-batches, then the next pass's), averaged over a run's steps: [(label, {metric: values by
    position})]. Step 1 is on-policy (ratios exactly 1); what follows shows how far off-policy the later ones are."""
    names = (("clip_ratio/region_mean_by_minibatch", "clip fraction"), ("kl/k3_by_minibatch", "k3 KL to π_old"))
    layout, refs = panels(1, 2, [title for _, title in names], gap=0.08)
    traces, tables = [], []
    for i, (label, values) in enumerate(series):
        for j, (name, _) in enumerate(names):
            y = values[name]
            x = np.arange(1, len(y) + 1)
            traces.append({"type": "bar", "x": x, "y": y, "name": label, "legendgroup": label, "showlegend": j == 0,
                           "xaxis": refs[0][j][0], "yaxis": refs[0][j][1], "marker": {"color": color(i)},
                           "hovertemplate": f"{name} at optimiser step %{{x}}: %{{y:.4f}}<extra>{label}</extra>"})
            tables.append(pd.DataFrame({"run": label, "optimiser step": x, name: y}))
    for xref, _ in refs[0]:
        layout[f"xaxis{xref[1:]}"].update(title={"text": "optimiser step within the update (mini-batch)"},
                                          tickformat="d", dtick=1)
    layout.update(height=360, barmode="group", legend={"orientation": "h", "y": -0.42, "yanchor": "top"},
                  title={"text": "By mini-batch: clip fraction and KL to π_old at each optimiser step of an update "
                                 "(mean over the run's steps)"})
    return Chart(figure(traces, layout), lambda: concat(tables))


CURVE_TITLES = {"eval/accuracy": "held-out, sampled", "eval/accuracy_greedy": "held-out, greedy", "reward": "reward",
                "entropy": "entropy"}


def learning_curves_chart(curves: dict[str, dict[str, dict]], title: str,
                          collapsed: dict[str, list[int]] | None = None) -> Chart:
    """Learning curves over seeds, one panel per metric, one line per measure: its mean with the band of
    `intervals.summarize` (the seeds' range below 4 seeds, else the t-interval within the metric's range), from
    `claims_lm.LMPlan.curves` ({metric: {measure: {"steps", "mean", "low", "high", "n"}}}); a measure keeps its colour
    in every panel, and one seed alone (no band) is dotted. `collapsed` ({measure: steps}, `LMPlan.collapses`' steps):
    on the panels read at every step (not the held-out evaluations between which nothing was read), a ✕ on the
    measure's mean line at each step where one of its seeds collapsed, said in the line's hover."""
    metrics = [m for m in curves if curves[m]]
    layout, refs = panels(1, max(1, len(metrics)), [CURVE_TITLES.get(m, m) for m in metrics], gap=0.05)
    measures = list(dict.fromkeys(name for m in metrics for name in curves[m]))
    traces, tables = [], []
    for j, metric in enumerate(metrics):
        for name, curve in curves[metric].items():
            steps, mean = np.asarray(curve["steps"], dtype=np.float64), np.asarray(curve["mean"], dtype=np.float64)
            band = Summary(mean, np.asarray(curve["low"]), np.asarray(curve["high"]), curve["n"]) if curve["n"] > 1 else None
            label = f"{name} (n = {curve['n']})"
            every_step = len(steps) > 1 and bool(np.all(np.diff(steps) == 1))
            at = [int(t) for t in (collapsed or {}).get(name, ()) if every_step and t in steps]
            seeds_at = Counter(at)
            notes = [f" · {seeds_at[t]} seed{'s' if seeds_at[t] > 1 else ''} collapsed at this step" if t in seeds_at
                     else "" for t in steps] if at else None
            traces += _series_traces(label, metric, measures.index(name), j == 0, *refs[0][j],
                                     steps, mean, band, [], thin=False, dashed=curve["n"] < 2, notes=notes)
            tables.append(pd.DataFrame({"metric": metric, "measure": name, "step": steps, "mean": mean,
                                        "low": curve["low"], "high": curve["high"], "n": curve["n"]}))
            if at:  # on the mean line; its hover (the line's) says so
                on_line = dict(zip(steps.astype(int).tolist(), mean.tolist()))  # `at` are steps of the curve
                traces.append({"type": "scatter", "x": at, "y": [on_line[t] for t in at], "mode": "markers",
                               "xaxis": refs[0][j][0], "yaxis": refs[0][j][1], "legendgroup": label,
                               "showlegend": False, "hoverinfo": "skip",
                               "marker": {"symbol": "x", "size": 11, "color": color(measures.index(name))}})
    for xref, _ in refs[0]:
        layout[f"xaxis{xref[1:]}"].update(title={"text": "step"}, tickformat="d")
    layout.update(height=420, title={"text": title}, legend={"orientation": "h", "y": -0.25, "yanchor": "top"})
    return Chart(figure(traces, layout), lambda: concat(tables))
