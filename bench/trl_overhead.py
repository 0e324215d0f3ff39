"""What divviz adds to TRL's step: DivvizGRPOTrainer / GRPOTrainer, same settings, steps alternating.

Both train the same built-in model (a fresh copy each) on the same prompts with the same loss: TRL's box ε = 0.2
(`loss_type="dapo"`) and divviz's `ratio` ε = 0.2 with aggregation dapo, μ = 2 (`num_iterations`), the medium
setting of bench/grpo_step.py (64 prompts × 16 completions, 16 tokens), bf16=False on the CPU. Each has a
`DivvizRunCallback` writing its run folder, so the ratio is what the divviz trainer itself adds: its loss
through `policy_loss`, its extra per-token metrics and the hand-over of per-token facts. Target: ≤ 1.05.

The two trainers run in two threads that take turns of one GRPO step (μ optimiser steps; generation happens in the
first) in the order A B B A A B B A …, so exactly one computes at a time, both see the same load on a shared
machine, and each is first of a pair as often as second. The first GRPO step of each is a warm-up. Printed: the
ratio of the median step times, and the median of the ratios of the two trainers' i-th steps (taken one after the
other, so they share the machine's state of the moment). Then, because whole steps on this VM wander by ±10%
(mostly in generation, which both share), the part the override replaces alone: `_compute_loss` and its
backward on one generation batch of the run, both trainers in turn (A B B A …), 20 times each, the divviz one at
its last inner step (so it also hands over the per-token facts).

    python bench/trl_overhead.py [--steps N] [--prompts P --group G --tokens T]
"""

import argparse
import statistics
import tempfile
import sys
import threading
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from divviz.catalogue.divergences import clip_test
from divviz.engine.policy import builtin_policy
from divviz.engine.tasks import get_task
from divviz.losses import Objective
from divviz.trl import DivvizGRPOTrainer, DivvizRunCallback

TASK, MU = get_task("reverse"), 2


class Turns:
    """Two trainers take turns of one GRPO step each, in the order A B B A A B B A … (each is first of a pair as
    often as second: taking the first turn of a pair cost ~10% here). `wait(name)` blocks until it is `name`'s
    turn; `done(name)` passes it on."""

    def __init__(self, names):
        self.order, self.turns, self.finished, self.cond = [*names, *names[::-1]], 0, set(), threading.Condition()

    def wait(self, name):
        with self.cond:
            self.cond.wait_for(lambda: self.order[self.turns % 4] == name or self.finished - {name})

    def done(self, name, last=False):
        with self.cond:
            self.finished |= {name} if last else set()
            self.turns += 1
            self.cond.notify_all()


class Timed(TrainerCallback):
    """Times each GRPO step (μ optimiser steps, one turn) of one trainer."""

    def __init__(self, name, turns, times):
        self.name, self.turns, self.times = name, turns, times

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step % MU == 0:
            self.turns.wait(self.name)
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % MU == 0:
            self.times.append(time.perf_counter() - self.start)
            self.turns.done(self.name)

    def on_train_end(self, args, state, control, **kwargs):
        self.turns.done(self.name, last=True)


def trainer(cls, prompts, group, tokens, steps, out, callbacks, **kwargs):
    model, tokenizer = builtin_policy(TASK)
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, prompts * steps)])
    reward = lambda prompts, completions, answer, **_: [TASK.reward(p, a, c) for p, c, a in  # noqa: E731
                                                         zip(prompts, completions, answer)]
    config = GRPOConfig(output_dir=out, per_device_train_batch_size=prompts * group, num_generations=group,
                        max_completion_length=tokens, num_iterations=MU, max_steps=steps * MU, beta=0.0, bf16=False,
                        use_cpu=True, gradient_checkpointing=False, learning_rate=2e-3, loss_type="dapo",
                        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                        shuffle_dataset=False, dataloader_num_workers=0)
    return cls(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
               callbacks=callbacks, **kwargs)


def time_loss_alone(trainers, repeats=20) -> dict[str, list[float]]:
    """Seconds of `_compute_loss` + backward of each trainer on TRL's last generation batch, in turns A B B A …"""
    batch = trainers["TRL"]._buffered_inputs[0]
    trainers["divviz"]._step = MU - 1  # the last inner step: the per-token facts are handed over too
    times = {name: [] for name in trainers}
    for i in range(repeats):
        for name in (["TRL", "divviz"] if i % 2 else ["divviz", "TRL"]):
            trainer = trainers[name]
            start = time.perf_counter()
            trainer._compute_loss(trainer.model, dict(batch)).backward()
            times[name].append(time.perf_counter() - start)
            trainer.model.zero_grad(set_to_none=True)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps each, after one warm-up")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; {args.prompts} prompts × {args.group}, "
          f"{args.tokens} tokens, μ = {MU}")
    turns, times = Turns(["TRL", "divviz"]), {"TRL": [], "divviz": []}
    with tempfile.TemporaryDirectory() as out:
        shape = (args.prompts, args.group, args.tokens, args.steps + 1, out)
        trainers = {
            "TRL": trainer(GRPOTrainer, *shape, [Timed("TRL", turns, times["TRL"]), DivvizRunCallback(out)]),
            "divviz": trainer(DivvizGRPOTrainer, *shape, [Timed("divviz", turns, times["divviz"]),
                                                          DivvizRunCallback(out)],
                              objective=Objective(clip=clip_test("ratio", eps=0.2), aggregation="dapo")),
        }
        died = {}

        def train(name):
            try:
                trainers[name].train()
            except BaseException as err:  # noqa: BLE001 — said below; the other trainer must not wait for it
                died[name] = err
                turns.done(name, last=True)

        threads = [threading.Thread(target=train, args=(name,)) for name in trainers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if died:
            sys.exit("; ".join(f"bench/trl_overhead.py: the {name} trainer died: {type(err).__name__}: {err}"
                               for name, err in died.items()))
        loss_times = time_loss_alone(trainers)
    per_step = {name: v[1:] for name, v in times.items()}
    trl, divviz = (statistics.median(per_step[k]) for k in ("TRL", "divviz"))
    paired = statistics.median(d / t for d, t in zip(per_step["divviz"], per_step["TRL"]))
    print(f"{'':<10} {'median s per GRPO step':>24} {'steps':>6}")
    for name, value in (("TRL", trl), ("divviz", divviz)):
        print(f"{name:<10} {value:>24.3f} {len(per_step[name]):>6}")
    print(f"DivvizGRPOTrainer / GRPOTrainer: {divviz / trl:.3f} (ratio of medians), {paired:.3f} (median of the "
          f"ratios of steps taken side by side)   target ≤ 1.05")
    loss_trl, loss_divviz = (statistics.median(loss_times[k]) for k in ("TRL", "divviz"))
    print(f"the loss and its backward alone: TRL {loss_trl:.3f} s, divviz {loss_divviz:.3f} s, "
          f"ratio {loss_divviz / loss_trl:.3f}")


if __name__ == "__main__":
    main()
