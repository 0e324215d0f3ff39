"""Queue, watch and stop runs: the app's and the CLI's API. The pool (`pool.py`) trains what is queued.

    folder = start_run(cfg, root, owner)   # queued at once; the pool starts it when a slot and memory are free
    queue_position(folder)                 # (runs ahead, estimated seconds until it starts or None)
    stop_run(folder)                       # returns at once: a queued run is stopped, a running one signalled
    resume_run(folder)                     # a stopped run queued again: it goes on from its resume state
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.runs import resume, store
from divviz.runs.pool import STOP_GRACE_S, QueueLock, control_dir, max_runs, queued_runs, worker_threads
from divviz.runs.processes import run_process_alive
from divviz.runs.store import list_runs, new_run_folder, read_metrics, read_status, write_status
from divviz.safetext import quoted

@dataclass(frozen=True)
class Viewer:
    """Who asks: a browser's identity (`ownership.browser_id`, "" for none) and whether it may manage every run
    (the teacher, or the one user of an app bound to this machine). A run belongs to the identity that queued
    it; terminal runs belong to nobody, so only a teacher manages them."""

    who: str
    teacher: bool = False

    def can_manage(self, status: dict) -> bool:
        return self.teacher or (bool(self.who) and status.get("owner") == self.who)


def check_may_manage(folder: Path, viewer: Viewer | None) -> None:
    if viewer is not None and not viewer.can_manage(read_status(folder)):
        raise DivvizInputError(f"run {quoted(folder.name, 60)} belongs to another browser; only its owner or the "
                               "teacher can stop or delete it")


_pools: dict[str, subprocess.Popen] = {}  # a runs folder's control folder → the pool this process last started there
_pools_lock = threading.Lock()  # the app's sessions, each in its own thread, poll at once


TIMING = "timing"  # a run's status "kind" when it was started only to time a step on this machine


def start_run(cfg: RunConfig, root: Path, owner: str = "", kind: str = "") -> Path:
    """Queue `cfg` in a new run folder owned by `owner` (a browser's identity, or "" for the terminal) and make
    sure a pool serves the runs folder; returns at once. `kind` TIMING marks a run started to time one step (the
    lists say so)."""
    folder = new_run_folder(root, f"{cfg.task}-{cfg.label}" if kind != TIMING else f"timing-{cfg.label}")
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    now = time.time()
    write_status(folder, {"state": "queued", "message": "", "pid": None, "step": 0, "steps": cfg.steps,
                          "owner": owner, "queued_at": now, "started": now, "updated": now,
                          **({"kind": kind} if kind else {})})
    ensure_pool(root)
    return folder


RUNS_PER_BROWSER = 8  # a student's runs queued or running at once, unless $DIVVIZ_RUNS_PER_BROWSER says otherwise


def runs_per_browser() -> int:
    """How many runs one browser that is not the teacher's may have queued or running at once."""
    return max(1, int(os.environ.get("DIVVIZ_RUNS_PER_BROWSER") or RUNS_PER_BROWSER))


def start_runs(configs: list[RunConfig], root: Path, viewer: Viewer, kind: str = "") -> list[Path]:
    """Queue `configs` for `viewer` (`start_run` each). A browser that is not the teacher's (in room mode: a student)
    may have at most `runs_per_browser()` runs queued or running at once, so that one Start cannot take a room's
    queue; a Start past it queues nothing and says so in one line."""
    if not viewer.teacher:
        mine, limit = len(active_runs(root, viewer.who)), runs_per_browser()
        if mine + len(configs) > limit:
            raise DivvizInputError(
                f"a browser in this workshop room may have {limit} runs queued or running at once (the teacher has "
                f"no limit; DIVVIZ_RUNS_PER_BROWSER sets it): this one has {mine}, and this Start asks for "
                f"{len(configs)} more. Choose fewer objectives or seeds, or stop some of your runs")
    return [start_run(cfg, root, owner=viewer.who, kind=kind) for cfg in configs]


def ensure_pool(root: Path) -> None:
    """Start the runs folder's pool unless one holds its lock or the one this process started there is still alive
    (starting up: it takes the lock once Python has imported it, seconds on a busy machine — a caller that polls, as
    the Training lab does every 2 s, would otherwise start one more each time, and a herd of them, all importing, kept
    any from reaching the lock). A second one started in a race with another process just leaves."""
    with _pools_lock:
        reap()
        control = control_dir(root)  # a runs folder that cannot be used: one line (DivvizInputError), before anything
        if str(control) in _pools:
            return
        with open(control / "pool.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a pool is serving
            fcntl.flock(lock, fcntl.LOCK_UN)
        with open(control / "pool.log", "a") as log:  # the pool writes to its own copy
            _pools[str(control)] = subprocess.Popen([sys.executable, "-m", *pool_command(root)], stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd())


def pool_command(root: Path) -> list[str]:
    """The pool that trains a runs folder: this machine's (`pool.py`), or a Ray cluster's (`divviz.ray.pool`, by
    name: the engine imports nothing of it) when $DIVVIZ_RAY names one ("local": a cluster of this machine's own).
    Either is told this process's pid, and leaves once idle after it ends."""
    cluster = os.environ.get("DIVVIZ_RAY")
    return [*(("divviz.ray.pool", str(root), cluster) if cluster else ("divviz.runs.pool", str(root))),
            str(os.getpid())]


def reap() -> None:
    """Forget the pools this process started that have ended (their exit status read: no zombie lingers)."""
    for key, proc in list(_pools.items()):
        if proc.poll() is not None:
            _pools.pop(key, None)


def stop_run(folder: Path, viewer: Viewer | None = None, wait_s: float = STOP_GRACE_S) -> str:
    """Stop a run and return at once: "stopped" for a queued one; "stopping" for a running one, which gets SIGTERM
    now and SIGKILL (marked stopped) from a background thread if it is still alive `wait_s` seconds later. With a
    `viewer`, only a run it may manage (else `DivvizInputError`)."""
    check_may_manage(folder, viewer)
    with QueueLock(folder.parent):
        status = read_status(folder)
        if status["state"] == "queued":
            write_status(folder, {**status, "state": "stopped", "message": "stopped before it started",
                                  "updated": time.time()})
            return "stopped"
    pid = status.get("pid")
    if status["state"] != "running" or not pid:  # read_status: a process that is not the run's reads interrupted
        return status["state"]
    (folder / ".stop").write_text(str(time.time()))  # the pool reads it: a child that dies now was stopped
    if status.get("executor"):  # Ray's pool trains it under its own pid (divviz/ray/pool.py): .stop stops it
        return "stopping"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return read_status(folder)["state"]
    threading.Thread(target=_kill_if_alive, args=(folder, status, wait_s), daemon=True).start()
    return "stopping"


RESUMABLE = ("stopped", "interrupted")


def resume_run(folder: Path, viewer: Viewer | None = None) -> int:
    """Queue a stopped or interrupted run again in its own folder; it goes on after the step its resume state was
    saved (`resume.py`; returned), else from step 0. With a `viewer`, only a run it may manage."""
    check_may_manage(folder, viewer)
    with QueueLock(folder.parent):
        status = read_status(folder)
        if status["state"] not in RESUMABLE:
            raise DivvizInputError(f"run {quoted(folder.name, 60)} is {status['state']}: only a stopped or "
                                   "interrupted run can be resumed")
        cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
        step = resume.saved_step(folder) if resume.can_resume(cfg) else 0
        (folder / ".stop").unlink(missing_ok=True)
        now = time.time()
        write_status(folder, {**status, "state": "queued", "pid": None, "queued_at": now, "updated": now,
                              "message": f"queued to resume after step {step}" if step else "queued to start again"})
    ensure_pool(folder.parent)
    return step


def _kill_if_alive(folder: Path, stopped: dict, wait_s: float) -> None:
    """SIGKILL the process of the status `stopped` was read from if it is still that run's `wait_s` seconds on."""
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if not run_process_alive(stopped) or read_status(folder)["state"] != "running":
            return
        time.sleep(0.05)
    if not run_process_alive(stopped):
        return
    try:
        os.kill(stopped["pid"], signal.SIGKILL)
    except ProcessLookupError:
        return
    status = read_status(folder)
    write_status(folder, {**status, "state": "stopped", "updated": time.time(), "message":
                          f"killed after step {status.get('step', 0)}: it did not stop within {wait_s:g} s of SIGTERM"})


def delete_run(folder: Path, viewer: Viewer | None = None) -> None:
    """Delete a finished run's folder; with a `viewer`, only one it may manage."""
    check_may_manage(folder, viewer)
    store.delete_run(folder)


def queue_position(folder: Path) -> tuple[int, float | None]:
    """(queued runs ahead of this one, estimated seconds until it starts, or None while nothing has timed a step).
    The estimate: the steps still to train ahead of it, at the median seconds per step of the running runs,
    spread over the pool's slots."""
    queue = [f for _, f in queued_runs(folder.parent)]
    ahead = queue.index(folder) if folder in queue else 0
    running = [run for run in list_runs(folder.parent) if run.state == "running" and run.step > 0]
    if not running:
        return ahead, None
    per_step = statistics.median((run.status["updated"] - run.status["started"]) / run.step for run in running)
    work = sum(run.steps - run.step for run in running)
    work += sum(read_status(f).get("steps", 0) for f in queue[:ahead])
    return ahead, work * per_step / max_runs()


SHAPE = ("prompts", "group_size", "max_new_tokens", "mu", "trainable_blocks")  # what a step's cost depends on


@dataclass(frozen=True)
class StepTime:
    """A step of the pool's runs on this machine: `alone` seconds with the cores to itself, found as `basis` says
    from a run timed while `side_by_side` runs trained at once (None where that run did not record it)."""
    alone: float
    side_by_side: int | None
    basis: str

    def at(self, runs: int) -> float:
        """A step's seconds while `runs` of the pool's runs train at once (`crowding`)."""
        return self.alone * crowding(runs, worker_threads())


def crowding(runs: int, threads: int) -> float:
    """How much slower a step is while `runs` runs of `threads` threads each share this machine's cores: not at all
    until their threads outnumber the cores, then in proportion."""
    return max(1.0, runs * threads / (os.cpu_count() or 1))


class _TimedRun(NamedTuple):
    """A run that timed its steps, as `step_time_estimate` weighs it."""
    run: store.RunInfo
    seconds: float  # its median step
    steps: int  # how many steps that median is of
    beside: int | None  # the median number of runs that trained beside it
    threads: int
    same_shape: bool  # the same SHAPE as the run to estimate


def step_time_estimate(root: Path, cfg: RunConfig, newest: int = 20) -> StepTime | None:
    """How long a step of `cfg` takes in the pool on this machine, from the newest `newest` runs of the same model and
    backend in `root`, or None when none has timed a step. A run's median step (its first, which warms up, left out
    unless it is the only one), with the runs it trained beside (`runs_training`) and its threads taken out
    (`crowding`); the run nearest `cfg` is taken: one on the pool's threads first, then one of the same shape
    (`SHAPE`), else the nearest in tokens a step samples and trains, completions × max_new_tokens × (1 + μ), scaled
    by them. A run on t threads is scaled to the pool's as if its work shared out perfectly (t / the pool's)."""
    def work(c) -> float:
        return c["prompts"] * c["group_size"] * c["max_new_tokens"] * (1 + c["mu"])

    pool = worker_threads()
    timed = []
    for run in [r for r in list_runs(root) if r.config.get("model") == cfg.model
                and r.config.get("backend", "divviz") == cfg.backend][:newest]:
        rows = [row for row in read_metrics(run.folder) if "step_time" in row]
        rows = rows[1:] if len(rows) > 1 else rows
        if rows and all(k in run.config for k in SHAPE):
            beside = [row["runs_training"] for row in rows if "runs_training" in row]
            timed.append(_TimedRun(run, statistics.median(row["step_time"] for row in rows), len(rows),
                                   round(statistics.median(beside)) if beside else None,
                                   int(run.status.get("threads") or pool),  # older runs did not record their threads
                                   all(run.config[k] == getattr(cfg, k) for k in SHAPE)))
    if not timed:
        return None
    near = min(timed, key=lambda t: (t.threads != pool, not t.same_shape,
                                     abs(math.log(work(t.run.config) / work(vars(cfg))))))
    basis = f"the median of {near.steps} step{'s' if near.steps != 1 else ''} of run {near.run.name}"
    basis += ", same settings" if near.same_shape else ", scaled by the tokens per step"
    if near.threads != pool:
        basis += f", scaled from its {near.threads} threads to the pool's {pool}"
    alone = (near.seconds * work(vars(cfg)) / work(near.run.config) * near.threads / pool
             / crowding(near.beside or 1, near.threads))
    return StepTime(alone, near.beside, basis)


def eval_time_estimate(root: Path, cfg: RunConfig, newest: int = 20) -> float | None:
    """Seconds a held-out evaluation of `cfg`'s model takes on this machine: the median `eval/time` of the newest
    `newest` runs of that model in `root` that evaluated, or None when none did."""
    times = [row["eval/time"] for run in [r for r in list_runs(root) if r.config.get("model") == cfg.model][:newest]
             for row in store.read_evals(run.folder) if "eval/time" in row]
    return statistics.median(times) if times else None


def wait_for_slot(root: Path, say) -> None:
    """For `divviz train`: wait while the runs folder already trains `max_runs()` runs (the pool's limit), saying
    so once. A terminal run takes the first free slot; it does not join the app's queue order."""
    said = False
    while sum(run.state == "running" for run in list_runs(root)) >= max_runs():
        if not said:
            say(f"waiting for a free slot: {max_runs()} runs are training in {root} (DIVVIZ_MAX_RUNS sets the limit)")
            said = True
        time.sleep(1.0)


def active_runs(root: Path, who: str, everyone: bool = False) -> list[str]:
    """The names of the queued and running runs that `who` queued, oldest first (a reloaded tab finds them); with
    `everyone`, all of them, whoever queued them (outside room mode the app has one user, who manages every run: a
    second browser, or the terminal's runs, are still that user's)."""
    active = [run for run in list_runs(root) if run.state in ("queued", "running")
              and (everyone or (who and run.status.get("owner") == who))]
    return [run.name for run in reversed(active)]


def lab_runs(root: Path, shown: list[str], who: str, everyone: bool = False) -> list[str]:
    """The runs a Training lab tab shows: those it shows already, then those `who` has queued or running (a reloaded
    tab finds them). A tab with none to show gets, with `everyone` (outside room mode, where the app's one user
    manages every run), every queued or running run: a second browser, or a run queued from elsewhere, is still
    that user's. A tab that shows runs of its own never takes in others'."""
    names = list(dict.fromkeys([*shown, *active_runs(root, who)]))
    return names or (active_runs(root, who, everyone=True) if everyone else [])


def is_running(folder: Path) -> bool:
    reap()
    status = read_status(folder)
    return status["state"] == "running" and run_process_alive(status)
