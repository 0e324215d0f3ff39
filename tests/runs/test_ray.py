"""The runs folder's queue on a real local Ray cluster (`divviz/ray/pool.py`, this machine's cores, no dashboard): the
claims grid through `divviz claims --lm --ray` gives the pool's runs metric for metric; a worker killed mid-run fails
only its run, which resumes from its last resume state and ends as an unbroken run would; Stop ends a run after its
step; the workers train in folders of their own and the runs land in the app's runs folder."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from divviz.cli import main
from divviz.engine.config import RunConfig
from divviz.evidence import claims_lm
from divviz.runs import runner, store
from divviz.views import run_text
from tests.lm_grid import LM_SEEDS, LM_STEPS

pytest.importorskip("ray")


def same_metrics(a: Path, b: Path) -> bool:
    strip = lambda rows: [{k: v for k, v in row.items() if k not in store.CLOCK_KEYS} for row in rows]  # noqa: E731
    return strip(store.read_metrics(a)) == strip(store.read_metrics(b))


def wait_for(condition, what: str, timeout: float = 600):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.2)


ON_RAY = 3  # the grid's cells Ray trains here (the first in queue order); the others are copies of the pool's runs


def test_the_claims_grid_on_ray_is_the_pools_run_for_run(lm_plan, tmp_path, capsys):
    for cell in claims_lm.queue_order(LM_SEEDS)[ON_RAY:]:
        shutil.copytree(lm_plan.runs[cell].folder, tmp_path / lm_plan.runs[cell].folder.name)
    assert main(["claims", "--seeds", "2", "--lm", "--lm-seeds", str(LM_SEEDS), "--lm-steps", str(LM_STEPS),
                 "--runs-dir", str(tmp_path), "--no-published", "--ray", "--json"]) == 0
    capsys.readouterr()
    assert "DIVVIZ_RAY" not in os.environ  # the CLI's choice of pool ends with it (main() runs in-process here)
    on_ray = claims_lm.LMPlan.read(tmp_path, LM_SEEDS, LM_STEPS, with_published=False)
    assert on_ray.finished and set(on_ray.runs) == set(lm_plan.runs)
    trained = {cell: run for cell, run in on_ray.runs.items() if run.status.get("executor") == "ray"}
    assert set(trained) == set(claims_lm.queue_order(LM_SEEDS)[:ON_RAY])
    for cell, run in trained.items():
        assert run.state == "done" and same_metrics(run.folder, lm_plan.runs[cell].folder), cell
    assert "(a Ray worker)" in run_text.progress_text(run, store.read_metrics(run.folder), time.time())  # the lab's


def small_run(steps: int, seed: int = 0) -> RunConfig:
    return RunConfig.make(task="reverse", prompts=4, group_size=4, steps=steps, seed=seed, checkpoint_every=5)


def test_a_killed_worker_fails_only_its_run_which_resumes_and_stop_ends_a_run_after_its_step(tmp_path, monkeypatch):
    alone = tmp_path / "pool"
    alone.mkdir()
    unbroken = runner.start_run(small_run(40), alone)  # the pool's run: what the resumed one must equal
    monkeypatch.setenv("DIVVIZ_RAY", "local")
    monkeypatch.setenv("DIVVIZ_RAY_WORKDIR", str(tmp_path / "workers"))  # the workers' own folders
    (tmp_path / "workers").mkdir()
    root = tmp_path / "runs"
    root.mkdir()
    killed = runner.start_run(small_run(40), root)
    stopped = runner.start_run(small_run(100_000, seed=1), root)  # too long to end before its Stop lands
    wait_for(lambda: store.read_status(killed).get("step", 0) >= 7 and store.read_status(stopped).get("step", 0) >= 2,
             "both Ray runs reach their steps")
    status = store.read_status(killed)
    assert status["executor"] == "ray" and status["pid"] != status["worker"]
    os.kill(status["worker"], signal.SIGKILL)
    asked_at = store.read_status(stopped)["step"]  # the worker may be a step further on, not more
    assert runner.stop_run(stopped) == "stopping"
    wait_for(lambda: store.read_status(stopped)["state"] == "stopped", "the stopped run ends", timeout=300)
    wait_for(lambda: store.read_status(killed)["state"] == "done" and store.read_status(unbroken)["state"] == "done",
             "the killed run resumes and ends, as the unbroken one")
    assert same_metrics(killed, unbroken)  # resumed from its step-5 state, as an unbroken run goes on
    assert not (killed / "resume.pt").exists()  # a done run forgets it, on the worker and here
    assert asked_at <= store.read_status(stopped)["step"] <= asked_at + 2
    assert store.read_status(stopped)["message"].startswith("stopped after step")
    trained = list((tmp_path / "workers").rglob(killed.name))  # the killed worker's own folder stays behind
    assert trained and all(root not in folder.parents for folder in trained)
    assert json.loads((killed / "config.json").read_text()) == json.loads((unbroken / "config.json").read_text())
