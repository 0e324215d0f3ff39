"""Re-scoring a recorded step (`evidence/rescore.py`, `divviz rescore`, the step inspector): each measure's shares
equal a hand count from the record's own ratios and advantages, the run's own measure gives back the recorded states,
and bad requests are one line."""

import json
from pathlib import Path

import numpy as np
import pytest

from divviz.catalogue.divergences import clip_test
from divviz.cli import main
from divviz.engine.config import RunConfig
from divviz.evidence.rescore import coverage, rescore_step
from divviz.runs import store
from divviz.runs.train import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return train(RunConfig.make(reward="random", inspect_prompts=4, steps=2, prompts=4, group_size=4, clip="kl3",
                                clip_params={"delta": 0.05}, lr=0.005,
                                mu=3, max_new_tokens=6, seed=3), root)


def seen(record: dict) -> dict[str, np.ndarray]:
    """The record's tokens the loss saw, as arrays."""
    rows = [(t["pi_old"][i], t["ratio"][i], t["adv"][i], t["state"][i] % 4, t["weight"][i]) for g in record["groups"]
            for c in g["completions"] for t in [c["tokens"]] for i in range(len(t["id"]))
            if t["state"][i] != 5 and t["ratio"][i] is not None]
    return dict(zip(("pi_old", "ratio", "adv", "state", "weight"), map(np.array, zip(*rows))))


@pytest.mark.parametrize("spec, test", [("ratio", clip_test("ratio")), ("clip_higher", clip_test("clip_higher")),
                                        ("kl3:delta=0.02", clip_test("kl3", delta=0.02))])
def test_shares_are_a_hand_count_from_the_records_ratios_and_advantages(run, spec, test):
    t = seen(store.read_completions(run, 2))
    lower, upper = test.bounds()
    low, high = (t["ratio"] < lower) & (t["adv"] < 0), (t["ratio"] > upper) & (t["adv"] > 0)
    own, other = rescore_step(run, 2, [spec])
    assert other["tokens"] == len(t["ratio"]) and other["measure"] == spec
    assert other["masked_low"] == low.mean() and other["masked_high"] == high.mean()
    assert other["outside"] == ((t["ratio"] < lower) | (t["ratio"] > upper)).mean()
    free = t["weight"] * t["ratio"] * np.abs(t["adv"])  # |∂ℓ/∂log π| = |A| w, weighed by the aggregation
    assert other["gradient_flows"] == pytest.approx(free[~(low | high)].sum() / free.sum(), rel=1e-12)
    assert own["measure"] == "kl3 δ=0.05 (this run)"
    assert other["changed"] == int((low * 1 + high * 2 != t["state"]).sum())


def test_the_runs_own_measure_gives_back_the_recorded_states(run):
    t = seen(store.read_completions(run, 2))
    lower, upper = clip_test("kl3", delta=0.05).bounds()
    far = (np.abs(t["ratio"] / lower - 1) > 1e-5) & (np.abs(t["ratio"] / upper - 1) > 1e-5)  # not at the rounding
    own = rescore_step(run, 2, [])[0]
    changed = {(g, c, i) for g, c, i, *_ in own["changed_tokens"]}
    assert len(changed) <= int((~far).sum())  # only a token within the record's 7 digits of a bound may differ
    assert own["masked_low"] + own["masked_high"] > 0  # the run clipped: the comparison is not empty


def test_the_cli_prints_each_measure_and_refuses_what_it_cannot_rescore(run, capsys):
    assert main(["rescore", str(run), "--step", "2", "--measure", "ratio", "--measure", "kl3:delta=0.02", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["measure"] for r in rows] == ["kl3 δ=0.05 (this run)", "ratio", "kl3:delta=0.02"]
    assert {"measure", "tokens", "masked_low", "masked_high", "outside", "gradient_flows", "changed"} <= set(rows[0])
    assert main(["rescore", run.name, "--runs-dir", str(run.parent), "--step", "2"]) == 0
    assert "masked low" in capsys.readouterr().out
    for argv, message in ((["rescore", str(run), "--step", "9"], "kept no completions for step 9"),
                          (["rescore", str(run), "--step", "2", "--measure", "k3"], "compares clip tests"),
                          (["rescore", str(run), "--step", "2", "--measure", "kl3:delta=nan"], "delta"),
                          (["rescore", str(run), "--step", "zero"], "step"),
                          (["rescore", "no-such-run", "--step", "1"], "no run 'no-such-run'")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_the_inspector_rescores_the_step_and_marks_the_tokens_judged_otherwise(run, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(run.parent))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300)
    at.query_params.update({"m": "ratio:eps=0.1"})
    at.run()
    at.switch_page("app_pages/step_inspector.py").run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "gradient_flows" in d.value.columns)
    step = int(at.select_slider[0].value) if at.select_slider else 2
    expected = rescore_step(run, step, ["ratio:eps=0.1"])
    assert list(table["masked_low"]) == [r["masked_low"] for r in expected]
    assert list(table["changed"]) == [r["changed"] for r in expected] and expected[1]["changed"] > 0
    next(sb for sb in at.selectbox if sb.label == "Colour tokens by").set_value("re-score").run()
    assert not at.exception
    body = "".join(element.proto.body for element in at.get("html"))
    assert "re-score" in body and body.count("rgb(") >= expected[1]["changed"]


def test_the_cli_says_which_completions_it_counted(run, tmp_path, capsys):
    """A run that keeps 2 of its 4 prompts' completions: the count is said to be of the inspected ones only."""
    part = train(RunConfig.make(steps=1, prompts=4, group_size=2, inspect_prompts=2, max_new_tokens=6), tmp_path)
    assert main(["rescore", str(part), "--step", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert ("tokens the loss saw, in the inspected completions only: 4 completions of 2 of the step's 4 prompts (8 "
            "completions); the run keeps its first inspect_prompts = 2 prompts' completions") in first, first
    assert main(["rescore", str(run), "--step", "2"]) == 0
    assert "tokens the loss saw, in all 16 completions of the step's 4 prompts" in capsys.readouterr().out
    capped = {"groups": [{"completions": [{}] * 3}], "omitted": 1}  # a byte cap left one of 4 out
    assert coverage(capped, {"prompts": 2, "group_size": 4, "inspect_prompts": 1}).endswith(
        "3 completions of 1 of the step's 2 prompts (8 completions); the run keeps its first inspect_prompts = 1 "
        "prompts' completions; the record's byte cap left out 1 more")


def test_the_cli_explains_a_gradient_flows_that_there_is_none_of(run, tmp_path, capsys):
    """A step whose advantages are all 0 (every reward of each group equal) has no gradient to keep: the CLI says so
    instead of printing nan."""
    import shutil

    folder = shutil.copytree(run, tmp_path / run.name)
    path = folder / "completions" / "step_000002.json"
    record = json.loads(path.read_text())
    for group in record["groups"]:
        for completion in group["completions"]:
            completion["advantage"] = 0.0
            completion["tokens"]["adv"] = [0.0] * len(completion["tokens"]["adv"])
    path.write_text(json.dumps(record))
    assert main(["rescore", str(folder), "--step", "2", "--measure", "ratio"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "every advantage is 0 in these completions, so no token has a gradient" in out
