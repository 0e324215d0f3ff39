"""The claims report: identities read "exact", every verdict follows from its own interval, a cell equals the runs
computed alone, the CLI's JSON contract, the self-contained HTML, and the Claims page."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from divviz import claims, evidence
from divviz.bandit import BanditConfig, run_bandit
from divviz.cli import main

SMALL_GRID = (claims.Condition("likely", 50, "sgd"), claims.Condition("random", 50, "adam"))


@pytest.fixture(scope="module")
def report():
    return claims.evaluate(seeds=4, grid=SMALL_GRID)


def test_identities_are_exact(report):
    for key in ("kl3_is_clipping", "rpg_same_gradient"):
        rows = [r for r in report.rows if r["claim_key"] == key]
        assert len(rows) >= 20 and all(r["verdict"] == evidence.EXACT for r in rows), key


def test_every_verdict_follows_from_its_interval(report):
    compared = [r for r in report.rows if r["predicted_sign"]]
    per_condition = sum(len(c.comparisons) for c in claims.CLAIMS) * 2  # early and late
    assert len(compared) == per_condition * len(SMALL_GRID)
    for r in compared:
        low = np.nan if r["low"] is None else r["low"]
        high = np.nan if r["high"] is None else r["high"]
        assert r["verdict"] == evidence.verdict(low, high, +1 if r["predicted_sign"] == "+" else -1)
        assert r["n"] == 4 and 0 <= r["seeds_reversed"] <= 4


def test_a_cell_equals_the_runs_computed_alone(report):
    """KL3 δ = 0.05 against PPO on entropy, likely correct actions, K = 50, SGD, late reading: the same numbers
    from each run trained on its own."""
    row = next(r for r in report.rows if r["claim_key"] == "kl3_entropy" and r["candidate"].startswith("KL3 δ=0.05")
               and r["condition"].startswith("correct actions likely") and "late" in r["condition"])
    cfg = SMALL_GRID[0].config(claims.LATE).to_dict()
    entropy = lambda name, seed: run_bandit(BanditConfig.make(**{**cfg, "seed": seed}),  # noqa: E731
                                            claims.OBJECTIVES[name]).history["entropy"][-1]
    d = evidence.paired([entropy(row["candidate"], s) for s in range(4)], [entropy(claims.PPO, s) for s in range(4)])
    assert (row["mean"], row["low"], row["high"]) == pytest.approx((d.mean, d.low, d.high), abs=1e-12)


def test_summary_counts_every_cell(report):
    assert sum(s["cells"] for s in report.summary()) == len(report.rows)
    text = claims.to_text(report)
    assert "Not testable here:" in text and "math benchmarks" in text


def test_cli_json_and_self_contained_html(capsys, tmp_path):
    out = tmp_path / "report.html"
    assert main(["claims", "--seeds", "3", "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"claim", "condition", "metric", "mean", "low", "high", "n", "verdict"} <= set(rows[0])
    assert {r["verdict"] for r in rows} <= {"holds", "reversed", "not resolved", "exact"}
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "exact" in page
    assert not re.search(r"<script|<link|src=|href=|@import|url\(", page)  # nothing fetched from anywhere


def test_cli_refuses_bad_options(capsys, tmp_path):
    assert main(["claims", "--seeds", "1"]) == 2
    assert main(["claims", "--quick", "--out", str(tmp_path / "missing" / "r.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_claims_page_renders():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception
    headers = [h.value for h in at.subheader]
    assert len(headers) == len(claims.CLAIMS) + 1 and "Not testable here" in headers[-1]
    at.slider[0].set_value(3).run()
    assert not at.exception and len(at.dataframe) == 2 * len(claims.CLAIMS)
