"""Make the shipped built-in models (seed 0, one per task) under divviz/engine/builtin/.

    python scripts/make_builtin.py

Deterministic: the same code and seed give the same weights. Prints each model's sampled accuracy (τ = 1)
on 512 fresh prompts, the starting point GRPO improves on.
"""

import shutil
from contextlib import nullcontext

import torch

from divviz.engine.policy import SHIPPED, _fingerprint, _warm_start, save_builtin
from divviz.engine.rollout import decode_completions, encode_prompts, sample
from divviz.engine.tasks import TASKS


def sampled_accuracy(model, tokenizer, task, n=512) -> float:
    pairs = task.batch(seed=10_000, n=n)
    ids, mask = encode_prompts(tokenizer([p for p, _ in pairs])["input_ids"], tokenizer.pad_token_id, 1, "cpu")
    out = sample(model, ids, mask, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, max_new_tokens=12,
                 temperature=1.0, generator=torch.Generator().manual_seed(0), autocast=nullcontext)
    texts = decode_completions(tokenizer, out)
    return sum(task.correct(p, a, c) for (p, a), c in zip(pairs, texts)) / n


def main():
    shutil.rmtree(SHIPPED, ignore_errors=True)
    SHIPPED.mkdir(parents=True)
    for task in TASKS.values():
        model, tokenizer = _warm_start(task, seed=0)
        save_builtin(model, SHIPPED / f"builtin-{task.name}-{_fingerprint(task.name, 0)}")
        print(f"{task.name:<10} sampled accuracy {sampled_accuracy(model, tokenizer, task):.3f}")


if __name__ == "__main__":
    main()
