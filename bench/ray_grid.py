"""What Ray costs on one machine: the same grid of built-in-model runs trained by the runs folder's pool and by a local
Ray cluster (`divviz/ray/pool.py`), one after the other on this machine; prints both wall times and Ray/pool.

    python bench/ray_grid.py [--runs 8] [--steps 30]

The wall time runs from queueing the first run to the last one's end, so it holds each pool's start (Ray's cluster
and its workers' imports) and, for Ray, the step-by-step mirroring of every run's files into the runs folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from divviz.engine.config import RunConfig
from divviz.runs import runner, store


def grid(root: Path, runs: int, steps: int, ray: bool) -> float:
    """Seconds from queueing `runs` runs (seeds 0 …, PPO and KL3 alternating) to the last one's end."""
    if ray:
        os.environ["DIVVIZ_RAY"] = "local"
    else:
        os.environ.pop("DIVVIZ_RAY", None)
    start = time.perf_counter()
    folders = [runner.start_run(RunConfig.make(task="reverse", prompts=8, group_size=8, steps=steps, seed=i // 2,
                                               clip=("ratio", "kl3")[i % 2]), root) for i in range(runs)]
    while any(store.read_status(f)["state"] in ("queued", "running") for f in folders):
        time.sleep(0.1)
    seconds = time.perf_counter() - start
    assert all(store.read_status(f)["state"] == "done" for f in folders), [store.read_status(f) for f in folders]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    os.environ.setdefault("DIVVIZ_POOL_IDLE_S", "2")  # each pool leaves soon after its grid
    with (tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as pool_root,  # a pool may still be leaving
          tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as ray_root):
        pool_s = grid(Path(pool_root), args.runs, args.steps, ray=False)
        ray_s = grid(Path(ray_root), args.runs, args.steps, ray=True)
    print(f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}; {args.runs} built-in runs of "
          f"{args.steps} steps")
    print(f"pool {pool_s:.1f} s · Ray (local cluster) {ray_s:.1f} s · Ray/pool {ray_s / pool_s:.2f}")


if __name__ == "__main__":
    main()
