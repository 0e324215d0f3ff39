"""README's over-training row and docs/claims.md's generated blocks are what the published runs say now
(scripts/evidence_tables.py writes them), and docs/claims.md's few lines that recompute a cell with numpy alone give
divviz's own cell."""

import contextlib
import json
import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from divviz.evidence import (bandit_cells, bandit_published, claims, claims_export, claims_real, claims_report,
                             lm_evidence, significance)
from divviz.evidence.kept import Kept
from divviz.safetext import literal

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("evidence_tables", ROOT / "scripts" / "evidence_tables.py")
evidence_tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evidence_tables)


def test_readme_and_claims_md_hold_what_the_bandit_grid_and_the_published_runs_say(repository_published, monkeypatch,
                                                                                   tmp_path):
    """Every table regenerated, its sign-flip p's drawn again here (the published ones hidden), then those p's
    compared with published/sign-flip-p.json's: the same p's, for the same cells (within one flip, for a CPU whose
    float sums break a tie the other way)."""
    published_ps = significance._read_kept(significance.published_file())
    monkeypatch.setattr(significance, "published_file", lambda: tmp_path / "hidden.json")
    monkeypatch.setattr(significance, "_TESTED", {})
    monkeypatch.setattr(significance, "_LOADED", set())
    monkeypatch.setattr(significance, "_READ", set())
    for kept in (lm_evidence, claims_real, claims_report):  # every cell and report computed here, as in the script's
        monkeypatch.setattr(kept, "COMPUTED", Kept())  # fresh process: one another test of this process kept reads no p
    claims_md = (ROOT / "docs" / "claims.md").read_text()
    stale = "is stale: run python scripts/evidence_tables.py"
    grids = evidence_tables.published()
    assert claims_md.split(evidence_tables.START)[1].split(evidence_tables.END)[0] == evidence_tables.block(grids), \
        f"docs/claims.md's over-training block {stale}"
    builtin = claims_export.published_evidence("builtin", "")
    assert builtin[0].done == len(builtin[0].runs) == 72  # the built-in LM's grid is published whole
    assert claims_md.split(evidence_tables.BUILTIN_START)[1].split(evidence_tables.BUILTIN_END)[0] == \
        claims_export.published_markdown(*builtin), f"docs/claims.md's built-in LM block {stale}"
    readme = (ROOT / "README.md").read_text().splitlines(keepends=True)
    assert [line for line in readme if line.startswith(evidence_tables.ROW)] == [evidence_tables.readme_row(grids)], \
        f"README's over-training row {stale}"
    assert bandit_published.read(claims.SEEDS, claims.GRID + claims.RANDOM_GRID) is not None, \
        f"published/{bandit_published.FILE} is not this code's grid: run python scripts/evidence_tables.py"
    bandit = evidence_tables.bandit_report()
    assert bandit.bandit.startswith(f"read from published/{bandit_published.FILE}")
    assert claims_md.split(evidence_tables.BANDIT_START)[1].split(evidence_tables.BANDIT_END)[0] == \
        claims_export.bandit_markdown(bandit), f"docs/claims.md's bandit table {stale}"
    mechanism = evidence_tables.mechanism_report(bandit, builtin[2])
    random_rewards, one_update = evidence_tables.across_settings(mechanism)
    assert claims_md.split(evidence_tables.RANDOM_START)[1].split(evidence_tables.RANDOM_END)[0] == random_rewards, \
        f"docs/claims.md's random-reward table {stale}"
    assert claims_md.split(evidence_tables.UPDATE_START)[1].split(evidence_tables.UPDATE_END)[0] == one_update, \
        f"docs/claims.md's one-update table {stale}"
    assert "of 16 against the mean" in one_update  # SmolLM2's 16 published batches, read (none computed here)
    assert [line for line in readme if line.startswith(evidence_tables.ENTROPY_ROW)] == \
        [evidence_tables.entropy_row(mechanism)], \
        f"README's row on why entropy moves {stale}"
    assert [line for line in readme if line.startswith(evidence_tables.BANDIT_ROW)] == \
        [evidence_tables.bandit_row(bandit)], f"README's bandit row {stale}"
    drawn = {key: significance._TESTED[key] for key in significance._READ}
    assert set(drawn) == set(published_ps), f"published/{significance.PUBLISHED_FILE} {stale}"
    one_flip = {key: 1 / (key[2] + 1) if key[2] else 2.0 ** -20 for key in drawn}
    assert all(abs(drawn[key] - published_ps[key]) <= 2 * one_flip[key] for key in drawn)


# Three of the grid's 16 conditions, computed again here: SGD and Adam, K = 50 and 1000, the coin's random rewards.
RECOMPUTED = (claims.Condition("likely", 50, "sgd"), claims.Condition("random", 1000, "adam"),
              claims.Condition("coin", 50, "adam"))


def test_the_published_bandit_cells_are_what_the_bandit_computes_here(repository_published):
    """The published bandit grid against this code, on three of its conditions at its 64 seeds: every seed's value
    within 1e-6 (relative) of the published one — the same to rounding on another CPU (the key checks the rest of
    what decides them: settings, objectives, comparisons)."""
    published = bandit_published.read(claims.SEEDS, claims.GRID + claims.RANDOM_GRID)
    assert published is not None
    here = bandit_cells.bandit_cells(claims.SEEDS, RECOMPUTED)
    texts = tuple(condition.text for condition in RECOMPUTED)
    shared = [cell for cell in published["cells"] if cell["condition"].startswith(texts)]
    assert len(here) == len(shared) > 0
    for mine, theirs in zip(here, shared, strict=True):
        assert {k: v for k, v in mine.items() if not k.endswith("_values")} == \
            {k: v for k, v in theirs.items() if not k.endswith("_values")}
        for values in ("candidate_values", "baseline_values"):
            assert mine[values] == pytest.approx(theirs[values], rel=1e-6, abs=1e-12, nan_ok=True), mine["condition"]


def test_the_cli_and_the_claims_page_open_on_the_published_bandit_cells(capsys, repository_published, tmp_path,
                                                                     monkeypatch):
    """`divviz claims` at its default 64 seeds reads the published cells and says so (the JSON's scope); the Claims
    page opens on them (64 seeds, read at once) with the same line under its slider."""
    from streamlit.testing.v1 import AppTest

    from divviz.cli import main

    assert main(["claims", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f"64 seeds per measure, every measure on the same seeds, read from published/{bandit_published.FILE}, " \
           "computed by commit" in out["scope"]
    rows = [r for r in out["cells"] if r["setting"] == claims.BANDIT]
    assert rows and {r["n"] for r in rows} == {claims.SEEDS}

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception and at.slider(key="claims:seeds").value == claims.SEEDS
    assert any(literal(f"read from published/{bandit_published.FILE}") in c.value for c in at.caption)


def test_the_numpy_recipe_in_claims_md_recomputes_divvizs_cell(repository_published):
    recipe = re.search(r"```python\n(# recompute a cell.*?)```", (ROOT / "docs" / "claims.md").read_text(), re.S)[1]
    assert len(recipe.strip().splitlines()) <= 10
    scope = {}
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(recipe, "docs/claims.md", "exec"), scope)  # our own documentation's code, not user text
    d = scope["d"]
    _, _, report = claims_export.published_evidence("smollm2-135m", "stress")
    cell = claims_export.headline_cell(report)
    assert cell["n"] == d.size >= 2 and cell["differences"] == pytest.approx(d.tolist(), abs=1e-12)
    half = stats.t.ppf(0.975, d.size - 1) * scope["se"]
    assert (cell["mean"], cell["low"], cell["high"]) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
    endpoints = re.search(r"```python\n(# the two endpoints.*?)```", (ROOT / "docs" / "claims.md").read_text(), re.S)[1]
    assert len(endpoints.strip().splitlines()) <= 10
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(endpoints, "docs/claims.md", "exec"), scope)  # our own documentation's code, not user text
    for metric, reading, values in (("eval/accuracy", "over the run", scope["auc"]),
                                    (claims.TIME_TO_COLLAPSE, "whole run", scope["ttc"])):
        cell = next(r for r in report.rows if r["candidate"] == claims.KL3_WIDE and r["baseline"] == claims.PPO
                    and r["metric"] == metric and r["reading"] == reading)
        assert cell["n"] == values.size and cell["differences"] == pytest.approx(values.tolist(), abs=1e-12)


def test_divviz_claims_json_carries_each_cells_per_seed_values_from_the_published_runs(capsys, tmp_path,
                                                                                     repository_published):
    from divviz.cli import main

    assert main(["claims", "--seeds", "2", "--lm", "--lm-model", "smollm2-135m", "--lm-setting", "stress", "--no-train",
                 "--runs-dir", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr()
    assert "runs are published: smollm2-135m-stress-cpu" in out.err  # the provenance, in one line
    report = json.loads(out.out)
    assert "runs are published: smollm2-135m-stress-cpu" in report["scope"]  # and in the JSON
    cells = [r for r in report["cells"] if r["setting"] == claims.LM_TRAINING and r["n"] >= 1]
    assert cells
    for cell in cells:
        assert len(cell["seeds"]) == len(cell["candidate_values"]) == len(cell["baseline_values"]) == cell["n"]
        assert cell["differences"] == pytest.approx(np.subtract(cell["candidate_values"], cell["baseline_values"]))
        assert {"p", "p_holm", "q_bh", "median", "p_median", "verdict", "verdict_adjusted"} <= set(cell)


def test_a_fresh_clones_claims_page_opens_on_the_published_grid(repository_published, tmp_path, monkeypatch):
    """Nothing trained: the Claims page opens on SmolLM2's published stress grid, says so in one line, and its
    over-training cells are the published runs' (raw and Holm-adjusted verdicts side by side)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300)
    at.run()
    at.switch_page("app_pages/claims.py").run()
    assert not at.exception
    said = " ".join(i.value for i in at.info)
    assert "Published runs" in said and "smollm2\\-135m\\-stress\\-cpu" in said
    at.selectbox(key="claims:claim").set_value("kl3_training").run()
    cells = next(d.value for d in at.dataframe if "verdict (Holm)" in d.value.columns)
    _, _, report = claims_export.published_evidence("smollm2-135m", "stress")
    assert len(cells) == sum(r["claim_key"] == "kl3_training" for r in report.rows)
    assert "verdict (raw)" in cells and "sign-flip p" in cells
    assert {"verdict power (whole rule, Holm)", "dose (clip fractions; tokens whose clip state differs)"} <= \
        set(cells.columns)
    sentence = claims_export.plain_sentence(report)
    assert sentence.startswith("At stress, ") and any(sentence in m.value.replace("\\", "") for m in at.markdown)


def test_the_cli_opens_on_the_setting_the_claims_page_opens_on(capsys, tmp_path, repository_published):
    from divviz.cli import main
    from divviz.evidence import claims_lm

    assert main(["claims", "--seeds", "2", "--lm", "--lm-model", "smollm2-135m", "--no-train", "--runs-dir",
                 str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert claims_lm.opening_setting(["learn", "stress"]) == "stress" and "smollm2-135m-stress-cpu" in out.err
    assert "At stress, KL3 δ=0.05 (wide) and PPO ε=0.2 clipped" in out.out


def test_the_gpu_pair_is_read_on_its_own_from_the_cli_and_the_claims_page(capsys, tmp_path, repository_published,
                                                                          monkeypatch):
    """SmolLM2's stress pair trained on a GPU (published/smollm2-135m-stress-h200) is a grid of its own: `--lm-device
    cuda --no-train` and the Claims page's Trained on read it alone; runs queued here cannot be asked to train there."""
    from streamlit.testing.v1 import AppTest

    from divviz.cli import main

    lm = ["claims", "--seeds", "2", "--lm", "--lm-model", "smollm2-135m", "--lm-setting", "stress",
          "--runs-dir", str(tmp_path), "--lm-device", "cuda"]
    assert main(lm) == 2
    assert "--lm-device cuda: runs queued here would train on cpu; add --no-train" in capsys.readouterr().err
    assert main([*lm, "--no-train", "--json"]) == 0
    out = capsys.readouterr()
    assert "smollm2-135m-stress-h200 (32 runs, trained on cuda (NVIDIA H200)" in out.err
    cells = [r for r in json.loads(out.out)["cells"] if r["setting"] == claims.LM_TRAINING]
    assert {r["candidate"] for r in cells} == {claims.KL3_WIDE} and {r["n"] for r in cells} == {16}  # the pair alone
    assert all(r["condition"].startswith("stress on a GPU · ") for r in cells)

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/claims.py").run()
    at.selectbox(key="claims:lm_device").set_value("cuda").run()
    assert not at.exception
    # the pair as closed (`claims_lm.CLOSED_AT`): nothing more to queue
    assert (at.slider(key="claims:lm_seeds").value, at.number_input(key="claims:lm_pilot_extra").value) == (0, 16)
    assert any("smollm2\\-135m\\-stress\\-h200" in i.value for i in at.info)
    assert any("on 16 seeds" in s.value for s in at.success) and not any(b.key == "claims:lm_start" for b in at.button)
    at.number_input(key="claims:lm_pilot_extra").set_value(17).run()  # a seed more than the closed grid has
    assert next(b for b in at.button if b.key == "claims:lm_start").disabled  # this CPU cannot train them as a GPU's
