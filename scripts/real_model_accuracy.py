"""The starting policy's sampled accuracy on each task: where GRPO has signal from the first step.

For SmolLM2-135M-Instruct (or `--model`), each task's chat form (the question through the template, the task's
extractor, its exact checker), `--prompts` problems of a fixed seed × `--group` samples each, at each temperature;
the share correct with its 95% Wilson interval (`evidence.intervals.proportion`), how many replies ended within the
token budget, and the seconds the sampling took. Sampling is divviz's own (`engine.rollout.sample`, the KV cache).

    python scripts/real_model_accuracy.py [--tasks add,sort,reverse,countdown] [--temperatures 0.5,0.7,1.0]
                                          [--prompts 64] [--group 4] [--max-new-tokens 24]
"""

import argparse
import time
from contextlib import nullcontext

import torch

from divviz.engine.policy import load_policy, pick_device
from divviz.engine.prompts import prompt_ids, resolve_format
from divviz.engine.rollout import decode_completions, encode_prompts, sample
from divviz.engine.smollm2 import NAME
from divviz.engine.tasks import TASKS
from divviz.evidence.intervals import proportion


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=NAME)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--temperatures", default="0.7")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=123)
    args = parser.parse_args()
    device = pick_device("auto")
    print(f"{args.model} on {device}: {args.prompts} problems × {args.group} samples, {args.max_new_tokens} new tokens, "
          f"problem seed {args.seed}")
    print(f"{'task':<10} {'τ':>4} {'n':>5} {'accuracy':>9} {'95% interval':>16} {'ended':>6} {'seconds':>8}")
    for name in args.tasks.split(","):
        task = TASKS[name]
        model, tokenizer = load_policy(args.model, task)
        model.to(device)
        fmt = resolve_format("auto", tokenizer)
        pairs = task.batch(seed=args.seed, n=args.prompts)
        ids, mask = encode_prompts(prompt_ids(tokenizer, task, [p for p, _ in pairs], fmt), tokenizer.pad_token_id,
                                   args.group, device)
        for temperature in (float(t) for t in args.temperatures.split(",")):
            start = time.perf_counter()
            rollout = sample(model, ids, mask, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                             max_new_tokens=args.max_new_tokens, temperature=temperature,
                             generator=torch.Generator(device=device).manual_seed(0),
                             autocast=(lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda"
                             else nullcontext)
            seconds = time.perf_counter() - start
            texts = decode_completions(tokenizer, rollout)
            right = sum(task.is_correct(p, a, text, fmt == "chat")
                        for (p, a), text in zip([q for q in pairs for _ in range(args.group)], texts))
            share, low, high = proportion(right, len(texts))
            ended = float((rollout.completion_ids == tokenizer.eos_token_id).any(1).float().mean())
            print(f"{name:<10} {temperature:>4g} {len(texts):>5} {share:>9.3f} {f'[{low:.3f}, {high:.3f}]':>16} "
                  f"{ended:>6.2f} {seconds:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
