"""Train a declared claims grid for a bounded time, as on a lent GPU's lease, and publish the runs that finished.

    python scripts/train_declared.py --runs-dir /tmp/runs --setting stress --device cuda --until 480 \\
        --commit 58781f6 --grid-suffix h200-2 [--out published]

The grid declared for the setting on the device's kind (`claims_lm.declared_seeds`: DECLARED, capped where the
grid is closed, CLOSED_AT) is queued in its queue order (the
pilot pair seed by seed first) to the runs folder's pool, which trains $DIVVIZ_MAX_RUNS runs at once. Once a run has
finished, the queue is stopped as soon as a run started now would not finish by `--until` seconds at the slowest
pace seen so far; the running ones go on until then, when whatever still trains is interrupted. The finished runs
are published (`scripts/publish_runs.py`) into a grid named by `--grid-suffix`, one per lease (a grid's manifest
records one commit and one set of versions: h200, then h200-2, …); a later lease queues only the cells no published
grid holds (`lease_plan`), so a declared grid is trained lease by lease until it is complete or closed (the GPU
pair is: a lease trains nothing).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from divviz.evidence import claims_lm
from divviz.runs import runner, store

POLL_S = 5


def too_late_to_start(runs: list[store.RunInfo], elapsed: float, until: float) -> bool:
    """Whether a run started now would end after `until` seconds at the pace of the slowest finished run (start to
    end: loading, evaluations and steps); never before a run has finished."""
    slowest = max((run.status["updated"] - run.status["started"] for run in runs if run.state == "done"), default=None)
    return slowest is not None and elapsed + slowest > until


def lease_plan(runs_dir: Path, model: str, setting: str, device: str) -> claims_lm.LMPlan:
    """The declared grid as a lease sees it: the cells neither in its runs folder nor published with the checkout it
    carries are the missing ones, so a later lease goes on where the last one stopped."""
    return claims_lm.LMPlan.declared(runs_dir, model, setting, with_published=True, device=device)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", required=True, type=Path)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--setting", default="stress")
    parser.add_argument("--device", default="cuda", choices=tuple(claims_lm.DEVICE_KINDS))
    parser.add_argument("--until", type=float, required=True, help="seconds after which every run is interrupted")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--grid-suffix", required=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    began = time.time()
    plan = lease_plan(args.runs_dir, args.model, args.setting, args.device)
    print(f"{plan.name}: {len(plan.missing)} of {len(plan.runs)} cells to train", flush=True)
    plan.queue_missing()
    stopped_queue = False
    while time.time() - began < args.until:
        time.sleep(POLL_S)
        runs = store.list_runs(args.runs_dir)
        states = Counter(run.state for run in runs)
        print(f"{time.time() - began:5.0f} s: {dict(states)}", flush=True)
        if not stopped_queue and too_late_to_start(runs, time.time() - began, args.until):
            for run in runs:
                if run.state == "queued":
                    runner.stop_run(run.folder)
            stopped_queue = True
        if not states["queued"] and not states["running"]:
            break
    for run in store.list_runs(args.runs_dir):
        if run.state == "running":
            runner.stop_run(run.folder, wait_s=5)  # SIGKILL after 5 s, marked stopped
    deadline = time.time() + 30
    while any(run.state == "running" for run in store.list_runs(args.runs_dir)) and time.time() < deadline:
        time.sleep(0.5)
    publish = [sys.executable, str(Path(__file__).with_name("publish_runs.py")), "--runs-dir", str(args.runs_dir),
               "--model", args.model, "--device", args.device, "--grid-suffix", args.grid_suffix,
               "--commit", args.commit, *(["--out", args.out] if args.out else [])]
    subprocess.run(publish, check=True)
    print(f"trained and published in {time.time() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
