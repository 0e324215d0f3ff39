"""Forest plots of the claims report: for a claim and one of its metrics, each cell's paired difference (candidate −
baseline) as a point with its 95% interval, against 0, coloured by the verdict the interval gives, the side the claim
predicts shaded, the axis read off above and below the rows. Written as SVG text, scriptless, so that the Claims page and the report's self-contained HTML export
show the same picture (each point's title, shown on hover, gives its numbers). The picture scales down to the width
it is given (a viewBox), never wider than its own size.
"""

from __future__ import annotations

import html
import math
import re

from divviz.evidence import intervals

VERDICT_COLOURS = {intervals.HOLDS: "#2ca02c", intervals.REVERSED: "#d62728", intervals.NOT_RESOLVED: "#8c8c8c"}
ROW, LABEL_WIDTH, PLOT_WIDTH, TOP, BOTTOM = 17, 430, 360, 74, 44  # LABEL_WIDTH: the most the labels take
CHAR_WIDTH = 6  # about a character's width at 11 px (the title's 13 px bold: 1.3 times that)
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
    """A cell's label: the candidate where the panel has several (without its note in brackets), the setting where
    it is not the bandit, and the condition without its last note in brackets (the steps of a reading), its parts
    joined by " · "."""
    who = "" if shared_candidate else f"{cell['candidate'].split(' (')[0]} · "
    where = "" if cell["setting"] == "bandit" else f"{cell['setting']} · "
    return f"{who}{where}{re.sub(r' [(][^()]*[)]$', '', cell['condition'])}"


def row_labels(labels: list[str]) -> tuple[list[str], list[str]]:
    """The parts (" · "-separated) that every label has, said once above the rows, and each row's label without
    them, cut at `LABEL_CHARS` with "…" (a point's hover title has everything). A row keeps at least one part."""
    split = [text.split(" · ") for text in labels]
    common = [part for part in (split[0] if split else []) if all(part in parts for parts in split)]
    if any(len(parts) <= len(common) for parts in split):
        common = []
    rows = [" · ".join(part for part in parts if part not in common) for parts in split]
    return common, [text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…" for text in rows]


def svg(cells: list[dict], title: str) -> str:
    """The forest plot of `cells` (rows of one claim and metric): a point at each mean, a line from its 95% low to
    high, 0 marked, the predicted side shaded; a cell without an interval (n < 2) is drawn as its mean alone."""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731
    shared = len({c["candidate"] for c in cells}) == 1
    common, texts = row_labels([label(cell, shared) for cell in cells])
    lines = (f"{cells[0]['candidate'] if shared and cells else 'each candidate'} − "
             f"{cells[0]['baseline'] if cells else ''}, paired over seeds; the predicted side is shaded",
             f"every row: {' · '.join(common)}" if common else "")
    width = max(min(LABEL_WIDTH, 16 + CHAR_WIDTH * max(map(len, texts), default=0)) + PLOT_WIDTH + 20,
                8 + 1.3 * CHAR_WIDTH * len(title), *(8 + CHAR_WIDTH * len(line) for line in lines))
    left = width - PLOT_WIDTH - 20  # the labels' room: as much as they, the title or the lines above need
    finite = [abs(v) for c in cells for v in (c["mean"], c["low"], c["high"]) if v is not None and math.isfinite(v)]
    reach = _round_up(max(finite, default=1.0))
    x = lambda v: left + PLOT_WIDTH / 2 * (1 + v / reach)  # noqa: E731
    height = TOP + ROW * len(cells) + BOTTOM
    zero = x(0.0)
    sign = +1 if cells and cells[0]["predicted_sign"] == "+" else -1
    shaded = (zero, left + PLOT_WIDTH) if sign > 0 else (left, zero)
    ticks = (-reach, -reach / 2, 0.0, reach / 2, reach)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width:.0f} {height}' width='100%' "
             f"style='max-width:{width:.0f}px' font-family='sans-serif' font-size='11' role='img' "
             f"aria-label='{e(title)}'>",
             f"<text x='4' y='16' font-size='13' font-weight='bold'>{e(title)}</text>",
             *(f"<text x='4' y='{32 + 16 * k}' fill='#555'>{e(line)}</text>" for k, line in enumerate(lines) if line),
             f"<rect x='{shaded[0]:.1f}' y='{TOP - 4}' width='{shaded[1] - shaded[0]:.1f}' "
             f"height='{ROW * len(cells) + 4}' fill='#eaf5ea'/>",
             f"<line x1='{zero:.1f}' x2='{zero:.1f}' y1='{TOP - 4}' y2='{TOP + ROW * len(cells)}' stroke='#333'/>",
             *(f"<line x1='{x(v):.1f}' x2='{x(v):.1f}' y1='{TOP - 4}' y2='{TOP + ROW * len(cells)}' "
               f"stroke='#ddd'/>" for v in ticks if v)]
    for i, (cell, text) in enumerate(zip(cells, texts)):
        y = TOP + ROW * i + ROW / 2
        colour = VERDICT_COLOURS.get(cell["verdict"], "#8c8c8c")
        parts.append(f"<text x='{left - 6:.0f}' y='{y + 4:.1f}' text-anchor='end'>{e(text)}</text>")
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
    for v in ticks:  # above the rows and below them: a long panel is read in a scrolling box
        parts += [f"<text x='{x(v):.1f}' y='{y}' text-anchor='middle' fill='#555'>{_num(v)}</text>"
                  for y in (TOP - 8, axis)]
    legend = "".join(f"<circle cx='{left + 8 + 120 * k:.0f}' cy='{axis + 18}' r='4' fill='{c}'/><text "
                     f"x='{left + 16 + 120 * k:.0f}' y='{axis + 22}'>{e(v)}</text>"
                     for k, (v, c) in enumerate(VERDICT_COLOURS.items()))
    parts.append(legend + "</svg>")
    return "".join(parts)


def _round_up(value: float) -> float:
    """The axis' half-width: the smallest of 1, 2, 2.5, 5 and 10 times a power of ten at or above `value` (1 for 0),
    so that its ticks at ± half and ± whole read as round numbers."""
    if not value > 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-12))


def _num(x) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.3g}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"
