"""The dose searches on the Claims page: each search's points read again by the rule (`evidence.dose_search`), as a
table, a few sentences and the dose and the entropy over the run — where PPO and KL3 act differently, and how long
they do."""

from __future__ import annotations

import pandas as pd

from divviz.evidence import dose_search
from divviz.views.figures import Chart, color, concat, figure, hline, panels

WINDOW = 10  # steps a point of the chart averages: a step's dose alone is the share of about 1,500 tokens


def read_again(summary: dict, search: dose_search.Search) -> dict:
    """The summary with every point's reading and the choice computed here from its per-step data, not taken from
    the file."""
    points = {name: {**p, "reading": dose_search.reading(p)} for name, p in summary["points"].items()}
    return {**summary, "points": points, "choice": dose_search.choose(points, len(search.points)).words}


def search_sentence(summary: dict, search: dose_search.Search, where: dict[str, dict[str, tuple[str, str]]]) -> str:
    """How much of the search is read, what it cost, how many of its runs are published (`where`:
    `dose_search.published_runs`) and the rule's choice, of a summary read again."""
    read, declared = dose_search.read_count(summary), len(search.points)
    runs = [(name, o, p[o]) for name, p in summary["points"].items() for o in ("ppo", "kl3") if p.get(o)]
    hours = sum(run["step_s"] * run["steps"] for _, _, run in runs if run.get("step_s")) / 3600
    shown = sum(1 for name, o, _ in runs if o in where.get(name, {}))
    kept = ("" if shown == len(runs) else f" ({len(runs) - shown} only in its summary: their folders were lost with "
                                          "their machine)")
    progress = f"All {declared} points read" if read == declared else f"Read so far: {read} of {declared} points"
    return (f"{progress}: {len(runs)} runs, {shown} of them published{kept}; about {hours:.1f} core-hours (each "
            f"run's steps at its median step time, one thread a run). The rule's choice: {summary['choice']}.")


def early_and_late_sentence(summary: dict) -> str:
    """The dose at the start and at the end of the runs: the disagreement over the first and the last `WINDOW` steps,
    averaged over the points (and the largest point's), against the run's mean the rule reads."""
    steps = dose_search.per_step(summary)
    first = {name: dose_search.mean(series["disagreement"][:WINDOW]) for name, series in steps.items()}
    last = {name: dose_search.mean(series["disagreement"][-WINDOW:]) for name, series in steps.items()}
    first, last = {k: v for k, v in first.items() if v is not None}, {k: v for k, v in last.items() if v is not None}
    if not first:
        return ""
    top, early, late = max(first, key=first.get), dose_search.mean(first.values()), dose_search.mean(last.values())
    where = f"at {top}" if len(first) == 1 else f"on average over the points ({first[top]:.2%} at {top})"
    return (f"Over the first {WINDOW} steps the two objectives' clip states differ on {early:.2%} of tokens {where}; "
            f"over the last {WINDOW}, on {late:.2%}: the rule reads the mean over the whole run.")


def dose_table(summary: dict, where: dict[str, dict[str, tuple[str, str]]]) -> pd.DataFrame:
    """The table `dose_search.table` prints, as a frame, with where each pair's runs are published (their grids and
    CPU kernels: a pair may cross CPUs, whose kernels give another step 0)."""
    frame = pd.DataFrame(dose_search.rows(summary), columns=list(dose_search.TABLE_HEADERS))
    frame.insert(2, "published in", [_published_in(where.get(name, {})) for name in frame["point"]])
    return frame


def _published_in(runs: dict[str, tuple[str, str]]) -> str:
    """"grid (CPU)" for a pair in one grid, "ppo: grid (CPU); kl3: grid (CPU)" across two, "summary only" for none."""
    said = {o: f"{grid} ({_cpu(cpu)})" for o, (grid, cpu) in sorted(runs.items(), reverse=True)}
    if not said:
        return "summary only"
    if len(set(said.values())) == 1 and len(said) == 2:
        return next(iter(said.values()))
    return "; ".join(f"{o}: {text}" for o, text in said.items())


def _cpu(kernels: str) -> str:
    """A manifest's CPU kernels, short: AMX, AVX512-BF16, or as written."""
    return "AMX" if "amx" in kernels else "AVX512-BF16" if "avx512_bf16" in kernels else kernels or "CPU not named"


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
    rule = [(dose_search.RULE["disagreement"], refs[0][0]), (dose_search.RULE["ppo_clip"], refs[0][1])]
    shapes = [hline(y, *ref, dash="dash", color="grey") for y, ref in rule]
    labels = [{"text": f"rule: {y:.0%}", "x": 1, "xref": f"{ref[0]} domain", "y": y, "yref": ref[1],
               "xanchor": "right", "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": "grey"}}
              for y, ref in rule]
    for j, (xref, yref) in enumerate(refs[0]):
        layout[f"xaxis{xref[1:]}"].update(title={"text": f"step (mean of each {WINDOW})"}, tickformat="d")
        layout[f"yaxis{yref[1:]}"].update(tickformat=".1%" if j < 2 else ".2f", rangemode="tozero")
    layout.update(height=440, title={"text": title}, legend={"orientation": "h", "y": -0.25, "yanchor": "top"})
    return Chart(figure(traces, layout, shapes, labels), lambda: concat(tables))
