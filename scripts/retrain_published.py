"""Train a published run again from its config.json with this checkout's code and say whether it is the same run.

    python scripts/retrain_published.py published/<grid>/<run id> [--runs-dir DIR]

The run trains as the pool trains it (one thread) into a runs folder of its own (a temporary one unless --runs-dir),
then every metric, evaluation and sample row (the wall clock's figures left out) and each kept step's per-token and
inspector record is compared with the published files (`published.differences`). A SmolLM2 run takes 10–25 minutes
on a 2-core CPU. Bits are a function of the config, the code and the CPU's kernels: on a CPU whose kernels are not
the grid's (its manifest's `cpu`, `published.cpu_kernels`), expect the same run only to rounding. Exit status 0: the
same run; 1: it differs (each difference on a line); 2: not a published run, or its config.json unreadable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from divviz.engine import published
from divviz.engine.config import RunConfig
from divviz.engine.train import train
from divviz.safetext import quoted, shorten


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a published run's folder: published/<grid>/<run id>")
    parser.add_argument("--runs-dir", type=Path, help="where the run trains again (default: a temporary folder)")
    args = parser.parse_args(argv)
    grid = published.manifests(args.run.parent.parent).get(args.run.parent.name, {})  # {}: no readable manifest
    if args.run.name not in grid.get("runs", {}):
        print(f"{quoted(str(args.run))} is not a run of a published grid (no readable manifest beside it names it)")
        return 2
    try:
        cfg = RunConfig.from_dict(json.loads((args.run / "config.json").read_text()))
    except (OSError, ValueError) as err:  # a DivvizInputError is a ValueError: a setting the code no longer takes
        print(f"{quoted(str(args.run))}: its config.json cannot be read as a run's ({shorten(str(err), 200)})")
        return 2
    if grid.get("cpu") != published.cpu_kernels():
        print(f"note: this CPU's kernels ({published.cpu_kernels()}) are not the grid's ({grid.get('cpu')}): "
              "expect the same run only to rounding")
    torch.set_num_threads(1)  # as the pool trains a run
    with tempfile.TemporaryDirectory() as scratch:
        start = time.time()
        folder = train(cfg, args.runs_dir or Path(scratch))
        found = published.differences(args.run, folder)
        minutes = (time.time() - start) / 60
    for line in found:
        print(line)
    print(f"{args.run.name}: {'differs' if found else 'the same run, to the bit'} "
          f"(trained again in {minutes:.1f} min)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
