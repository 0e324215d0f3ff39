"""The search for a SmolLM2-135M setting that learns on this CPU with a binding constraint (docs/learning.md).

Each candidate is one `divviz train` run (PPO ε = 0.2 unless it says otherwise) in its own folder under the runs
folder given (default runs-search/); a candidate whose run is done is not trained again, so the search resumes where
it was stopped. Prints, and writes to <runs>/search.md, one row per candidate: held-out accuracy (sampled and greedy,
Wilson 95%) at the start and the end, whether the end's interval lies wholly above the start's, the mean clip
fraction, the largest update KL, whether and when the run collapsed (`engine/stability.py`), the median (and
fastest) seconds per step and the run's wall time (both longer while other work shared the 2 cores).

    python scripts/learning_search.py [--runs DIR] [NAME …]      # NAME: only these candidates
    python scripts/learning_search.py --table                    # the table alone, nothing trained
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from divviz.runs import store  # noqa: E402

BASE = ["--model", "smollm2-135m", "--task", "add", "--prompts", "8", "--group-size", "8", "--max-new-tokens", "24",
        "--trainable-blocks", "4", "--mu", "1", "--seed", "0", "--inspect-prompts", "1"]
LEARN = ["--lr", "5e-5", "--minibatches", "4", "--steps", "50", "--eval-every", "25"]
STRESS = ["--lr", "2e-4", "--minibatches", "4", "--steps", "30", "--eval-every", "15"]
CANDIDATES = {  # name: the flags it adds (later flags win)
    "A lr5e-5 K4": LEARN,
    "B lr1e-4 K4": ["--lr", "1e-4", "--minibatches", "4", "--steps", "50", "--eval-every", "25"],
    "C lr2e-4 K4 (stress)": STRESS,
    "D lr1e-5 K1 mu2 (old)": ["--lr", "1e-5", "--minibatches", "1", "--mu", "2", "--prompts", "4", "--group-size", "4",
                              "--steps", "50", "--eval-every", "25"],
    "E kl3 δ=0.05, learn": [*LEARN, "--measure", "kl3", "--param", "delta=0.05"],
    "F dapo 0.2/0.28, learn": [*LEARN, "--measure", "clip_higher", "--param", "eps_low=0.2", "--param", "eps_high=0.28"],
    "G kl3 δ=0.05, stress": [*STRESS, "--measure", "kl3", "--param", "delta=0.05"],
    "H dapo 0.2/0.28, stress": [*STRESS, "--measure", "clip_higher", "--param", "eps_low=0.2", "--param",
                                "eps_high=0.28"],
    "I lr5e-5 K4 float32, 12 steps": [*LEARN, "--dtype", "float32", "--steps", "12", "--eval-every", "12"],
    "J the learn setting, 40 steps": ["--steps", "40", "--eval-every", "20"],  # stopped after 32 steps (docs)
}


def folder_of(runs: Path, name: str) -> Path:
    return runs / name.split()[0]


def train(runs: Path, name: str, log) -> None:
    folder = folder_of(runs, name)
    if folder.is_dir() and store.read_run(folder).state == "done":
        return
    if folder.exists():
        import shutil

        shutil.rmtree(folder)  # a run stopped half-way starts again: its curve must be one run's
    command = [sys.executable, "-m", "divviz", "train", *BASE, *CANDIDATES[name], "--runs-dir", str(runs), "--now"]
    log.write(f"\n== {name}: {' '.join(command[3:])}\n")
    log.flush()
    started = time.time()
    made = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    made_folder = Path(made.stdout.strip().splitlines()[-1]) if made.stdout.strip() else None
    if made_folder and made_folder.is_dir():
        made_folder.rename(folder)
        (folder / "wall_time.json").write_text(json.dumps({"seconds": time.time() - started}))


def row(runs: Path, name: str) -> str | None:
    folder = folder_of(runs, name)
    if not folder.is_dir():
        return None
    run, rows, evals = store.read_run(folder), store.read_metrics(folder), store.read_evals(folder)
    if len(evals) < 2:
        return f"| {name} | {run.state} | | | | | | | | |"
    first, last = evals[0], evals[-1]
    cell = lambda e, k: f"{e[k]:.3f} [{e[k + '_low']:.3f}, {e[k + '_high']:.3f}]"  # noqa: E731
    above = lambda k: "yes" if last[k + "_low"] > first[k + "_high"] else "no"  # noqa: E731
    clip = np.mean([r.get("clip_ratio/region_mean", 0.0) for r in rows])
    collapse = next((f"step {r['stability/collapse_step']:.0f}" for r in rows if "stability/collapse_step" in r), "no")
    wall = json.loads((folder / "wall_time.json").read_text())["seconds"] if (folder / "wall_time.json").exists() else 0
    return (f"| {name} | {run.state}, {len(rows)} steps | {cell(first, 'eval/accuracy')} → {cell(last, 'eval/accuracy')}"
            f" | {above('eval/accuracy')} | {cell(first, 'eval/accuracy_greedy')} → "
            f"{cell(last, 'eval/accuracy_greedy')} | {above('eval/accuracy_greedy')} | {100 * clip:.2f}% | "
            f"{max(r.get('kl/k3', 0.0) for r in rows):.4f} | {collapse} | {np.median([r['step_time'] for r in rows]):.1f} s "
            f"({min(r['step_time'] for r in rows):.1f}), {wall / 60:.1f} min |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="runs-search")
    parser.add_argument("--table", action="store_true", help="only write the table of the runs there are")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    runs = Path(args.runs).resolve()
    runs.mkdir(exist_ok=True)
    names = [n for n in CANDIDATES if not args.names or n.split()[0] in args.names]
    with open(runs / "search.log", "a") as log:
        for name in [None] if args.table else names:
            if name is not None:
                train(runs, name, log)
            table = ["| candidate | run | eval/accuracy start → end | above | eval/accuracy_greedy start → end | above "
                     "| clip (mean) | max kl/k3 | collapsed | step median (fastest), wall |",
                     "|---|---|---|---|---|---|---|---|---|---|"]
            table += [r for n in CANDIDATES if (r := row(runs, n))]
            (runs / "search.md").write_text("\n".join(table) + "\n")
            print("\n".join(table), flush=True)


if __name__ == "__main__":
    main()
