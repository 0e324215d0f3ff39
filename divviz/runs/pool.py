"""`python -m divviz.runs.pool RUNS_DIR`: the one process that trains a runs folder's queued runs.

A workshop room presses Start thirty times on one small machine. The pool keeps that bounded and the app
responsive:

- **Bounded.** At most `max_runs()` runs train at once, and a new one starts only while the app, the pool and
  its runs stay under `memory_cap_mb()` (their proportional set size, PSS, so pages the forks share count
  once). The others wait in the queue: run folders whose status.json says "queued", oldest first. The queue
  is files, so it survives a restart of the app or of the pool.
- **Fast, isolated starts.** The pool imports torch and transformers once, then forks one child per run: a run
  starts in a fraction of a second, yet is its own process, so a crash or NaN fails only that run and a stuck
  one can be killed alone.
- **Below the user's own work, not starved.** The pool and its children share one session, hence one scheduler
  autogroup, whose weight the pool lowers (`/proc/self/autogroup` = `POOL_NICE`, 5) before importing anything
  heavy, and they are niced too (5). Against a busy session of normal priority the pool then gets about a quarter
  of the cores it shares (weights 335 : 1024), the app and the user's own work the rest; at the lowest weight (19)
  it got about 1.5% and a run sat minutes at its first step on a busy machine. Under autogrouping a plain `nice`
  does not hold across sessions, which is what let twenty workers starve the app before. The lab says when a run
  gets under half its share (`run_text.starved_text`).
- **Stop at once.** `runner.stop_run` marks a queued run stopped itself; a running one gets SIGTERM, and SIGKILL
  from a background thread if it has not stopped `STOP_GRACE_S` seconds later. A run that dies records how: the
  pool marks it stopped (its folder has a `.stop` request) or failed.

One pool per runs folder (an flock on `.divviz/pool.lock`); `runner.ensure_pool` starts it when a run is
queued. With nothing queued or running it leaves by itself: at once when the app that started it is gone (nothing
is left to queue runs or read them), else after `IDLE_EXIT_S` seconds ($DIVVIZ_POOL_IDLE_S, default 600), warm
meanwhile for the app's next Start. Runs still queued or running when the app ends are trained first: the queue
outlives the app, the idle pool does not.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.runs.processes import running
from divviz.runs.store import read_status, writable_runs_folder, write_status
from divviz.safetext import quoted

STOP_GRACE_S = 10.0
IDLE_EXIT_S = float(os.environ.get("DIVVIZ_POOL_IDLE_S", 600))  # the tests shorten it
POLL_S = 0.1
RUN_ESTIMATE_MB = 450  # what a run of the built-in model adds before one has been measured (a fresh process: ~430)


def control_dir(root: Path) -> Path:
    """Where the pool keeps its lock and log: hidden, so that listing the runs skips it."""
    folder = writable_runs_folder(root) / ".divviz"
    try:
        folder.mkdir(exist_ok=True)
    except OSError as err:
        raise DivvizInputError(f"cannot write a run into {quoted(str(root))} ({err.strerror or err})") from None
    return folder


def max_runs() -> int:
    """How many runs train at once: $DIVVIZ_MAX_RUNS, else one per core, fewer if memory allows fewer."""
    given = os.environ.get("DIVVIZ_MAX_RUNS")
    if given:
        return max(1, int(given))
    return max(1, min(os.cpu_count() or 1, memory_cap_mb() // RUN_ESTIMATE_MB))


def worker_threads() -> int:
    """The CPU threads each of the pool's runs computes with: $DIVVIZ_WORKER_THREADS, else 1 (a run per core)."""
    return max(1, int(os.environ.get("DIVVIZ_WORKER_THREADS") or 1))


def memory_cap_mb() -> int:
    """The memory the app, the pool and its runs may use together: $DIVVIZ_MEMORY_CAP_MB, else half the machine."""
    given = os.environ.get("DIVVIZ_MEMORY_CAP_MB")
    if given:
        return int(given)
    total_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemTotal:")))
    return total_kb // 2048


def pss_mb(pid: int) -> float:
    """A process's proportional set size in MB (shared pages divided among their sharers); 0 if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in text.splitlines() if line.startswith("Pss:")), 0.0)


POOL_NICE = 5  # the pool's autogroup and processes: weight 335 against a normal session's 1024


def lower_priority() -> None:
    """Give the pool's session (its autogroup) and the pool itself (inherited by the forks) nice `POOL_NICE`, so that
    training yields to the app's pages and the user's own work without starving. Best effort: where there is no
    autogroup file, nice alone is what the kernel has. $DIVVIZ_POOL_PRIORITY=normal keeps the pool's priority as it
    is: an even share beside other work (the test suite sets it, so that its runs finish on a busy machine)."""
    if os.environ.get("DIVVIZ_POOL_PRIORITY") == "normal":
        return
    try:
        Path("/proc/self/autogroup").write_text(str(POOL_NICE))
    except OSError:
        pass
    os.nice(POOL_NICE)


def queued_runs(root: Path) -> list[tuple[float, Path]]:
    """The queued run folders, oldest first."""
    found = []
    for folder in root.iterdir():
        if folder.name.startswith(".") or not (folder / "status.json").is_file():
            continue
        status = read_status(folder)
        if status["state"] == "queued":
            found.append((status.get("queued_at") or status.get("started") or 0.0, folder))
    return sorted(found)


class QueueLock:
    """The lock every change of a queued run's state takes (the pool claiming it, the app stopping it)."""

    def __init__(self, root: Path):
        self.path = control_dir(root) / "queue.lock"

    def __enter__(self):
        self.file = open(self.path, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


class Pool:
    def __init__(self, root: Path, app_pid: int | None, lock):
        self.root, self.app_pid, self.lock = root, app_pid, lock
        self.limit, self.cap = max_runs(), memory_cap_mb()
        self.children: dict[int, Path] = {}  # pid → run folder
        self.idle_since = time.time()

    def serve(self) -> None:
        """Train the queue; return once nothing is queued or running and the app is gone or `IDLE_EXIT_S` passed."""
        while True:
            self.reap()
            if self.start_queued() or self.children:
                self.idle_since = time.time()
            elif not self.app_alive() or time.time() - self.idle_since > IDLE_EXIT_S:
                return
            time.sleep(POLL_S)

    def app_alive(self) -> bool:
        """Whether the app that started the pool still runs. The pool is its child (`runner.ensure_pool`), and an
        orphan is adopted by another process, so the parent's pid changes when the app ends, however it ends (a
        pid reused since cannot pass for it). A pool started without the app's pid never counts it gone."""
        return self.app_pid is None or os.getppid() == self.app_pid

    def memory_used_mb(self) -> float:
        pids = [os.getpid(), *self.children] + ([self.app_pid] if self.app_pid else [])
        return sum(pss_mb(pid) for pid in pids)

    def run_estimate_mb(self) -> float:
        return max([pss_mb(pid) for pid in self.children] + [RUN_ESTIMATE_MB])

    def start_queued(self) -> bool:
        """Start queued runs while a slot and the memory cap allow; returns whether runs are still queued. Memory
        is read only when a run is queued and a slot is free (reading it costs more than the rest of a poll)."""
        while True:
            with QueueLock(self.root) as queue_lock:
                queue = queued_runs(self.root)
                if not queue or len(self.children) >= self.limit:
                    return bool(queue)
                if self.memory_used_mb() + self.run_estimate_mb() > self.cap:
                    return True  # a run would exceed the cap: it waits, queued, until one ends
                folder = queue[0][1]
                status = read_status(folder)
                status.pop("executor", None)  # a run Ray's pool once trained: this pool's are stopped by their pid
                pid = os.fork()
                if pid == 0:  # the child trains this one run, then leaves; the pool's locks are not its to hold
                    self.lock.close()
                    queue_lock.file.close()
                    os._exit(train_child(folder))
                write_status(folder, {**status, "state": "running", "message": "starting", **running(pid),
                                      "started": time.time(), "updated": time.time()})
                self.children[pid] = folder

    def reap(self) -> None:
        for pid, folder in list(self.children.items()):
            try:
                done, code = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, code = pid, 0
            if not done:
                continue
            del self.children[pid]
            status = read_status(folder)
            if status["state"] in ("running", "interrupted"):  # it died without saying how it ended
                how = (f"signal {os.WTERMSIG(code)}" if os.WIFSIGNALED(code) else f"exit code {os.WEXITSTATUS(code)}")
                stop = folder / ".stop"
                state = "stopped" if stop.exists() else "failed"
                message = f"the training process ended ({how}) after step {status.get('step', 0)}"
                write_status(folder, {**status, "state": state, "updated": time.time(), "message": message})


def train_child(folder: Path) -> int:
    """In a forked child of the pool: train the run in `folder`; its status says how it ended."""
    log = os.open(folder / "worker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        from divviz.runs.worker import main

        main(str(folder))
        return 0
    except BaseException:  # noqa: BLE001 — the run folder already says how it ended
        return 1


def preload() -> None:
    """Import once, in the pool, what every run would import: torch, the engine, and the modules transformers loads
    lazily when a model is first built (3.4 of a run's 3.7 s of start-up before this). Imports only: no tensor op
    runs here, so no thread pool exists yet when the pool forks."""
    import torch  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    from safetensors.torch import save_model  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401

    import divviz.engine.grpo  # noqa: F401
    import divviz.runs.train  # noqa: F401
    import divviz.runs.worker  # noqa: F401


def claim(root: Path, **about):
    """Become the runs folder's one pool: its lock, held (the open file), and pool.json saying who holds it (with
    `about`) and the divviz code it trains with (the package's folder: a grid trained from a checkout of one commit
    names that checkout); None when another pool serves the folder."""
    lock = open(control_dir(root) / "pool.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    code = str(Path(__file__).resolve().parents[1])
    (control_dir(root) / "pool.json").write_text(json.dumps({"pid": os.getpid(), "started": time.time(), "code": code,
                                                             **about}))
    return lock


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    app_pid = int(argv[1]) if len(argv) > 1 else None
    lock = claim(root)
    if lock is None:
        return  # another pool serves this runs folder
    lower_priority()
    os.environ["OMP_NUM_THREADS"] = str(worker_threads())
    preload()

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    Pool(root, app_pid, lock).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
