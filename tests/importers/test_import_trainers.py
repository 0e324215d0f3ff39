"""`divviz import` on what trainers actually write: TRL 1.16's trainer_state.json from its own GRPOTrainer (a checkpoint
folder, and the state saved after training with its settings beside it), verl 0.9.1's own FileLogger, and UNIPO's
forms (JSON, `prob`, blueprint, JSONL, build_data.py's folder, and its published metrics-only file). Every number of
the file is kept, in the metrics and in the Runs page's CSV, under the source's names and divviz's; a [ε_low, ε_high]
clip scores tokens with DAPO's box; bad input is refused in one line with nothing written.

tests/data/unipo_grpo_metrics_head.json is the header and first three entries of UNIPO's published
`static/grpo_metrics.json` (poloclub/unipo), as they are."""

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from divviz.catalogue.divergences import clip_test
from divviz.catalogue.estimators import k1
from divviz.cli import main
from divviz.evidence.rescore import rescore_step
from divviz.importers.source import source_of
from divviz.losses import Objective, policy_loss
from divviz.metrics import clip_fractions
from divviz.runs import store
from divviz.views import run_files, run_views

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"


def imported(path: Path, tmp_path: Path, capsys, *extra: str) -> tuple[Path, str]:
    """`divviz import path` into a fresh runs folder: (the run folder, what the command printed)."""
    root = tmp_path / "runs"
    assert main(["import", str(path), "--runs-dir", str(root), *extra]) == 0
    (run,) = store.list_runs(root)
    return run.folder, capsys.readouterr().out


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def assert_every_number_kept(folder: Path, source: dict[int, dict]) -> None:
    """Every finite number of the source's rows ({step: {name: value}}) is in the run's metrics row of that step under
    its own name, and in the Runs page's CSV download (`run_files.metrics_csv`); a row's own `step` is its key."""
    rows = {row["step"]: row for row in store.read_metrics(folder)}
    csv = pd.read_csv(io.StringIO(run_files.metrics_csv([store.read_run(folder)])))
    table = csv.set_index("step")
    assert sorted(rows) == sorted(source) == sorted(table.index)
    kept = 0
    for step, values in source.items():
        for name, value in values.items():
            if finite(value) and name != "step":
                assert rows[step][name] == value and table.loc[step, name] == value, (step, name)
                kept += 1
    assert kept >= len(source)


# -- TRL ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl_output(tmp_path_factory):
    """TRL 1.16's GRPOTrainer on the built-in model, 2 steps, a checkpoint after each (as `save_steps=1` writes it),
    and the state saved again after training (with the end-of-training summary row) beside its settings as JSON."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOTrainer

    from tests.trl_support import TASK, config, load_policy

    out = tmp_path_factory.mktemp("trl")
    model, tokenizer = load_policy()
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, 8)])

    def accuracy(prompts, completions, answer, **_):
        return [TASK.reward(p, a, c) for p, c, a in zip(prompts, completions, answer)]

    trainer = GRPOTrainer(model=model, reward_funcs=accuracy, train_dataset=data, processing_class=tokenizer,
                          args=config(out, max_steps=2, logging_steps=1, epsilon_high=0.28, save_strategy="steps",
                                      save_steps=1))
    trainer.train()
    final = out / "final"
    final.mkdir()
    trainer.state.save_to_json(str(final / "trainer_state.json"))
    (final / "training_args.json").write_text(trainer.args.to_json_string())
    return out


def test_a_trl_checkpoint_folder_imports_every_number_of_its_log_history(trl_output, tmp_path, capsys):
    checkpoint = trl_output / "checkpoint-2"
    assert {"trainer_state.json", "training_args.bin"} <= {p.name for p in checkpoint.iterdir()}
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert [row["step"] for row in history] == [1, 2]
    folder, said = imported(checkpoint, tmp_path, capsys)
    (run,) = store.list_runs(tmp_path / "runs")
    assert run.folder == folder and run.state == "done" and run.step == run.steps == 2
    assert_every_number_kept(folder, {row["step"]: row for row in history})
    for name in ("reward", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "completions/mean_length"):
        assert all(finite(row[name]) for row in store.read_metrics(folder)), name  # TRL's names are divviz's
    assert "(trl)" in said and "of metrics only: the file has no per-token data" in said
    assert store.completion_steps(folder) == [] and store.read_tokens(folder, 1) is None
    source = run.config["source"]
    assert source["clip"] is None and "training_args.bin, not read (a pickle)" in source["training_args"]["file"]
    assert source_of(run.config) == ("TRL (checkpoint folder) 'checkpoint-2' · model LlamaForCausalLM · algorithm "
                                     "not given · clip not given (ε = 0.2 assumed)")


def test_trl_state_saved_after_training_merges_its_summary_row_and_reads_its_settings(trl_output, tmp_path, capsys):
    path = trl_output / "final" / "trainer_state.json"
    history = json.loads(path.read_text())["log_history"]
    assert [row["step"] for row in history] == [1, 2, 2] and "train_runtime" in history[-1]
    folder, _ = imported(path, tmp_path, capsys)
    assert_every_number_kept(folder, {1: history[0], 2: {**history[1], **history[2]}})
    run = store.read_run(folder)
    assert run.config["clip"] == "clip_higher" and run.config["clip_params"] == {"eps_low": 0.2, "eps_high": 0.28}
    assert run.config["source"]["algorithm"] == "dapo"  # TRL 1.16's default loss_type, from training_args.json
    assert source_of(run.config).endswith("· dapo · epsilon=0.2 epsilon_high=0.28")
    assert source_of({"backend": "trl", "seed": 0}) == ""  # a run divviz trained has no import source


# -- verl --------------------------------------------------------------------------------------------------------------

def test_verls_file_logger_imports_with_divvizs_names_beside_verls(tmp_path, capsys, monkeypatch):
    """verl's own vanilla loss metrics on three batches, written by its own FileLogger: imported, each mapped name
    equals what divviz computes on the same tokens (pg_clipfrac = low + high, ppo_kl = k1), and they chart on the
    Runs page's panels."""
    tracking = pytest.importorskip("verl.utils.tracking")
    from tests.loss.test_verl_plugin import batch, config, dispatch

    path = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = tracking.FileLogger("divviz", "import")
    ours = {}
    for step in (1, 2, 3):
        old, new, adv, mask = batch(step)
        _, _, metrics = dispatch("vanilla", old, new, adv, mask, "token-mean", config(clip_ratio=0.2, clip_ratio_c=3.0))
        out = policy_loss(new, old, adv, mask.double(), Objective(clip=clip_test("ratio", eps=0.2), dual_clip_c=3.0))
        ours[step] = {**clip_fractions(out, mask.double()), "kl/k1": float(k1(new - old)[mask].mean())}
        data = {**metrics, "actor/entropy": np.float32(1.5 - step / 10), "critic/score/mean": np.float64(step / 5),
                "response_length/mean": 12.0 + step, "timing_s/step": 3.25}
        if step == 2:
            data.update({"actor/grad_norm": float("nan"), "val-core/note": "n/a"})
        logger.log(data, step)
    logger.finish()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[1]["data"]["actor/grad_norm"] is None  # orjson writes NaN as null
    folder, said = imported(path, tmp_path, capsys)
    assert "(verl)" in said and "2 values dropped, not finite numbers (first: step 2 'actor/grad_norm' = null)" in said
    config = store.read_run(folder).config
    assert config["source"]["dropped"] == 2
    assert source_of(config) == ("verl (file logger) 'verl.jsonl' · model not given · algorithm not given · clip "
                                 "not given (ε = 0.2 assumed)")
    assert_every_number_kept(folder, {line["step"]: line["data"] for line in lines})
    rows = {row["step"]: row for row in store.read_metrics(folder)}
    for step, row in rows.items():
        assert row["clip_ratio/region_mean"] == row["actor/pg_clipfrac"] == pytest.approx(
            ours[step]["clip_ratio/region_mean"], abs=1e-7)
        assert row["kl/k1"] == row["actor/ppo_kl"] == pytest.approx(ours[step]["kl/k1"], rel=1e-6)
        assert row["entropy"] == row["actor/entropy"] and row["reward"] == row["critic/score/mean"]
        assert row["completions/mean_length"] == row["response_length/mean"]
        assert "clip_ratio/low_mean" not in row  # verl's pg_clipfrac_lower is the dual-clip share, not TRL's low
    charts = run_views.training_charts([("verl", store.read_metrics(folder))])
    for panel, name in (("kl", "kl/k1"), ("entropy", "entropy"), ("reward", "reward")):
        np.testing.assert_array_equal(charts[panel].data[name], [rows[s][name] for s in (1, 2, 3)])


# -- UNIPO -------------------------------------------------------------------------------------------------------------

HEADER = {"algorithm": "dapo", "model_name": "Qwen/Qwen3-0.6B", "task": "math",
          "hparams": {"clip_eps": [0.2, 0.28], "kl_estimator": "k3"}}
RATIOS = ((1.0, 1.25, 1.3), (0.85, 0.75, 1.0))  # w = π/π_old per token of a response with A = +1, one with A = −1
STATES = [[0, 0, 2], [0, 1, 0]]  # in the box (0.8, 1.28): 1.3 masked high, 0.75 masked low; 1.25 inside (not in PPO's)


def response(ratios, advantage: float, prob: bool) -> dict:
    """A response whose tokens have π_old = 0.5 and the given ratios, with `log_probs` or UNIPO's `prob`."""
    tokens = {"ids": list(range(len(ratios))), "strings": [f" t{i}" for i in range(len(ratios))],
              "old_log_probs": [math.log(0.5)] * len(ratios)}
    tokens.update({"prob": [0.5 * w for w in ratios]} if prob else {"log_probs": [math.log(0.5 * w) for w in ratios]})
    return {"id": "r", "reward": max(advantage, 0.0), "advantage": advantage, "response_text": "", "tokens": tokens}


def prompts(prob: bool = False) -> list:
    responses = [response(RATIOS[0], 1.0, prob), response(RATIOS[1], -1.0, prob)]
    return [{"prompt": "What is 2 + 2?", "responses": responses}]


def metrics(step: int) -> dict:
    return {"reward": 0.5 + step / 10, "kl": 0.01 * (step + 1), "policy_clip_ratio": 0.125, "entropy": 2 - step / 10,
            "note": "warm-up"}


def dump(path: Path, value) -> Path:
    return written(path, json.dumps(value))


def written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_unipo(form: str, tmp_path: Path) -> Path:
    """Three updates (UNIPO steps 0, 1, 2) in one of UNIPO's forms."""
    entries = [{"step": s, "is_first_step_after_rollout_phase": True, "metrics": metrics(s),
                "prompts": prompts(form == "prob")} for s in range(3)]
    if form in ("json", "prob"):
        return dump(tmp_path / "run.json", {"header": HEADER, "entries": entries})
    if form == "blueprint":  # the prompts shared by entries that have none
        bare = [{k: v for k, v in entry.items() if k != "prompts"} for entry in entries]
        return dump(tmp_path / "run.json", {"header": HEADER, "blueprint": {"prompts": prompts()}, "entries": bare})
    if form == "jsonl":
        lines = [{"type": "header", **HEADER}, *({"type": "step", **entry} for entry in entries)]
        path = tmp_path / "run.jsonl"
        path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        return path
    static = tmp_path / "static"  # as build_data.py writes it: every entry's metrics, a step file where prompts were
    (static / "dapo").mkdir(parents=True)
    dump(static / "dapo_metrics.json", {"header": HEADER, "entries": [
        {"step": e["step"], "metrics": e["metrics"], "is_first_step_after_rollout_phase": True} for e in entries]})
    for s in (0, 2):
        dump(static / "dapo" / f"step-{s}.json", {"step": s, "prompts": prompts()})
    return static if form == "folder" else static / "dapo"


@pytest.mark.parametrize("form", ["json", "prob", "blueprint", "jsonl", "folder", "step folder"])
def test_each_unipo_form_imports_and_its_clip_pair_scores_tokens_with_dapos_box(form, tmp_path, capsys):
    folder, said = imported(write_unipo(form, tmp_path), tmp_path, capsys)
    run = store.read_run(folder)
    assert run.config["clip"] == "clip_higher" and run.config["clip_params"] == {"eps_low": 0.2, "eps_high": 0.28}
    assert store.completion_steps(folder) == ([1, 3] if "folder" in form else [1, 2, 3])
    record = store.read_completions(folder, 1)
    completions = record["groups"][0]["completions"]
    assert [c["tokens"]["state"] for c in completions] == STATES
    np.testing.assert_allclose([c["tokens"]["ratio"] for c in completions], RATIOS, rtol=1e-6)
    this_run, ppo = rescore_step(folder, 1, ["ratio:eps=0.2"])
    assert (this_run["masked_high"], ppo["masked_high"], this_run["masked_low"]) == (1 / 6, 2 / 6, 1 / 6)
    assert_every_number_kept(folder, {s + 1: {**metrics(s), "unipo/step": s} for s in range(3)})
    for row in store.read_metrics(folder):  # the file's numbers, over every rollout, win over the 3 prompts' tokens
        assert row["kl_ref/k3"] == row["kl"] and row["clip_ratio/region_mean"] == row["policy_clip_ratio"] == 0.125
    assert "3 values dropped, not finite numbers (first: step 1 'note' = 'warm-up')" in said
    assert source_of(run.config).endswith("· model Qwen/Qwen3-0.6B · dapo · clip_eps=[0.2, 0.28]")


def test_unipos_published_metrics_file_imports_as_curves_without_step_records(tmp_path, capsys):
    path = DATA / "unipo_grpo_metrics_head.json"
    entries = json.loads(path.read_text())["entries"]
    folder, said = imported(path, tmp_path, capsys)
    assert "imported 3 steps of metrics only: the file has no per-token data" in said
    run = store.read_run(folder)
    assert run.config["clip"] == "ratio" and run.config["clip_params"] == {"eps": 0.2}  # its [0.2, 0.2]
    assert_every_number_kept(folder, {e + 1: {**entry["metrics"], "unipo/step": entry["step"]}
                                      for e, entry in enumerate(entries)})
    rows = store.read_metrics(folder)
    assert [r["kl_ref/k3"] for r in rows] == [e["metrics"]["kl"] for e in entries]  # its header's kl_estimator k3
    assert [r["clip_ratio/region_mean"] for r in rows] == [e["metrics"]["policy_clip_ratio"] for e in entries]
    assert [r["completions/mean_length"] for r in rows] == [e["metrics"]["response_length"] for e in entries]
    assert store.completion_steps(folder) == []
    assert main(["rescore", str(folder), "--step", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no per-token data to re-score" in err and "holds metrics only" in err
    assert source_of(run.config) == ("UNIPO (JSON, metrics only) 'unipo_grpo_metrics_head.json' · model "
                                     "meta-llama/Llama-3.2-1B-Instruct · grpo · clip_eps=[0.2, 0.2]")


def test_the_runs_table_says_where_each_run_came_from_and_filters_by_it(tmp_path, capsys, monkeypatch):
    """An imported run beside one divviz trained: the Runs table's source column names the file and its format,
    a filter on the source keeps the import alone, and the inspector says why the import is not among its runs."""
    from streamlit.testing.v1 import AppTest

    from divviz.engine.config import RunConfig
    from divviz.runs.train import train

    folder, _ = imported(DATA / "unipo_grpo_metrics_head.json", tmp_path, capsys)
    train(RunConfig.make(task="reverse", prompts=2, group_size=4, steps=1), folder.parent)
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(folder.parent))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "router.py"), default_timeout=120).run()
    at.switch_page("app_pages/runs.py").run()
    table = at.dataframe[0].value
    sources = dict(zip(table["run"], table["source"]))
    assert sources[folder.name].startswith("UNIPO (JSON, metrics only)") and "trained here" in sources.values()
    assert sorted(table["device"]) == ["", "cpu"]  # the run divviz trained says where; the import cannot
    at.text_input(key="runs:filter").set_value("unipo").run()
    assert list(at.dataframe[0].value["run"]) == [folder.name]
    at.switch_page("app_pages/step_inspector.py").run()
    assert not at.exception and any("holds metrics only" in c.value or "metrics only" in c.value for c in at.caption)


# -- bad input ---------------------------------------------------------------------------------------------------------

def trainer_state(*rows) -> dict:
    return {"global_step": len(rows), "log_history": list(rows), "max_steps": len(rows)}


def verl_lines(path: Path, *steps) -> Path:
    path.write_text("".join(json.dumps({"step": s, "data": {"actor/entropy": 1.0}}) + "\n" for s in steps))
    return path


def sparse(path: Path) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(2 * 2**30)  # 2 GB, nothing written: nothing to read in it
    return path


def unipo_with(tmp_path: Path, **hparams) -> Path:
    return dump(tmp_path / "run.json", {"header": {**HEADER, "hparams": hparams}, "entries": [
        {"step": 0, "metrics": metrics(0), "prompts": prompts()}]})


def two_runs(tmp_path: Path) -> Path:
    static = write_unipo("folder", tmp_path)
    dump(static / "grpo_metrics.json", {"header": HEADER, "entries": []})
    return static


def orphan_step_file(tmp_path: Path) -> Path:
    static = write_unipo("folder", tmp_path)
    dump(static / "dapo" / "step-7.json", {"step": 7, "prompts": prompts()})
    return static


BAD = {  # name: (writes the file in a folder, the command's extra arguments, the one line said)
    "truncated trainer_state.json": (
        lambda d: written(d / "trainer_state.json", json.dumps(trainer_state({"loss": 1.0, "step": 1}), indent=2)[:60]),
        (), "trainer_state.json is not JSON ("),
    "truncated verl line": (lambda d: written(d / "v.jsonl", '{"step": 1, "data": {}}\n{"step": 2, "data": {"ac'), (),
                            "v.jsonl: line 2 is not JSON (Unterminated string"),
    "log_history not a list": (lambda d: dump(d / "trainer_state.json", {"log_history": {"step": 1}}), (),
                               "'log_history' is dict, not a list"),
    "verl steps out of order": (lambda d: verl_lines(d / "v.jsonl", 1, 3, 2), (),
                                "line 3: step 2 after step 3 (steps out of order)"),
    "verl step repeated": (lambda d: verl_lines(d / "v.jsonl", 1, 2, 2), (), "line 3: step 2 again"),
    "trl steps out of order": (lambda d: dump(d / "s.json", trainer_state({"step": 2}, {"step": 1})), (),
                               "log_history row 2: step 1 after step 2 (steps out of order)"),
    "trl step given twice": (lambda d: dump(d / "s.json", trainer_state({"loss": 0.5, "step": 1},
                                                                        {"loss": 0.6, "step": 1})), (),
                             "log_history row 2: step 1's 'loss' again, as 0.6 after 0.5"),
    "unipo step repeated": (lambda d: dump(d / "run.json", {"header": HEADER, "entries": [
        {"step": 0, "metrics": metrics(0)}, {"step": 0, "metrics": metrics(1)}]}), (), "entry 2: step 0 again"),
    "negative clip_eps": (lambda d: unipo_with(d, clip_eps=-0.2), (),
                          "header hparams 'clip_eps' is -0.2: not a clip ε (ratio: parameter 'eps' must be"),
    "clip_eps of 3 values": (lambda d: unipo_with(d, clip_eps=[0.2, 0.28, 0.3]), (),
                             "header hparams 'clip_eps' is a list of 3 values; a clip is ε or [ε_low, ε_high]"),
    "prob of 0": (lambda d: dump(d / "run.json", {"header": HEADER, "entries": [{"metrics": {}, "prompts": [
        {"prompt": "p", "responses": [response((1.0, 0.0), 1.0, prob=True)]}]}]}), (),
                  "entry 1, prompt 1, response 1: 'prob' at token 1 is 0.0, not a probability in (0, 1]"),
    "2 GB trainer_state.json": (lambda d: sparse(d / "trainer_state.json"), (),
                                "trainer_state.json is 2048 MB; a JSON document (UNIPO's JSON, TRL's "
                                "trainer_state.json) is read whole, at most 256 MB"),
    "2 GB verl log without a line break": (lambda d: sparse(d / "v.jsonl"), ("--format", "verl"),
                                           "v.jsonl: line 1 is longer than 64 MB"),
    "folder of two UNIPO runs": (two_runs, (), "static holds 2 UNIPO runs (dapo, grpo): name one run's step folder"),
    "step file of no entry": (orphan_step_file, (), "dapo/step-7.json belongs to no entry of dapo_metrics.json"),
    "JSON of no format": (lambda d: written(d / "x.json", '{\n"a": 1}'), (),
                          "x.json: a JSON document with neither 'entries' (UNIPO) nor 'log_history' (TRL's "
                          "trainer_state.json) but keys ['a']; name its format with --format"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(case, tmp_path, capsys):
    write, extra, message = BAD[case]
    given = tmp_path / "given"
    given.mkdir()
    path = write(given)
    root = tmp_path / "runs"
    assert main(["import", str(path), "--runs-dir", str(root), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not root.exists() or not list(root.iterdir())  # no folder, hidden or not, is left behind


def test_imported_metrics_only_runs_show_on_the_runs_page(tmp_path, monkeypatch, capsys):
    """The Runs page draws a metrics-only import (no tokens, no completions) with the rest, without an error."""
    from streamlit.testing.v1 import AppTest

    for form in ("folder", "jsonl"):
        (tmp_path / form).mkdir()
        assert main(["import", str(write_unipo(form, tmp_path / form)), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert main(["import", str(DATA / "unipo_grpo_metrics_head.json"), "--runs-dir", str(tmp_path / "runs")]) == 0
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) == 3 and set(at.dataframe[0].value["state"]) == {"done"}
