"""`divviz train --backend trl`: a divviz run configuration trained by `DivvizGRPOTrainer` on TRL's loop.

The same settings mean the same things as in divviz's engine: step s samples the same prompts (the task's batch of
step s, in order), G completions each; μ → `num_iterations`; the task's exact checker is the reward (and, with
weight 0, `accuracy`); AdamW without weight decay at a constant learning rate. Under
`accelerate launch --multi_gpu --num_processes N -m divviz train --backend trl …` (or `torchrun --nproc-per-node N
-m divviz …`; on CPUs add `--device cpu`: the processes then join a gloo group) each process takes 1/N of the completions
and TRL gathers what it logs; the main process writes the one run folder.
"""

from __future__ import annotations

import contextlib
import tempfile
from functools import partial
from pathlib import Path

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import PrinterCallback
from trl import GRPOConfig

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.engine.evaluate import evaluate
from divviz.engine.grpo import NonFiniteLoss
from divviz.engine.policy import load_policy, pick_device, pick_dtype, train_last_blocks
from divviz.engine.prompts import prompting, resolve_format
from divviz.engine.tasks import Task, get_task
from divviz.runs.train import StopRequested, eval_steps
from divviz.trl.callback import DivvizRunCallback
from divviz.trl.options import trl_loss_type
from divviz.trl.trainer import DivvizGRPOTrainer


def prompt_dataset(task: Task, cfg: RunConfig, fmt: str) -> Dataset:
    """Every step's prompts in step order, as the engine samples them (`make_batch`), with their answers and compact
    form: in the chat format a conversation of one user message, which TRL puts through the chat template as the
    engine does (`prompts.prompt_ids`)."""
    rows = [{"prompt": prompt if fmt == "compact" else [{"role": "user", "content": task.question(prompt)}],
             "compact": prompt, "answer": answer} for step in range(cfg.steps)
            for prompt, answer in task.batch(seed=cfg.seed * 1_000_003 + step, n=cfg.prompts)]
    return Dataset.from_list(rows)


def task_rewards(task: Task, format_reward: float, chat: bool) -> list:
    """TRL reward functions: the task's reward, and its checker's verdict (logged as rewards/accuracy/mean); a chat
    completion (a list of messages) is judged on its reply's text, through the task's extractor."""

    def text(completion) -> str:
        return completion if isinstance(completion, str) else completion[-1]["content"]

    def reward(completions, answer, compact, **_):
        return [task.reward(p, a, text(c), format_reward, chat) for p, c, a in zip(compact, completions, answer)]

    def accuracy(completions, answer, compact, **_):
        return [float(task.is_correct(p, a, text(c), chat)) for p, c, a in zip(compact, completions, answer)]

    return [reward, accuracy]


def grpo_config(cfg: RunConfig, processes: int, device: torch.device, output_dir: str) -> GRPOConfig:
    """TRL's settings for `cfg`, with 1/`processes` of each step's completions per process, in K = `minibatches`
    optimiser steps per pass (`steps_per_generation`), at the run's precision (`policy.pick_dtype`)."""
    completions = cfg.prompts * cfg.group_size
    if completions % (processes * cfg.minibatches):
        raise DivvizInputError(f"prompts × group_size = {completions} completions per step do not split evenly over "
                               f"{processes} processes × {cfg.minibatches} mini-batches")
    return GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=completions // processes // cfg.minibatches,
        gradient_accumulation_steps=1, steps_per_generation=cfg.minibatches, num_generations=cfg.group_size,
        num_iterations=cfg.mu, max_steps=cfg.steps * cfg.mu * cfg.minibatches,
        learning_rate=cfg.lr, lr_scheduler_type="constant", weight_decay=0.0, optim="adamw_torch",
        max_grad_norm=cfg.max_grad_norm, top_entropy_quantile=cfg.top_entropy_quantile, temperature=cfg.temperature,
        max_completion_length=cfg.max_new_tokens, seed=cfg.seed, loss_type=trl_loss_type(cfg.objective),
        scale_rewards=cfg.scale_rewards, shuffle_dataset=False, reward_weights=[1.0, 0.0],
        use_cpu=device.type == "cpu", bf16=pick_dtype(cfg.dtype, device, cfg.model) == torch.bfloat16,
        gradient_checkpointing=False, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0)


def process_state(cfg: RunConfig) -> PartialState:
    """This process's place in the run (accelerate's state, made once per process): on the CPU, the processes
    that `accelerate launch --multi_gpu` or `torchrun` started join one gloo group; on GPUs, NCCL."""
    return PartialState(cpu=pick_device(cfg.device).type == "cpu")


def train(cfg: RunConfig, root: Path, *, folder: Path | None = None, on_row=None) -> Path | None:
    """Train `cfg` with `DivvizGRPOTrainer`; returns the run folder on the main process (None on the others).

    Bad settings and a model that will not load raise `DivvizInputError` before a run folder exists. A run that
    fails later, or is stopped (Ctrl-C, SIGTERM), ends with that state in its folder, as the engine's do."""
    task, device, processes = get_task(cfg.task), pick_device(cfg.device), process_state(cfg).num_processes
    model, tokenizer = load_policy(cfg.model, task, seed=0, trust_remote_code=cfg.trust_remote_code)
    fmt = resolve_format(cfg.prompt_format, tokenizer)
    train_last_blocks(model, cfg.trainable_blocks)
    dtype = pick_dtype(cfg.dtype, device, cfg.model)
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    held_out = partial(evaluate, tokenizer=tokenizer, task=task, prompt_format=fmt, temperature=cfg.temperature,
                       max_new_tokens=cfg.max_new_tokens, device=device, autocast=autocast)
    callback = DivvizRunCallback(root, folder=folder, config={**cfg.to_dict(), "prompting": prompting(tokenizer, task, fmt),
                                                             "precision": str(dtype or torch.float32).removeprefix("torch.")},
                                 on_row=on_row, inspect_prompts=cfg.inspect_prompts, inspect_bytes=cfg.inspect_bytes,
                                 evaluate=held_out if cfg.eval_every else None, eval_steps=eval_steps(cfg))
    with tempfile.TemporaryDirectory(prefix="divviz-trl-") as output_dir:
        trainer = DivvizGRPOTrainer(model=model, reward_funcs=task_rewards(task, cfg.format_reward, fmt == "chat"),
                                    args=grpo_config(cfg, processes, device, output_dir),
                                    train_dataset=prompt_dataset(task, cfg, fmt), processing_class=tokenizer,
                                    callbacks=[callback], objective=cfg.objective)
        trainer.remove_callback(PrinterCallback)  # it prints every log line; the CLI shows a progress bar
        try:
            trainer.train()
        except (StopRequested, KeyboardInterrupt, NonFiniteLoss, DivvizInputError):
            pass  # the run folder says how it ended
    return callback.folder
