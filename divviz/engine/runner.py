"""Start, watch and stop runs in separate processes (the app's and the CLI's API)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from divviz.engine.config import RunConfig
from divviz.engine.store import new_run_folder, process_alive, read_status, write_status

_children: list[subprocess.Popen] = []  # kept so finished workers are reaped, not left as zombies


def start_run(cfg: RunConfig, root: Path) -> Path:
    """Create the run folder and start a worker process on it; returns at once."""
    folder = new_run_folder(root, f"{cfg.task}-{cfg.label}")
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    log = open(folder / "worker.log", "w")
    # one thread per worker: the app often runs several at once, and oversubscribed threads on a small CPU
    # spin against each other (three 2-thread workers on 2 cores ran 20× slower than one)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("DIVVIZ_WORKER_THREADS", "1")}
    proc = subprocess.Popen([sys.executable, "-m", "divviz.engine.worker", str(folder)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=os.getcwd(), env=env)
    _children.append(proc)
    if not (folder / "status.json").exists():  # until the worker writes its own, say who is running it
        write_status(folder, {"state": "running", "message": "starting", "pid": proc.pid, "step": 0,
                              "steps": cfg.steps, "started": time.time()})
    reap()
    return folder


def reap() -> None:
    for proc in list(_children):
        if proc.poll() is not None:
            _children.remove(proc)


def stop_run(folder: Path, wait_s: float = 10.0) -> str:
    """Send SIGTERM to the run's process and wait until it has written its final state; a process that has
    not ended after `wait_s` is killed and the run marked stopped here."""
    status = read_status(folder)
    pid = status.get("pid")
    if status.get("state") != "running" or not pid:
        return status.get("state", "failed")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.time() + wait_s
    while time.time() < deadline:
        reap()
        status = read_status(folder)
        if status.get("state") != "running":
            return status["state"]
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    status.update(state="stopped", message=f"killed after step {status.get('step', 0)}: it did not stop within "
                                           f"{wait_s:g} s of SIGTERM", updated=time.time())
    write_status(folder, status)
    reap()
    return "stopped"


def is_running(folder: Path) -> bool:
    reap()
    status = read_status(folder)
    return status.get("state") == "running" and process_alive(status.get("pid"))
