"""SmolLM2's sampler drawing each token by the inverse of its cumulative distribution (`rollout.inverse_cdf_draw`)
against `torch.multinomial`'s exponential draw, side by side in one run: the draw alone, the sampling stage, the
whole step and the held-out evaluation.

The learn setting (8 prompts × 8 completions, up to 24 tokens at τ = 0.7, K = 4 mini-batches, the last 4 blocks
trained) under bfloat16 autocast. The draw alone: one (64, 49,152) distribution, the median of 30 draws each way.
Then two trainers from the same seed, one per way, alternate: for each step r, the sampling stage (`make_batch`) of
step r, then the whole step r (`grpo_step`), one way then the other, so that both see the same load; the medians are
over the steps after one warm-up. Before them, after one untimed warm-up evaluation, one held-out evaluation of the
start policy each way (its 128 problems sampled and greedy).
Baseline: `torch.multinomial(π, 1)`, the draw before (it draws an exponential per vocabulary entry, serially on a
CPU). The two ways sample different tokens from the same distributions; docs/benchmarks.md holds the runs.

    python bench/draw.py [--steps N] [--device cpu|cuda]
"""

import argparse
import statistics
import time

import torch

from divviz.engine import rollout
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_batch, make_trainer
from divviz.engine.smollm2 import NAME
from divviz.runs.train import held_out_evaluation

INVERSE_CDF = rollout.inverse_cdf_draw


def multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The baseline: torch.multinomial's draw, argmax π / q with q ~ Exp(1) drawn for every entry."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


WAYS = {"multinomial (baseline)": multinomial, "inverse CDF": INVERSE_CDF}


def timed(device: torch.device, work, draw):
    """(seconds, result) of `work()` with the sampler drawing by `draw`."""
    rollout.inverse_cdf_draw = draw
    try:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = work()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, result
    finally:
        rollout.inverse_cdf_draw = INVERSE_CDF


def draw_alone(device: torch.device) -> dict[str, float]:
    """Median seconds of one draw from a (64, 49,152) tempered softmax, each way."""
    generator = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(64, 49_152, generator=generator, device=device) * 3
    probs = torch.softmax(logits / 0.7, dim=-1)
    seconds = {}
    for name, draw in WAYS.items():
        runs = [timed(device, lambda: draw(probs, generator), draw)[0] for _ in range(33)]
        seconds[name] = statistics.median(runs[3:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="steps timed after the warm-up")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    cfg = RunConfig.make(model=NAME, device=args.device, dtype="bfloat16")
    trainers = {name: make_trainer(cfg) for name in WAYS}
    device = next(iter(trainers.values())).device
    rows = {(name, "draw"): [seconds] for name, seconds in draw_alone(device).items()}
    held_out_evaluation(next(iter(trainers.values())))  # the warm-up: kernels chosen, caches filled
    for name, tr in trainers.items():  # the start policy, the same both ways
        rows[name, "evaluation"] = [timed(device, lambda: held_out_evaluation(tr), WAYS[name])[0]]
    for step in range(args.steps + 1):
        for name, tr in trainers.items():
            for stage, work in (("sampling", lambda: make_batch(tr, step)), ("step", lambda: grpo_step(tr, step))):
                seconds, _ = timed(device, work, WAYS[name])
                if step:  # step 0 is the warm-up
                    rows.setdefault((name, stage), []).append(seconds)
    print(f"{NAME} learn setting, {device} bfloat16 autocast, {torch.get_num_threads()} threads, median of "
          f"{args.steps} steps (the draw alone: of 30 draws of one (64, 49,152) distribution; the evaluation: one):")
    base, new = WAYS
    for stage in ("draw", "sampling", "step", "evaluation"):
        before, after = (statistics.median(rows[name, stage]) for name in (base, new))
        print(f"  {stage:10}  {base} {before:8.4f} s   {new} {after:8.4f} s   ratio {after / before:.2f}")


if __name__ == "__main__":
    main()
