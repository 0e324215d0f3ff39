"""Train a published run again from its config.json with the code that trained it and say whether it is the same run.

    python scripts/retrain_published.py published/<grid>/<run id> [--runs-dir DIR] [--this-checkout]

The code is the commit the grid's manifest names, checked out in a temporary git worktree of this repository and
run in a child process (this checkout's own code when that commit is this checkout's HEAD, or with
--this-checkout: whether today's code still trains the same run). The run trains as the pool trains it (one thread)
into a runs folder of its own (a temporary one unless --runs-dir), then every metric, evaluation and sample row (the
wall clock's figures left out) and each kept step's per-token and inspector record is compared with the published
files (`published.differences`). A SmolLM2 run takes 10–25 minutes on a 2-core CPU. Bits are a function of the
config, the code and the CPU's kernels: on a CPU whose kernels are not the grid's (its manifest's `cpu`,
`published.cpu_kernels`), expect the same run only to rounding. Exit status 0: the same run; 1: it differs (each
difference on a line); 2: not a published run, its config.json unreadable, or its commit not in this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from divviz.engine.config import RunConfig
from divviz.runs import published
from divviz.runs.train import train
from divviz.safetext import quoted, shorten


ROOT = Path(__file__).resolve().parents[1]
TRAIN_CHILD = """import json, sys, torch
from pathlib import Path
import divviz
assert Path(divviz.__file__).resolve().is_relative_to(Path.cwd().resolve()), f"divviz from {divviz.__file__}"
from divviz.engine.config import RunConfig
from divviz.runs.train import train
torch.set_num_threads(1)
print(train(RunConfig.from_dict(json.loads(Path(sys.argv[1]).read_text())), Path(sys.argv[2])))
"""  # as the pool trains a run, with the code of the folder it runs in


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def train_at_commit(commit: str, config: Path, runs: Path) -> Path:
    """Train `config` with the code of `commit`, in a detached worktree and a child process whose path starts there;
    returns the run's folder. Raises LookupError when the commit is not in this repository."""
    with tempfile.TemporaryDirectory(prefix="divviz-retrain-") as scratch:
        tree = Path(scratch) / "tree"
        if git("worktree", "add", "--detach", str(tree), commit).returncode != 0:
            raise LookupError(commit)
        try:
            child = subprocess.run([sys.executable, "-c", TRAIN_CHILD, str(config.resolve()), str(runs.resolve())],
                                   cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                                   text=True)
        finally:
            git("worktree", "remove", "--force", str(tree))
    if child.returncode != 0:
        raise RuntimeError(child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "no output")
    return Path(child.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a published run's folder: published/<grid>/<run id>")
    parser.add_argument("--runs-dir", type=Path, help="where the run trains again (default: a temporary folder)")
    parser.add_argument("--this-checkout", action="store_true",
                        help="train with this checkout's code instead of the commit the manifest names")
    args = parser.parse_args(argv)
    grid = published.manifests(args.run.parent.parent).get(args.run.parent.name, {})  # {}: no readable manifest
    if args.run.name not in grid.get("runs", {}):
        fault = published.damaged(args.run.parent.parent).get(args.run.parent.name)
        print(f"{quoted(str(args.run))}: its grid is damaged ({fault})" if fault else
              f"{quoted(str(args.run))} is not a run of a published grid (no readable manifest beside it names it)")
        return 2
    try:
        cfg = RunConfig.from_dict(json.loads((args.run / "config.json").read_text()))
    except (OSError, ValueError) as err:  # a DivvizInputError is a ValueError: a setting the code no longer takes
        print(f"{quoted(str(args.run))}: its config.json cannot be read as a run's ({shorten(str(err), 200)})")
        return 2
    if grid.get("cpu") != published.cpu_kernels():
        print(f"note: this CPU's kernels ({published.cpu_kernels()}) are not the grid's ({grid.get('cpu')}): "
              "expect the same run only to rounding")
    commit = str(grid.get("commit", ""))
    head = git("rev-parse", "HEAD").stdout.strip()
    here = args.this_checkout or not commit or head.startswith(commit)
    with tempfile.TemporaryDirectory() as scratch:
        runs, start = args.runs_dir or Path(scratch), time.time()
        if here:
            torch.set_num_threads(1)  # as the pool trains a run
            folder = train(cfg, runs)
        else:
            print(f"training with commit {quoted(commit)}, the code the manifest names (a temporary worktree)…",
                  flush=True)
            try:
                folder = train_at_commit(commit, args.run / "config.json", runs)
            except LookupError:
                print(f"commit {quoted(commit)}, which trained {quoted(args.run.name)}, is not in this repository; "
                      "--this-checkout trains it with today's code")
                return 2
            except RuntimeError as err:
                print(f"commit {quoted(commit)} could not train the run: {shorten(str(err), 300)}")
                return 1
        found = published.differences(args.run, folder)
        minutes = (time.time() - start) / 60
    for line in found:
        print(line)
    code = "this checkout" if here else f"commit {commit}"
    print(f"{args.run.name}: {'differs' if found else 'the same run, to the bit'} "
          f"(trained again by {code} in {minutes:.1f} min)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
