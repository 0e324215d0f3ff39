"""divviz's app in a process of its own, started as a user starts it (`streamlit run app.py`, bound to localhost):
for the browser tests and the benches, which need it answering before they begin and gone, with its runs' pool,
when they end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app.py"  # beside the package in a checkout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(env: dict[str, str], log=subprocess.DEVNULL, timeout_s: float = 90.0) -> tuple[subprocess.Popen, str]:
    """Start the app on a free localhost port with `env` added to this process's environment, its output to `log`;
    return the process and its URL once its health endpoint answers (RuntimeError if it has not in `timeout_s`)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true",
                               "--browser.gatherUsageStats", "false"],
                              cwd=APP.parent, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline and server.poll() is None:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return server, url
        except OSError:
            time.sleep(0.3)
    stop(server)
    raise RuntimeError(f"streamlit did not start within {timeout_s:g} s (exit status {server.returncode})")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (the runs' pool leaves the server's session but stays its child)."""
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


def stop(server: subprocess.Popen) -> None:
    """Kill the server and everything below it (its runs' pool and their runs), leaves first."""
    for pid in reversed(descendants(server.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.wait(timeout=30)
