"""The claims report: identities read "exact", every verdict follows from its own interval, a cell equals the runs
computed alone, the CLI's JSON contract, the self-contained HTML, and the Claims page (the language model's cells over
training: tests/evidence/test_claims_lm.py)."""

import gzip
import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from divviz.evidence import bandit_cells, cell_words, claims, claims_export, claims_report, forest, intervals, significance
from divviz.bandit.grpo import run_bandit
from divviz.bandit.setting import BanditConfig
from divviz.cli import main
from divviz.metrics import GLOSSARY
from divviz.safetext import literal
from divviz.views import claims_tables

from tests.page_helpers import open_page, shown

SMALL_GRID = (claims.Condition("likely", 50, "sgd"), claims.Condition("random", 50, "adam"),
              claims.Condition("coin", 50, "sgd"))


@pytest.fixture(scope="module")
def report():
    return claims_report.build(seeds=4, grid=SMALL_GRID)


def test_identities_are_exact(report):
    for key in ("kl3_is_clipping", "rpg_same_gradient"):
        rows = [r for r in report.rows if r["claim_key"] == key]
        assert len(rows) >= 20 and all(r["verdict"] == intervals.EXACT for r in rows), key


def test_every_verdict_follows_from_its_interval_and_its_tests(report):
    """At 4 seeds no sign-flip p can go below 0.125: nothing holds or reverses, whatever the t interval says."""
    compared = [r for r in report.rows if r["predicted_sign"]]
    per_condition = {kind: sum(len(c.comparisons) for c in claims.CLAIMS if c.reward == kind) * 2  # early, late
                     for kind in ("task", "random")}
    assert per_condition["random"] == 8 and len(compared) == 2 * per_condition["task"] + per_condition["random"]
    for r in compared:
        low = np.nan if r["low"] is None else r["low"]
        high = np.nan if r["high"] is None else r["high"]
        sign = +1 if r["predicted_sign"] == "+" else -1
        p_median = np.nan if r["p_median"] is None else r["p_median"]
        assert r["verdict"] == significance.verdict(low, high, r["p"], r["mean"], r["median"], sign, p_median)
        assert r["p"] == significance.sign_flip_p(r["differences"]) and r["p"] >= 0.125
        assert r["verdict"] not in (intervals.HOLDS, intervals.REVERSED)
        assert r["n"] == 4 and 0 <= r["seeds_against_mean"] <= 4
        assert r["differences"] == pytest.approx(np.subtract(r["candidate_values"], r["baseline_values"]).tolist())


def test_a_cell_equals_the_runs_computed_alone(report):
    """KL3 δ = 0.05 against PPO on entropy, likely correct actions, K = 50, SGD, late reading: the same numbers
    from each run trained on its own."""
    row = next(r for r in report.rows if r["claim_key"] == "kl3_entropy" and r["candidate"].startswith("KL3 δ=0.05")
               and r["condition"].startswith("correct actions likely") and "late" in r["condition"])
    cfg = SMALL_GRID[0].config(claims.LATE).to_dict()
    entropy = lambda name, seed: run_bandit(BanditConfig.make(**{**cfg, "seed": seed}),  # noqa: E731
                                            claims.OBJECTIVES[name]).history["entropy"][-1]
    d = intervals.paired([entropy(row["candidate"], s) for s in range(4)], [entropy(claims.PPO, s) for s in range(4)])
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((d.mean, d.low, d.high), abs=1e-12)


def test_an_identical_cell_is_two_equal_runs_on_every_seed():
    """One rare correct action, K = 50, SGD, early: where KL3's box and PPO's never bind differently, the two runs
    are the same run — "identical", not "not resolved"."""
    rare = claims.Condition("rare", 50, "sgd")
    same = next(r for r in claims_report.build(seeds=4, grid=(rare,)).rows
                if r["verdict"] == intervals.IDENTICAL and r["claim_key"] == "kl3_entropy"
                and "early" in r["condition"])
    cfg = rare.config(claims.EARLY).to_dict()
    entropy = lambda name, seed: run_bandit(BanditConfig.make(**{**cfg, "seed": seed}),  # noqa: E731
                                            claims.OBJECTIVES[name]).history["entropy"][-1]
    assert all(entropy(same["candidate"], s) == entropy(claims.PPO, s) for s in range(4))
    assert (same["mean"], same["low"], same["high"], same["seeds_against_mean"]) == (0, 0, 0, 0)


def test_the_random_reward_cells_read_the_runs_own_start_zero_and_a_window_of_updates(report):
    """Coin rewards, K = 50, SGD: PPO's late entropy against its own entropy before any update, and the late mean of
    what its masked-low samples would have done against 0, from runs trained alone."""
    cfg = SMALL_GRID[2].config(claims.LATE).to_dict()
    runs = [run_bandit(BanditConfig.make(**{**cfg, "seed": s}), claims.OBJECTIVES[claims.PPO]) for s in range(4)]
    cells = {(r["claim_key"], r["metric"]): r for r in report.rows if r["condition"].startswith("random rewards")
             and "late" in r["condition"]}
    falls = cells[("random_reward_entropy_falls", "entropy")]
    d = intervals.paired([run.history["entropy"][-1] for run in runs], [run.initial_entropy for run in runs])
    assert (falls["mean"], falls["low"], falls["high"]) == pytest.approx((d.mean, d.low, d.high), abs=1e-12)
    would = cells[("random_reward_attribution", "entropy/would_masked_low")]
    values = [run.history["entropy/would_masked_low"][claims.LATE - claims.EARLY:].mean() for run in runs]
    d = intervals.paired(values, [0.0] * 4)
    assert (would["mean"], would["low"], would["high"]) == pytest.approx((d.mean, d.low, d.high), abs=1e-12)
    assert "iterations 71–80" in would["condition"] and falls["baseline"] == claims.START


def test_summary_counts_every_cell(report):
    assert sum(s["cells"] for s in report.summary()) == len(report.rows)
    for s in report.summary():  # an identity says how close it came; a measured claim has no such number
        cells = [r for r in report.rows if r["claim"] == s["claim"] and r["setting"] == s["setting"]
                 and r["candidate"] == s["candidate"] and r["metric"] == s["metric"]]
        identity = all(r["verdict"] in (intervals.EXACT, intervals.NOT_EXACT) for r in cells)
        assert s["largest"] == (max(abs(r["mean"]) for r in cells) if identity else None)
    text = claims_export.to_text(report)
    assert "Not testable here:" in text and "math benchmarks" in text


def test_cli_json_and_self_contained_html(capsys, tmp_path):
    out = tmp_path / "report.html"
    assert main(["claims", "--seeds", "3", "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["cells"]
    assert {"claim", "condition", "metric", "mean", "low", "high", "n", "verdict"} <= set(rows[0])
    assert {r["verdict"] for r in rows} <= {"holds", "reversed", "not resolved", "identical", "exact",
                                            "mean and median disagree"}
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "exact" in page
    assert not re.search(r"<script|<link|src=|href=|@import|url\(", page)  # nothing fetched from anywhere


def test_the_overview_never_adds_one_settings_verdicts_to_anothers(report):
    """A claim tested in two settings (here the bandit's cells and, as if trained on a language model, copies of
    some of them) has a row per setting, each counting its own cells; a claim with no cell has one row."""
    copied = [{**row, "setting": claims.LM_TRAINING} for row in report.rows if row["setting"] == claims.BANDIT][::3]
    both = replace(report, rows=report.rows + copied)
    rows = {(r["claim"], r["setting"]): r for r in both.overview()}
    alone = {(r["claim"], r["setting"]): r for r in report.overview()}
    assert len(rows) == len(both.overview()) == len(alone) + len({row["claim"] for row in copied})
    for (claim, setting), row in rows.items():
        own = [r for r in both.rows if (r["claim"], r["setting"]) == (claim, setting)]
        assert row["cells"] == len(own) and sum(row[v] for v in claims_report.VERDICTS) == len(own)
        if setting == claims.BANDIT:
            assert row == alone[claim, setting]  # the copies' verdicts are not added to the bandit's
    assert all(row["setting"] == "" for row in rows.values() if row["cells"] == 0)
    primary = [row for row in copied if row["primary"] and row["p"] is not None]
    ruling = [{**primary[0], "rules_out": True}, {**primary[1], "rules_out": True, "primary": False}]
    ruled = replace(report, rows=report.rows + ruling).overview()  # only a primary cell's ruling out is counted
    assert sum(row[claims_report.RULES_OUT] for row in ruled) == 1 + sum(r["rules_out"] is True for r in report.rows)
    assert "rule out a gain of the margin" in claims_export.to_text(replace(report, rows=report.rows + ruling[:1]))


def test_claims_across_settings_say_what_the_summary_counts(report):
    """docs/claims.md's tables across settings (`settings_markdown`): each entry's counts are the summary's after
    Holm; one or two cells give their own mean and interval; a setting without the pair's cells reads "—"."""
    for s in report.summary():
        cells = [r for r in report.rows if claims_report.summary_key(r) == claims_report.summary_key(s)]
        assert len(cells) == s["cells"]
        phrase = claims_export.cells_phrase(s, cells)
        if len(cells) > 2:
            assert phrase == ", ".join(f"{v} {s[v]}" for v in claims_report.VERDICTS if s[v]) + \
                f" of {s['cells']} cells ({s[claims_report.RAW]} held or reversed before Holm)"
        else:
            assert all(f"{c['verdict_adjusted']}, {cell_words.signed(c['mean'])} [{cell_words.signed(c['low'])}"
                       in phrase for c in cells)
    keys = ("random_reward_clip_low", "kl3_entropy")
    table = claims_export.settings_markdown(report, keys, (claims.BANDIT, claims.REAL)).splitlines()
    pairs = {(r["claim_key"], r["candidate"], r["baseline"]) for r in report.rows if r["claim_key"] in keys}
    assert table[0] == f"| claim | candidate − baseline | {claims.BANDIT} | {claims.REAL} |"
    assert len(table) == 2 + len(pairs)
    assert all(line.endswith("| — |") and "| entropy: " in line for line in table[2:])  # no SmolLM2 cell here


def test_a_signed_number_has_its_sign_and_zero_has_none():
    assert [cell_words.signed(x) for x in (0.146, -0.00184, 8.8e-5, -3e-7)] == ["+0.146", "-0.00184", "+0.000088",
                                                                                "-0.0000003"]
    assert cell_words.signed(0.0) == cell_words.signed(-0.0) == "0"  # a median of exactly 0 is on neither side


def test_forest_plots_put_each_cell_on_its_side_of_zero_in_its_verdicts_colour(report):
    panels = forest.panels(report)
    assert {(claim.key, metric) for claim, metric, _ in panels} == {
        (r["claim_key"], r["metric"]) for r in report.rows if r["predicted_sign"]}
    for claim in report.claims:  # one claim's panels, as the page draws them
        assert forest.panels(report, [claim]) == [panel for panel in panels if panel[0] == claim]
    for claim, metric, cells in panels:
        drawn, tall = forest.panel(claim, metric, cells)
        width = forest.LABEL_WIDTH + forest.PLOT_WIDTH + forest.MARGIN_WIDTH
        assert f"viewBox='0 0 {width} {tall}'" in drawn  # every panel as wide
        zero = float(re.search(r"<line x1='([\d.]+)' x2='\1'", drawn).group(1))
        points = re.findall(r"<circle cx='([\d.]+)' cy='[\d.]+' r='4' fill='(#\w+)'><title>", drawn)
        assert len(points) == len(cells)
        for (cx, colour), cell in zip(points, cells):
            assert colour == forest.VERDICT_COLOURS[cell["verdict_adjusted"]]
            assert np.sign(float(cx) - zero) == np.sign(round(cell["mean"], 12)) or abs(float(cx) - zero) < 0.1
        assert "<script" not in drawn and "&lt;" not in claim.text
        assert "viewBox='0 0 " in drawn and "width='100%'" in drawn  # scales down to the page's column
        ticks = [float(t) for t in re.findall(r"text-anchor='middle' fill='#555'>([^<]+)<", drawn)]
        half_width = max(ticks)  # round numbers, above the rows and below them
        assert sorted(ticks) == sorted(2 * [-half_width, -half_width / 2, 0.0, half_width / 2, half_width])
        assert float(f"{half_width:.0e}") == half_width or half_width / 10 ** np.floor(np.log10(half_width)) == 2.5
        common, rows = forest.row_labels([forest.label(cell, False) for cell in cells])
        assert all(0 < len(row) <= forest.LABEL_CHARS for row in rows)
        assert ("every row: " in drawn) == bool(common)
    page = claims_export.to_html(report)
    assert page.count("<svg") == len(panels)
    cell = {"candidate": "KL3 δ=0.05 (wide)", "setting": claims.LM_TRAINING,
            "condition": "stress · add · over the run (trapezoid mean of steps 0–30)"}
    assert forest.label(cell, False) == "KL3 δ=0.05 · SmolLM2-135M, over training · stress · add · over the run"
    labels = [forest.label({**cell, "candidate": who, "condition": f"stress · add · {when}"}, False)
              for who in ("KL3 δ=0.05", "DAPO") for when in ("early", "late")]  # what every row shares, said once
    assert forest.row_labels(labels) == (["SmolLM2-135M, over training", "stress", "add"],
                                         ["KL3 δ=0.05 · early", "KL3 δ=0.05 · late", "DAPO · early", "DAPO · late"])
    assert forest.row_labels(labels[:1]) == ([], labels[:1])  # a row keeps its label whole rather than nothing
    assert forest.row_labels(["x" * 100])[1] == ["x" * (forest.LABEL_CHARS - 1) + "…"]


def test_a_few_wide_intervals_do_not_squeeze_the_forest_plot():
    """Nineteen narrow cells and one seed far out: the axis is set by the many (its ends run past with an arrowhead),
    every mean stays on it, and a one-seed cell is drawn hollow."""
    cell = {"candidate": "KL3", "baseline": "PPO", "setting": "bandit", "predicted_sign": "+", "n": 4,
            "seeds_against_mean": 0, "verdict": intervals.HOLDS, "verdict_adjusted": intervals.HOLDS, "p": None}
    cells = [{**cell, "condition": f"c{i}", "mean": 0.03, "low": 0.01, "high": 0.05} for i in range(19)]
    wide = {**cell, "condition": "far", "mean": 0.2, "low": -3.0, "high": 3.4, "verdict": intervals.NOT_RESOLVED,
            "verdict_adjusted": intervals.NOT_RESOLVED}
    one = {**cell, "condition": "one seed", "mean": 0.02, "low": None, "high": None, "n": 1}
    assert forest.axis_reach(cells + [wide]) == 0.2 == forest.axis_reach(cells + [wide, one])  # its mean, not its ends
    drawn = forest.svg(cells + [wide, one], "t")
    assert drawn.count("<path d=") == 2 and "runs past the axis" in drawn  # both ends of the wide one
    assert "fill='white' stroke='#2ca02c'" in drawn and "no interval from one seed" in drawn
    assert "runs past the axis" not in forest.svg(cells, "t") and forest.axis_reach(cells) == 0.05


def test_cli_refuses_bad_options(capsys, tmp_path):
    assert main(["claims", "--seeds", "1"]) == 2
    assert main(["claims", "--quick", "--out", str(tmp_path / "missing" / "r.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_claims_page_renders(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_CACHE", str(tmp_path))  # no SmolLM2 cells cached and no LM runs (whatever the
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "runs"))  # user's runs folder holds): the bandit's alone
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception
    headers = [h.value for h in at.subheader]  # the verdicts first, then the model sections that add cells to them
    assert headers == ["Every claim at a glance", literal(claims.CLAIMS[0].text), "On a language model, over training",
                       "Where the constraint binds: the dose searches", "On a real model, one update at a time",
                       "Not testable here"]
    at.slider[0].set_value(3).run()
    report = claims_report.build(3)
    overview = at.table[0].value  # every claim and setting, its cells and each verdict's count, static: nothing cut
    claim_of = overview.claim.mask(overview.claim == "").ffill()  # a claim's text on its first row only
    assert list(dict.fromkeys(claim_of)) == [literal(c.text) for c in claims.CLAIMS]
    assert (overview[[v for v in claims_report.VERDICTS if v in overview]].sum(axis=1) == overview.cells).all()
    cells = Counter((literal(r["claim"]), literal(r["setting"])) for r in report.rows)
    untested = {(literal(c.text), literal(claims_tables.NOT_YET)): 0 for c in claims.CLAIMS  # on a language model
                if not (c.comparisons or c.real_comparisons or c.identity)}              # only, none trained here
    assert untested and dict(zip(zip(claim_of, overview.setting), overview.cells)) == {**cells, **untested}
    for claim in (claims.CLAIMS[0], next(c for c in claims.CLAIMS if c.comparisons)):  # an identity; a measured one
        at.selectbox(key="claims:claim").set_value(claim.key).run()  # one claim drawn at a time
        assert not at.exception and at.subheader[1].value == literal(claim.text)
        summary, cells = at.dataframe[0].value, at.dataframe[1].value
        assert len(at.table) == 1 and len(at.dataframe) == 2 and summary.cells.sum() == len(cells) == sum(
            row["claim_key"] == claim.key for row in report.rows)
        assert at.query_params.get("claim") == (None if claim == claims.CLAIMS[0] else claim.key)  # in the link
        assert not {"seeds_against_mean", "predicted_sign", "claim"} & (set(summary) | set(cells))  # read as headers
        outcome = (["verdict (Holm)", "verdict (raw)", "mean"] if claim.comparisons
                   else ["verdict (raw)", "largest |difference|"])  # in view: before the long text
        assert list(cells)[list(cells).index(outcome[0]):][:len(outcome)] == outcome
        assert list(cells).index("condition") > list(cells).index(outcome[-1])
        assert ("largest |difference|" in summary) == (claim == claims.CLAIMS[0])  # an identity's closeness
        shared = claims_report.in_common([r for r in report.rows if r["claim_key"] == claim.key], ("baseline", "setting"))
        assert shared and not set(shared) & set(cells)  # said once above the table, not in every row
        assert any(literal(f"baseline {shared['baseline']}") in c.value for c in at.caption)
        for metric in {c.metric for c in claim.comparisons}:  # each metric's meaning, in words
            assert any(literal(f"{metric}: {GLOSSARY[metric]}") in c.value for c in at.caption)
    drawn = [m.value for m in at.markdown if "<svg" in m.value]  # a forest plot per metric of the claim shown
    assert len(drawn) == len({c.metric for c in claim.comparisons}) > 0
    assert all("<circle" in body for body in drawn)
    linked = open_page("app_pages/claims.py", {"claim": "<b>no_such_claim"})  # a link's unknown claim is said
    assert not linked.exception and "'claim' has unknown value" in shown(linked.warning[0])
    assert "<b>" not in linked.warning[0].value and linked.selectbox(key="claims:claim").value == claims.CLAIMS[0].key


def test_published_bandit_cells_are_read_only_when_whole_and_this_codes(report, tmp_path, monkeypatch):
    """A grid's cells published (`bandit_published.write`) come back as the same report, saying where from; a file
    that is not this grid's (other seeds), cut short, unreadable, or with a cell that is not whole is not read: the
    grid is computed here instead, and `recompute` computes it whatever is published."""
    from divviz.evidence import bandit_published

    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(tmp_path))
    written = bandit_published.write(bandit_cells.bandit_cells(4, SMALL_GRID), 4, SMALL_GRID, 1.0, "abc1234")
    read = claims_report.build(seeds=4, grid=SMALL_GRID)
    assert read.bandit.startswith(f"read from published/{bandit_published.FILE}, computed by commit abc1234") \
        and report.bandit == claims_report.COMPUTED_HERE
    assert read.rows == report.rows
    assert claims_report.build(seeds=4, grid=SMALL_GRID, recompute=True).bandit == claims_report.COMPUTED_HERE
    again = bandit_published.write(bandit_cells.bandit_cells(4, SMALL_GRID), 4, SMALL_GRID, 2.0, "def5678")
    assert "abc1234" in claims_report.build(seeds=4, grid=SMALL_GRID).bandit  # the same cells: the file left as it was
    assert bandit_published.read(3, SMALL_GRID) is None  # another grid's key
    whole = again.read_bytes()
    about = json.loads(gzip.decompress(whole))
    broken = [whole[:len(whole) // 2], b"not gzip",
              gzip.compress(json.dumps({**about, "commit": None}).encode()),
              gzip.compress(json.dumps({**about, "cells": [{**about["cells"][0], "baseline_values": [1.0]}]}).encode()),
              gzip.compress(json.dumps({**about, "cells": [{**about["cells"][0], "metric": "no such metric"}]}).encode()),
              gzip.compress(json.dumps({**about, "cells": [{**about["cells"][0],
                                                            "candidate_values": ["x"] * 4}]}).encode())]
    for content in broken:
        written.write_bytes(content)
        assert bandit_published.read(4, SMALL_GRID) is None
        assert claims_report.build(seeds=4, grid=SMALL_GRID).bandit == claims_report.COMPUTED_HERE


def test_the_json_names_each_p_by_its_test_and_keeps_its_flips(report):
    cells = claims_export.report_json(report)["cells"]
    compared = [c for c in cells if c["p"] is not None]
    assert compared and all(c["p_sign_flip"] == c["p"] and c["p_sign_flip_holm"] == c["p_holm"]
                            and c["p_sign_test"] == c["p_median"] for c in compared)
    assert all(c["p_flips"] is None and c["p_bounds"] == [c["p"], c["p"]] for c in compared)  # 4 seeds: every flip
    json.dumps(cells)  # the bounds are plain floats
