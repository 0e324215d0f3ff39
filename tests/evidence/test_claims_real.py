"""The claims on SmolLM2-135M, one update per batch (`evidence/claims_real.py`): computed once and cached (a second
call trains nothing), Ctrl-C keeps what is done, every cell is the paired difference of the cached numbers with the
verdict its interval gives, and the CLI and the Claims page include them."""

import json
from pathlib import Path

import numpy as np
import pytest

from divviz.cli import main
from divviz.engine import compare
from divviz.evidence import claims, claims_export, claims_real, claims_report, intervals
from divviz.runs import published

BATCHES = 2
COMPUTED = (0, "random")  # the one batch the fixture computes (2 measures, a task batch 4); the others are published


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache of the published batches but one, which is computed here (2 of the 12 updates of computing them all)
    and must come back as published."""
    folder = tmp_path_factory.mktemp("claims_real")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(claims_real, "cache_folder", lambda: folder)
        patch.setenv("DIVVIZ_PUBLISHED", str(folder / "nothing published"))
        plan = claims_real.RealPlan(BATCHES)
        for job in [job for job in plan.jobs if job != COMPUTED]:
            name = claims_real.cache_file(*job).name
            (folder / name).write_bytes((published.ROOT / claims_real.PUBLISHED / name).read_bytes())
        assert plan.missing == [COMPUTED]
        seen = []
        plan.compute(lambda done, total, text: seen.append((done, total)))
        assert seen[0] == (0, 1) and seen[-1] == (1, 1) and not plan.missing
    return folder


def test_a_batch_computed_here_is_the_published_one(cache):
    """Across CPUs the same to rounding: every measure's every number within 1e-3 (or 1%)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(claims_real, "cache_folder", lambda: cache)
        here = claims_real.cache_file(*COMPUTED)
    shared = json.loads((published.ROOT / claims_real.PUBLISHED / here.name).read_text())
    mine = json.loads(here.read_text())
    assert mine.keys() == shared.keys()  # the file's name is its content's key: config, measures, checkpoint
    for measure, numbers in shared.items():
        assert mine[measure] == pytest.approx(numbers, rel=1e-2, abs=1e-3), measure


@pytest.fixture
def cached(cache, monkeypatch):
    monkeypatch.setattr(claims_real, "cache_folder", lambda: cache)
    return cache


def test_a_second_call_trains_nothing(cached, monkeypatch):
    monkeypatch.setattr(compare, "same_batch", lambda *a, **k: pytest.fail("a cached batch was computed again"))
    plan = claims_real.RealPlan(BATCHES)
    plan.compute()
    assert len(plan.rows()) == sum(len(c.real_comparisons) for c in claims.CLAIMS)


def test_every_cell_is_the_paired_difference_of_the_cached_updates(cached):
    plan = claims_real.RealPlan(BATCHES)
    rows = plan.rows()
    assert {r["setting"] for r in rows} == {claims.REAL} and all(r["n"] == BATCHES for r in rows)
    for r in rows:
        claim = next(c for c in claims.CLAIMS if c.key == r["claim_key"])
        results = [json.loads(claims_real.cache_file(b, claim.reward).read_text()) for b in range(BATCHES)]
        base = [0.0 if r["baseline"] == claims.ZERO else res[r["baseline"]][r["metric"]] for res in results]
        d = intervals.paired([res[r["candidate"]][r["metric"]] for res in results], base)
        assert (r["mean"], r["low"], r["high"]) == pytest.approx((d.mean, d.low, d.high))
        assert r["verdict"] == intervals.verdict(d.low, d.high, +1 if r["predicted_sign"] == "+" else -1)
    ppo = json.loads(claims_real.cache_file(0, "task").read_text())[claims.PPO]
    assert ppo["clip_ratio/low_mean"] + ppo["clip_ratio/high_mean"] > 0  # one update at these settings clips
    assert all(np.isfinite(ppo[key]) for key in ("entropy/change", "entropy/change_predicted", "top1_change"))
    report = plan.report(claims_report.build(seeds=2, grid=()))
    assert "SmolLM2-135M-Instruct, one update per batch" in report.scope and "<svg" in claims_export.to_html(report)


def test_ctrl_c_keeps_the_batches_done(cached, tmp_path, monkeypatch, capsys):
    for job in claims_real.RealPlan(BATCHES).jobs[:2]:  # the first batch, both rewards, already done
        target = tmp_path / claims_real.cache_file(*job).name
        target.write_text(claims_real.cache_file(*job).read_text())
    monkeypatch.setattr(claims_real, "cache_folder", lambda: tmp_path)
    monkeypatch.setattr(compare, "same_batch", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["claims", "--seeds", "2", "--real", "--batches", str(BATCHES)]) == 2
    err = capsys.readouterr().err
    assert "stopped: 2 of 4 batches are kept" in err and "2 of 4 batches already" in err
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".json"]  # nothing half-written left


def test_the_cli_and_the_page_include_the_real_cells(cached, capsys, monkeypatch):
    assert main(["claims", "--seeds", "2", "--real", "--batches", str(BATCHES), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["cells"]
    assert sum(r["setting"] == claims.REAL for r in rows) == sum(len(c.real_comparisons) for c in claims.CLAIMS)
    assert main(["claims", "--batches", "3"]) == 2 and "add --real" in capsys.readouterr().err

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/claims.py").run()
    at.slider(key="claims:seeds").set_value(2).run()
    at.slider(key="claims:real_batches").set_value(BATCHES).run()
    assert not at.exception
    assert any("SmolLM2-135M-Instruct, one update per batch" in s.value.replace("\\", "") for s in at.success)
    at.selectbox(key="claims:claim").set_value(next(c for c in claims.CLAIMS if c.real_comparisons).key).run()
    cells = [d.value for d in at.dataframe if "setting" in d.value.columns]
    assert any((table["setting"] == claims.REAL).any() for table in cells)


def test_a_fresh_clone_reads_the_published_batches_and_a_batch_computed_here_wins(cache, tmp_path, monkeypatch):
    """The batches published with the repository (`published/smollm2-135m-one-update/`, the cache's own files) are
    read where nothing is cached: nothing is missing and every cell is the same; a batch computed here is read first."""
    computed = claims_real.RealPlan(BATCHES)
    monkeypatch.setattr(claims_real, "cache_folder", lambda: cache)
    rows = computed.rows()
    (tmp_path / "published" / claims_real.PUBLISHED).mkdir(parents=True)
    for path in cache.glob("*.json"):
        (tmp_path / "published" / claims_real.PUBLISHED / path.name).write_bytes(path.read_bytes())
    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(tmp_path / "published"))
    monkeypatch.setattr(claims_real, "cache_folder", lambda: tmp_path / "nothing cached")
    fresh = claims_real.RealPlan(BATCHES)
    assert not fresh.missing and fresh.rows() == rows
    assert claims_real.result_file(0, "task").parent == tmp_path / "published" / claims_real.PUBLISHED
    monkeypatch.setattr(claims_real, "cache_folder", lambda: cache)
    assert claims_real.result_file(0, "task").parent == cache
