"""Bring your own run: `divviz import` makes a run folder from UNIPO's schema or divviz's JSONL; hostile strings stay
text; a broken file is refused in one line with nothing written; the JSONL format round-trips an engine run's step;
an imported run lists, opens in the step inspector and re-scores like any other."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from divviz.catalogue.divergences import clip_test
from divviz.cli import main
from divviz.engine.config import RunConfig
from divviz.evidence.rescore import rescore_step
from divviz.importers import jsonl
from divviz.runs import store
from divviz.runs.train import train

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)>\u202e\x00"


def response(ids, strings, logp, old, reward, advantage, per_token=None):
    tokens = {"ids": ids, "strings": strings, "log_probs": logp, "old_log_probs": old}
    if per_token is not None:
        tokens["advantages"] = per_token
    return {"id": "r", "reward": reward, "advantage": advantage, "response_text": "".join(strings), "tokens": tokens}


def unipo_document() -> dict:
    """Two updates of a GRPO run in UNIPO's canonical schema, hostile text in the header, prompts and pieces."""
    rng = np.random.default_rng(0)

    def group(prompt, n):
        out = []
        for r in range(n):
            length = int(rng.integers(2, 7))
            old = np.log(rng.uniform(0.05, 1.0, length))
            new = np.minimum(old + rng.normal(0, 0.3, length), 0.0)
            advantage = float(rng.normal())
            out.append(response(list(range(length)), [HOSTILE if t == 0 else f" t{t}" for t in range(length)],
                                new.tolist(), old.tolist(), float(r % 2), advantage))
        return {"prompt": prompt, "responses": out}

    return {"header": {"task": HOSTILE, "model_name": "meta-llama/Llama-3.2-1B-Instruct", "algorithm": "grpo",
                       "hparams": {"clip_eps": 0.2, "learning_rate": 1e-6}},
            "entries": [{"step": s, "is_first_step_after_rollout_phase": s == 0,
                         "metrics": {"policy_objective": 0.1, "reward": 0.4 + s, "entropy": 2.5, HOSTILE: 1.0},
                         "prompts": [group(f"{HOSTILE} question {s}.{p}", 4) for p in range(3)]} for s in range(2)]}


@pytest.fixture
def imported(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(unipo_document()))
    root = tmp_path / "runs"
    assert main(["import", str(path), "--runs-dir", str(root)]) == 0
    (folder,) = [p for p in root.iterdir()]
    return path, folder


def test_a_unipo_file_imports_as_a_finished_run_with_every_token_scored(imported, capsys):
    path, folder = imported
    run = store.read_run(folder)
    assert run.state == "done" and run.step == run.steps == 2
    assert run.config["source"]["format"] == "unipo" and run.config["clip_params"] == {"eps": 0.2}
    rows = store.read_metrics(folder)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["reward"] == 1.4  # the file's own numbers win
    record = store.read_completions(folder, 1)
    entry = unipo_document()["entries"][0]
    first = entry["prompts"][0]["responses"][0]["tokens"]
    tokens = record["groups"][0]["completions"][0]["tokens"]
    assert tokens["piece"][0] == HOSTILE and record["groups"][0]["prompt"].startswith(HOSTILE)
    ratio = np.exp(np.array(first["log_probs"]) - np.array(first["old_log_probs"]))
    np.testing.assert_allclose(tokens["ratio"], ratio, rtol=1e-6)
    assert main(["runs", "--runs-dir", str(folder.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["state"] == "done"


@pytest.mark.parametrize("spec, test", [("ratio", clip_test("ratio")), ("clip_higher", clip_test("clip_higher")),
                                        ("kl3", clip_test("kl3"))])
def test_rescore_of_an_imported_step_is_a_hand_count_from_the_files_numbers(imported, spec, test):
    _, folder = imported
    responses = [r for p in unipo_document()["entries"][1]["prompts"] for r in p["responses"]]
    ratio = np.concatenate([np.exp(np.array(r["tokens"]["log_probs"]) - np.array(r["tokens"]["old_log_probs"]))
                            for r in responses])
    adv = np.concatenate([[r["advantage"]] * len(r["tokens"]["ids"]) for r in responses])
    lower, upper = test.bounds()
    near = (np.abs(ratio / lower - 1) < 1e-6) | (np.abs(ratio / upper - 1) < 1e-6)
    assert not near.any()  # no token within the record's 7 digits of a bound: the count below is exact
    row = rescore_step(folder, 2, [spec])[1]
    assert row["tokens"] == len(ratio)
    assert row["masked_low"] == ((ratio < lower) & (adv < 0)).mean() > 0
    assert row["masked_high"] == ((ratio > upper) & (adv > 0)).mean()


def broken_files() -> dict[str, tuple[object, str]]:
    good = unipo_document()
    missing = json.loads(json.dumps(good))
    del missing["entries"][1]["prompts"][2]["responses"][1]["tokens"]["log_probs"]
    lengths = json.loads(json.dumps(good))
    lengths["entries"][0]["prompts"][1]["responses"][0]["tokens"]["old_log_probs"].append(-0.5)
    nan = json.loads(json.dumps(good))
    nan["entries"][1]["prompts"][0]["responses"][2]["tokens"]["old_log_probs"][0] = float("nan")  # JSON's NaN
    positive = json.loads(json.dumps(good))
    positive["entries"][0]["prompts"][0]["responses"][3]["tokens"]["log_probs"][1] = 0.7
    return {"not json": ("{'entries': [", "is not JSON"),
            "missing field": (missing, "entry 2, prompt 3, response 2: 'tokens' lacks 'log_probs'"),
            "lengths differ": (lengths, "entry 1, prompt 2, response 1: 'old_log_probs' has"),
            "nan": (json.dumps(nan), "entry 2, prompt 1, response 3: 'old_log_probs' at token 0 is nan, not a finite"),
            "positive log-prob": (positive, "entry 1, prompt 1, response 4: 'log_probs' at token 1 is 0.7, above 0"),
            "no entries": ({"header": {}}, "no 'entries' list")}


@pytest.mark.parametrize("case", list(broken_files()))
def test_a_broken_file_is_refused_in_one_line_and_nothing_is_written(case, tmp_path, capsys):
    content, message = broken_files()[case]
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    root = tmp_path / "runs"
    assert main(["import", str(path), "--runs-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not root.exists() or not list(root.iterdir())  # no folder, hidden or not, is left behind


def test_a_file_too_big_to_read_whole_is_refused_before_reading(tmp_path, capsys):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(2 * 2**30)  # a sparse 2 GB file: nothing to read in it
    assert main(["import", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "2048 MB; a JSON document (UNIPO's JSON, TRL's trainer_state.json) is read whole, at most 256 MB" \
        in capsys.readouterr().err


def test_one_long_completion_beside_many_short_ones_imports_in_memory_bounded_by_its_tokens(tmp_path):
    """A 3 MB step of one 100,000-token completion beside 3,000 of one token: its token weights come from each
    completion's length (`aggregation.prefix_weights`), not from a 3,001 × 100,000 mask (gigabytes). The import
    runs in a process whose address space is capped at 2 GiB."""
    def completion(n, i):
        return {"text": "x" * n, "reward": float(i % 2), "ids": [7] * n, "pieces": ["x"] * n, "logp_old": [-1.0] * n,
                "logp": [-1.0] * n, "advantage": 0.5 if i % 2 else -0.5}

    path = tmp_path / "step.jsonl"
    step = {"prompts": [{"prompt": "p", "completions": [completion(100_000, 0)]
                         + [completion(1, i + 1) for i in range(3_000)]}]}
    path.write_text(json.dumps({"header": {"model": "builtin", "task": "reverse"}}) + "\n" + json.dumps(step) + "\n")
    capped = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30)); "
              "from divviz.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", capped, "import", str(path), "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-1500:]
    [run] = store.list_runs(tmp_path / "runs")
    [row] = store.read_metrics(run.folder)
    assert row["completions/mean_length"] == pytest.approx(103_000 / 3_001)


def test_the_jsonl_format_round_trips_an_engine_runs_recorded_step(tmp_path):
    folder = train(RunConfig.make(reward="random", inspect_prompts=3, steps=2, prompts=3, group_size=4, lr=0.005,
                                  mu=3, max_new_tokens=6), tmp_path / "engine")
    original = store.read_completions(folder, 2)
    path = tmp_path / "export.jsonl"
    lines = [{"header": {"model": "builtin", "task": "reverse", "clip_eps": 0.2}}, jsonl.export_record(original),
             jsonl.export_record(store.read_completions(folder, 1))]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    assert main(["import", str(path), "--runs-dir", str(tmp_path / "runs")]) == 0
    (imported,) = list((tmp_path / "runs").iterdir())
    again = store.read_completions(imported, 1)
    lower, upper = clip_test("ratio").bounds()
    for g, group in enumerate(original["groups"]):
        assert again["groups"][g]["prompt"] == group["prompt"]
        for c, completion in enumerate(group["completions"]):
            a, b = completion["tokens"], again["groups"][g]["completions"][c]["tokens"]
            assert a["id"] == b["id"] and a["piece"] == b["piece"]
            for fact in ("pi_old", "ratio", "adv"):
                np.testing.assert_allclose(b[fact], a[fact], rtol=2e-7)
            far = [abs(w / lower - 1) > 1e-5 and abs(w / upper - 1) > 1e-5 for w in a["ratio"]]
            assert [s for s, f in zip(a["state"], far) if f] == [s for s, f in zip(b["state"], far) if f]
    assert len(store.read_metrics(imported)) == 2


def test_jsonl_faults_are_named_by_line_and_nothing_is_written(tmp_path, capsys):
    good = {"prompts": [{"prompt": "p", "completions": [{"text": "a", "reward": 1, "ids": [1, 2], "pieces": ["a", "b"],
                                                         "logp_old": [-0.1, -0.2], "logp": [-0.1, -0.3],
                                                         "advantage": 0.5}]}]}
    bad = json.loads(json.dumps(good))
    bad["prompts"][0]["completions"][0]["logp"] = [-0.1]
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{json.dumps(good)}\n{json.dumps(good)}\n{json.dumps(bad)}\n")
    root = tmp_path / "runs"
    assert main(["import", str(path), "--runs-dir", str(root)]) == 2
    assert "line 3, prompt 1, completion 1: 'logp' has 1 values for 2 tokens" in capsys.readouterr().err
    assert not list(root.iterdir())  # the two good steps written first were removed with the folder
    path.write_text("")
    assert main(["import", str(path), "--runs-dir", str(root)]) == 2
    assert "holds no step" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing.jsonl")]) == 2


def test_an_imported_run_opens_in_the_inspector_with_its_text_escaped(imported, monkeypatch):
    from streamlit.testing.v1 import AppTest

    _, folder = imported
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(folder.parent))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/step_inspector.py").run()
    assert not at.exception, at.exception
    body = "".join(element.proto.body for element in at.get("html"))
    assert "&lt;script&gt;" in body and "<script" not in body and "<img" not in body
    assert any("gradient_flows" in d.value.columns for d in at.dataframe)
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception and "done" in set(at.dataframe[0].value["state"])
    assert math.isfinite(store.last_metrics(folder)["kl/k3"])


def test_an_imported_run_is_named_as_imported_with_no_seed_and_its_missing_pi_after_blamed_on_its_file(imported,
                                                                                                     monkeypatch):
    """Lists say "imported (unipo)" where an engine run has its seed (the file gave none, none is made up); the
    inspector says π after the update is unknown because the run came from that file, not from TRL."""
    from streamlit.testing.v1 import AppTest

    from divviz.views import run_text

    _, folder = imported
    run = store.read_run(folder)
    assert "seed" not in run.config
    choice = run_text.run_choice(run)
    assert "imported (unipo)" in choice and "seed" not in choice and "imported (unipo)" in run_text.run_label(run)
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(folder.parent))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/step_inspector.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="inspector:run").options == [choice]
    said = " ".join(c.value for c in at.caption).replace("\\", "")
    assert "imported (divviz import) from 'run.json' in UNIPO's schema" in said and "TRL" not in said
