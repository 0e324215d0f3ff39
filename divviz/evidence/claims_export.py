"""The claims report as text and as one self-contained HTML page (`divviz claims`, the Claims page's download): the
summary per claim and compared measure, each cell over training, the forest plots, every cell, what was not tested."""

from __future__ import annotations

import html
import math
import tempfile
from pathlib import Path


from divviz.evidence import claims, claims_lm, forest, intervals, lm_evidence, significance
from divviz.evidence.cell_words import dose_text, effect_text, power_text, signed, tested_text, verdict_power_text
from divviz.evidence.claims import LM, LM_TRAINING
from divviz.evidence.claims_report import (BY_CONSTRUCTION_VERDICT, CELL_KEYS, DESCRIPTIVE, HEADERS, RAW, RULES_OUT,
                                           VERDICT_RULE, VERDICTS, Report, summary_key)


def to_text(report: Report) -> str:
    """The summary per claim and compared measure; over training, each cell with data (its difference, interval, n,
    seeds against the mean and verdict), the collapses and the pilot; then what could not be tested."""
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
            ruled = f"; {s[RULES_OUT]} rule out a gain of the margin" if s[RULES_OUT] else ""
            lines.append(f"  [{s['setting']}] {s['candidate']} vs {s['baseline']} ({s['metric']}): {counts} of "
                         f"{s['cells']} cells{largest}{ruled}")
        lines.append("")
    if report.lm_details:
        lines.append(f"Over training ({report.lm}):")
        lines += [f"  {sentence}" for sentence in (plain_sentence(report),) if sentence]
        lines += [f"  {cell_text(r)}" for r in report.rows if r["setting"] in (LM, LM_TRAINING) and r["n"]]
        lines += [f"  {line}" for line in report.lm_details] + [""]
    lines.append("Not testable here:")
    lines += [f"  - {text}" for text in report.untested]
    return "\n".join(lines)


NAMED_P = {"p": "p_sign_flip", "p_holm": "p_sign_flip_holm", "p_median": "p_sign_test"}  # a p's key naming its test


def report_json(report: Report) -> dict:
    """The report as JSON holds it (`divviz claims --json`, the Claims page's download): its scope — where each
    part's cells come from — and every cell with its statistics and per-seed values. Each p also under a key naming
    its test (`NAMED_P`: `p_sign_flip`, its Holm adjustment `p_sign_flip_holm`, the median's `p_sign_test`); the
    short keys (`p`, `p_holm`, `p_median`) stay for this release and then go."""
    return {"scope": report.scope,
            "cells": [{**{k: v for k, v in row.items() if k != "claim_key"},
                       **{named: row.get(short) for short, named in NAMED_P.items()}} for row in report.rows]}


def cell_text(row: dict) -> str:
    """A compared cell in a line: "KL3 … − PPO … · condition · metric: −0.023 [−0.063, 0.016], n = 4, 0 of 4 seeds
    reversed, sign-flip p 0.25 (Holm 1), median −0.021: not resolved"; for a cell sized for an effect, its verdict
    power and, where it does, the gain it rules out after it."""
    value = lambda key: math.nan if row[key] is None else row[key]  # noqa: E731
    d = intervals.Paired(value("mean"), value("low"), value("high"), row["n"], row["seeds_against_mean"])
    tested = tested_text(row)
    adjusted = ("" if row["verdict_adjusted"] == row["verdict"] else
                " (descriptive: outside the claim's primary readings, not adjusted or counted)"
                if row["verdict_adjusted"] == DESCRIPTIVE else
                " (before Holm; counted as by construction, not as stability: a wider box clips less)"
                if row["verdict_adjusted"] == BY_CONSTRUCTION_VERDICT else f" ({row['verdict_adjusted']} after Holm)")
    sized = "".join(f"; {text}" for text in (verdict_power_text(row) and f"verdict power {verdict_power_text(row)}",
                                             effect_text(row), dose_text(row) and f"dose: {dose_text(row)}") if text)
    return (f"{row['candidate']} − {row['baseline']} · {row['condition']} · {row['metric']}: {d.text(3)}{tested}: "
            f"{row['verdict']}{adjusted}{sized}")


SUMMARY_KEYS = ("claim", "setting", "candidate", "baseline", "metric", "cells", *VERDICTS, RAW, RULES_OUT, "largest")
NUMBERS = ("mean", "low", "high", "p", "p_holm", "q_bh", "median", "p_median")
VERDICT_COLOURS = {intervals.HOLDS: "#d9f2d9", intervals.REVERSED: "#f8d7d7", intervals.NOT_RESOLVED: "#eeeeee",
                   significance.DISAGREE: "#fde5c8", intervals.IDENTICAL: "#dde8f6", BY_CONSTRUCTION_VERDICT: "#e8def3",
                   DESCRIPTIVE: "#f7f7f7", intervals.EXACT: "#d9f2d9", intervals.NOT_EXACT: "#f8d7d7",
                   intervals.NO_DATA: "#ffffff"}


def number(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}" if abs(x) < 1e-3 and x != 0 else f"{x:.4f}"


def shown(row: dict, key: str) -> str:
    """A cell's value as the HTML table shows it."""
    if key == "seeds_for_power":
        return power_text(row)
    if key == "rules_out":
        return effect_text(row)
    if key == "verdict_power":
        return verdict_power_text(row)
    if key == "dose":
        return dose_text(row)
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


# The over-training cells a summary shows (candidate, metric, reading), in this order: the headline and its ablations
HEADLINE = (*((claims.KL3_WIDE, m, r) for m, r in (("eval/accuracy", "end"), ("eval/accuracy_greedy", "end"),
                                                   ("eval/accuracy", "over the run"), ("stability/collapsed", "whole run"),
                                                   (claims.TIME_TO_COLLAPSE, "whole run"),
                                                   ("stability/max_kl", "whole run"), ("stability/max_clip", "whole run"),
                                                   ("entropy", "late"), ("top1_mass", "late"),
                                                   ("mass_to_argmax", "late"))),
            (claims.KL3_HIGH_EDGE, "eval/accuracy", "end"), (claims.BOX_LOW_ONLY, "eval/accuracy", "end"),
            (claims.BOX_HIGH_ONLY, "eval/accuracy", "end"), (claims.DAPO, "entropy", "late"),
            (claims.PROBL2, "eval/accuracy", "end"), (claims.PROBL2, "eval/accuracy_greedy", "end"),
            (claims.PPO, "entropy", "late"), (claims.CLIP_LOW, "entropy", "late"))


def headline_markdown(report: Report) -> str:
    """The over-training cells of `HEADLINE` as a Markdown table: mean and interval, n, the seeds each way, the
    sign-flip p and its Holm adjustment, the verdict raw and adjusted, the seeds 80% power needs for the t-test alone,
    the power of the whole verdict at this n (`verdict_power`), the gain ruled out and the dose — what README and
    docs/claims.md quote, made from the report's own rows; a line saying so while no headline
    cell has two paired seeds."""
    header = ("candidate − baseline", "metric", "reading", "mean [95%]", "n", "seeds +/−", "sign-flip p (Holm)",
              "median (sign-test p)", "verdict (raw → Holm)", "seeds for 80% power (t-test alone)",
              "verdict power at n (whole rule, Holm)", "rules out", "dose over training")
    rows = []
    for candidate, metric, reading in HEADLINE:
        row = next((r for r in report.rows if r["setting"] in (LM, LM_TRAINING) and r["candidate"] == candidate
                    and r["metric"] == metric and r["reading"] == reading
                    and (r["baseline"] == claims.START) == (candidate == claims.PPO)), None)
        if row is None or row["n"] < 2:
            continue
        verdict = row["verdict"] + ("" if row["verdict_adjusted"] == row["verdict"] else f" → {row['verdict_adjusted']}")
        rows.append((f"{candidate} − {row['baseline']}", metric, reading,
                     f"{row['mean']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}]", row["n"],
                     f"{row['seeds_up']}/{row['seeds_down']}", f"{row['p']:.3g} ({holm_text(row)})",
                     f"{row['median']:+.3f} ({number(row['p_median']) or '—'})", verdict, power_text(row) or "—",
                     verdict_power_text(row) or "—", effect_text(row).removeprefix("rules out ") or "—",
                     dose_text(row) or "—"))
    return markdown_table(header, rows) if rows else "No headline cell has two paired seeds yet.\n"


def markdown_table(header, rows) -> str:
    """A Markdown table: its header, a rule, one line per row (each value as text, a pipe in it escaped)."""
    lines = ["| " + " | ".join(map(md, header)) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(md(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def published_evidence(model: str, setting: str, device: str = "cpu"):
    """The published runs of `model` at `setting` trained on `device`'s kind alone (an empty runs folder beside
    them), at the grid's declared seeds: (the plan, its evidence, a report of its cells)."""
    with tempfile.TemporaryDirectory() as nothing:
        plan = claims_lm.LMPlan.declared(Path(nothing), model, setting, device=device)
        evidence = lm_evidence.LMEvidence(plan)
        return plan, evidence, evidence.report(Report([], 0))


def published_markdown(plan, evidence, report: Report) -> str:
    """What a grid's published runs say (`published_evidence`), in Markdown (docs/claims.md's generated block):
    where the runs come from, the headline cells, the collapses per measure and the pilot."""
    if not plan.done:
        return f"No run of {plan.name} is published yet ({len(plan.runs)} declared).\n"
    collapses = lm_evidence.collapse_table(evidence.collapses())
    pilot = evidence.pilot()
    table = markdown_table(list(collapses[0]), [list(row.values()) for row in collapses])
    closed = (" (closed before its declared seeds: the pilot below)"
              if (plan.setting, plan.device) in claims_lm.CLOSED_AT else "")
    sentence = plain_sentence(report)
    return "\n".join([*([sentence, ""] if sentence else []),
                      f"{plan.done} of the grid's {len(plan.runs)} runs{closed} published: {plan.published_grids}.",
                      "", headline_markdown(report).rstrip(), "", table.rstrip(), "",
                      lm_evidence.pilot_text(pilot) if pilot else "No pilot pair has two seeds yet.", ""])


def holm_text(row: dict) -> str:
    """A cell's Holm-adjusted p as the tables print it, "descriptive" for a cell in no family."""
    return "descriptive" if row["p_holm"] is None else f"{row['p_holm']:.3g}"


def headline_cell(report: Report) -> dict | None:
    """The headline cell of an over-training report: KL3 δ = 0.05 − PPO, held-out accuracy at the end (None in a
    report without one)."""
    return next((r for r in report.rows if r["setting"] in (LM, LM_TRAINING) and r["candidate"] == claims.KL3_WIDE
                 and r["baseline"] == claims.PPO and r["metric"] == "eval/accuracy" and r["reading"] == "end"), None)


def plain_sentence(report: Report) -> str:
    """The over-training headline in one plain sentence, generated: "At learn, KL3 δ=0.05 (wide) and PPO ε=0.2
    clipped 0.45% and 0.85% of tokens and acted differently on 0.50%; end accuracy −0.010 [−0.041, +0.021] over 8
    seeds: not resolved — no gain of 5 points or more (rejected at one-sided α = 0.05; a 5-point margin, fixed after
    the learn pair had been read); the verdict's power for a gain of +0.050 was 0.50" ("" while the headline cell has
    no two paired seeds)."""
    row = headline_cell(report)
    if row is None or row["n"] < 2:
        return ""
    where = f"At {row['condition'].split(' · ')[0]}" if row["setting"] == LM_TRAINING else "On the built-in LM"
    dose = row.get("dose") or {}
    clip = dose.get("clip", {})
    acted = ""
    if claims.KL3_WIDE in clip and claims.PPO in clip:
        acted = (f", {claims.KL3_WIDE} and {claims.PPO} clipped {100 * clip[claims.KL3_WIDE]:.2f}% and "
                 f"{100 * clip[claims.PPO]:.2f}% of tokens")
        if dose.get("disagreement") is not None and math.isfinite(dose["disagreement"]):
            acted += f" and acted differently on {100 * dose['disagreement']:.2f}%"
    verdict = row["verdict_adjusted"]
    ruled = (f" — no gain of {100 * row['effect']:.0f} points or more (rejected at one-sided α = 0.05; "
             f"{row['effect_source']})" if row["rules_out"] else "")
    power = (f"; the verdict's power for a gain of {row['effect']:+.3f} was {row['verdict_power']:.2f}"
             if row.get("verdict_power") is not None else "")
    return (f"{where}{acted}; end accuracy {row['mean']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] over "
            f"{row['n']} seeds: {verdict}{ruled}{power}.")


def headline_sentence(plan, report: Report) -> str:
    """The headline cell of a grid's published runs (`published_evidence`) in a phrase, for README: "stress, 12
    seeds (the two clip states differing on 1.01% of tokens): +0.012 [−0.030, +0.054], sign-flip p 0.62: not
    resolved"."""
    row, setting = headline_cell(report), plan.setting + claims_lm.on_device(plan.device)
    if row is None or row["n"] < 2:
        return f"{setting}, {plan.done} of {len(plan.runs)} runs published: fewer than two paired seeds"
    differ = (row.get("dose") or {}).get("disagreement")
    dose = (f" (the two clip states differing on {100 * differ:.2f}% of tokens)"
            if differ is not None and math.isfinite(differ) else "")
    return (f"{setting}, {row['n']} seeds{dose}: {row['mean']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}], "
            f"sign-flip p {row['p']:.3g}: {row['verdict_adjusted']}"
            + (f", {effect_text(row)}" if row["rules_out"] else ""))


def bandit_markdown(report: Report) -> str:
    """The bandit grid's summary per claim and compared measure as a Markdown table: its cells and how many of them
    each verdict has after adjustment for multiplicity (the verdicts some cell has), and how many held or reversed
    before it."""
    summary = [s for s in report.summary() if s["setting"] in (claims.BANDIT, "random batches")]
    shown = [v for v in VERDICTS if any(s[v] for s in summary)]
    rows, last = [], None
    for s in summary:
        claim, last = ("" if s["claim"] == last else s["claim"]), s["claim"]
        rows.append((claim, f"{s['candidate']} − {s['baseline']}, {s['metric']}", s["cells"],
                     *(s[v] or "" for v in shown), s[RAW] or ""))
    return markdown_table(("claim", "candidate − baseline, metric", "cells", *shown, RAW), rows)


def settings_markdown(report: Report, claim_keys: tuple[str, ...], settings: tuple[str, ...]) -> str:
    """Claims side by side across settings as a Markdown table: a row per claim and compared pair, a column per
    setting, and in each entry, per metric, what its summary entry says after Holm (`cells_phrase`); "—" where the
    setting has no such cell."""
    texts = [claim.text for claim in report.claims if claim.key in claim_keys]
    cells: dict[tuple, list[dict]] = {}
    for row in report.rows:
        cells.setdefault(summary_key(row), []).append(row)
    groups: dict[tuple[str, str], dict[str, list[str]]] = {}
    for entry in sorted((s for s in report.summary() if s["claim"] in texts and s["setting"] in settings),
                        key=lambda entry: texts.index(entry["claim"])):
        pair = groups.setdefault((entry["claim"], f"{entry['candidate']} − {entry['baseline']}"), {})
        pair.setdefault(entry["setting"], []).append(f"{entry['metric']}: "
                                                     f"{cells_phrase(entry, cells[summary_key(entry)])}")
    rows, last = [], None
    for (claim, pair), by_setting in groups.items():
        rows.append(("" if claim == last else claim, pair,
                     *("; ".join(by_setting[s]) if s in by_setting else "—" for s in settings)))
        last = claim
    return markdown_table(("claim", "candidate − baseline", *settings), rows)


def cells_phrase(entry: dict, cells: list[dict]) -> str:
    """What a summary entry (`Report.summary`) says after Holm: up to two cells (one update; an early and a late
    reading) each with its mean, interval and the seeds against the mean; more, the entry's count of each verdict
    and of those that held or reversed before Holm."""
    if entry["cells"] <= 2:
        return "; ".join(f"{c['reading'] + ' ' if len(cells) > 1 else ''}{c['verdict_adjusted']}, {signed(c['mean'])} "
                         f"[{signed(c['low'])}, {signed(c['high'])}], {c['seeds_against_mean']} of {c['n']} against "
                         "the mean" for c in cells)
    return (", ".join(f"{v} {entry[v]}" for v in VERDICTS if entry[v]) + f" of {entry['cells']} cells ({entry[RAW]} "
            "held or reversed before Holm)")


def md(text: str) -> str:
    """Text inside a Markdown table's cell: its pipes escaped."""
    return str(text).replace("|", "\\|")


def bandit_sentence(report: Report, candidate: str = claims.KL3_WIDE, metric: str = "entropy") -> str:
    """One summary line of the bandit grid in words, for README: "KL3 δ=0.05 (wide) − PPO ε=0.2, entropy, 64 seeds:
    reversed in 7 of its 12 primary cells (the late readings), holds in 1, mean and median disagree in 0 (after Holm;
    12 more descriptive; 17 of the 24 held or reversed before adjustment)"."""
    s = next(s for s in report.summary() if s["setting"] == claims.BANDIT and s["candidate"] == candidate
             and s["metric"] == metric)
    primary = s["cells"] - s[DESCRIPTIVE]
    return (f"{candidate} − {s['baseline']}, {metric}, {report.seeds} seeds: reversed in {s[intervals.REVERSED]} of "
            f"its {primary} primary cells (the late readings), holds in {s[intervals.HOLDS]}, mean and median "
            f"disagree in {s[significance.DISAGREE]} (after Holm; {s[DESCRIPTIVE]} more descriptive; {s[RAW]} of the "
            f"{s['cells']} held or reversed before adjustment)")
