"""The lab's time estimate takes a step's time from the way it was measured: alone or beside other runs, on the pool's
threads or on a terminal's (`runner.step_time_estimate`, `runner.crowding`), and a trained run records both."""

import pytest

from divviz.engine.config import RunConfig
from divviz.runs import runner, store
from divviz.runs.train import train


def timed_run(root, name, seconds, side_by_side, threads, **settings):
    """A finished run folder whose steps took `seconds` each while `side_by_side` runs trained (as train() writes)."""
    cfg = RunConfig.make(steps=3, **settings)
    writer = store.RunWriter(root / name, cfg.to_dict(), 3)
    writer.set_device("cpu", threads)
    for step in (1, 2, 3):
        writer.append(step, {"step": step, "step_time": seconds, "runs_training": side_by_side}, None, [])
    writer.finish("done", "3 steps")
    return cfg


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.delenv("DIVVIZ_WORKER_THREADS", raising=False)


def test_a_step_timed_beside_another_run_on_a_core_each_is_not_halved_or_doubled(tmp_path, two_cores):
    """The case a user met: a timing run's 87 s were measured while two one-thread runs shared two cores. Alone or
    side by side, a one-thread run has a core to itself, so the estimate stays 87 s either way (it once printed
    87 s alone and twice that side by side: the pair took half the time it said)."""
    cfg = timed_run(tmp_path, "timing", 87.0, side_by_side=2, threads=1)
    estimate = runner.step_time_estimate(tmp_path, cfg)
    assert estimate.side_by_side == 2 and "same settings" in estimate.basis
    assert estimate.at(1) == pytest.approx(87.0) and estimate.at(2) == pytest.approx(87.0)


def test_threads_past_the_cores_share_them_out(tmp_path, two_cores, monkeypatch):
    """Runs of two threads each on two cores: two side by side take twice a step alone, and a step measured side by
    side is half that alone."""
    monkeypatch.setenv("DIVVIZ_WORKER_THREADS", "2")
    cfg = timed_run(tmp_path, "pair", 20.0, side_by_side=2, threads=2)
    estimate = runner.step_time_estimate(tmp_path, cfg)
    assert estimate.at(1) == pytest.approx(10.0) and estimate.at(2) == pytest.approx(20.0)


def test_a_terminal_run_on_more_threads_is_scaled_to_the_pools_and_said(tmp_path, two_cores):
    """A `divviz train` run computes on every core; the pool's runs on one each: its step is scaled as if its work
    shared out perfectly, and the basis says so. A run on the pool's threads is preferred to it."""
    cfg = timed_run(tmp_path, "b-terminal", 6.0, side_by_side=1, threads=2)
    estimate = runner.step_time_estimate(tmp_path, cfg)
    assert estimate.at(1) == pytest.approx(12.0) and "from its 2 threads to the pool's 1" in estimate.basis
    timed_run(tmp_path, "a-pool", 9.0, side_by_side=1, threads=1, prompts=4)  # another shape, but the pool's threads
    estimate = runner.step_time_estimate(tmp_path, cfg)
    assert "a-pool" in estimate.basis and "scaled by the tokens per step" in estimate.basis
    assert estimate.at(1) == pytest.approx(9.0 * cfg.prompts / 4)


def test_a_run_older_than_the_record_is_taken_as_the_pools_and_said(tmp_path, two_cores):
    cfg = RunConfig.make(steps=2)
    writer = store.RunWriter(tmp_path / "old", cfg.to_dict(), 2)
    for step in (1, 2):
        writer.append(step, {"step": step, "step_time": 5.0}, None, [])
    writer.finish("done", "2 steps")
    estimate = runner.step_time_estimate(tmp_path, cfg)
    assert estimate.side_by_side is None and estimate.at(2) == pytest.approx(5.0)


def test_a_trained_run_records_its_threads_and_the_runs_beside_each_step(tmp_path):
    import torch

    folder = train(RunConfig.make(steps=2, prompts=4, group_size=4), tmp_path)
    assert store.read_status(folder)["threads"] == torch.get_num_threads()
    assert [row["runs_training"] for row in store.read_metrics(folder)] == [1, 1]  # itself, alone in its folder
    store.RunWriter(tmp_path / "other", RunConfig.make(steps=1).to_dict(), 1)  # a run starts training beside it
    assert store.runs_training(tmp_path) == 1  # the finished one no longer counts
