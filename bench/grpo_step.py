"""One GRPO step, three ways, side by side in one run: divviz, TRL's GRPOTrainer, and a bare loop.

Same built-in model (fresh copy each), tokenizer, task, prompts × G, completion length, μ = 1, AdamW, on
the CPU. Targets (issue: backend): divviz ≤ 0.5× TRL and ≤ 1.25× bare.

    (a) divviz   `divviz.engine.grpo.grpo_step`, the whole call: sample, rewards, advantages, the loss with its
                 per-token facts, and every metric (incl. the extra no-grad forward for KL and mass reallocation)
    (b) TRL      `trl.GRPOTrainer.train` with bf16=False, use_cpu=True, gradient_checkpointing=False, beta=0,
                 loss_type="dapo" (divviz uses aggregation="dapo" too); step time from a callback
    (c) bare     the same KV-cached sampler and one forward/backward of −A·log π, nothing else

Each figure is the median over the steps after one warm-up step. The three alternate step by step (TRL's
trainer owns its loop; a callback runs a divviz and a bare step after each of TRL's), so that all three see
the same load on a shared machine.

    pip install trl   # not a dependency of divviz; keeps torch as it is
    python bench/grpo_step.py [--steps N]
"""

import argparse
import random
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch

from divviz.catalogue.aggregation import group_advantages
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_trainer
from divviz.engine.policy import builtin_policy
from divviz.engine.rollout import completion_logps, decode_completions, encode_prompts, sample
from divviz.engine.tasks import get_task

TASK = "reverse"
SETTINGS = {"small (16 prompts × 8, 8 tokens)": (16, 8, 8), "medium (64 prompts × 16, 16 tokens)": (64, 16, 16)}


def divviz_step(prompts, group, tokens, steps):
    """A function running divviz's step `s` and returning its wall time."""
    cfg = RunConfig.make(task=TASK, prompts=prompts, group_size=group, max_new_tokens=tokens, mu=1, steps=steps,
                         clip="ratio", aggregation="dapo", device="cpu")
    trainer = make_trainer(cfg)

    def step(s):
        start = time.perf_counter()
        grpo_step(trainer, s)
        return time.perf_counter() - start
    return step


def bare_step(prompts, group, tokens):
    """A function running the bare loop's step `s` and returning its wall time."""
    task = get_task(TASK)
    model, tok = builtin_policy(task)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0, foreach=True)

    def step(s):
        start = time.perf_counter()
        pairs = task.batch(s, prompts)
        ids, mask = encode_prompts(tok([p for p, _ in pairs])["input_ids"], tok.pad_token_id, group, "cpu")
        rollout = sample(model, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_new_tokens=tokens,
                         temperature=1.0, generator=torch.Generator().manual_seed(s), autocast=nullcontext)
        done = decode_completions(tok, rollout)
        rewards = torch.tensor([task.reward(p, a, c) for (p, a), c in zip([q for q in pairs for _ in range(group)], done)])
        adv = group_advantages(rewards.view(prompts, group), True).reshape(-1, 1)
        logp = completion_logps(model, rollout, 1.0, nullcontext)
        loss = -(adv * logp).sum() / rollout.completion_mask.sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        return time.perf_counter() - start
    return step


def time_side_by_side(prompts, group, tokens, steps):
    """Step times of TRL, divviz and bare, all three alternating: TRL's trainer owns its loop, so after each of
    its steps a callback runs one divviz step and one bare step. Step 0 of each is a warm-up, not counted."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = get_task(TASK)
    model, tok = builtin_policy(task)
    rng = random.Random(0)
    rows = [dict(zip(("prompt", "answer"), task.make(rng))) for _ in range(prompts * (steps + 2))]
    data = Dataset.from_list([{"prompt": "<bos>" + r["prompt"], "answer": r["answer"]} for r in rows])
    others = {"divviz": divviz_step(prompts, group, tokens, steps), "bare": bare_step(prompts, group, tokens)}
    times = {"TRL": [], "divviz": [], "bare": []}

    def reward(prompts, completions, answer, **_):
        return [task.reward(p[5:], a, c) for p, c, a in zip(prompts, completions, answer)]

    class SideBySide(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times["TRL"].append(time.perf_counter() - self.start)
            for name, step in others.items():
                times[name].append(step(state.global_step - 1))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=prompts * group, num_generations=group,
                            max_completion_length=tokens, num_iterations=1, beta=0.0, bf16=False, use_cpu=True,
                            gradient_checkpointing=False, learning_rate=2e-3, loss_type="dapo", temperature=1.0,
                            max_steps=steps + 1, logging_steps=1, report_to="none", save_strategy="no",
                            disable_tqdm=True, seed=0, dataloader_num_workers=0)
        GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                    callbacks=[SideBySide()]).train()
    return {name: values[1:] for name, values in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    print(f"{'setting':<38} {'divviz s':>9} {'TRL s':>8} {'bare s':>8} {'divviz/TRL':>11} {'divviz/bare':>12}")
    for name, (prompts, group, tokens) in SETTINGS.items():
        times = time_side_by_side(prompts, group, tokens, args.steps)
        d, t, b = (statistics.median(times[k]) for k in ("divviz", "TRL", "bare"))
        print(f"{name:<38} {d:>9.3f} {t:>8.3f} {b:>8.3f} {d / t:>11.2f} {d / b:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
