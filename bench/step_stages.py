"""Where a SmolLM2 step's wall time goes, stage by stage, at the learn setting and at a second setting, side by side.

Two trainers in one process, the learn setting (the model's defaults: μ = 1, K = 4) and the compared one (default
the binding setting, μ = 2, K = 8), one warm-up step each, then their steps alternating so that a drift of the
machine falls on both. Each stage is timed by the wall clock around the engine's own functions (the sampling, the
frozen prefix, π_before, each mini-batch's training forward and backward, the gradient clipping, the AdamW step,
the after-update forward, the metrics), each exclusive of the stages it calls; what no stage holds (the loss, the
tallies) is "the rest". Prints each stage's median seconds both ways, the compared setting's extra, and its step's
ratio to the learn step (the baseline).
torch.profiler is not used: under it the step's 38-300 MB logit operations read 5-10x their wall time here.
docs/benchmarks.md holds its runs.

    python bench/step_stages.py [--steps N] [--dtype bfloat16] [--mu 2] [--minibatches 8]
"""

import argparse
import statistics
import time
from collections import defaultdict

import torch

import divviz.engine.grpo as grpo
from real_model import config  # bench/ is the script's own folder on sys.path

STAGES = ("sample", "frozen_prefix", "policy_before", "training_forward", "backward", "clip_grad_norm",
          "optimiser_step", "policy_after", "step_metrics")
ENGINE_STAGES = ("sample", "frozen_prefix", "policy_before", "training_forward", "policy_after", "step_metrics")


class StageClock:
    """Seconds spent in each stage since `reset`, by wrapping the functions the engine calls them through; a stage
    called inside another (π_before runs the first mini-batch's training forward) counts in its own row only."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.inner = []  # per open stage, the seconds of the stages called inside it

    def timed(self, stage: str, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            self.inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds[stage] += elapsed - self.inner.pop()
                if self.inner:
                    self.inner[-1] += elapsed
        return wrapper

    def install(self):
        for stage in ENGINE_STAGES:
            setattr(grpo, stage, self.timed(stage, getattr(grpo, stage)))
        torch.Tensor.backward = self.timed("backward", torch.Tensor.backward)
        torch.nn.utils.clip_grad_norm_ = self.timed("clip_grad_norm", torch.nn.utils.clip_grad_norm_)

    def watch_optimiser(self, trainer):
        trainer.optimiser.step = self.timed("optimiser_step", trainer.optimiser.step)

    def reset(self):
        self.seconds.clear()
        self.inner.clear()


def timed_step(clock: StageClock, trainer, step: int) -> dict[str, float]:
    clock.reset()
    start = time.perf_counter()
    grpo.grpo_step(trainer, step)
    total = time.perf_counter() - start
    row = {stage: clock.seconds.get(stage, 0.0) for stage in STAGES}
    row["the rest"] = total - sum(row.values())
    row["step"] = total
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting, after one warm-up step")
    parser.add_argument("--dtype", default="bfloat16", help="auto, float32 or bfloat16")
    parser.add_argument("--mu", type=int, default=2, help="the compared setting's passes over each batch")
    parser.add_argument("--minibatches", type=int, default=8, help="the compared setting's K")
    args = parser.parse_args()
    clock = StageClock()
    clock.install()
    settings = {"learn": config("auto", args.steps, None, None, None, args.dtype),  # real_model.py's settings
                f"mu={args.mu} K={args.minibatches}": config("auto", args.steps, None, args.mu, args.minibatches,
                                                             args.dtype)}
    trainers = {name: grpo.make_trainer(cfg) for name, cfg in settings.items()}
    for trainer in trainers.values():
        clock.watch_optimiser(trainer)
    rows = {name: [] for name in trainers}
    for step in range(args.steps + 1):
        for name, trainer in trainers.items():
            row = timed_step(clock, trainer, step)
            if step:  # step 0 is the warm-up
                rows[name].append(row)
            print(f"{name} step {step}: {row['step']:.2f} s", flush=True)
    medians = {name: {stage: statistics.median(r[stage] for r in steps) for stage in steps[0]}
               for name, steps in rows.items()}
    learn, other = medians.values()
    name = list(medians)[1]
    print(f"\nmedian of {args.steps} steps, {torch.get_num_threads()} threads, {args.dtype}; extra = {name} − learn")
    print(f"{'stage':<18}{'learn s':>9}{name + ' s':>16}{'extra s':>9}")
    for stage in (*STAGES, "the rest", "step"):
        print(f"{stage:<18}{learn[stage]:>9.2f}{other[stage]:>16.2f}{other[stage] - learn[stage]:>+9.2f}")
    print(f"{name} step / learn step: {other['step'] / learn['step']:.2f}")


if __name__ == "__main__":
    main()
