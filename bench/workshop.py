"""A workshop room against one server: S students open the Training lab, press Start with the default measures,
watch, press Stop; meanwhile new visitors open the Clipping regions page.

Each student is a websocket session speaking Streamlit's protocol as the browser does (`BackMsg.rerun_script` to
load a page or click a button; a fragment rerun whenever the server's `auto_rerun` asks for one), with a cookie of
its own, so the app sees S browsers. All on 127.0.0.1; everything is bounded in time, and the server, its pool and
the runs are ended by pid at the end.

Prints: the most runs training at once, the peak memory of the server, the pool and its runs together (PSS), p50 /
p95 of a new visitor's page (connect → page drawn) and of a live update (fragment rerun → drawn), Start → first
metrics line, Stop (click → page answered, and → every run of that student stopped), and runs lost or failed.
Targets at S = 30: memory under the cap, no run lost, p95 live update ≤ 2 s, a new visitor's page ≤ 2 s.

    python bench/workshop.py [--students 10 30] [--watch 60]
"""

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from divviz.engine import store
from divviz.engine.pool import memory_cap_mb, pss_mb
from divviz.ownership import browser_id

ROOT = Path(__file__).resolve().parents[1]


class Session:
    """One browser: a websocket, a cookie, the last widget ids seen, the fragment the server asks to rerun."""

    def __init__(self, url: str):
        self.url, self.buttons, self.fragment, self.interval = url, {}, None, None
        mask, token = secrets.token_hex(4), secrets.token_hex(16)
        self.cookie = f"2|{mask}|{token}|{int(time.time())}"
        self.identity = browser_id(self.cookie)

    async def __aenter__(self):
        self.ws = await websockets.connect(f"{self.url}/_stcore/stream", subprotocols=["streamlit"], max_size=None,
                                           additional_headers={"Cookie": f"_streamlit_xsrf={self.cookie}"},
                                           open_timeout=60)
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()

    async def rerun(self, page: str, trigger: str | None = None, fragment: str | None = None) -> float:
        """Send one rerun (a page load, a click on the button labelled `trigger`, or a fragment's auto-rerun) and
        return the seconds until the server says the script finished."""
        msg = BackMsg()
        msg.rerun_script.page_name = page
        if trigger:
            widget = msg.rerun_script.widget_states.widgets.add()
            widget.id, widget.trigger_value = self.buttons[trigger], True
        if fragment:
            msg.rerun_script.fragment_id, msg.rerun_script.is_auto_rerun = fragment, True
        start = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        while True:
            reply = ForwardMsg()
            reply.ParseFromString(await asyncio.wait_for(self.ws.recv(), 120))
            kind = reply.WhichOneof("type")
            if kind == "delta" and reply.delta.WhichOneof("type") == "new_element":
                element = reply.delta.new_element
                if element.WhichOneof("type") == "button":
                    self.buttons[element.button.label] = element.button.id
            elif kind == "auto_rerun":
                self.fragment, self.interval = reply.auto_rerun.fragment_id, reply.auto_rerun.interval
            elif kind == "stop_auto_rerun":
                self.fragment = None
            elif kind == "script_finished":
                return time.perf_counter() - start


class Room:
    def __init__(self, url: str, runs: Path, watch: float):
        self.url, self.runs, self.watch = url, runs, watch
        self.visitor, self.live, self.first_line, self.stop_click, self.stop_done = [], [], [], [], []
        self.identities: list[str] = []
        self.errors: list[str] = []

    def runs_of(self, identity: str) -> list[store.RunInfo]:
        return [run for run in store.list_runs(self.runs) if run.status.get("owner") == identity]

    async def student(self, arrive: float) -> None:
        await asyncio.sleep(arrive)
        try:
            async with Session(self.url) as me:
                self.identities.append(me.identity)
                await me.rerun("training_lab")
                clicked = time.time()
                await me.rerun("training_lab", trigger="Start")
                seen_line, until = False, time.time() + self.watch
                while time.time() < until:
                    await asyncio.sleep(me.interval or 2.0)
                    if me.fragment:
                        self.live.append(await me.rerun("training_lab", fragment=me.fragment))
                    if not seen_line and any(store.read_metrics(run.folder) for run in self.runs_of(me.identity)):
                        self.first_line.append(time.time() - clicked)
                        seen_line = True
                clicked = time.time()
                self.stop_click.append(await me.rerun("training_lab", trigger="Stop"))
                while any(r.state in ("queued", "running") for r in self.runs_of(me.identity)):
                    if time.time() - clicked > 60:
                        break
                    await asyncio.sleep(0.1)
                self.stop_done.append(time.time() - clicked)
        except Exception as err:  # noqa: BLE001 — a bench reports what broke and goes on
            self.errors.append(f"{type(err).__name__}: {err}")

    async def visitors(self, until: float) -> None:
        while time.time() < until:
            try:
                async with Session(self.url) as visitor:
                    self.visitor.append(await visitor.rerun("clipping_regions"))
            except Exception as err:  # noqa: BLE001
                self.errors.append(f"visitor: {type(err).__name__}: {err}")
            await asyncio.sleep(3.0)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (the pool leaves the server's session but stays its child)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


async def monitor(server: int, runs: Path, peaks: dict, until: float) -> None:
    while time.time() < until:
        peaks["memory"] = max(peaks["memory"], sum(pss_mb(pid) for pid in descendants(server)))
        peaks["training"] = max(peaks["training"], sum(run.state == "running" for run in store.list_runs(runs)))
        await asyncio.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def room(students: int, watch: float) -> dict:
    runs = Path(tempfile.mkdtemp(prefix="divviz-workshop-"))
    port = free_port()
    env = {**os.environ, "DIVVIZ_RUNS_DIR": str(runs), "DIVVIZ_ROOM": "1", "DIVVIZ_POOL_IDLE_S": "30"}
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.port",
                               str(port), "--server.address", "127.0.0.1", "--server.headless", "true"],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.3)
        url = f"ws://127.0.0.1:{port}"
        result = Room(url, runs, watch)
        peaks = {"memory": 0.0, "training": 0}

        async def everyone():
            arrive = [i * 10.0 / students for i in range(students)]  # they arrive over 10 s
            until = time.time() + 10 + watch + 20
            await asyncio.wait_for(asyncio.gather(
                *(result.student(t) for t in arrive), result.visitors(until),
                monitor(server.pid, runs, peaks, until)), timeout=watch + 240)

        asyncio.run(everyone())
        ended = [run for run in store.list_runs(runs) if run.status.get("owner") in result.identities]
        return {"students": students, "peaks": peaks, "room": result, "runs": ended,
                "lost": len(result.identities) * 2 - len(ended) + sum(r.state in ("queued", "running") for r in ended),
                "failed": sum(r.state in ("failed", "interrupted", "corrupt") for r in ended)}
    finally:
        for pid in reversed(descendants(server.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.wait(timeout=30)


def quantiles(values: list[float]) -> str:
    if not values:
        return "—"
    q = statistics.quantiles(values, n=20) if len(values) > 1 else [values[0]] * 19
    return f"{statistics.median(values):.2f} / {q[18]:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, nargs="+", default=[10, 30])
    parser.add_argument("--watch", type=float, default=60.0, help="seconds each student watches before Stop")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; memory cap {memory_cap_mb()} MB; each student: lab, Start (ratio + kl3), watch "
          f"{args.watch:g} s, Stop")
    print(f"{'S':>3} {'training at once':>16} {'peak MB':>8} {'visitor p50/p95 s':>18} {'live p50/p95 s':>15} "
          f"{'Start→1st line p50/p95 s':>25} {'Stop click p50/p95 s':>21} {'Stop→stopped p50/p95 s':>23} "
          f"{'lost':>5} {'failed':>7}")
    for students in args.students:
        r = room(students, args.watch)
        room_ = r["room"]
        print(f"{students:>3} {r['peaks']['training']:>16} {r['peaks']['memory']:>8.0f} {quantiles(room_.visitor):>18} "
              f"{quantiles(room_.live):>15} {quantiles(room_.first_line):>25} {quantiles(room_.stop_click):>21} "
              f"{quantiles(room_.stop_done):>23} {r['lost']:>5} {r['failed']:>7}", flush=True)
        for error in room_.errors[:5]:
            print(f"    error: {error}")
        states = {}
        for run in r["runs"]:
            states[run.state] = states.get(run.state, 0) + 1
        print(f"    {len(r['runs'])} runs: {json.dumps(states)}; {len(room_.live)} live updates, "
              f"{len(room_.visitor)} visitors")


if __name__ == "__main__":
    main()
