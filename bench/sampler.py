"""SmolLM2's sampler with its linear weights cast once per call against autocast's cast at every model call
(`rollout.linear_weights_cast`), side by side in one run: the sampling stage and the whole step, and whether the two
ways sampled and trained the same bits.

The learn setting (8 prompts × 8 completions, up to 24 tokens at τ = 0.7, K = 4 mini-batches, the last 4 blocks
trained) under bfloat16 autocast, on one thread as a pool's run. Two trainers from the same seed, one per way,
alternate: for each step r, the sampling stage (`make_batch`) of step r, then the whole step r (`grpo_step`: sample,
π_old, the updates, every metric), first one way then the other, so both see the same load. The figures are medians
over the steps after one warm-up. Baseline: the cast left to autocast (the sampler before the cast left its loop).

    python bench/sampler.py [--steps N] [--device cpu|cuda]
"""

import argparse
import contextlib
import statistics
import time

import torch

from divviz.engine import rollout
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_batch, make_trainer
from divviz.engine.smollm2 import NAME
from divviz.runs.store import CLOCK_KEYS

FACTS = ("completion_ids", "completion_mask", "logp", "entropy", "top1", "was_argmax")
CAST_ONCE = rollout.linear_weights_cast


def per_call(model, autocast):
    """The baseline: nothing cast ahead, autocast casts every weight at every call."""
    return contextlib.nullcontext()


def timed(tr, work, cast):
    """(seconds, result) of `work()` with the sampler's cast `cast`."""
    rollout.linear_weights_cast = cast
    try:
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = work()
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, result
    finally:
        rollout.linear_weights_cast = CAST_ONCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps timed after the warm-up")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a pool's run trains
    cfg = RunConfig.make(model=NAME, device=args.device, dtype="bfloat16")
    trainers = {CAST_ONCE: make_trainer(cfg), per_call: make_trainer(cfg)}
    times = {(way, stage): [] for way in trainers for stage in ("sampling", "step")}
    same = True
    for step in range(args.steps + 1):
        batches, results = {}, {}
        for way, tr in trainers.items():
            seconds, batches[way] = timed(tr, lambda: make_batch(tr, step), way)
            times[way, "sampling"].append(seconds)
            seconds, results[way] = timed(tr, lambda: grpo_step(tr, step), way)
            times[way, "step"].append(seconds)
        a, b = (batches[way].rollout for way in trainers)
        same &= all(torch.equal(getattr(a, f), getattr(b, f)) for f in FACTS)
        a, b = ({k: v for k, v in results[way].metrics.items() if k not in CLOCK_KEYS} for way in trainers)
        same &= a == b
    median = {key: statistics.median(values[1:]) for key, values in times.items()}  # the first is the warm-up
    print(f"{NAME} learn setting, {trainers[CAST_ONCE].device} bfloat16 autocast, median of {args.steps} steps:")
    for stage in ("sampling", "step"):
        once, every = median[CAST_ONCE, stage], median[per_call, stage]
        print(f"  {stage:8}  cast at every call (baseline) {every:6.2f} s   cast once per call {once:6.2f} s   "
              f"ratio {once / every:.2f}")
    print(f"  the same samples and metrics both ways: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
