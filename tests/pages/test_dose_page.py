"""The Claims page's dose searches: each published search's points read again by the rule, as a table and step by
step; a damaged summary is one line while the other search is still shown."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from divviz.evidence import dose_search
from divviz.evidence.bandit_published import FILE as BANDIT_FILE
from divviz.views import dose_plots
from tests.page_helpers import open_page, shown, specs, typed
from tests.pages.test_plots import validated

ROOT = Path(__file__).resolve().parents[2]
FIRST = dose_search.SEARCHES["first"]
SECOND = dose_search.SEARCHES["second"]


@pytest.fixture
def published_searches(tmp_path, monkeypatch):
    """A published folder holding the bandit grid, the first search's summary and its three grids of runs, as the
    repository publishes them (4 MB)."""
    folder = tmp_path / "published"
    folder.mkdir()
    for name in (BANDIT_FILE, f"{FIRST.name}.json"):
        shutil.copy(ROOT / "published" / name, folder)
    for grid in (ROOT / "published").glob(f"{FIRST.name}*"):
        if grid.is_dir():
            shutil.copytree(grid, folder / grid.name)
    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(folder))
    monkeypatch.setenv("DIVVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "runs"))
    return folder


def test_the_claims_page_reads_the_first_search_again_and_says_the_second_has_no_point_yet(published_searches):
    summary = json.loads((published_searches / f"{FIRST.name}.json").read_text())
    at = open_page("app_pages/claims.py")
    table = next(frame.value for frame in at.dataframe if "disagreement" in frame.value)
    assert [tuple(row) for row in table.drop(columns="published in").itertuples(index=False)] == \
        dose_search.rows(summary)  # the file's own readings, read again
    assert (table["published in"] == "summary only").sum() == 1  # the first point: its folders lost with a machine
    assert table.set_index("point").loc["mu4-K8-lr2e-4", "published in"] == \
        "smollm2-135m-dose-search-3 (AVX512-BF16)"  # both runs in the third grid (a CPU without AMX)
    said = [shown(m) for m in at.markdown if "The first search" in m.value]
    hours = sum(p[o]["step_s"] * p[o]["steps"] for p in summary["points"].values() for o in ("ppo", "kl3")) / 3600
    assert said == [f"**The first search** — All 18 points read: 36 runs, 34 of them published (2 only in its "
                    f"summary: their folders were lost with their machine); about {hours:.1f} core-hours (each run's "
                    "steps at its median step time, one thread a run). The rule's choice: none: no binding regime at "
                    "this cost (all 18 points read, none meets conditions 1–3)."]
    early = next(shown(c) for c in at.caption if c.value.startswith("Over the first 10 steps"))
    first = np.mean([np.mean(np.add(p["ppo"]["disagreement"][:10], p["kl3"]["disagreement"][:10]) / 2)
                     for p in summary["points"].values()])
    assert f"differ on {first:.2%} of tokens on average over the points" in early
    assert any(shown(c).startswith(f"The second dose search: none of its 4 points ({', '.join(SECOND.points)}) "
                                   "published yet. The experiment it may choose is pre-registered in published/"
                                   "smollm2-135m-bind/preregistration.md.") for c in at.caption)
    chart = next(json.loads(spec) for spec in specs(at) if "dose search" in json.loads(spec)["layout"]["title"]["text"])
    drawn = {(t["name"], t["xaxis"]): typed(t["y"]) for t in chart["data"]}
    assert len(drawn) == 3 * len(summary["points"])  # a line a point in each of the three panels
    point = summary["points"]["mu2-K8-lr5e-5"]  # the pair's mean disagreement over each 10 steps, with numpy here
    pair = np.mean([point["ppo"]["disagreement"], point["kl3"]["disagreement"]], axis=0).reshape(10, 10).mean(axis=1)
    assert np.allclose(drawn["mu2-K8-lr5e-5", "x"], pair, rtol=0, atol=1e-15)
    assert np.allclose(drawn["mu2-K8-lr5e-5", "x3"], np.reshape(point["ppo"]["entropy"], (10, 10)).mean(axis=1),
                       rtol=0, atol=1e-15)
    assert pair[0] > 2 * pair[-1]  # the dose is front-loaded: it falls with the entropy (docs/claims.md)
    assert [shown(m) for m in at.markdown if m.value.startswith("**The experiment's setting**")] == [
        "**The experiment's setting** (published/smollm2-135m-bind/preregistration.md): none yet: the second search "
        "is still being read."]
    assert not at.exception


def test_with_both_searches_read_and_neither_choosing_the_page_says_the_experiment_is_not_run(published_searches):
    shutil.copy(ROOT / "published" / f"{SECOND.name}.json", published_searches)
    at = open_page("app_pages/claims.py")
    said = [shown(m) for m in at.markdown if m.value.startswith(("**The first search**", "**The second search**"))]
    assert len(said) == 2 and all(s.endswith("none meets conditions 1–3).") for s in said)
    assert [shown(m) for m in at.markdown if m.value.startswith("**The experiment's setting**")] == [
        "**The experiment's setting** (published/smollm2-135m-bind/preregistration.md): none: neither search chose a "
        "point, so by the pre-registration the experiment is not run — no setting was found on SmolLM2-135M at this "
        "cost where PPO ε = 0.2 and KL3 δ = 0.05 act differently on enough tokens, for long enough, to test the "
        "papers' claims."]
    assert not at.exception


def test_a_damaged_summary_is_one_line_and_the_other_search_is_still_shown(published_searches):
    (published_searches / f"{SECOND.name}.json").write_text('{"points": {"mu9-K1": {}}, "choice": "mine"}')
    at = open_page("app_pages/claims.py")
    assert [shown(w) for w in at.warning if "dose search" in w.value] == [
        f"The second dose search is not shown: published/{SECOND.name}.json: not a dose search's summary "
        "(ValueError: points this search does not declare: mu9-K1)"]
    assert any("disagreement" in frame.value for frame in at.dataframe) and not at.exception
    # while a search is not shown, the experiment's setting is unsaid
    assert not [m for m in at.markdown if m.value.startswith("**The experiment's setting**")]


def test_a_reading_differing_from_the_file_is_the_one_computed_here(published_searches):
    """The page shows the rule's reading of the per-step data, not the reading the file states."""
    path = published_searches / f"{FIRST.name}.json"
    summary = json.loads(path.read_text())
    summary["points"]["mu2-K8-lr5e-5"]["reading"]["differ"] = True  # a file claiming condition 2 was met
    summary["choice"] = "mu2-K8-lr5e-5: conditions 1–3 (the stability claim not testable)"
    path.write_text(json.dumps(summary))
    at = open_page("app_pages/claims.py")
    table = next(frame.value for frame in at.dataframe if "disagreement" in frame.value)
    assert table.set_index("point").loc["mu2-K8-lr5e-5", "rule 1 2 3 4"] == "✗ ✗ ✓ ✓"
    assert any("none: no binding regime at this cost" in shown(m) for m in at.markdown if "first search" in m.value)


@pytest.mark.parametrize("damage, said", [
    ("link", "not a regular file"), ("fifo", "not a regular file"), ("large", "larger than 8,388,608 bytes"),
    ("not json", "not a dose search's summary (JSONDecodeError"), ("a list", "not a dose search's summary (TypeError"),
    ("text clip", "not a dose search's summary (TypeError: a run's clip is not numbers)"),
    ("no entropy", "not a dose search's summary (IndexError"),
    ("no step time", "not a dose search's summary (TypeError")])
def test_a_hostile_summary_file_is_refused_with_one_line(tmp_path, damage, said):
    path = tmp_path / f"{FIRST.name}.json"
    good = json.loads((ROOT / "published" / f"{FIRST.name}.json").read_text())
    if damage == "link":
        path.symlink_to(ROOT / "published" / f"{FIRST.name}.json")
    elif damage == "fifo":
        os.mkfifo(path)  # a read would wait for a writer forever
    elif damage == "large":
        path.write_text(" " * (dose_search.MAX_SUMMARY_BYTES + 1))
    elif damage == "not json":
        path.write_text('{"points": ')
    elif damage == "a list":
        path.write_text("[]")
    else:
        run = good["points"]["mu2-K8-lr5e-5"]["ppo"]
        if damage == "text clip":
            run["clip"][3] = "<b>0.5</b>"
        elif damage == "no entropy":
            run["entropy"] = []  # a finished run the rule cannot read
        else:
            run["step_s"] = None
        path.write_text(json.dumps(good))
    with pytest.raises(dose_search.DivvizInputError) as refused:
        dose_search.published_summary(FIRST, tmp_path)
    assert str(refused.value).startswith(f"published/{FIRST.name}.json: {said}") and "\n" not in str(refused.value)


def test_the_chart_and_its_table_hold_every_step_of_every_point():
    summary = json.loads((ROOT / "published" / f"{FIRST.name}.json").read_text())
    chart = dose_plots.dose_chart(summary, "t")
    validated(chart)  # plotly's own check of every trace and axis
    assert len(chart.data) == sum(max(len(p["ppo"]["clip"]), len(p["kl3"]["clip"])) for p in summary["points"].values())
    assert set(chart.data.columns) == {"point", "step", "disagreement", "ppo_clip", "ppo_entropy"}
