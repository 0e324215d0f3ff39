"""Forest plots of the claims report: for a claim and one of its metrics, each cell's paired difference (candidate −
baseline) as a point with its 95% interval, against 0, coloured by the verdict the interval gives, the side the claim
predicts shaded, the axis read off above and below the rows. Written as SVG text, scriptless, so that the Claims page
and the report's self-contained HTML export show the same picture (each point's title, shown on hover, gives its
numbers). The picture scales down to the width it is given (a viewBox), never wider than its own size.
"""

from __future__ import annotations

import html
import math
import re
import textwrap

import numpy as np

from divviz.evidence import intervals, significance
from divviz.evidence.cell_words import tested_text
from divviz.evidence.claims_report import BY_CONSTRUCTION_VERDICT, DESCRIPTIVE
from divviz.metrics import GLOSSARY

VERDICT_COLOURS = {intervals.HOLDS: "#2ca02c", intervals.REVERSED: "#d62728", intervals.NOT_RESOLVED: "#8c8c8c",
                   significance.DISAGREE: "#ff7f0e", intervals.IDENTICAL: "#1f77b4",
                   BY_CONSTRUCTION_VERDICT: "#9467bd", DESCRIPTIVE: "#c7c7c7"}  # by the verdict after adjustment
ROW, LABEL_WIDTH, PLOT_WIDTH, MARGIN_WIDTH, BOTTOM = 17, 430, 360, 120, 60  # MARGIN_WIDTH: the rules-out column
CHAR_WIDTH = 6  # about a character's width at 11 px (the title's 13 px bold: 1.3 times that)
LABEL_CHARS = 72  # a longer label is cut, with "…" (its hover title has everything)


def panels(report, claims=None) -> list[tuple[object, str, list[dict]]]:
    """(claim, metric, its compared cells in report order) for every claim (or only `claims`) and metric with compared
    cells that have data (a cell with no seed yet is in the report's tables only)."""
    out = []
    for claim in report.claims if claims is None else claims:
        cells = [r for r in report.rows if r["claim_key"] == claim.key and r["predicted_sign"] and r["n"]]
        for metric in dict.fromkeys(r["metric"] for r in cells):
            out.append((claim, metric, [r for r in cells if r["metric"] == metric]))
    return out


def panel(claim, metric: str, cells: list[dict]) -> tuple[str, int]:
    """A panel of `panels` drawn: its SVG, titled with the claim and the metric, the metric's meaning (`GLOSSARY`)
    under the title; and its height in pixels at full width."""
    drawn = svg(cells, f"{claim.text}: {metric}", GLOSSARY.get(metric, ""))
    return drawn, int(re.search(r"viewBox='0 0 \d+ (\d+)'", drawn).group(1))  # its height, as drawn


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


def svg(cells: list[dict], title: str, meaning: str = "") -> str:
    """The forest plot of `cells` (rows of one claim and metric): a point at each mean, a line from its 95% low to
    high, 0 marked, the predicted side shaded, `meaning` (what the metric is) under the title; a cell without an
    interval (n < 2) is drawn as a hollow point at its mean alone, an interval past the axis (`axis_reach`) to its edge
    with an arrowhead. Every plot is as wide, so that a claim's plots line up; a long title wraps."""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731
    heads, texts = _header(cells, title, meaning)
    width = LABEL_WIDTH + PLOT_WIDTH + MARGIN_WIDTH
    top = 16 * len(heads) + 24  # the wrapped lines, then the upper axis' numbers
    reach = axis_reach(cells)
    x = lambda v: LABEL_WIDTH + PLOT_WIDTH / 2 * (1 + v / reach)  # noqa: E731
    bottom = top + ROW * len(cells)
    zero = x(0.0)
    sign = +1 if cells and cells[0]["predicted_sign"] == "+" else -1
    shaded = (zero, LABEL_WIDTH + PLOT_WIDTH) if sign > 0 else (LABEL_WIDTH, zero)
    ticks = (-reach, -reach / 2, 0.0, reach / 2, reach)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {width} {bottom + BOTTOM}' width='100%' "
             f"style='max-width:{width}px' font-family='sans-serif' font-size='11' role='img' aria-label='{e(title)}'>",
             *(f"<text x='4' y='{16 + 16 * k}'" + (" font-size='13' font-weight='bold'>" if bold else " fill='#555'>")
               + f"{e(line)}</text>" for k, (line, bold) in enumerate(heads)),
             f"<rect x='{shaded[0]:.1f}' y='{top - 4}' width='{shaded[1] - shaded[0]:.1f}' "
             f"height='{ROW * len(cells) + 4}' fill='#eaf5ea'/>",
             f"<line x1='{zero:.1f}' x2='{zero:.1f}' y1='{top - 4}' y2='{bottom}' stroke='#333'/>",
             *(f"<line x1='{x(v):.1f}' x2='{x(v):.1f}' y1='{top - 4}' y2='{bottom}' stroke='#ddd'/>"
               for v in ticks if v)]
    past_axis = False
    for i, (cell, text) in enumerate(zip(cells, texts)):
        y = top + ROW * i + ROW / 2
        colour = VERDICT_COLOURS.get(cell["verdict_adjusted"], "#8c8c8c")
        parts.append(f"<text x='{LABEL_WIDTH - 6}' y='{y + 4:.1f}' text-anchor='end'>{e(text)}</text>")
        if _sized(cell):
            parts.append(f"<text x='{LABEL_WIDTH + PLOT_WIDTH + 8}' y='{y + 4:.1f}'"
                         + (" font-weight='bold'>" if cell["rules_out"] else " fill='#555'>")
                         + f"{e(_margin_text(cell))}</text>")
        if cell["low"] is not None and cell["high"] is not None:
            low, high = max(cell["low"], -reach), min(cell["high"], reach)
            parts.append(f"<line x1='{x(low):.1f}' x2='{x(high):.1f}' y1='{y:.1f}' y2='{y:.1f}' "
                         f"stroke='{colour}' stroke-width='2'/>")
            arrows = [f"<path d='M{x(end):.1f},{y:.1f} l{-7 * side},-4 v8 z' fill='{colour}'/>"
                      for end, side, past in ((low, -1, cell["low"] < -reach), (high, +1, cell["high"] > reach))
                      if past]  # an arrowhead: the interval runs on past the axis
            parts += arrows
            past_axis = past_axis or bool(arrows)
        if cell["mean"] is not None:
            paint = (f"fill='{colour}'" if cell["low"] is not None  # hollow: one seed, no interval
                     else f"fill='white' stroke='{colour}' stroke-width='1.5'")
            parts.append(f"<circle cx='{x(cell['mean']):.1f}' cy='{y:.1f}' r='4' {paint}>"
                         f"<title>{e(_hover_text(cell))}</title></circle>")
    margins = {c["effect"] for c in cells if _sized(c)}
    parts += [f"<line x1='{x(m):.1f}' x2='{x(m):.1f}' y1='{top - 4}' y2='{bottom}' stroke='#2ca02c' "
              f"stroke-dasharray='4 3'><title>the margin: a gain of {m:+g}</title></line>"
              for m in margins if m <= reach]
    for v in ticks:  # above the rows and below them: a long panel is read in a scrolling box
        parts += [f"<text x='{x(v):.1f}' y='{y}' text-anchor='middle' fill='#555'>{_num(v)}</text>"
                  for y in (top - 8, bottom + 14)]
    if past_axis:
        parts.append(f"<text x='4' y='{bottom + 52}' fill='#555'>▸ the interval runs past the axis (hover: its "
                     "numbers)</text>")
    parts.append(_legend(bottom + 32) + "</svg>")
    return "".join(parts)


def _legend(y: float) -> str:
    """The verdicts' colours in one line at height `y`, each name as wide as its characters."""
    starts = np.cumsum([8] + [16 + CHAR_WIDTH * len(v) for v in VERDICT_COLOURS])
    return "".join(f"<circle cx='{start}' cy='{y}' r='4' fill='{c}'/><text x='{start + 8}' y='{y + 4}'>"
                   f"{html.escape(v, quote=True)}</text>" for start, (v, c) in zip(starts, VERDICT_COLOURS.items()))


def _hover_text(cell: dict) -> str:
    """A point's hover title: the cell in full, its numbers, its verdicts and whether it rules out its margin."""
    whole = f"{cell['candidate']} − {cell['baseline']} · {cell['setting']} · {cell['condition']}"
    if cell["mean"] is None:
        return f"{whole}: no value"
    interval = (f"95% [{_num(cell['low'])}, {_num(cell['high'])}]" if cell["low"] is not None
                else "no interval from one seed")
    return (f"{whole}: mean {cell['mean']:.4g}, {interval}, n = {cell['n']}, {cell['seeds_against_mean']} of "
            f"{cell['n']} seeds against the mean{tested_text(cell)}: {cell['verdict']}" + _adjusted_text(cell)
            + _margin_text(cell, ": ")
            + (" (every seed's difference exactly 0)" if cell["verdict"] == intervals.IDENTICAL else ""))


def _sized(cell: dict) -> bool:
    """Whether a cell is sized for a gain (a margin it can rule out): an effect, and a predicted gain."""
    return cell.get("effect") is not None and cell["predicted_sign"] == "+"


def _adjusted_text(cell: dict) -> str:
    """After the raw verdict in a point's hover: what adjustment made of it ("", where nothing changed)."""
    if cell["verdict_adjusted"] == DESCRIPTIVE:
        return ", descriptive (outside the claim's family: not adjusted, not counted)"
    return f", {cell['verdict_adjusted']} after Holm" if cell["verdict_adjusted"] != cell["verdict"] else ""


def _margin_text(cell: dict, before: str = "") -> str:
    """Whether a cell sized for a gain rules it out ("rules out +0.05", "+0.05 not ruled out"; "" if not sized)."""
    if not _sized(cell):
        return ""
    return before + (f"rules out {cell['effect']:+g}" if cell["rules_out"] else f"{cell['effect']:+g} not ruled out")


def _header(cells: list[dict], title: str, meaning: str) -> tuple[list[tuple[str, bool]], list[str]]:
    """The lines above the rows, wrapped to the plot's width, each with whether it is the (bold) title; and the rows'
    labels (`row_labels`: what every row shares is one of the lines above)."""
    shared = len({c["candidate"] for c in cells}) == 1
    common, texts = row_labels([label(cell, shared) for cell in cells])
    pair = (f"{cells[0]['candidate'] if shared and cells else 'each candidate'} − "
            f"{cells[0]['baseline'] if cells else ''}, paired over seeds: the mean difference and its 95% interval "
            "(Student-t; Newcombe's for a 0/1 reading); the predicted side is shaded"
            + ("; dashed: the margin, and at the right whether the cell rules out a gain that large (one-sided "
               "α = 0.05)" if any(_sized(c) for c in cells) else ""))
    width = LABEL_WIDTH + PLOT_WIDTH + MARGIN_WIDTH
    return ([(line, True) for line in textwrap.wrap(title, int(width / (1.3 * CHAR_WIDTH)))]
            + [(line, False) for text in (meaning, pair, f"every row: {' · '.join(common)}" if common else "")
               for line in textwrap.wrap(text, int(width / (0.9 * CHAR_WIDTH)))], texts)  # grey text runs narrower


def axis_reach(cells: list[dict]) -> float:
    """The axis' half-width: rounded up (`_round_up`) from the largest |mean| or, where larger, the 90th percentile
    of the intervals' |ends|, so that a few very wide intervals (one or two seeds far out) do not squeeze every other
    row to a dot; an interval past it is drawn to the edge with an arrowhead."""
    finite = lambda values: [abs(v) for v in values if v is not None and math.isfinite(v)]  # noqa: E731
    means, ends = finite(c["mean"] for c in cells), finite(v for c in cells for v in (c["low"], c["high"]))
    return _round_up(max(max(means, default=0.0), float(np.quantile(ends, 0.9)) if ends else 0.0))


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
