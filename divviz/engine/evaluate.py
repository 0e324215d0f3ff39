"""Held-out evaluation during training, as verl's `test_freq` and TRL's evaluation do: the task's fixed held-out
problems (`Task.held_out`, never in a training batch) answered by the policy as it is, without gradients.

    eval/accuracy          share answered correctly, sampled at the run's temperature τ, with
    eval/accuracy_low      its Wilson 95% interval (`metrics.proportion`)
    eval/accuracy_high
    eval/accuracy_greedy   the same answering greedily (argmax at each token), with _low and _high
    eval/mean_length       mean sampled completion length in tokens
    eval/n                 problems evaluated
    eval/time              seconds the evaluation took

The sampled evaluation draws from one fixed seed (`EVAL_SEED`) every time, so two evaluations differ only by the
policy, and every run starts from the same step-0 figures as the other runs of its model and task. Completions are
generated in batches of `EVAL_BATCH` with the KV cache, as training samples them, each batch's prompts prefilled once
for both ways (`rollout.sample_ways`): the same completions, to the bit, as sampling every batch at τ and then every
batch greedily, since the greedy way draws nothing from the generator.
"""

from __future__ import annotations

import time

import torch

from divviz.engine.prompts import prompt_ids
from divviz.engine.rollout import decode_completions, encode_prompts, sample_ways
from divviz.engine.tasks import Task
from divviz.metrics import proportion

EVAL_BATCH = 64
EVAL_SEED = 20_261_126
WAYS = (False, True)  # each batch sampled at τ, then greedily, from one prefill (`rollout.sample_ways`)


def evaluate(model, tokenizer, task: Task, prompt_format: str, *, temperature: float, max_new_tokens: int,
             device: torch.device, autocast) -> dict[str, float]:
    """The `eval/*` metrics of `model` on `task`'s held-out problems (see the module docstring)."""
    start = time.perf_counter()
    problems = task.held_out()
    asked = prompt_ids(tokenizer, task, [prompt for prompt, _ in problems], prompt_format)
    chat = prompt_format == "chat"
    generator = torch.Generator(device=device).manual_seed(EVAL_SEED)
    was_training = model.training
    model.eval()
    correct, tokens = {False: 0, True: 0}, 0.0
    for first in range(0, len(problems), EVAL_BATCH):
        chunk = problems[first:first + EVAL_BATCH]
        ids, mask = encode_prompts(asked[first:first + EVAL_BATCH], tokenizer.pad_token_id, 1, device)
        rollouts = sample_ways(model, ids, mask, WAYS, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                               max_new_tokens=max_new_tokens, temperature=temperature, generator=generator,
                               autocast=autocast)
        for greedy, rollout in zip(WAYS, rollouts):
            texts = decode_completions(tokenizer, rollout)
            correct[greedy] += sum(task.is_correct(prompt, answer, text, chat)
                                   for (prompt, answer), text in zip(chunk, texts))
            if not greedy:
                tokens += float(rollout.completion_mask.sum())
    model.train(was_training)
    n = len(problems)
    metrics = {"eval/n": float(n), "eval/mean_length": tokens / n}
    for greedy, name in ((False, "eval/accuracy"), (True, "eval/accuracy_greedy")):
        share, low, high = proportion(correct[greedy], n)
        metrics.update({name: share, f"{name}_low": low, f"{name}_high": high})
    metrics["eval/time"] = time.perf_counter() - start
    return metrics
