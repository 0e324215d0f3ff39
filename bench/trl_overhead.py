"""What divviz adds to TRL's step: DivvizGRPOTrainer / GRPOTrainer, same settings, steps alternating.

Both train the same built-in model (a fresh copy each) on the same prompts with the same loss: TRL's box ε = 0.2
(`loss_type="dapo"`) and divviz's `ratio` ε = 0.2 with aggregation dapo, μ = 2 (`num_iterations`), the medium
setting of bench/grpo_step.py (64 prompts × 16 completions, 16 tokens), bf16=False on the CPU. Each has a
`DivvizRunCallback` writing its run folder, so the ratio is what the divviz trainer itself adds: its loss
through `policy_loss`, its extra per-token metrics and the hand-over of per-token facts. Target: ≤ 1.05.

The two trainers run in two threads that take turns (each waits at `on_step_begin` for its turn and passes it on
at `on_step_end`), so exactly one computes at a time and both see the same load on a shared machine. A GRPO
step is μ optimiser steps (generation happens in the first); the first GRPO step of each is a warm-up.

    python bench/trl_overhead.py [--steps N] [--prompts P --group G --tokens T]
"""

import argparse
import statistics
import tempfile
import threading
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from divviz.divergences import clip_test
from divviz.engine.model import builtin_policy
from divviz.engine.tasks import get_task
from divviz.losses import Objective
from divviz.trl import DivvizGRPOTrainer, DivvizRunCallback

TASK, MU = get_task("reverse"), 2


class Turns:
    """Two trainers, one turn: `wait(name)` blocks until it is `name`'s turn; `done(name)` hands the turn over."""

    def __init__(self, names):
        self.names, self.turn, self.finished, self.cond = names, names[0], set(), threading.Condition()

    def wait(self, name):
        with self.cond:
            self.cond.wait_for(lambda: self.turn == name or self.finished - {name})

    def done(self, name, last=False):
        with self.cond:
            if last:
                self.finished.add(name)
            self.turn = next(n for n in self.names if n != name)
            self.cond.notify_all()


class Timed(TrainerCallback):
    def __init__(self, name, turns, times):
        self.name, self.turns, self.times = name, turns, times

    def on_step_begin(self, args, state, control, **kwargs):
        self.turns.wait(self.name)
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
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
        threads = [threading.Thread(target=t.train) for t in trainers.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    per_step = {name: [sum(v[i:i + MU]) for i in range(MU, len(v), MU)] for name, v in times.items()}
    trl, divviz = (statistics.median(per_step[k]) for k in ("TRL", "divviz"))
    print(f"{'':<10} {'median s per GRPO step':>24} {'steps':>6}")
    for name, value in (("TRL", trl), ("divviz", divviz)):
        print(f"{name:<10} {value:>24.3f} {len(per_step[name]):>6}")
    print(f"DivvizGRPOTrainer / GRPOTrainer = {divviz / trl:.3f}   (target ≤ 1.05)")


if __name__ == "__main__":
    main()
