"""Forest plots of the claims report: for a claim and one of its metrics, each cell's paired difference (candidate −
baseline) as a point with its 95% interval, against 0, coloured by the verdict the interval gives, the side the claim
predicts shaded. Written as SVG text, scriptless, so that the Claims page and the report's self-contained HTML export
show the same picture (each point's title, shown on hover, gives its numbers). The picture scales down to the width
it is given (a viewBox), never wider than its own size.
"""

from __future__ import annotations

import html
import math
import re

from divviz.evidence import intervals

VERDICT_COLOURS = {intervals.HOLDS: "#2ca02c", intervals.REVERSED: "#d62728", intervals.NOT_RESOLVED: "#8c8c8c"}
ROW, LABEL_WIDTH, PLOT_WIDTH, TOP, BOTTOM = 17, 430, 360, 46, 44
LABEL_CHARS = 72  # a longer label is cut, with "…" (its hover title has everything)


def panels(report) -> list[tuple[object, str, list[dict]]]:
    """(claim, metric, its compared cells in report order) for every claim and metric with compared cells that have
    data (a cell with no seed yet is in the report's tables only)."""
    out = []
    for claim in report.claims:
        cells = [r for r in report.rows if r["claim_key"] == claim.key and r["predicted_sign"] and r["n"]]
        for metric in dict.fromkeys(r["metric"] for r in cells):
            out.append((claim, metric, [r for r in cells if r["metric"] == metric]))
    return out


def label(cell: dict, shared_candidate: bool) -> str:
    """A cell's row label: the candidate where the panel has several (without its note in brackets), the setting where
    it is not the bandit, and the condition without its last note in brackets (the steps of a reading), cut at
    `LABEL_CHARS` (its hover title has everything)."""
    who = "" if shared_candidate else f"{cell['candidate'].split(' (')[0]} · "
    where = "" if cell["setting"] == "bandit" else f"{cell['setting']} · "
    text = f"{who}{where}{re.sub(r' [(][^()]*[)]$', '', cell['condition'])}"
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"


def svg(cells: list[dict], title: str) -> str:
    """The forest plot of `cells` (rows of one claim and metric): a point at each mean, a line from its 95% low to
    high, 0 marked, the predicted side shaded; a cell without an interval (n < 2) is drawn as its mean alone."""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731
    finite = [abs(v) for c in cells for v in (c["mean"], c["low"], c["high"]) if v is not None and math.isfinite(v)]
    reach = 1.08 * max(finite, default=1.0) or 1.0
    x = lambda v: LABEL_WIDTH + PLOT_WIDTH / 2 * (1 + v / reach)  # noqa: E731
    height = TOP + ROW * len(cells) + BOTTOM
    zero = x(0.0)
    sign = +1 if cells and cells[0]["predicted_sign"] == "+" else -1
    shaded = (zero, LABEL_WIDTH + PLOT_WIDTH) if sign > 0 else (LABEL_WIDTH, zero)
    shared = len({c["candidate"] for c in cells}) == 1
    width = LABEL_WIDTH + PLOT_WIDTH + 20
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {height}' width='100%' "
             f"style='max-width:{width}px' font-family='sans-serif' font-size='11' role='img' aria-label='{e(title)}'>",
             f"<text x='4' y='16' font-size='13' font-weight='bold'>{e(title)}</text>",
             f"<text x='4' y='32' fill='#555'>{e(cells[0]['candidate'] if shared and cells else 'each candidate')} "
             f"− {e(cells[0]['baseline'] if cells else '')}, paired over seeds; the predicted side is shaded</text>",
             f"<rect x='{shaded[0]:.1f}' y='{TOP - 4}' width='{shaded[1] - shaded[0]:.1f}' "
             f"height='{ROW * len(cells) + 4}' fill='#eaf5ea'/>",
             f"<line x1='{zero:.1f}' x2='{zero:.1f}' y1='{TOP - 4}' y2='{TOP + ROW * len(cells)}' stroke='#333'/>"]
    for i, cell in enumerate(cells):
        y = TOP + ROW * i + ROW / 2
        colour = VERDICT_COLOURS.get(cell["verdict"], "#8c8c8c")
        text = label(cell, shared)
        parts.append(f"<text x='{LABEL_WIDTH - 6}' y='{y + 4:.1f}' text-anchor='end'>{e(text)}</text>")
        whole = f"{cell['candidate']} − {cell['baseline']} · {cell['setting']} · {cell['condition']}"
        numbers = (f"{whole}: mean {cell['mean']:.4g}, 95% [{_num(cell['low'])}, {_num(cell['high'])}], "
                   f"n = {cell['n']}, {cell['seeds_reversed']} reversed: {cell['verdict']}"
                   if cell["mean"] is not None else f"{whole}: no value")
        if cell["low"] is not None and cell["high"] is not None:
            parts.append(f"<line x1='{x(cell['low']):.1f}' x2='{x(cell['high']):.1f}' y1='{y:.1f}' y2='{y:.1f}' "
                         f"stroke='{colour}' stroke-width='2'/>")
        if cell["mean"] is not None:
            parts.append(f"<circle cx='{x(cell['mean']):.1f}' cy='{y:.1f}' r='4' fill='{colour}'>"
                         f"<title>{e(numbers)}</title></circle>")
    axis = TOP + ROW * len(cells) + 14
    for v in (-reach, -reach / 2, 0.0, reach / 2, reach):
        parts.append(f"<text x='{x(v):.1f}' y='{axis}' text-anchor='middle' fill='#555'>{_num(v)}</text>")
    legend = "".join(f"<circle cx='{LABEL_WIDTH + 8 + 120 * k}' cy='{axis + 18}' r='4' fill='{c}'/><text "
                     f"x='{LABEL_WIDTH + 16 + 120 * k}' y='{axis + 22}'>{e(v)}</text>"
                     for k, (v, c) in enumerate(VERDICT_COLOURS.items()))
    parts.append(legend + "</svg>")
    return "".join(parts)


def _num(x) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.3g}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"
