"""What verl's rollout corrections do when the sampler is not the policy: paired differences over seeds, on the exact
bandit and on the built-in LM, each with its 95% interval, n, how many seeds reverse it, and the verdict on two
predictions: the stale sampler costs (uncorrected − on-policy < 0), and a correction recovers some of it
(correction − uncorrected > 0).

The sampler is the policy of `--lag` updates ago in bfloat16 (`engine/sampler.py`, `bandit/rollout.py`); the
corrections are the Training lab's: none, token TIS (u = 2), token IcePop ([0.5, 2]), token_k1 rejection ([0.5, 2])
and verl's bypass mode. The on-policy run (no lag, same precision) is the reference the others lose against. The
bandit uses the Mass reallocation page's defaults; the LM runs are the lab's default run (`reverse`, 60 steps), one
thread each, two at a time, in a temporary runs folder.

    python scripts/rollout_evidence.py [--seeds 8] [--bandit-seeds 64] [--lag 2] [--skip-lm]
"""

from __future__ import annotations

import argparse
import tempfile
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from divviz.evidence import intervals

from divviz.bandit.setting import BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective
from divviz.views import explorer

CORRECTIONS = ("none", "TIS token", "IcePop token", "rejection", "bypass")
WINDOWS = {"early (steps 11–20)": (11, 20), "late (steps 51–60)": (51, 60)}


def variants() -> dict[str, dict]:
    return {name: explorer.rollout_variant(name, 2.0, (0.5, 2.0), "token_k1", (0.5, 2.0), 0.05, False)
            for name in CORRECTIONS}


def line(name: str, base: str, d: intervals.Paired, sign: int = +1) -> str:
    verdict = intervals.verdict(d.low, d.high, sign)
    return (f"  {name:<14} − {base:<10} {d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]  n = {d.n}, "
            f"{d.against_mean} against the mean · {verdict}")


def bandit(seeds: int, lag: int) -> None:
    cfg = BanditConfig().to_dict()
    objective = [Objective(clip=clip_test("ratio"))]
    on_policy = explorer.bandit_runs(cfg, objective, seeds)[0]
    lagged = explorer.bandit_runs({**cfg, "rollout_lag": lag, "rollout_dtype": "bfloat16"}, objective, seeds,
                               list(variants().values()))
    runs = dict(zip(CORRECTIONS, lagged))
    print(f"Bandit (the page's defaults, PPO ε = 0.2, {seeds} seeds), sampler {lag} iterations behind in bfloat16: "
          "expected reward")
    for iteration in (10, 80):
        at = lambda name: [run.history["expected_reward"][iteration - 1] for run in runs[name]]  # noqa: E731
        print(f" iteration {iteration}")
        print(line("none", "on-policy", intervals.paired(at("none"),
                                                       [r.history["expected_reward"][iteration - 1] for r in on_policy]),
                   sign=-1))
        for name in CORRECTIONS[1:]:
            print(line(name, "none", intervals.paired(at(name), at("none"))))
    print(" iterations 2–10, mean over seeds: clip_ratio/high_mean, clip_ratio/low_mean")
    for name, group in (("on-policy", on_policy), *runs.items()):
        high, low = (np.mean([run.history[f"clip_ratio/{side}_mean"][1:10] for run in group]) for side in ("high", "low"))
        print(f"  {name:<14} {high:.3f}  {low:.3f}")


def train_one(job):
    import torch

    from divviz.engine.config import RunConfig
    from divviz.runs import store
    from divviz.runs.train import train

    torch.set_num_threads(1)
    name, seed, settings, root = job
    folder = train(RunConfig.make(seed=seed, checkpoint_every=0, inspect_prompts=0, **settings), Path(root) / name)
    return name, seed, {key: [row.get(key, np.nan) for row in store.read_metrics(folder)] for key in LM_METRICS}


LM_METRICS = ("accuracy", "clip_ratio/region_mean", "kl/k3", "rollout_corr/k3_kl")


def lm(seeds: int, lag: int) -> None:
    sampler = {"rollout_dtype": "bfloat16", "rollout_lag": lag}
    settings = {"on-policy": {}, **{name: {**sampler, **v} for name, v in variants().items()}}
    with tempfile.TemporaryDirectory(prefix="divviz-rollout-") as root, Pool(2) as pool:
        done = pool.map(train_one, [(name, s, v, root) for name, v in settings.items() for s in range(seeds)])
    runs = {(name, seed): {key: np.array(values) for key, values in metrics.items()} for name, seed, metrics in done}
    accuracy = {key: metrics["accuracy"] for key, metrics in runs.items()}
    print(f"\nBuilt-in LM (reverse, the lab's default run, {seeds} seeds), sampler {lag} updates behind in bfloat16: "
          "accuracy")
    for window, (first, last) in WINDOWS.items():
        mean = lambda name: [float(np.mean(accuracy[(name, s)][first - 1:last])) for s in range(seeds)]  # noqa: E731
        print(f" {window}")
        print(line("none", "on-policy", intervals.paired(mean("none"), mean("on-policy")), sign=-1))
        for name in CORRECTIONS[1:]:
            print(line(name, "none", intervals.paired(mean(name), mean("none"))))
    print(" steps 2–20, mean over seeds: clip_ratio/region_mean, kl/k3 of the update, rollout_corr/k3_kl; accuracy "
          "in the first and last 10 steps")
    for name in settings:
        early = [np.array([runs[(name, s)][key][1:20] for s in range(seeds)]) for key in LM_METRICS[1:]]
        shown = ["   —  " if np.isnan(x).all() else f"{np.nanmean(x):.4f}" for x in early]  # on-policy: no sampler
        first, last = (np.mean([accuracy[(name, s)][window] for s in range(seeds)]) for window in (slice(0, 10),
                                                                                                  slice(-10, None)))
        print(f"  {name:<14} {'  '.join(shown)}   {first:.3f} → {last:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="runs per correction on the built-in LM")
    parser.add_argument("--bandit-seeds", type=int, default=64)
    parser.add_argument("--lag", type=int, default=2)
    parser.add_argument("--skip-lm", action="store_true")
    args = parser.parse_args()
    bandit(args.bandit_seeds, args.lag)
    if not args.skip_lm:
        lm(args.seeds, args.lag)


if __name__ == "__main__":
    main()
