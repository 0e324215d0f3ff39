"""The sampling stage of a SmolLM2 step, with its linear weights cast once per call against autocast's cast at every
model call (`rollout.linear_weights_cast`), side by side in one run, and whether they sampled the same bits.

The learn setting's batch (8 prompts × 8 completions, up to 24 tokens at τ = 0.7, the last 4 blocks trainable) under
bfloat16 autocast, each repetition sampling step r's batch both ways, alternately, so both see the same load; the
figure is the median over the repetitions after one warm-up. Baseline: the same sampler with the cast left to
autocast (the sampler before the cast moved out of the loop).

    python bench/sampler.py [--repeats N] [--device cpu|cuda]
"""

import argparse
import contextlib
import statistics
import time

import torch

from divviz.engine import rollout
from divviz.engine.config import RunConfig
from divviz.engine.grpo import make_batch, make_trainer
from divviz.engine.smollm2 import NAME

FACTS = ("completion_ids", "completion_mask", "logp", "entropy", "top1", "was_argmax")


def timed_batch(tr, step: int, cast_once: bool):
    """(seconds, rollout) of sampling step `step`'s batch, the weights cast once or by autocast at every call."""
    cast = rollout.linear_weights_cast if cast_once else (lambda model, autocast: contextlib.nullcontext())
    real, rollout.linear_weights_cast = rollout.linear_weights_cast, cast
    try:
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        batch = make_batch(tr, step)
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, batch.rollout
    finally:
        rollout.linear_weights_cast = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a pool's run trains
    tr = make_trainer(RunConfig.make(model=NAME, device=args.device, dtype="bfloat16"))
    times = {True: [], False: []}
    same = True
    for step in range(args.repeats + 1):
        (once, by_once), (per_call, by_call) = timed_batch(tr, step, True), timed_batch(tr, step, False)
        same &= all(torch.equal(getattr(by_once, f), getattr(by_call, f)) for f in FACTS)
        if step:  # the first is the warm-up
            times[True].append(once)
            times[False].append(per_call)
    once, per_call = statistics.median(times[True]), statistics.median(times[False])
    print(f"{NAME} learn batch, {tr.device} bfloat16 autocast, {args.repeats} repeats (median):")
    print(f"  cast at every call (baseline) {per_call:.2f} s   cast once per call {once:.2f} s   "
          f"ratio {once / per_call:.2f}   same samples: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
