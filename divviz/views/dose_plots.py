"""The dose searches on the Claims page: each search's points read again by the rule (`evidence.dose_search`), as a
table and as the dose and the entropy step by step — where PPO and KL3 act differently, and how long they do."""

from __future__ import annotations

import pandas as pd

from divviz.evidence import dose_search
from divviz.views.figures import Chart, color, concat, figure, hline, panels


def read_again(summary: dict, search: dose_search.Search) -> dict:
    """The summary with every point's reading and the choice computed here from its per-step data, not taken from
    the file."""
    points = {name: {**p, "reading": dose_search.reading(p)} for name, p in summary["points"].items()}
    return {**summary, "points": points, "choice": dose_search.choose(points, len(search.points))}


def search_sentence(summary: dict, search: dose_search.Search) -> str:
    """"Read so far: 18 of 18 points (36 runs, 21.3 CPU-hours). The rule's choice: none: …" of a summary read
    again."""
    runs = [p[o] for p in summary["points"].values() for o in ("ppo", "kl3") if p.get(o)]
    hours = sum(run["step_s"] * run["steps"] for run in runs if run.get("step_s")) / 3600
    return (f"Read so far: {dose_search.read_count(summary)} of {len(search.points)} points ({len(runs)} runs, "
            f"{hours:.1f} hours of one core at the median step). The rule's choice: {summary['choice']}.")


def dose_table(summary: dict) -> pd.DataFrame:
    """The table `dose_search.table` prints, as a frame."""
    return pd.DataFrame(dose_search.rows(summary), columns=list(dose_search.TABLE_HEADERS))


WINDOW = 10  # steps a point of the chart averages: a step's dose alone is the share of about 1,500 tokens


def windowed(values: list, window: int = WINDOW) -> list[float | None]:
    """The mean of each `window` steps' values (1–10, 11–20, …), None where none of a window's was read."""
    return [dose_search.mean(values[i:i + window]) for i in range(0, len(values), window)]


def dose_chart(summary: dict, title: str) -> Chart:
    """Per point, over each `WINDOW` steps: the disagreement (the pair's mean; the rule's 2% dashed), PPO's clip
    fraction (the rule's 3% dashed) and PPO's entropy. The table under it holds every step."""
    steps = dose_search.per_step(summary)
    panel_titles = ["disagreement: clip states differ", "PPO clip fraction", "PPO entropy"]
    layout, refs = panels(1, 3, panel_titles, gap=0.06)
    traces, tables = [], []
    for i, (name, series) in enumerate(steps.items()):
        centres = [t + (WINDOW - 1) / 2 for t in series["step"][::WINDOW]]
        for j, key in enumerate(("disagreement", "ppo_clip", "ppo_entropy")):
            traces.append({"type": "scatter", "x": centres, "y": windowed(series[key]), "mode": "lines+markers",
                           "name": name, "legendgroup": name, "showlegend": j == 0, "xaxis": refs[0][j][0],
                           "yaxis": refs[0][j][1], "marker": {"size": 5},
                           "line": {"color": color(i), "width": 1.5, "dash": ("solid", "dash", "dot")[i // 8 % 3]},
                           "hovertemplate": f"{name}<br>steps around %{{x}}: %{{y:.4f}}<extra></extra>"})
        tables.append(pd.DataFrame({"point": name, **series}))
    shapes = [hline(dose_search.RULE["disagreement"], *refs[0][0], dash="dash", color="grey"),
              hline(dose_search.RULE["ppo_clip"], *refs[0][1], dash="dash", color="grey")]
    for j, (xref, yref) in enumerate(refs[0]):
        layout[f"xaxis{xref[1:]}"].update(title={"text": f"step (mean of each {WINDOW})"}, tickformat="d")
        layout[f"yaxis{yref[1:]}"].update(tickformat=".1%" if j < 2 else ".2f", rangemode="tozero")
    layout.update(height=440, title={"text": title}, legend={"orientation": "h", "y": -0.25, "yanchor": "top"})
    return Chart(figure(traces, layout, shapes), lambda: concat(tables))
