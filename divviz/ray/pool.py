"""A runs folder's queue trained on a Ray cluster: the pool's job (`runs/pool.py`) done by Ray's workers.

    python -m divviz.ray.pool RUNS_FOLDER ADDRESS [APP_PID]     # started by `runner.ensure_pool` when $DIVVIZ_RAY
                                                                # names a cluster (`ray://…`, `auto`) or `local`

    this process (the driver, on the runs folder's machine)
        takes the oldest queued runs while the cluster has room (`RUN_CPUS` and `RUN_GPUS` each), marks each running
        under its own pid (so the pages read it as live, and as interrupted if this process dies) and submits it as
        a Ray task, with the run folder's files (a run that trained before resumes from its resume.pt)
    a worker (anywhere in the cluster)
        trains the run with the engine's own `train`, one thread, in a folder of its own, and after every step sends
        the files that changed to `Mirror`, an actor on the driver's node that writes them into the run's folder:
        the Claims and Runs pages see a Ray run as they see a pool run
    Stop (`runner.stop_run` writes the run's .stop)  →  `Mirror.write` answers the worker's next send with it:
        the run ends as stopped after its step (a run no worker has reported yet is `ray.cancel`led; Ray's
        cancel of a running task is best effort and lands anywhere, a file write included, so it is not relied on)
    a worker that dies  →  the run is queued again and resumes from its last resume.pt (`MAX_RETRIES` times)

Ray core's tasks, not Ray Tune: a run's folder, its resume state, its queue and Stop are divviz's already (the
engine's), and what Ray adds is where a run trains; Tune's trial folders, syncing and experiment state would sit
beside them as a second copy. docs/scale.md says how to run it and what it buys.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from divviz.engine.config import RunConfig
from divviz.runs.pool import IDLE_EXIT_S, POLL_S, QueueLock, claim, queued_runs
from divviz.runs.processes import running
from divviz.runs.store import read_status, write_status

RUN_CPUS = float(os.environ.get("DIVVIZ_RAY_RUN_CPUS", 1))  # a run's CPU threads
RUN_GPUS = float(os.environ.get("DIVVIZ_RAY_RUN_GPUS", 0))  # a run's share of a GPU (0.25: four runs share one)
WORKDIR = os.environ.get("DIVVIZ_RAY_WORKDIR")  # where a worker makes a run's own folder (None: its temp folder)
MAX_RETRIES = 3
EXECUTOR = "ray"  # a run's status "executor" while Ray trains it: Stop writes .stop instead of signalling its pid


@ray.remote(num_cpus=0)
class Mirror:
    """On the driver's node: writes what the workers send into the runs folder, a run's status under the driver's
    pid (a worker's pid means nothing here)."""

    def __init__(self, root: str, driver_pid: int):
        self.root, self.driver_pid = Path(root), driver_pid

    def write(self, name: str, files: dict[str, bytes | None]) -> bool:
        """Write `files` into the run `name`'s folder; return whether the run has been asked to stop."""
        folder = self.root / name
        for relative, data in files.items():
            if data is None:
                (folder / relative).unlink(missing_ok=True)
                continue
            if relative == "status.json":
                status = json.loads(data)
                data = json.dumps({**status, **running(self.driver_pid), "executor": EXECUTOR,
                                   "worker": status.get("pid")}).encode()
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_name(f".{target.name}.ray")
            temporary.write_bytes(data)
            os.replace(temporary, target)
        return (folder / ".stop").exists()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of a run folder, by its path inside it (hidden ones, such as .stop, left out): all are new."""
    return Changes(folder)()


class Changes:
    """The files of a folder that changed since the last call, by (size, modification time): their bytes, or None
    for a file that is gone (a run's resume.pt once it is done)."""

    def __init__(self, folder: Path):
        self.folder, self.seen = folder, {}

    def __call__(self) -> dict[str, bytes | None]:
        changed, now = {}, {}
        for path in sorted(self.folder.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                relative = str(path.relative_to(self.folder))
                now[relative] = (path.stat().st_size, path.stat().st_mtime_ns)
                if self.seen.get(relative) != now[relative]:
                    changed[relative] = path.read_bytes()
        changed.update(dict.fromkeys(set(self.seen) - set(now)))
        self.seen = now
        return changed


@ray.remote(max_retries=0)
def train_remote(name: str, files: dict[str, bytes], mirror, threads: int, workdir: str | None) -> None:
    """On a worker: the run `name` from its folder's `files`, trained in a folder of the worker's own (in
    `workdir`, else its temp folder; as the pool's fork would, `threads` threads), every step's changed files sent
    to `mirror`."""
    import torch

    from divviz.runs.train import StopRequested, train

    torch.set_num_threads(threads)
    folder = Path(tempfile.mkdtemp(prefix="divviz-ray-", dir=workdir)) / name
    for relative, data in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    changes = Changes(folder)
    changes()  # what the driver holds already is not sent back
    send = lambda: ray.get(mirror.write.remote(name, changes()))  # noqa: E731 — True once the run is asked to stop

    def after_step(result) -> None:
        if send():
            raise StopRequested  # `train` ends the run as stopped after this step, as SIGTERM would

    try:
        train(RunConfig.from_dict(json.loads(files["config.json"])), folder.parent, folder=folder,
              on_step=after_step)
    finally:
        send()  # how it ended: done, failed or stopped
        shutil.rmtree(folder.parent, ignore_errors=True)  # the driver holds the run now


class RayPool:
    def __init__(self, root: Path, app_pid: int | None):
        self.root, self.app_pid = root, app_pid
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.mirror = Mirror.options(scheduling_strategy=here).remote(str(root), os.getpid())
        resources = ray.cluster_resources()
        self.slots = max(1, int(min(resources.get("CPU", 1) / RUN_CPUS,
                                    resources.get("GPU", 0) / RUN_GPUS if RUN_GPUS else float("inf"))))
        self.live: dict[ray.ObjectRef, Path] = {}
        self.stopping: set[ray.ObjectRef] = set()  # the tasks of runs asked to stop, cancelled or not
        self.retries: dict[str, int] = {}
        self.idle_since = time.time()

    def serve(self) -> None:
        """Train the queue; return once nothing is queued or training and the app is gone or `IDLE_EXIT_S` passed."""
        while True:
            self.start_queued()
            self.cancel_stopped()
            if self.live:
                done, _ = ray.wait(list(self.live), num_returns=1, timeout=POLL_S)
                for ref in done:
                    self.ended(ref)
                self.idle_since = time.time()
            elif queued_runs(self.root):
                self.idle_since = time.time()
            elif not self.app_alive() or time.time() - self.idle_since > IDLE_EXIT_S:
                return
            else:
                time.sleep(POLL_S)

    def app_alive(self) -> bool:
        """As the pool's (`Pool.app_alive`): the app that started this process still runs."""
        return self.app_pid is None or os.getppid() == self.app_pid

    def start_queued(self) -> None:
        while len(self.live) < self.slots:
            with QueueLock(self.root):
                queue = queued_runs(self.root)
                if not queue:
                    return
                folder = queue[0][1]
                status = read_status(folder)
                status.pop("worker", None)  # a worker of an earlier try: this one has reported nothing yet
                write_status(folder, {**status, "state": "running", "message": "starting on Ray",
                                      **running(os.getpid()),
                                      "executor": EXECUTOR, "started": time.time(), "updated": time.time()})
            self.live[train_remote.options(num_cpus=RUN_CPUS, num_gpus=RUN_GPUS).remote(
                folder.name, folder_files(folder), self.mirror, max(1, int(RUN_CPUS)), WORKDIR)] = folder

    def cancel_stopped(self) -> None:
        """Cancel the tasks of stopped runs that no worker has reported yet (waiting for a worker, or loading its
        model); a run that reports stops itself at its next step (`train_remote`)."""
        for ref, folder in self.live.items():
            if ref not in self.stopping and (folder / ".stop").exists():
                if "worker" not in read_status(folder):
                    ray.cancel(ref)
                self.stopping.add(ref)

    def ended(self, ref: ray.ObjectRef) -> None:
        """A task ended: trained to its end (the mirror holds how), cancelled, or its worker died (queued again to
        resume, while retries are left)."""
        folder = self.live.pop(ref)
        self.stopping.discard(ref)
        try:
            ray.get(ref)
            return
        except ray.exceptions.TaskCancelledError:
            how, again = "stopped", False
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.ActorDiedError,
                ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError) as err:
            how, again = f"its Ray worker died ({type(err).__name__})", True
        except ray.exceptions.RayTaskError as err:
            how, again = f"{type(err.cause).__name__}: {err.cause}", False
        status = read_status(folder)
        if status["state"] not in ("running", "interrupted"):
            return  # the run said how it ended before its task did
        tries = self.retries[folder.name] = self.retries.get(folder.name, 0) + 1
        asked_to_stop = (folder / ".stop").exists()
        if again and tries <= MAX_RETRIES and not asked_to_stop:
            write_status(folder, {**status, "state": "queued", "pid": None, "updated": time.time(),
                                  "message": f"{how} after step {status.get('step', 0)}: queued to resume "
                                             f"(try {tries + 1} of {MAX_RETRIES + 1})"})
            return
        state = "stopped" if how == "stopped" or asked_to_stop else "failed"
        write_status(folder, {**status, "state": state, "updated": time.time(),
                              "message": f"{how} after step {status.get('step', 0)}"})


def connect(address: str) -> None:
    """Join the cluster at `address`, or start one of this machine's own for "local" (its cores, no dashboard)."""
    if address == "local":
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def main(argv: list[str]) -> None:
    root, address = Path(argv[0]), argv[1]
    app_pid = int(argv[2]) if len(argv) > 2 else None
    lock = claim(root, ray=address)  # held while this process lives
    if lock is None:
        return  # another pool serves this runs folder
    connect(address)
    try:
        RayPool(root.resolve(), app_pid).serve()
    finally:
        ray.shutdown()
        lock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
