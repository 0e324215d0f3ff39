"""The pool's share of a busy machine: as many busy loops as cores at normal priority in one session (the user's own
work, e.g. a training script or a build), against as many in one session at the pool's priority (`pool.lower_priority`: autogroup and
nice `POOL_NICE`) and, for comparison, at the lowest (19). Prints each way's CPU seconds per process over the window
and the pool's share of the CPU the two sides got together: the ratio the app's pool trains at beside other work.

    python bench/pool_priority.py [--seconds 10]
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from divviz.runs.pool import POOL_NICE  # noqa: E402

BUSY = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def side(seconds: float, nice: int | None) -> list[int]:
    """As many busy loops as cores in one new session, at `nice` (autogroup and process) or at normal priority: pids."""
    def at_pool_priority():
        Path("/proc/self/autogroup").write_text(str(nice))
        os.nice(nice)

    cores = os.cpu_count() or 1
    code = f"import os\nfor _ in range({cores - 1}):\n    if os.fork() == 0: break\n{BUSY.format(s=seconds + 2)}"
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              preexec_fn=None if nice is None else at_pool_priority)
    time.sleep(1.0)  # the forks are made
    return [parent.pid, *map(int, Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split())]


def share(nice: int, seconds: float) -> tuple[float, float]:
    """(CPU seconds of a normal loop, of a pool loop) over `seconds`."""
    normal, pool = side(seconds, None), side(seconds, nice)
    before = {pid: cpu_seconds(pid) for pid in normal + pool}
    time.sleep(seconds)
    used = {pid: cpu_seconds(pid) - before[pid] for pid in normal + pool}
    time.sleep(3.0)  # the loops end
    return sum(used[p] for p in normal) / len(normal), sum(used[p] for p in pool) / len(pool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, {args.seconds:g} s, as many loops as cores on each side")
    for label, nice in (("the pool's priority", POOL_NICE), ("the lowest", 19)):
        normal_s, pool_s = share(nice, args.seconds)
        print(f"{label} (nice {nice}): a normal loop {normal_s:.2f} CPU-s, a pool loop {pool_s:.2f} CPU-s; "
              f"the pool's share {pool_s / (normal_s + pool_s):.0%}")


if __name__ == "__main__":
    main()
