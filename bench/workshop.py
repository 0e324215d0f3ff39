"""A workshop room against one server: S students open the Training lab, press Start with the default measures,
watch, press Stop; meanwhile new visitors open the Clipping regions page. The teacher has opened each page once
before the room arrives.

Each student is a websocket session speaking Streamlit's protocol as the browser does (`BackMsg.rerun_script` to
load a page or click a button; a fragment rerun whenever the server's `auto_rerun` asks for one), with a cookie of
its own, so the app sees S browsers. All on 127.0.0.1; everything is bounded in time, and the server, its pool and
the runs are ended by pid at the end.

Prints: the most runs training at once, the peak memory of the server, the pool and its runs together (PSS), p50 /
p95 of a new visitor's page (connect → page drawn) and of a live update (fragment rerun → drawn), Start → first
metrics line (with 2 runs a student and a few slots, most of it is the wait in the queue), Stop (click → page
answered, and → every run of that student stopped), runs lost or failed, the server's CPU, the GRPO steps trained
per second by all runs together, and live updates the server never answered.
Targets at S = 30: memory under the cap, no run lost, p95 live update ≤ 2 s, a new visitor's page ≤ 2 s.

    python bench/workshop.py [--students 10 30] [--watch 60]
"""

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import threading
import time
from pathlib import Path

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from divviz.app import local_server
from divviz.app.ownership import browser_id
from divviz.runs import store
from divviz.runs.pool import memory_cap_mb, pss_mb



class Session:
    """One browser: a websocket, a cookie, the last widget ids seen, the fragment the server asks to rerun."""

    def __init__(self, url: str):
        self.url, self.buttons, self.fragment, self.interval, self.cached = url, {}, None, None, set()
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
        msg.rerun_script.cached_message_hashes.extend(self.cached)  # as the browser does: the server sends a reference
        if trigger:
            widget = msg.rerun_script.widget_states.widgets.add()
            widget.id, widget.trigger_value = self.buttons[trigger], True
        if fragment:
            msg.rerun_script.fragment_id, msg.rerun_script.is_auto_rerun = fragment, True
        while True:  # first what the server sent on its own (an app rerun that a fragment asked for)
            try:
                self.read(await asyncio.wait_for(self.ws.recv(), 0.001))
            except asyncio.TimeoutError:
                break
        start = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        while True:
            if self.read(await asyncio.wait_for(self.ws.recv(), 60)) == "script_finished":
                return time.perf_counter() - start

    def read(self, data: bytes) -> str:
        """Take one message from the server: remember buttons, cacheable messages, the fragment to rerun."""
        reply = ForwardMsg()
        reply.ParseFromString(data)
        kind = reply.WhichOneof("type")
        if reply.metadata.cacheable:
            self.cached.add(reply.hash)
        if kind == "delta" and reply.delta.WhichOneof("type") == "new_element":
            element = reply.delta.new_element
            if element.WhichOneof("type") == "button":
                self.buttons[element.button.label] = element.button.id
        elif kind == "auto_rerun":
            self.fragment, self.interval = reply.auto_rerun.fragment_id, reply.auto_rerun.interval
        elif kind == "stop_auto_rerun":
            self.fragment = None
        return kind


class Room:
    def __init__(self, url: str, runs: Path, watch: float):
        self.url, self.runs, self.watch = url, runs, watch
        self.visitor, self.live, self.first_line, self.stop_click, self.stop_done = [], [], [], [], []
        self.identities: list[str] = []
        self.unanswered: list[str] = []  # live updates the server never answered, and when
        self.errors: list[str] = []

        self.by_owner: dict[str, list[tuple[str, bool]]] = {}  # identity → [(state, has a metrics line)]
        self.peaks = {"memory": 0.0, "training": 0}
        self.seen: dict[str, dict[str, float]] = {}  # run → when the watcher first saw it running / with a step

    def dequeue_to_step(self) -> list[float]:
        """Seconds from a run leaving the queue to its first step, for runs seen queued first (±0.25 s)."""
        return [s["stepped"] - s["running"] for s in self.seen.values() if "running" in s and "stepped" in s]

    def runs_of(self, identity: str) -> list[tuple[str, bool]]:
        return self.by_owner.get(identity, [])

    def watch_folder(self, server: int, until: float) -> None:
        """In a thread of its own (file reads would stall the sessions' event loop and so their timings): who
        owns which runs in what state, the most runs training at once, and the peak memory."""
        while time.time() < until:
            runs = store.list_runs(self.runs)
            by_owner: dict[str, list] = {}
            for run in runs:
                stepped = (run.folder / "metrics.jsonl").exists() and (run.folder / "metrics.jsonl").stat().st_size > 0
                by_owner.setdefault(run.status.get("owner"), []).append((run.state, stepped))
                seen = self.seen.setdefault(run.name, {})
                if run.state == "running":
                    seen.setdefault("running", time.time())
                if stepped:
                    seen.setdefault("stepped", time.time())
            self.by_owner = by_owner
            self.peaks["training"] = max(self.peaks["training"], sum(run.state == "running" for run in runs))
            memory = sum(pss_mb(pid) for pid in local_server.descendants(server))
            self.peaks["memory"] = max(self.peaks["memory"], memory)
            time.sleep(0.25)

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
                    if me.fragment and not any(s in ("queued", "running") for s, _ in self.runs_of(me.identity)):
                        await asyncio.sleep(0.5)  # the page reruns itself once every run has ended
                    if me.fragment:
                        try:
                            self.live.append(await me.rerun("training_lab", fragment=me.fragment))
                        except asyncio.TimeoutError:  # counted: an update that never came back
                            ended = not any(s in ("queued", "running") for s, _ in self.runs_of(me.identity))
                            self.unanswered.append("after its runs ended" if ended else "while runs were active")
                    if not seen_line and any(line for _, line in self.runs_of(me.identity)):
                        self.first_line.append(time.time() - clicked)
                        seen_line = True
                clicked = time.time()
                self.stop_click.append(await me.rerun("training_lab", trigger="Stop"))
                await asyncio.sleep(0.6)  # the watcher's next look
                while any(state in ("queued", "running") for state, _ in self.runs_of(me.identity)):
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


def cpu_seconds(pid: int) -> float:
    """CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def room(students: int, watch: float) -> dict:
    runs = Path(tempfile.mkdtemp(prefix="divviz-workshop-"))
    server, http_url = local_server.start({"DIVVIZ_RUNS_DIR": str(runs), "DIVVIZ_ROOM": "1",
                                           "DIVVIZ_POOL_IDLE_S": "30"})
    try:
        url = http_url.replace("http://", "ws://")
        result = Room(url, runs, watch)
        until = time.time() + 10 + watch + 30
        watcher = threading.Thread(target=result.watch_folder, args=(server.pid, until), daemon=True)
        watcher.start()
        cpu_before = cpu_seconds(server.pid)

        async def teacher():  # opens the app before the room arrives, as a teacher does: the server's first loads
            async with Session(url) as me:  # import plotly & co. (1.7–2.9 s), which no student should pay
                for page in ("training_lab", "clipping_regions", "mass_reallocation", "runs"):
                    await me.rerun(page)

        asyncio.run(teacher())

        async def everyone():
            arrive = [i * 10.0 / students for i in range(students)]  # they arrive over 10 s
            await asyncio.wait_for(asyncio.gather(*(result.student(t) for t in arrive), result.visitors(until - 20)),
                                   timeout=watch + 240)

        started = time.time()
        asyncio.run(everyone())
        server_cores = (cpu_seconds(server.pid) - cpu_before) / (time.time() - started)
        ended = [run for run in store.list_runs(runs) if run.status.get("owner") in result.identities]
        steps = sum(len(store.read_metrics(run.folder)) for run in ended)
        return {"students": students, "peaks": result.peaks, "room": result, "runs": ended, "server_cores": server_cores,
                "steps_per_s": steps / (time.time() - started),
                "lost": len(result.identities) * 2 - len(ended) + sum(r.state in ("queued", "running") for r in ended),
                "failed": sum(r.state in ("failed", "interrupted", "corrupt") for r in ended)}
    finally:
        local_server.stop(server)


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
              f"{len(room_.visitor)} visitors; the server kept {r['server_cores']:.2f} cores busy; "
              f"{r['steps_per_s']:.1f} GRPO steps trained per s; dequeued → first step p50/p95 "
              f"{quantiles(room_.dequeue_to_step())} s; live updates never answered: "
              + (json.dumps({w: room_.unanswered.count(w) for w in set(room_.unanswered)}) or "none"))


if __name__ == "__main__":
    main()
