"""A room on one machine: the run queue and its limit, queued runs shown and stoppable, a crash failing only its
run, the queue surviving a restart, the memory cap, and runs that belong to the browser that started them."""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.runs import processes, runner, store

APP = str(Path(__file__).resolve().parents[2] / "router.py")
SMALL = dict(prompts=2, group_size=4, max_new_tokens=6)


def wait(predicate, timeout=600):
    """Until `predicate()` holds: the pool trains at nice 5, so beside two busy loops a 3-step run can take minutes;
    the timeout only bounds a failure."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def states(folders):
    return [store.read_run(f).state for f in folders]


def test_the_queue_keeps_its_limit_and_its_order(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    folders = [runner.start_run(RunConfig.make(steps=3, seed=i, **SMALL), tmp_path) for i in range(3)]
    most = 0
    while any(s in ("queued", "running") for s in states(folders)):
        most = max(most, states(folders).count("running"))
        time.sleep(0.02)
    assert most == 1 and states(folders) == ["done"] * 3
    started = [store.read_run(f).status["started"] for f in folders]
    assert started == sorted(started)  # first queued, first trained


def test_a_queued_run_says_where_it_stands_and_stops_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    first = runner.start_run(RunConfig.make(steps=5000, **SMALL), tmp_path)
    second = runner.start_run(RunConfig.make(steps=10, **SMALL), tmp_path)
    third = runner.start_run(RunConfig.make(steps=10, **SMALL), tmp_path)
    wait(lambda: store.read_run(first).step >= 2)
    assert runner.queue_position(second)[0] == 0 and runner.queue_position(third)[0] == 1
    assert runner.queue_position(third)[1] > 0  # an estimate, once a step has been timed
    start = time.time()
    assert runner.stop_run(third) == "stopped" and time.time() - start < 1
    assert store.read_run(third).message == "stopped before it started"
    assert runner.stop_run(first) == "stopping"
    wait(lambda: states([first, second]) == ["stopped", "done"])


def test_a_crash_fails_only_its_run(tmp_path):
    doomed = runner.start_run(RunConfig.make(steps=5000, **SMALL), tmp_path)
    other = runner.start_run(RunConfig.make(steps=6, clip="kl3", **SMALL), tmp_path)
    wait(lambda: store.read_run(doomed).step >= 1)
    os.kill(store.read_run(doomed).status["pid"], signal.SIGSEGV)
    wait(lambda: states([doomed, other]) == ["failed", "done"])
    assert "signal 11" in store.read_run(doomed).message


def test_the_queue_survives_a_restart(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    first = runner.start_run(RunConfig.make(steps=5000, **SMALL), tmp_path)
    later = runner.start_run(RunConfig.make(steps=3, **SMALL), tmp_path)
    wait(lambda: store.read_run(first).step >= 1)
    about = json.loads((tmp_path / ".divviz" / "pool.json").read_text())
    assert about["code"] == str(Path(runner.__file__).resolve().parents[1])  # the divviz it trains with
    os.kill(about["pid"], signal.SIGKILL)  # the app's machine restarts the app; the queue is in the runs folder
    os.kill(store.read_run(first).status["pid"], signal.SIGTERM)
    wait(lambda: states([first]) in (["stopped"], ["interrupted"]))
    assert states([later]) == ["queued"]
    try:  # what the Training lab does when it is opened again, and on every poll while a run of its is queued
        wait(lambda: runner.ensure_pool(tmp_path) or states([later]) == ["done"])
    except AssertionError:
        raise AssertionError(f"the queued run never trained: {pool_state(tmp_path)}") from None


def pool_state(root: Path) -> str:
    """What a stuck queue's pool left: its pool.json and log, and which processes hold its lock (for the failure)."""
    control, holders = root / ".divviz", []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and any(os.readlink(fd) == str(control / "pool.lock")
                                           for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(bytes(1), b" ")[:100].decode(errors="replace")
                holders.append(f"{proc.name} {command}")
        except OSError:
            continue
    read = lambda name: (control / name).read_text()[-400:] if (control / name).exists() else "none"  # noqa: E731
    return f"pool.json {read('pool.json')}; pool.log {read('pool.log')!r}; pool.lock held by {holders or 'none'}"


def test_a_run_over_the_memory_cap_waits_queued(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_MEMORY_CAP_MB", "50")  # less than one run needs
    folder = runner.start_run(RunConfig.make(steps=2, **SMALL), tmp_path)
    wait(lambda: (tmp_path / ".divviz" / "pool.json").exists())
    time.sleep(3)
    assert store.read_run(folder).state == "queued"
    assert runner.stop_run(folder) == "stopped"


def test_divviz_train_waits_for_a_free_slot(tmp_path):
    env = {**os.environ, "DIVVIZ_MAX_RUNS": "1"}
    busy = runner.start_run(RunConfig.make(steps=5000, **SMALL), tmp_path)
    wait(lambda: store.read_run(busy).state == "running")
    cli = subprocess.Popen([sys.executable, "-m", "divviz", "train", "--steps", "1", *sum(
        ([f"--{k.replace('_', '-')}", str(v)] for k, v in SMALL.items()), []), "--runs-dir", str(tmp_path)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    said, deadline = "", time.time() + 120
    while "waiting for a free slot" not in said and time.time() < deadline:  # other lines (warnings) may come first
        if select.select([cli.stderr], [], [], 1.0)[0]:
            said += cli.stderr.readline()
    assert "waiting for a free slot" in said
    runner.stop_run(busy)
    assert cli.wait(timeout=120) == 0


def lab(tmp_path, query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    at.switch_page("app_pages/training_lab.py").run()
    assert not at.exception, at.exception
    return at


def test_queued_runs_show_on_the_page_and_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    at = lab(tmp_path, {"m": "ratio,kl3", "steps": "5000", "prompts": "2", "group_size": "4"})
    next(b for b in at.button if b.label == "Start").click().run()
    names = at.session_state["lab_runs"]
    wait(lambda: store.read_run(tmp_path / names[0]).step >= 1)
    at.run()
    texts = [p.proto.text for p in at.get("progress")]
    assert any("queued, 0 ahead" in t for t in texts), texts
    next(b for b in at.button if b.label == "Stop").click().run()
    assert store.read_run(tmp_path / names[1]).state == "stopped"  # the queued one, at once
    wait(lambda: store.read_run(tmp_path / names[0]).state == "stopped", 30)


def test_one_browser_cannot_stop_or_delete_anothers_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_ROOM", "1")  # students own their runs, as on a LAN
    alice = lab(tmp_path, {"m": "ratio", "steps": "5000", "prompts": "2", "group_size": "4"})
    next(b for b in alice.button if b.label == "Start").click().run()
    (name,) = alice.session_state["lab_runs"]
    bob = AppTest.from_file(APP, default_timeout=120)
    bob.run()
    bob.switch_page("app_pages/runs.py").run()
    assert not bob.exception, bob.exception
    table = bob.dataframe[0].value
    assert list(table.loc[table["run"] == name, "owner"]) == ["another browser"]
    assert name not in bob.selectbox(key="runs:delete").options  # nothing of Alice's to stop or delete
    bob_viewer = runner.Viewer(bob.session_state["_tab_identity"])
    with pytest.raises(DivvizInputError, match="belongs to another browser"):
        runner.stop_run(tmp_path / name, bob_viewer)
    with pytest.raises(DivvizInputError, match="belongs to another browser"):
        runner.delete_run(tmp_path / name, bob_viewer)
    assert store.read_run(tmp_path / name).state in ("queued", "running")
    alice.switch_page("app_pages/runs.py").run()
    assert name in alice.selectbox(key="runs:delete").options
    runner.stop_run(tmp_path / name, runner.Viewer(alice.session_state["_tab_identity"]))
    wait(lambda: store.read_run(tmp_path / name).state == "stopped", 30)


def test_the_teacher_key_manages_every_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_TEACHER_KEY", "s3cret")
    folder = runner.start_run(RunConfig.make(steps=1, **SMALL), tmp_path, owner="a-student")
    wait(lambda: store.read_run(folder).state == "done")
    for query, manages in (({}, False), ({"teacher": "wrong"}, False), ({"teacher": "s3cret"}, True)):
        at = AppTest.from_file(APP, default_timeout=120)
        at.query_params.update(query)
        at.run()
        at.switch_page("app_pages/runs.py").run()
        assert not at.exception, at.exception
        assert (folder.name in at.selectbox(key="runs:delete").options) == manages
        assert "teacher" not in at.query_params  # the key never stays in a link that could be shared


def test_a_students_start_past_its_share_of_the_queue_queues_nothing_and_says_why(tmp_path, monkeypatch):
    """In room mode one browser may have `runs_per_browser()` runs queued or running at once: a Start past it
    queues none of its runs and says so in one line; within it, it queues; the teacher has no limit."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_ROOM", "1")
    monkeypatch.setenv("DIVVIZ_RUNS_PER_BROWSER", "3")
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    student = lab(tmp_path, {"m": "ratio,kl3", "seeds": "2", "steps": "5000", **{k: str(v) for k, v in SMALL.items()}})
    next(b for b in student.button if b.label == "Start").click().run()
    (refused,) = [e.value.replace("\\", "") for e in student.error]  # the one line, unescaped
    assert "may have 3 runs queued or running at once" in refused
    assert "this one has 0, and this Start asks for 4 more" in refused
    assert store.list_runs(tmp_path) == []  # nothing queued, nothing half-queued
    me = runner.Viewer(student.session_state["_tab_identity"])
    mine = runner.start_runs([RunConfig.make(steps=5000, **SMALL)] * 3, tmp_path, me)  # within the share
    with pytest.raises(DivvizInputError, match="this one has 3, and this Start asks for 1 more"):
        runner.start_runs([RunConfig.make(steps=1, **SMALL)], tmp_path, me)
    teacher = runner.start_runs([RunConfig.make(steps=5000, **SMALL)] * 4, tmp_path, runner.Viewer("t", teacher=True))
    assert len(teacher) == 4
    for folder in [*mine, *teacher]:
        runner.stop_run(folder)
    wait(lambda: all(store.read_run(f).state == "stopped" for f in [*mine, *teacher]), 60)


def test_only_the_teacher_queues_the_claims_lm_grid_in_room_mode(tmp_path, monkeypatch):
    """The Claims page's "Train the N missing runs" fills the room's queue: a student sees it disabled and why."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_TEACHER_KEY", "s3cret")
    for query, allowed in (({}, False), ({"teacher": "s3cret"}, True)):
        at = AppTest.from_file(APP, default_timeout=300)
        at.query_params.update(query)
        at.run()
        at.switch_page("app_pages/claims.py").run()
        assert not at.exception, at.exception
        button = next(b for b in at.button if b.label.startswith("Train the"))
        assert button.disabled != allowed and ("only the teacher" in (button.help or "")) != allowed


APP_STAND_IN = """import sys, time
from pathlib import Path
from divviz.engine.config import RunConfig
from divviz.runs import runner
root = Path(sys.argv[1])
if sys.argv[2] == "queue":
    print(runner.start_run(RunConfig.make(steps=5000, prompts=2, group_size=4, max_new_tokens=6), root), flush=True)
else:
    runner.ensure_pool(root)
    print("pool started", flush=True)
time.sleep(600)
"""


def app_with_pool(root: Path, what: str) -> tuple[subprocess.Popen, int, str]:
    """A process standing in for the app: it starts the runs folder's pool (and queues a long run if `what` is
    "queue"), then idles. Returns it, its pool's pid and what it printed. Pools wait 600 s idle here, so only the
    app's end can end them within a test."""
    app = subprocess.Popen([sys.executable, "-c", APP_STAND_IN, str(root), what], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "DIVVIZ_POOL_IDLE_S": "600"})
    said = app.stdout.readline().strip()
    pool_file = root / ".divviz" / "pool.json"
    wait(lambda: pool_file.exists() and json.loads(pool_file.read_text())["pid"] != os.getpid(), 60)
    return app, json.loads(pool_file.read_text())["pid"], said


def test_an_idle_pool_leaves_when_its_app_is_gone_and_a_busy_one_trains_its_runs_first(tmp_path):
    app, pool, _ = app_with_pool(tmp_path / "idle", "ensure")
    time.sleep(1)
    assert processes.process_alive(pool)
    app.kill()
    app.wait()
    wait(lambda: not processes.process_alive(pool), 60)  # it imports torch first (seconds), then leaves within a poll

    app, pool, folder = app_with_pool(tmp_path / "busy", "queue")
    folder = Path(folder)
    wait(lambda: store.read_run(folder).step >= 1)
    app.kill()
    app.wait()
    step = store.read_run(folder).step
    wait(lambda: store.read_run(folder).step > step + 1)  # the queue outlives the app
    assert processes.process_alive(pool)
    runner.stop_run(folder)
    wait(lambda: store.read_run(folder).state == "stopped")
    wait(lambda: not processes.process_alive(pool))  # and with nothing left to train, the pool leaves too


def test_outside_room_mode_a_new_browser_sees_the_runs_going(tmp_path, monkeypatch):
    """On a local app (one user), the lab of a browser that started nothing shows every queued and running run; in
    room mode it shows only its own, and points to the Runs page."""
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    monkeypatch.setenv("DIVVIZ_MAX_RUNS", "1")
    going = [runner.start_run(RunConfig.make(steps=5000, seed=i, **SMALL), tmp_path, owner="another-browser")
             for i in range(2)]
    wait(lambda: store.read_run(going[0]).state == "running")
    at = lab(tmp_path, {})
    assert sorted(at.session_state["lab_runs"]) == sorted(f.name for f in going)  # two runs queued in one second:
    # their folders' order is their random suffix's
    texts = [p.proto.text for p in at.get("progress")]
    assert len(texts) == 2 and any("queued, 0 ahead" in t for t in texts), texts
    assert next(b for b in at.button if b.label == "Stop").disabled is False
    monkeypatch.setenv("DIVVIZ_ROOM", "1")
    student = lab(tmp_path, {})
    assert student.session_state["lab_runs"] == []
    assert any("No run queued or running" in c.value for c in student.caption)
    for folder in going:
        runner.stop_run(folder)
    wait(lambda: states(going) == ["stopped", "stopped"], 30)


def test_a_pool_still_starting_is_not_started_again(tmp_path):
    """`ensure_pool` called again and again (the Training lab polls every 2 s while a run of its is queued; the
    restart test above every 50 ms) while the pool it started has not yet taken the lock starts no second pool. It
    did: 9 pools in 1.5 s of polling beside two busy loops, each importing before it could take the lock, and a herd
    of them kept any from reaching it — a queue that never trained in 10 minutes, and a machine too busy for the
    browser tests beside it."""
    alive = []
    for _ in range(20):
        runner.ensure_pool(tmp_path)
        alive.append(pools_of(tmp_path))
        time.sleep(0.05)
    wait(lambda: (tmp_path / ".divviz" / "pool.json").exists())
    [pool] = set().union(*alive)  # one pool, the same all along (the first polls may come before its exec)
    assert max(map(len, alive)) == 1, alive
    assert json.loads((tmp_path / ".divviz" / "pool.json").read_text())["pid"] == pool
    os.kill(pool, signal.SIGKILL)


def pools_of(root: Path) -> list[int]:
    """The pids of the processes that are pools of the runs folder `root`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(bytes(1)) if proc.name.isdigit() else []
        except OSError:
            continue
        if b"divviz.runs.pool" in command and str(root).encode() in command:
            found.append(int(proc.name))
    return found
