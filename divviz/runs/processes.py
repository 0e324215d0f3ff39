"""Which process is a run's: a running run's status names its process by pid and by an identity that a reused pid
or another machine's process cannot have, so that Stop signals only the process that trains the run
(`runner.stop_run`) and a run whose process is gone, or is not its own, reads "interrupted" (`store.read_status`)."""

from __future__ import annotations

import os
from pathlib import Path


def process_alive(pid: int | None) -> bool:
    """True if `pid` is a live (not zombie) process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True
    return True


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def process_identity(pid: int | None) -> str | None:
    """What tells a process from a later one given the same pid, or from one on another machine: this boot's id and
    the process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat). None where there is no /proc
    (then a run's process is known by its pid alone) or no such process."""
    if not pid:
        return None
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        return f"{BOOT_ID.read_text().strip()}:{start}"
    except (OSError, IndexError):
        return None


def running(pid: int) -> dict:
    """The fields of a running run's status that name its process: the pid and its identity (`process_identity`),
    so that only that process is ever signalled (`runner.stop_run`)."""
    return {"pid": pid, "process": process_identity(pid)}


def run_process_alive(status: dict) -> bool:
    """Whether the process a running run's status names is alive and is the one recorded there: a pid reused since,
    a folder copied from another machine or a status that names no identity is not (its run reads "interrupted" and
    is sent no signal). Where the recorder had no /proc (identity null) the pid alone decides."""
    pid = status.get("pid")
    if not process_alive(pid) or "process" not in status:
        return False
    return status["process"] is None or status["process"] == process_identity(pid)


def cpu_share(status: dict) -> float | None:
    """The CPU a running run's own process has had since it started, in cores: its user and system time over its
    age (fields 14, 15 and 22 of /proc/<pid>/stat; 1.0 is one core all along). None where the status names no process
    of its own (`run_process_alive`) or there is no /proc."""
    if not run_process_alive(status):
        return None
    try:
        fields = Path(f"/proc/{status['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    age = uptime - int(fields[19]) / tick
    return (int(fields[11]) + int(fields[12])) / tick / age if age > 0 else None
