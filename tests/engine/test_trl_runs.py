"""divviz inside TRL, trained for real on the built-in model: `divviz train --backend trl` (its metrics, tokens,
records and TRL's advantages), DivvizRunCallback on a plain GRPOTrainer, a failing, a SIGKILLed and a SIGTERMed run,
two processes under `accelerate launch`, and TRL runs on the Runs page, the step inspector and the Training lab."""

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from divviz import cli  # noqa: E402
from divviz.catalogue.aggregation import group_advantages  # noqa: E402
from divviz.catalogue.divergences import clip_test  # noqa: E402
from divviz.engine.tasks import get_task  # noqa: E402
from divviz.losses import Objective  # noqa: E402
from divviz.runs import store  # noqa: E402
from divviz.trl import DivvizGRPOTrainer, DivvizRunCallback  # noqa: E402
from tests.trl_support import APP, TASK, config, load_policy  # noqa: E402


@pytest.fixture(scope="module")
def policy():
    return load_policy()


def train_cli(tmp_path, *extra) -> dict:
    code = cli.main(["train", "--backend", "trl", "--steps", "2", "--prompts", "2", "--group-size", "4",
                     "--max-new-tokens", "6", "--runs-dir", str(tmp_path), *extra])
    assert code == 0
    (run,) = store.list_runs(tmp_path)
    return run


@pytest.mark.parametrize("extra", [
    ("--measure", "kl3", "--param", "delta=0.05"),
    ("--measure", "kl3", "--penalty", "k3", "--penalty-param", "importance_weight=1", "--beta", "0.04",
     "--dual-clip", "3", "--aggregation", "dapo", "--scale-rewards", "batch"),
])
def test_real_trl_steps_on_the_builtin_model(tmp_path, capsys, extra):
    run = train_cli(tmp_path, *extra, "--mu", "2")
    assert run.state == "done" and run.config["backend"] == "trl"
    rows = store.read_metrics(run.folder)
    assert [r["step"] for r in rows] == [1, 2] and [r["trl/global_step"] for r in rows] == [2, 4]
    for key in ("reward", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "kl/k3", "divviz/measure_mean",
                "divviz/outside_last_mean", "rewards/accuracy/mean"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert ("kl" in rows[0]) == ("--penalty" in extra)
    tokens = store.read_tokens(run.folder, 2)
    assert tokens is not None and ((tokens["pi_old"] > 0) & (tokens["pi_old"] <= 1)).all()
    assert store.completion_steps(run.folder) == [1, 2]  # the step inspector's records, as the engine writes them
    answers = dict(get_task("reverse").batch(seed=1, n=2))  # step 2's prompts (seed 0): prompt → answer
    groups = store.read_completions(run.folder, 2)["groups"]
    for group in groups:
        assert len(group["completions"]) == 4 and all(c["tokens"]["pi_new"] is None for c in group["completions"])
        for completion in group["completions"]:  # TRL's reward of the completion's text
            assert completion["reward"] == TASK.reward(group["prompt"], answers[group["prompt"]], completion["text"])
    # TRL's advantages (group std, or with --scale-rewards batch the std of all 8 rewards) are divviz's
    rewards = torch.tensor([[c["reward"] for c in group["completions"]] for group in groups], dtype=torch.float64)
    want = group_advantages(rewards, run.config["scale_rewards"])
    assert run.config["scale_rewards"] == ("batch" if "batch" in extra else "group")
    assert [c["advantage"] for g in groups for c in g["completions"]] == pytest.approx(want.flatten().tolist(),
                                                                                      rel=1e-5, abs=1e-6)
    capsys.readouterr()
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["state"] == "done" and listed["clip"] == "kl3"


def test_the_callback_writes_a_plain_grpo_trainer_run(tmp_path, policy):
    """A plain TRL GRPOTrainer with DivvizRunCallback: metrics per GRPO step, TRL's box as the run's objective."""
    model, tokenizer = policy
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, 8)])
    reward = lambda prompts, completions, answer, **_: [TASK.reward(p, a, c) for p, c, a in  # noqa: E731
                                                         zip(prompts, completions, answer)]
    callback = DivvizRunCallback(tmp_path / "runs", task="reverse")
    GRPOTrainer(model=copy.deepcopy(model), reward_funcs=reward, train_dataset=data, processing_class=tokenizer,
                args=config(tmp_path, max_steps=4, num_iterations=2, logging_steps=1, epsilon_high=0.28),
                callbacks=[callback]).train()
    (run,) = store.list_runs(tmp_path / "runs")
    assert run.state == "done" and run.step == 2 == run.steps
    assert run.config["clip"] == "clip_higher" and run.config["clip_params"] == {"eps_low": 0.2, "eps_high": 0.28}
    assert [r["step"] for r in store.read_metrics(run.folder)] == [1, 2]
    assert store.read_tokens(run.folder, 2) is None  # TRL's own loss hands over no per-token facts


def test_a_failing_trl_run_reads_failed_with_its_message(tmp_path, policy):
    def broken(completions, **_):
        raise RuntimeError("reward server unreachable")

    model, tokenizer = policy
    callback = DivvizRunCallback(tmp_path)
    trainer = DivvizGRPOTrainer(model=copy.deepcopy(model), reward_funcs=broken, processing_class=tokenizer,
                                train_dataset=Dataset.from_list([{"prompt": "rev:abc="}] * 8),
                                args=config(tmp_path, max_steps=2), callbacks=[callback],
                                objective=Objective(clip=clip_test("kl3"), aggregation="dapo"))
    with pytest.raises(RuntimeError):
        trainer.train()
    (run,) = store.list_runs(tmp_path)
    assert run.state == "failed" and "reward server unreachable" in run.message


def test_a_sigkilled_trl_run_reads_interrupted_and_a_sigtermed_one_stopped(tmp_path):
    runs = {}
    for sig in (signal.SIGKILL, signal.SIGTERM):
        root = tmp_path / sig.name
        proc = subprocess.Popen([sys.executable, "-m", "divviz", "train", "--backend", "trl", "--steps", "500",
                                 "--prompts", "2", "--group-size", "4", "--runs-dir", str(root)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and not any(run.step >= 1 for run in store.list_runs(root)):
            time.sleep(0.2)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        (runs[sig],) = store.list_runs(root)
    assert runs[signal.SIGKILL].state == "interrupted"
    assert runs[signal.SIGTERM].state == "stopped" and runs[signal.SIGTERM].step >= 1


def test_two_processes_under_accelerate_write_one_gathered_run(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 … --device cpu`: two gloo processes each train their half
    of the completions; the main one writes the one run folder. Gathered: the per-token facts of the last optimiser step
    come from both processes, and the logged share outside the region at that step is the share over both."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
         "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "divviz", "train", "--backend", "trl",
         "--device", "cpu", "--steps", "2", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "6",
         "--mu", "2", "--lr", "0.05", "--measure", "kl3", "--param", "delta=0.001", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "process 1 of 2 trained" in done.stderr
    (run,) = store.list_runs(tmp_path)
    assert run.state == "done" and run.config["backend"] == "trl"
    last = store.read_metrics(run.folder)[-1]
    tokens = store.read_tokens(run.folder, 2)
    assert set(np.unique(tokens["rank"])) == {0, 1}
    outside = tokens["measure"] > 0.001  # every token of the step is kept at this size (≤ 128 per process)
    assert last["divviz/outside_last_mean"] == pytest.approx(outside.mean(), abs=1e-6)
    assert math.isfinite(last["reward"])


def test_the_runs_page_lists_and_overlays_a_trl_run_with_an_engine_run(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from divviz.engine.config import RunConfig
    from divviz.runs.train import train

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    trl_run = train_cli(tmp_path, "--measure", "kl3")
    train(RunConfig.make(steps=2, prompts=2, group_size=4, max_new_tokens=6, clip="ratio"), tmp_path)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert trl_run.name in set(table["run"]) and set(table["state"]) == {"done"}
    assert "kl3 δ=0.05 (TRL)" in set(table["objective"])
    assert len(at.get("plotly_chart")) == 9  # both runs overlaid: six metric panels (stability too), the engine run's
    # entropy change and covariance by state (a TRL run logs neither), and the mass by π_old
    at.switch_page("app_pages/step_inspector.py").run()
    at.sidebar.selectbox(key="inspector:run").set_value(trl_run.name).run()  # the TRL run's completions, explained
    assert not at.exception, at.exception
    assert any("π after the update is not known" in c.value for c in at.caption) and not at.warning
    assert any("This token's loss" in h.value for h in at.subheader)
    assert len(at.get("plotly_chart")) == 1  # the token on the clipping regions, at its last optimiser step


def test_the_training_lab_trains_with_the_trl_backend(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"m": "kl3", "backend": "trl", "steps": "2", "prompts": "2", "group_size": "4"})
    at.run()
    at.switch_page("app_pages/training_lab.py").run()
    assert not at.exception, at.exception
    next(b for b in at.button if b.label == "Start").click().run()
    (name,) = at.session_state["lab_runs"]
    deadline = time.time() + 180
    while time.time() < deadline and store.read_run(tmp_path / name).state in ("queued", "running"):
        time.sleep(0.5)
    run = store.read_run(tmp_path / name)
    assert run.state == "done", run.message
    at.run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 9  # six metric panels, Cov(log π_old, A) by clip state, the mass by π_old
    # and the token scatter (no entropy/change: TRL makes no forward pass after its update)


def test_a_trl_run_in_minibatches_evaluates_on_the_held_out_set(tmp_path):
    """`--backend trl --minibatches 2`: TRL's steps_per_generation = 2, so μ × K optimiser steps per divviz step; the
    held-out evaluation runs at the start, every step asked and the end, and every row carries the stability."""
    run = train_cli(tmp_path, "--mu", "2", "--minibatches", "2", "--eval-every", "1")
    assert run.state == "done" and run.config["minibatches"] == 2
    rows = store.read_metrics(run.folder)
    assert [r["trl/global_step"] for r in rows] == [4, 8]
    assert all({"stability/max_kl", "stability/collapsed"} <= set(r) for r in rows)
    assert [e["step"] for e in store.read_evals(run.folder)] == [0, 1, 2]
