"""The dose search's rule (scripts/dose_search.py, fixed before its first run) read on made-up points, and its
published summary read again: the choice it states is the rule's on its own points, and every published run is one
of a summarised point's."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("dose_search", ROOT / "scripts" / "dose_search.py")
dose_search = importlib.util.module_from_spec(spec)
sys.modules["dose_search"] = dose_search  # its dataclass looks its module up there
spec.loader.exec_module(dose_search)


def run(clip, dose, entropy, evals, collapse=None, step_s=10.0):
    return {"state": "done", "clip": [clip] * 20, "disagreement": [dose] * 20, "entropy": entropy,
            "collapse_step": collapse, "evals": [{"eval/accuracy": a} for a in evals], "step_s": step_s}


def point(clip, dose, learns=True, collapse=None, step_s=10.0):
    entropy = [0.8] * 10 + [0.7] * 10  # never falls by half: only a collapse meets condition 4
    evals = [0.2, 0.5] if learns else [0.5, 0.2]
    return {"ppo": run(clip, dose, entropy, evals, collapse, step_s), "kl3": run(clip / 2, dose, entropy, evals)}


def read(**points):
    for p in points.values():
        p["reading"] = dose_search.reading(p)
    return dose_search.choose(points, len(dose_search.SEARCH.points)).words


def test_the_rule_takes_the_cheapest_point_meeting_all_four_conditions():
    assert read(a=point(0.04, 0.03, collapse=40, step_s=20), b=point(0.05, 0.05, collapse=30, step_s=10),
                c=point(0.02, 0.05, collapse=10, step_s=5)) == "b: all four conditions"
    assert dose_search.reading(point(0.04, 0.03))["destabilises"] is False
    assert dose_search.reading(point(0.03, 0.02, collapse=5))["binds"] and \
        dose_search.reading(point(0.03, 0.02, collapse=5))["differ"]  # the thresholds are inclusive


def test_without_a_collapse_it_takes_the_largest_disagreement_and_says_stability_is_not_testable():
    assert read(a=point(0.04, 0.03), b=point(0.05, 0.06), c=point(0.05, 0.09, learns=False)) == \
        "b: conditions 1–3 (the stability claim not testable)"
    assert read(a=point(0.01, 0.01, collapse=3)).startswith("none yet (1 of")


def test_with_every_point_read_and_none_binding_it_reports_no_binding_regime(monkeypatch):
    monkeypatch.setattr(dose_search, "SEARCH", dose_search.Search("two", {"a": (1, 4, 1e-4, None), "b": (2, 8, 5e-5,
                                                                                                     None)}))
    assert read(a=point(0.01, 0.01, collapse=3)) == "none yet (1 of 2 points read)"
    assert read(a=point(0.01, 0.01, collapse=3), b=point(0.04, 0.01, collapse=3)) == \
        "none: no binding regime at this cost (all 2 points read, none meets conditions 1–3)"


@pytest.mark.parametrize("search", list(dose_search.SEARCHES))
def test_the_published_summary_states_its_own_points_choice_and_holds_every_published_run(search, monkeypatch):
    monkeypatch.setattr(dose_search, "SEARCH", dose_search.SEARCHES[search])
    if not dose_search.summary_file().exists():
        pytest.skip(f"the {search} search has no published summary yet")
    summary = json.loads(dose_search.summary_file().read_text())
    assert summary["rule"] == dose_search.RULE and summary["steps"] == dose_search.STEPS
    declared = dose_search.SEARCH.points
    assert dose_search.choose(summary["points"], len(declared)).words == summary["choice"] and set(summary["points"]) <= set(
        declared)
    for name, p in summary["points"].items():
        if p.get("reading"):
            assert dose_search.reading(p) == p["reading"]
    names = []
    for grid in dose_search.grids():  # one CPU's runs each
        manifest = json.loads((grid / "manifest.json").read_text())
        for name, cell in manifest["runs"].items():
            assert name == f"{cell['point']}-{'ppo' if cell['measure'] == 'ratio' else 'kl3'}" and cell["point"] in \
                summary["points"] and cell["state"] == "done"
            names.append(name)
    assert len(names) == len(set(names))  # a run is published once, in its own CPU's grid


def test_a_point_samples_at_its_declared_temperature_else_at_the_models(monkeypatch):
    second = dose_search.SEARCHES["second"]
    assert all(p not in dose_search.SEARCHES["first"].points for p in second.points)  # runs never mix
    first = dose_search.flags("mu2-K8-lr5e-5", "ppo")
    assert "--temperature" not in first and first[first.index("--lr") + 1] == "5e-05"
    monkeypatch.setattr(dose_search, "SEARCH", second)
    warm, cool = dose_search.flags("mu4-K8-lr2.5e-5-T1", "kl3"), dose_search.flags("mu4-K8-lr2.5e-5", "kl3")
    assert warm[warm.index("--temperature") + 1] == "1" and warm[warm.index("--lr") + 1] == "2.5e-05"
    assert "--temperature" not in cool and warm[warm.index("--mu") + 1] == "4" and "delta=0.05" in warm


def test_a_run_joins_the_grid_of_its_own_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(dose_search, "SEARCH", dose_search.Search("search", {}))
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path)
    first = {"cpu": "AVX512 amx", "commit": "abc1234"}
    assert dose_search.grid_for(first) == tmp_path / "search"  # none yet: the first grid
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "manifest.json").write_text(json.dumps({**first, "runs": {}}))
    other = {"cpu": "AVX512", "commit": "abc1234"}
    assert dose_search.grid_for(first) == tmp_path / "search"
    assert dose_search.grid_for(other) == tmp_path / "search-2"
    (tmp_path / "search-2").mkdir()
    (tmp_path / "search-2" / "manifest.json").write_text(json.dumps({**other, "runs": {}}))
    assert dose_search.grid_for(other) == tmp_path / "search-2"
    assert dose_search.grid_for({"cpu": "AVX2", "commit": "abc1234"}) == tmp_path / "search-3"
    assert dose_search.grids() == [tmp_path / "search", tmp_path / "search-2"]


def test_a_run_summarised_done_is_not_trained_again_while_its_pair_is():
    first, second, *rest = dose_search.SEARCH.points
    half = point(0.02, 0.01)
    del half["kl3"]  # its PPO run done, its KL3 run stopped with the machine
    summarised = {first: {**point(0.02, 0.01), "reading": {}}, second: half}
    assert dose_search.to_train(summarised, []) == [(second, "kl3")] + [(p, o) for p in rest for o in ("ppo", "kl3")]
    assert dose_search.to_train(summarised, [second, rest[0]]) == [(second, "kl3"), (rest[0], "ppo"), (rest[0], "kl3")]
    assert dose_search.kept_run({**half, "commit": "abc1234"}, "ppo", "abc1234") is half["ppo"]
    assert dose_search.kept_run({**half, "commit": "0000000"}, "ppo", "abc1234") is None  # another commit's: again
    assert dose_search.kept_run({**half, "commit": "abc1234"}, "kl3", "abc1234") is None


def test_a_run_stopped_with_the_machine_goes_on_from_its_resume_state_and_is_published(tmp_path, monkeypatch):
    """A search run stopped after step 3 (its resume state after step 2) is trained on by `train`, not from step 0:
    the log says so, the finished run replaces its training folder under its point and is published once."""
    from divviz.engine.config import RunConfig
    from divviz.runs import resume, store
    from divviz.runs.train import train

    def stop_after_3(result):
        if result.metrics["step"] == 3:
            raise KeyboardInterrupt

    point = next(iter(dose_search.SEARCH.points))
    cfg = RunConfig.make(task="reverse", prompts=4, group_size=4, steps=5, checkpoint_every=2)
    stopped = train(cfg, tmp_path / point / "kl3.training", on_step=stop_after_3)
    assert store.read_run(stopped).state == "stopped" and resume.saved_step(stopped) == 2
    published = []
    monkeypatch.setattr(dose_search, "publish", lambda folder, p, o: published.append((folder, p, o)))
    log = tmp_path / "search.log"
    with log.open("w") as out:
        dose_search.train(tmp_path, point, "kl3", out, nice=0)  # the suite's own priority: at the search's 19 a
        # busy machine starves it (886 s beside two busy loops, 26 s alone)
    folder = tmp_path / point / "kl3"
    assert "resumed after step 2" in log.read_text()
    assert store.read_run(folder).state == "done" and [r["step"] for r in store.read_metrics(folder)] == [1, 2, 3, 4, 5]
    assert not (tmp_path / point / "kl3.training").exists() and published == [(folder, point, "kl3")]


def test_the_table_prints_the_published_summary_and_changes_nothing(tmp_path, monkeypatch, capsys):
    """`--table` reads the summary the search wrote, with the runs it keeps only there (trained on a machine since
    returned), whatever this checkout's commit: nothing is read again or written."""
    published = (ROOT / "published" / "smollm2-135m-dose-search.json").read_text()
    copy = tmp_path / "summary.json"
    copy.write_text(published)
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path)
    monkeypatch.setitem(dose_search.SEARCHES, "first", dose_search.Search("summary", dose_search.SEARCH.points))
    monkeypatch.setattr("sys.argv", ["dose_search.py", "--table", "--runs", str(tmp_path / "no-runs")])
    dose_search.main()
    printed = capsys.readouterr().out
    summary = json.loads(published)
    assert printed.strip().endswith(f"The rule's choice so far: {summary['choice']}") and copy.read_text() == published
    assert all(f"| {name} | " in printed for name in summary["points"])


@pytest.mark.parametrize("search", list(dose_search.SEARCHES))
def test_docs_claims_md_shows_every_published_point_as_the_table_reads_it(search):
    declared = dose_search.SEARCHES[search]
    text = (ROOT / "docs" / "claims.md").read_text()
    if not dose_search.summary_file(declared).exists():
        assert f"**Read so far: 0 of {len(declared.points)} points**" in text.split(f"`--search {search}`")[-1]
        return
    summary = json.loads(dose_search.summary_file(declared).read_text())
    rows = [line for line in dose_search.table(summary).splitlines() if line.startswith("| mu")]
    assert len(rows) == len(summary["points"]) and all(row in text for row in rows)
    read = sum(1 for p in summary["points"].values() if p.get("reading"))
    assert f"**Read so far: {read} of {len(declared.points)} points**" in text


def test_the_table_of_a_search_not_yet_published_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path)
    monkeypatch.setattr("sys.argv", ["dose_search.py", "--search", "second", "--table"])
    with pytest.raises(SystemExit, match="^the second search has no published summary yet"):
        dose_search.main()


def test_a_machine_without_the_declared_precision_trains_nothing_and_says_why(tmp_path, monkeypatch, capsys):
    """The search's runs are bfloat16: on a CPU without native bfloat16 (divviz refuses it there) the search stops
    at once with one line, before any run starts, instead of starting runs that each refuse."""
    from divviz.engine import policy

    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(dose_search, "pick_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path / "published")
    monkeypatch.setitem(dose_search.SEARCHES, "first", dose_search.Search("search", {"p": (1, 4, 1e-4, None)}))
    monkeypatch.setattr(sys, "argv", ["dose_search.py", "--runs", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        dose_search.main()
    assert str(stopped.value).startswith("dose search: nothing trained: the search's runs are declared in bfloat16")
    assert "has no native bfloat16" in str(stopped.value) and not (tmp_path / "search.log").exists()


@pytest.mark.parametrize("nice", ["30", "-1", "low"])
def test_a_priority_outside_nices_range_is_one_line(nice, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dose_search.py", "--table", "--nice", nice])
    with pytest.raises(SystemExit) as ended:
        dose_search.main()
    assert ended.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        f"dose_search.py: error: argument --nice: '{nice}' is not a priority from 0 to 19")


def test_a_run_whose_training_fails_is_said_and_the_search_ends_failed(tmp_path, monkeypatch, capsys):
    """A run that ends without a finished run (here `divviz train` refusing a flag, as it refuses on a machine it
    cannot train on) is one line on stderr and in the log, nothing is published, and the search's exit says how
    many failed."""
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path / "published")
    monkeypatch.setitem(dose_search.SEARCHES, "first", dose_search.Search("search", {"p": (1, 4, 1e-4, None)}))
    monkeypatch.setattr(dose_search, "refusal_here", lambda: None)
    monkeypatch.setattr(dose_search, "flags", lambda point, objective: ["--steps", "-1"])
    # at the suite's priority: at the search's nice 19 beside a busy machine's work each refusal took minutes
    monkeypatch.setattr(sys, "argv", ["dose_search.py", "--runs", str(tmp_path / "runs"), "--nice", "0"])
    with pytest.raises(SystemExit) as ended:
        dose_search.main()
    assert str(ended.value).startswith("dose search: 2 of 2 runs failed")
    said = capsys.readouterr().err
    for objective in ("ppo", "kl3"):
        assert f"p {objective} failed: RuntimeError: its training ended with exit status 2 and no finished run" in said
    log = (tmp_path / "runs" / "search.log").read_text()
    assert "2 of 2 runs failed" in log and "steps" in log  # divviz train's own line is there too
    assert not (tmp_path / "published").exists()


def test_readmes_row_is_what_the_published_summaries_say():
    from divviz.evidence.dose_search import README_ROW, published_summary, readme_row

    rows = [line for line in (ROOT / "README.md").read_text().splitlines(keepends=True) if line.startswith(README_ROW)]
    assert rows == [readme_row({label: published_summary(search, ROOT / "published")
                                for label, search in dose_search.SEARCHES.items()})], \
        "README's dose-search row is stale: python scripts/dose_search.py --publish writes it"


def test_publishing_writes_readmes_row_beside_the_published_folder_and_nothing_else(tmp_path, monkeypatch):
    from divviz.evidence.dose_search import README_ROW, readme_row

    (tmp_path / "published").mkdir()
    first = dose_search.SEARCHES["first"]
    (tmp_path / "published" / f"{first.name}.json").write_text(dose_search.summary_file(first).read_text())
    monkeypatch.setattr(dose_search, "PUBLISHED", tmp_path / "published")
    readme = tmp_path / "README.md"
    readme.write_text(f"# divviz\n{README_ROW} an old reading |\n| the next row |\n")
    dose_search.update_readme(readme)
    summary = json.loads(dose_search.summary_file(first).read_text())
    assert readme.read_text() == f"# divviz\n{readme_row({'first': summary, 'second': None})}| the next row |\n"
    assert "second search: 0 of 4 points read" in readme.read_text()


def test_the_experiments_setting_is_the_first_searchs_choice_else_the_next_ones_as_pre_registered():
    from divviz.evidence.dose_search import PREREGISTRATION, Choice, experiment_setting as setting
    none = Choice(None, "no binding regime at this cost (all 18 points read, none meets conditions 1–3)", True)
    chosen = Choice("mu4-K8-lr2.5e-5-T1", "conditions 1–3 (the stability claim not testable)", True)
    assert setting({"first": Choice("mu2-K8-lr5e-5", "all four conditions", False), "second": chosen}) == \
        "mu2-K8-lr5e-5, the first search's choice"
    assert setting({"first": none, "second": chosen}) == "mu4-K8-lr2.5e-5-T1, the second search's choice"
    assert setting({"first": Choice(None, "3 of 18 points read", False), "second": chosen}) == \
        "none yet: the first search is still being read"
    assert setting({"first": none, "second": None}) == "none yet: the second search is still being read"
    assert setting({"first": none, "second": none}).startswith("none: neither search chose a point, so by the "
                                                                 "pre-registration the experiment is not run")
    assert (ROOT / PREREGISTRATION).is_file()
