"""The dose search: where on SmolLM2-135M does a constraint bind enough that PPO and KL3 can differ?

The published claims grids compare PPO ε = 0.2 with KL3 δ = 0.05 where the two act differently on about 0.5% of
tokens in 30 steps (docs/claims.md), so "no difference" is close to guaranteed by the design. This search looks, before
any experiment is declared, for a setting where the constraint shapes training. Every grid point trains PPO ε = 0.2
and KL3 δ = 0.05 at seed 0 on the learn setting's batch (8 prompts × 8 completions of `add` through the chat
template, 24 new tokens, the last 4 blocks trained, bf16), for STEPS steps with a held-out evaluation every 25, and
records per run and step: each objective's clip fraction, the **disagreement** (the share of the step's sampled tokens
whose clip state the other objective would set otherwise: the run's recorded (π_old, w, A) re-scored under the other
clip test, `evidence.rescore`, averaged over the pair's two runs), the entropy, the stability flag and the held-out
accuracy (sampled and greedy).

**The rule, fixed before the first run (this commit):** the experiment's setting is the cheapest grid point (CPU
seconds per run) at which
  1. PPO's clip fraction, averaged over the run, is at least 3%;
  2. the disagreement, averaged over the run, is at least 2% of tokens;
  3. PPO's sampled held-out accuracy at the end is above its start (point estimates: the search has one seed);
  4. PPO's run collapses (`engine/stability.py`) or its entropy's last-10-step mean falls below half its first step's.
If no point meets all four, the point meeting 1–3 with the largest disagreement is chosen and the stability claim is
reported as not testable here; if none meets 1–3, the search is reported as finding no binding regime at this cost.
The declared searches, the rule and its reading are code in `divviz/evidence/dose_search.py`, which the Claims page
reads the published summaries with; this script trains and publishes.

**The second search, declared after the first had read 17 of its 18 points and before its own first run (this
commit): the same rule on four more points.** No point of the first search (μ ∈ {1, 2, 4}, K ∈ {4, 8}, lr ∈ {5e-5,
1e-4, 2e-4}, the model's sampling temperature 0.7) reached condition 2 (largest disagreement 0.73%): the dose is
front-loaded — over the first 10 steps the disagreement reaches 1.9–2.5% at lr 5e-5 with μ ≥ 2 — and falls as the
entropy collapses (a near-deterministic policy's ratios stay near 1; entropy 0.81 → below 0.4 by step 25 at every
point). The second search keeps the policy's entropy: sampling temperature 1.0 (TRL's default; the loss uses the same
tempered policy) at μ = 4 or 2, K = 8, lr 5e-5, and at μ = 4, K = 8 lr 2.5e-5 with temperature 1.0 and with the
model's 0.7. Its summary and runs are published under smollm2-135m-second-dose-search; the experiment's setting is the
first search's choice if it has one, else the second's, else divviz reports no binding regime on this model at this
cost.

Points are trained in the search's order (the likeliest to bind first), two runs at a time on one thread each at the
lowest CPU priority (nice 19: the search yields to anything else on the machine; `--nice 0` on a machine of its own),
each run in its own folder under the runs folder (default ../runs-dose, outside the checkout); a finished run is never
trained again and one stopped part-way goes on from its last resume state (every CHECKPOINT steps), so the search
resumes where it stopped. After each run the summary (every run's per-step dose, entropy, stability and evaluations,
and the rule's reading) is written to published/<search>.json and printed as a table, and the finished run itself is
published into published/<search>/<point>-<objective>/ (`runs/published.py`: its metrics, evaluations, samples and the
first, middle and last steps' per-token records, the manifest naming the commit and the CPU kernels that trained it; a
published grid holds one CPU's runs, so a run trained on another CPU goes into <search>-2/, and so on: a pair may
cross CPUs, which the rule, read run by run, allows). The training code is held at one commit by training from
a worktree (`--tree`) while this script runs from the checkout that publishes. A point already in the summary whose runs
are not in the runs folder (a machine since returned) keeps its summarised reading, and a finished run summarised by the
same commit is kept and not trained again while its pair's other run is.

    python scripts/dose_search.py [--search second] [--runs DIR] [--tree WORKTREE] [--parallel N] [POINT …]
    python scripts/dose_search.py [--search second] --table                     # the published summary as it is
    python scripts/dose_search.py [--search second] --publish --tree WORKTREE   # publish again, nothing trained
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import platform  # noqa: E402

import transformers  # noqa: E402

from divviz.catalogue.params import DivvizInputError  # noqa: E402
from divviz.engine.policy import pick_device, pick_dtype  # noqa: E402
from divviz.evidence.dose_search import (README_ROW, RULE, SEARCHES, STEPS, Search, choose, reading,  # noqa: E402
                                         readme_row, table)
from divviz.evidence.rescore import disagreement, measure_objective, sampled_tokens  # noqa: E402
from divviz.runs import published, resume, store  # noqa: E402

BASE = ["--model", "smollm2-135m", "--task", "add", "--prompts", "8", "--group-size", "8", "--max-new-tokens", "24",
        "--trainable-blocks", "4", "--seed", "0", "--inspect-prompts", "1", "--steps", str(STEPS), "--eval-every",
        "25", "--dtype", "bfloat16"]
OBJECTIVES = {"ppo": ("ratio", ["--measure", "ratio", "--param", "eps=0.2"]),
              "kl3": ("kl3:delta=0.05", ["--measure", "kl3", "--param", "delta=0.05"])}  # name: (clip test, flags)


PUBLISHED = ROOT / "published"
SEARCH = SEARCHES["first"]  # `--search`
TREE = ROOT  # the checkout whose code trains the runs (`--tree`: a worktree held at one commit)
CHECKPOINT = 5  # steps between a run's resume states (what a run keeps, not how it trains: `config.KEPT_ONLY`)
RESUME = """import sys
try:
    from divviz.runs.worker import main
except ImportError:  # a tree from before run management had its own folder
    from divviz.engine.worker import main
main(sys.argv[1])"""  # trains a stopped run on in its folder, as the pool does


def summary_file(search: Search | None = None) -> Path:
    """Where the search's summary is published (`--search`'s by default)."""
    return PUBLISHED / f"{(search or SEARCH).name}.json"


def grid_root() -> Path:
    """The first CPU's published runs of the search; another CPU's go into <grid>-2, <grid>-3, …"""
    return PUBLISHED / SEARCH.name


def flags(point: str, objective: str) -> list[str]:
    mu, k, lr, temperature = SEARCH.points[point]
    return [*BASE, "--mu", str(mu), "--minibatches", str(k), "--lr", f"{lr:g}",
            *(["--temperature", f"{temperature:g}"] if temperature is not None else []), *OBJECTIVES[objective][1]]


def train(runs: Path, point: str, objective: str, log, nice: int) -> None:
    """Train one run of the search into runs/<point>/<objective> unless it is done there. It trains in
    runs/<point>/<objective>.training/ and keeps its resume state every CHECKPOINT steps (`runs/resume.py`: a resumed
    run writes the rows an unbroken one would), so a run stopped with the machine goes on from its last resume state;
    one stopped without any starts again. It trains at `nice` (--nice: 19 unless asked, yielding to anything else)."""
    folder, training = runs / point / objective, runs / point / f"{objective}.training"
    if folder.is_dir() and store.read_run(folder).state == "done":
        return
    saved = {f: resume.saved_step(f) for f in sorted(training.glob("*/"))} if training.is_dir() else {}
    stopped = next((f for f, step in saved.items() if step), None)
    if stopped is None:
        shutil.rmtree(training, ignore_errors=True)
        training.mkdir(parents=True)
        command = [sys.executable, "-m", "divviz", "train", *flags(point, objective), "--checkpoint-every",
                   str(CHECKPOINT), "--runs-dir", str(training), "--now"]
    else:
        command = [sys.executable, "-c", RESUME, str(stopped)]
    log.write(f"\n== {point} {objective} ({time.strftime('%H:%M:%S')}): "
              f"{f'resumed after step {saved[stopped]}' if stopped else ' '.join(command[3:])}\n")
    log.flush()
    status = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=log, cwd=TREE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=lambda: os.nice(nice)).returncode
    made = [f for f in training.glob("*/") if store.read_run(f).state == "done"]
    if not made:
        raise RuntimeError(f"its training ended with exit status {status} and no finished run (its message is in "
                           f"{log.name})")
    shutil.rmtree(folder, ignore_errors=True)
    made[0].rename(folder)
    shutil.rmtree(training)
    publish(folder, point, objective)


def attempt(runs: Path, job: tuple[str, str], log, nice: int) -> str | None:
    """Train and publish one run of the queue, then write the summary; a failure is one line in the log and on
    stderr, returned, and the search goes on with the next run (a finished run stays in the runs folder, to publish
    again with --publish)."""
    try:
        train(runs, *job, log, nice)
        write(runs)
        return None
    except Exception as error:  # noqa: BLE001 - a worker thread's error would otherwise wait, unseen, in its future
        line = f"{' '.join(job)} failed: {type(error).__name__}: {error}"
        log.write(f"\n== {line}\n")
        log.flush()
        print(f"dose search: {line}", file=sys.stderr, flush=True)
        return line


def refusal_here() -> str | None:
    """Why this machine cannot train the search's runs as declared, or None: they are bfloat16 (`BASE`), which
    divviz refuses where the device has no native bfloat16 (`engine/policy.pick_dtype`) — a search is not moved to
    another precision on the quiet."""
    dtype, model, device = BASE[BASE.index("--dtype") + 1], BASE[BASE.index("--model") + 1], pick_device()
    try:
        pick_dtype(dtype, device, model)
    except DivvizInputError:
        return (f"the search's runs are declared in {dtype}, and this {device.type.upper()} has no native {dtype} "
                "(AVX512-BF16 or AMX on a CPU): run it on a machine that has it")
    return None


def commit() -> str:
    """The commit whose code trains the search: the training checkout's HEAD (`TREE`, a clean worktree)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=TREE, capture_output=True, text=True,
                          check=True).stdout.strip()


def grids() -> list[Path]:
    """The search's published grids so far: its grid, then one per further CPU (<grid>-2, …), in that order."""
    grid = grid_root()
    return [grid, *sorted(grid.parent.glob(f"{grid.name}-[0-9]*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))]


def grid_for(trained_by: dict) -> Path:
    """The grid a run trained so joins: the first whose manifest says the same of its runs (a published grid holds
    one CPU's kernels, `published.publish`), else the next new one."""
    for grid in grids():
        manifest = grid / "manifest.json"
        if not manifest.exists() or all(json.loads(manifest.read_text()).get(k) == v for k, v in trained_by.items()):
            return grid
    return grid_root().parent / f"{grid_root().name}-{len(grids()) + 1}"


def publish(folder: Path, point: str, objective: str) -> None:
    """A finished run of the search into its CPU's grid (`grid_for`), recorded in its manifest under its point and
    objective."""
    trained_by = {"model": "smollm2-135m", "setting": "dose search", "device": "cpu", "cpu": published.cpu_kernels(),
                  "precision": "bfloat16 autocast", "torch": torch.__version__,
                  "transformers": transformers.__version__, "python": platform.python_version(), "commit": commit()}
    cell = {"point": point, "measure": OBJECTIVES[objective][0], "seed": 0, **SEARCH.design(point)}
    published.publish(folder, grid_for(trained_by), cell, trained_by, name=f"{point}-{objective}")


def run_summary(folder: Path, other_clip: str) -> dict | None:
    """One run's per-step dose, entropy and stability, its evaluations and its seconds per step."""
    if not folder.is_dir():
        return None
    run, rows, evals = store.read_run(folder), store.read_metrics(folder), store.read_evals(folder)
    other = measure_objective(other_clip)
    tokens = [sampled_tokens(folder, int(row["step"])) for row in rows]
    return {"state": run.state, "steps": len(rows),
            "clip": [r.get("clip_ratio/region_mean") for r in rows], "entropy": [r.get("entropy") for r in rows],
            "disagreement": [None if t is None else disagreement(t, other) for t in tokens], "reward": [r.get("reward") for r in rows],
            "collapse_step": next((r["stability/collapse_step"] for r in rows if "stability/collapse_step" in r), None),
            "evals": [{k: e[k] for k in ("step", "eval/accuracy", "eval/accuracy_greedy") if k in e} for e in evals],
            "step_s": float(np.median([r["step_time"] for r in rows])) if rows else None}


def kept_run(point: dict, objective: str, trained_by: str) -> dict | None:
    """A finished run summarised earlier by the commit `trained_by` whose folder is gone: its summary stands."""
    run = point.get(objective)
    return run if run and run["state"] == "done" and point.get("commit") == trained_by else None


def summary(runs: Path) -> dict:
    """Every point with a run in `runs` summarised from it; a point only in the published summary kept from there."""
    before = json.loads(summary_file().read_text())["points"] if summary_file().exists() else {}
    points, trained_by = {}, commit()
    for name in SEARCH.points:
        point = {objective: run_summary(runs / name / objective, OBJECTIVES["kl3" if objective == "ppo" else "ppo"][0])
                 or kept_run(before.get(name, {}), objective, trained_by) for objective in OBJECTIVES}
        point = {k: v for k, v in point.items() if v is not None}
        if not point and name in before:
            points[name] = before[name]
        elif point:
            points[name] = {**SEARCH.design(name), "commit": trained_by, **point}
            points[name]["reading"] = reading(points[name])
    choice = choose(points, len(SEARCH.points))
    return {"rule": RULE, "steps": STEPS, "flags": BASE, "points": points, "choice": choice.words}


def to_train(summarised: dict, only: list[str]) -> list[tuple[str, str]]:
    """The (point, objective) runs still to train, in the search's order: none of a point read, nor a run summarised
    done."""
    done = {(name, objective) for name, point in summarised.items() for objective in OBJECTIVES
            if point.get("reading") or (point.get(objective) or {}).get("state") == "done"}
    return [(name, objective) for name in SEARCH.points if not only or name in only for objective in OBJECTIVES
            if (name, objective) not in done]


def write(runs: Path) -> None:
    """The summary published, README's row of the searches (in the README beside the published folder, where there
    is one) written from every search's summary, the table printed."""
    result = summary(runs)
    store.write_atomic(summary_file(), json.dumps(result, indent=1) + "\n")  # the Claims page may be reading it
    readme = PUBLISHED.parent / "README.md"
    if readme.exists():
        update_readme(readme)
    print(table(result), flush=True)


def update_readme(readme: Path) -> None:
    """README's row of the searches replaced by what every published summary says now (`readme_row`)."""
    row = readme_row({label: json.loads(summary_file(search).read_text()) if summary_file(search).exists() else None
                      for label, search in SEARCHES.items()})
    store.write_atomic(readme, "".join(row if line.startswith(README_ROW) else line
                                       for line in readme.read_text().splitlines(keepends=True)))


def nice_value(text: str) -> int:
    """--nice's value: a whole number from 0 (the usual priority) to 19 (the lowest)."""
    if not (text.isdigit() and int(text) <= 19):
        raise argparse.ArgumentTypeError(f"{text!r} is not a priority from 0 to 19")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", choices=SEARCHES, default="first", help="which declared search (default: first)")
    parser.add_argument("--runs", default=str(ROOT.parent / "runs-dose"))
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (each on one thread)")
    parser.add_argument("--nice", type=nice_value, default=19, metavar="0…19",
                        help="the runs' CPU priority (default 19: the search yields to anything else on the machine)")
    parser.add_argument("--table", action="store_true", help="only print the published summary as a table")
    parser.add_argument("--publish", action="store_true",
                        help="only publish every finished run of the runs folder (again) and write the summary")
    parser.add_argument("--tree", default=str(ROOT),
                        help="the checkout whose code trains the runs and whose HEAD their manifest names (a worktree "
                             "held at one commit; default: this one)")
    parser.add_argument("points", nargs="*")
    args = parser.parse_args()
    global TREE, SEARCH
    TREE, SEARCH = Path(args.tree).resolve(), SEARCHES[args.search]
    if args.table:  # as the search last wrote it: read again here, a run kept only in the summary would need --tree
        if not summary_file().exists():
            sys.exit(f"the {args.search} search has no published summary yet ({summary_file().name})")
        print(table(json.loads(summary_file().read_text())))
        return
    runs = Path(args.runs).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    if args.publish:
        for point in SEARCH.points:
            for objective in OBJECTIVES:
                folder = runs / point / objective
                if folder.is_dir() and store.read_run(folder).state == "done":
                    publish(folder, point, objective)
    if args.publish:
        write(runs)
        return
    queue = to_train(summary(runs)["points"], args.points)
    if queue and (refused := refusal_here()):
        sys.exit(f"dose search: nothing trained: {refused}")
    started = time.time()
    with open(runs / "search.log", "a") as log, ThreadPoolExecutor(args.parallel) as pool:
        failed = [line for line in pool.map(lambda job: attempt(runs, job, log, args.nice), queue) if line]
        log.write(f"\n== the search's queue done in {(time.time() - started) / 60:.1f} min"
                  f"{f', {len(failed)} of {len(queue)} runs failed' if failed else ''}\n")
    if failed:
        sys.exit(f"dose search: {len(failed)} of {len(queue)} runs failed (the lines above; {runs / 'search.log'})")


if __name__ == "__main__":
    main()
