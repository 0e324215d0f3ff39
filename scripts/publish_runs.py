"""Publish the finished runs of a model's claims grids from a runs folder into published/ (`runs/published.py`).

    python scripts/publish_runs.py --runs-dir runs-grid --commit 6facbc5 [--model smollm2-135m] [--device cpu]
        [--grid-suffix cpu]

For each of the model's settings with held-out evaluations (SmolLM2's learn and stress; the built-in LM's defaults),
the grid declared for `--device`'s kind (`LMPlan.declared`: seeds per measure and the pilot pair's seeds) is read
from the runs folder; every cell whose run finished is published into published/<model>[-<setting>]-<suffix>/, and
the manifest
records how it was trained: the device and precision the run reports, this Python's torch and transformers, and
`--commit`, the commit whose code trained the runs. A run already published with the same files is left as it is.
Run it again as runs finish: a grid is published run by run.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch
import transformers

from divviz.engine.models import MODELS, evaluated_settings
from divviz.engine.policy import pick_dtype
from divviz.evidence import claims_lm
from divviz.runs import published

def precision_of(run) -> str:
    """The precision a run's forward passes took on this machine (its config's dtype, `policy.pick_dtype`)."""
    dtype = pick_dtype(run.config.get("dtype", "auto"), torch.device(run.status.get("device") or "cpu"),
                       run.config["model"])
    return "float32" if dtype is None else f"{str(dtype).removeprefix('torch.')} autocast"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", required=True, type=Path)
    parser.add_argument("--commit", required=True, help="the commit whose code trained the runs")
    parser.add_argument("--model", default="smollm2-135m", choices=MODELS)
    parser.add_argument("--device", default="cpu", choices=tuple(claims_lm.DEVICE_KINDS),
                        help="the kind of device that trained it")
    parser.add_argument("--grid-suffix", default="cpu", help="the device's part of the grid's name (h200, …)")
    parser.add_argument("--out", type=Path, default=published.root())
    args = parser.parse_args(argv)
    for setting in evaluated_settings(args.model) or [""]:  # the built-in LM: its defaults, which evaluate
        if args.device != "cpu" and (setting, args.device) not in claims_lm.DECLARED:
            continue
        plan = claims_lm.LMPlan.declared(args.runs_dir, args.model, setting, with_published=False, device=args.device)
        grid = args.out / "-".join(part for part in (args.model, setting, args.grid_suffix) if part)
        count = 0
        for (measure, reward, seed), run in plan.runs.items():
            if run is None or run.state not in claims_lm.FINAL:
                continue
            device = run.status.get("device") or "cpu"
            trained_by = {"model": args.model, "setting": setting, "device": device,
                          **({"gpu": torch.cuda.get_device_name(device)} if device.startswith("cuda") else {}),
                          "cpu": published.cpu_kernels(), "precision": precision_of(run), "torch": torch.__version__,
                          "transformers": transformers.__version__, "python": platform.python_version(),
                          "commit": args.commit, "seeds": plan.seeds, "pilot_seeds": plan.pilot_seeds}
            published.publish(run.folder, grid, {"measure": measure, "reward": reward, "seed": seed}, trained_by)
            count += 1
        print(f"{grid.name}: {count} of {len(plan.runs)} runs published")


if __name__ == "__main__":
    main(sys.argv[1:])
