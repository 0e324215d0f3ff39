"""The claims report as text and as one self-contained HTML page (`divviz claims`, the Claims page's download): the
summary per claim and compared measure, each cell over training, the forest plots, every cell, what was not tested."""

from __future__ import annotations

import html
import math

from divviz.evidence import forest, intervals, significance
from divviz.evidence.claims import LM, LM_TRAINING
from divviz.evidence.claims_report import (BY_CONSTRUCTION_VERDICT, CELL_KEYS, HEADERS, RAW, VERDICT_RULE, VERDICTS,
                                           Report, effect_text, power_text)


def to_text(report: Report) -> str:
    """The summary per claim and compared measure; over training, each cell with data (its difference, interval, n,
    seeds reversed and verdict), the collapses and the pilot; then what could not be tested."""
    lines = [f"divviz claims: {report.scope}", f"({VERDICT_RULE})", ""]
    summary = report.summary()
    for claim in report.claims:
        lines.append(f"{claim.text}  [{claim.source}; {claim.provenance}]")
        lines.append(f"  measured as: {claim.operational}")
        if claim.lm_operational and report.lm:
            lines.append(f"  on a language model: {claim.lm_operational}")
        if claim.real_operational and report.real:
            lines.append(f"  on SmolLM2-135M: {claim.real_operational}")
        for s in (s for s in summary if s["claim"] == claim.text):
            counts = ", ".join(f"{s[v]} {v}" for v in VERDICTS if s[v])
            largest = "" if s["largest"] is None else f" (largest |difference| {s['largest']:.3g})"
            lines.append(f"  [{s['setting']}] {s['candidate']} vs {s['baseline']} ({s['metric']}): {counts} of "
                         f"{s['cells']} cells{largest}")
        lines.append("")
    if report.lm_details:
        lines.append(f"Over training ({report.lm}):")
        lines += [f"  {cell_text(r)}" for r in report.rows if r["setting"] in (LM, LM_TRAINING) and r["n"]]
        lines += [f"  {line}" for line in report.lm_details] + [""]
    lines.append("Not testable here:")
    lines += [f"  - {text}" for text in report.untested]
    return "\n".join(lines)


def cell_text(row: dict) -> str:
    """A compared cell in a line: "KL3 … − PPO … · condition · metric: −0.023 [−0.063, 0.016], n = 4, 0 of 4 seeds
    reversed, sign-flip p 0.25 (Holm 1), median −0.021: not resolved"."""
    value = lambda key: math.nan if row[key] is None else row[key]  # noqa: E731
    d = intervals.Paired(value("mean"), value("low"), value("high"), row["n"], row["seeds_reversed"])
    tested = "" if row["p"] is None else (f", sign-flip p {row['p']:.3g} (Holm {row['p_holm']:.3g}), "
                                          f"median {row['median']:+.3f}")
    adjusted = "" if row["verdict_adjusted"] == row["verdict"] else f" ({row['verdict_adjusted']} after Holm)"
    return (f"{row['candidate']} − {row['baseline']} · {row['condition']} · {row['metric']}: {d.text(3)}{tested}: "
            f"{row['verdict']}{adjusted}")


SUMMARY_KEYS = ("claim", "setting", "candidate", "baseline", "metric", "cells", *VERDICTS, RAW, "largest")
NUMBERS = ("mean", "low", "high", "p", "p_holm", "q_bh", "median", "p_median")
VERDICT_COLOURS = {intervals.HOLDS: "#d9f2d9", intervals.REVERSED: "#f8d7d7", intervals.NOT_RESOLVED: "#eeeeee",
                   significance.DISAGREE: "#fde5c8", intervals.IDENTICAL: "#dde8f6", BY_CONSTRUCTION_VERDICT: "#e8def3",
                   intervals.EXACT: "#d9f2d9", intervals.NOT_EXACT: "#f8d7d7", intervals.NO_DATA: "#ffffff"}


def number(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}" if abs(x) < 1e-3 and x != 0 else f"{x:.4f}"


def shown(row: dict, key: str) -> str:
    """A cell's value as the HTML table shows it."""
    if key == "seeds_for_power":
        return power_text(row)
    if key == "rules_out":
        return effect_text(row)
    return number(row[key]) if key in NUMBERS else "" if row[key] is None else str(row[key])


def to_html(report: Report) -> str:
    """One self-contained HTML page (no script, no outside file): the summary, every cell, what was not tested."""
    e = lambda x: html.escape(str(x))  # noqa: E731
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>divviz claims report</title><style>",
             "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#f4f4f4}",
             "</style></head><body><h1>divviz claims report</h1>",
             f"<p>{e(report.scope)}. {e(VERDICT_RULE)}</p>"
             "<h2>Summary</h2><table><tr>" + "".join(f"<th>{e(HEADERS.get(k, k))}</th>" for k in SUMMARY_KEYS)
             + "</tr>"]
    for s in report.summary():
        parts.append("<tr>" + "".join(f"<td>{e(number(s[k]) if k == 'largest' else s[k])}</td>" for k in SUMMARY_KEYS)
                     + "</tr>")
    parts.append("</table><h2>Forest plots</h2><p>Each cell's paired difference with its 95% interval against 0, "
                 "coloured by its verdict; the side each claim predicts is shaded. Hover a point for its numbers.</p>")
    parts += [f"<div>{forest.panel(claim, metric, cells)[0]}</div>" for claim, metric, cells in forest.panels(report)]
    parts.append("<h2>Claims</h2><ul>")
    for claim in report.claims:
        lm = f" On a language model: {e(claim.lm_operational)}." if claim.lm_operational and report.lm else ""
        lm += f" On SmolLM2-135M: {e(claim.real_operational)}." if claim.real_operational and report.real else ""
        parts.append(f"<li><b>{e(claim.text)}</b>: {e(claim.source)}; {e(claim.provenance)}. "
                     f"Measured as {e(claim.operational)}.{lm}</li>")
    parts.append("</ul><h2>Every cell</h2><table><tr>" + "".join(f"<th>{e(HEADERS[k])}</th>" for k in CELL_KEYS)
                 + "</tr>")
    for r in report.rows:
        parts.append(f"<tr style='background:{VERDICT_COLOURS[r['verdict_adjusted']]}'>" + "".join(
            f"<td>{e(shown(r, k))}</td>" for k in CELL_KEYS) + "</tr>")
    parts.append("</table>")
    if report.lm_details:
        parts.append(f"<h2>Over training</h2><p>{e(report.lm)}</p><ul>"
                     + "".join(f"<li>{e(line)}</li>" for line in report.lm_details) + "</ul>")
    parts.append("<h2>Not testable here</h2><ul>" + "".join(f"<li>{e(t)}</li>" for t in report.untested)
                 + "</ul></body></html>")
    return "".join(parts)
