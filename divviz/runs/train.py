"""The training loop around `grpo_step`: writes the run folder, and ends every run with a clear state —
done, stopped (Ctrl-C or SIGTERM, at once), or failed with a message (NaN loss, a model that will not load).
A run folder that holds a resume state (`resume.py`) goes on from it."""

from __future__ import annotations

import contextlib
import math
import signal
from pathlib import Path
from typing import Callable

import torch

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.engine.evaluate import evaluate
from divviz.engine.grpo import NonFiniteLoss, StepResult, Trainer, grpo_step, make_trainer
from divviz.engine.prompts import prompting
from divviz.engine.stability import Stability
from divviz.runs import resume
from divviz.runs.store import RunWriter, new_run_folder, read_metrics, runs_training


class StopRequested(BaseException):
    """Raised in the training thread by SIGTERM: the run ends as "stopped" with its metrics kept.

    A BaseException, like KeyboardInterrupt, so that no library's `except Exception` on the way swallows it
    (seen once: a worker kept training for minutes after SIGTERM)."""


_stop = {"writing": False, "pending": False}


def stop_on_sigterm() -> None:
    """SIGTERM raises StopRequested at once — except while the run folder is being written, where it waits for
    the write to finish (raised inside numpy's zip writer, it once turned a clean stop into a failure)."""

    def handler(signum, frame):
        if _stop["writing"]:
            _stop["pending"] = True
        else:
            raise StopRequested

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def writing():
    _stop["writing"] = True
    try:
        yield
    finally:
        _stop["writing"] = False
        if _stop["pending"]:
            _stop["pending"] = False
            raise StopRequested


def small_enough(model, limit: int = 50_000_000) -> bool:
    """Checkpoints are for small models: a real LLM's weights every few steps would fill the disk."""
    return sum(p.numel() for p in model.parameters()) <= limit


def eval_steps(cfg: RunConfig) -> set[int]:
    """The steps after which a run evaluates on the held-out set: 0 (before the first), every `eval_every`, the last;
    none when `eval_every` is 0."""
    if not cfg.eval_every:
        return set()
    return {0, cfg.steps, *range(cfg.eval_every, cfg.steps, cfg.eval_every)}


def held_out_evaluation(trainer: Trainer) -> dict[str, float]:
    """`evaluate.evaluate` of the trainer's policy at its run's temperature and completion length."""
    cfg = trainer.cfg
    return evaluate(trainer.model, trainer.tokenizer, trainer.task, trainer.prompt_format, temperature=cfg.temperature,
                    max_new_tokens=cfg.max_new_tokens, device=trainer.device, autocast=trainer.autocast)


def train(cfg: RunConfig, root: Path, *, folder: Path | None = None, trainer: Trainer | None = None,
          on_step: Callable[[StepResult], None] | None = None) -> Path:
    """Run `cfg` to the end (or until stopped or failed) and return its run folder; evaluate on the held-out set at
    `eval_steps` and add the run's stability so far (`stability.Stability`) to every metrics row."""
    folder = folder or new_run_folder(root, f"{cfg.task}-{cfg.label}")
    start = resume.saved_step(folder) if resume.can_resume(cfg) else 0
    writer = RunWriter(folder, cfg.to_dict(), cfg.steps, resume_step=start)
    evaluated, stability = eval_steps(cfg), Stability()
    try:
        trainer = trainer or make_trainer(cfg)
        writer.add_to_config({"prompting": prompting(trainer.tokenizer, trainer.task, trainer.prompt_format),
                              "precision": str(trainer.dtype or torch.float32).removeprefix("torch.")})
        writer.set_device(str(trainer.device), torch.get_num_threads())
        if start:
            resume.restore(folder, trainer)
            for row in read_metrics(folder):  # the stability record of the steps already trained
                stability.update(row["step"], row)
        elif 0 in evaluated:
            scores = held_out_evaluation(trainer)
            with writing():
                writer.add_eval(0, scores)
        for step in range(start, cfg.steps):
            result = grpo_step(trainer, step)
            result.metrics["runs_training"] = runs_training(folder.parent)
            bad = [k for k, v in result.metrics.items() if not math.isfinite(v)]
            if bad:
                raise NonFiniteLoss(f"metric '{bad[0]}' became {result.metrics[bad[0]]} at step {step + 1}")
            result.metrics.update(stability.update(step + 1, result.metrics))
            with writing():
                writer.append(step + 1, result.metrics, result.tokens, result.completions, result.inspected)
            if step + 1 in evaluated:
                scores = held_out_evaluation(trainer)
                with writing():
                    writer.add_eval(step + 1, scores)
            with writing():
                if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                    if small_enough(trainer.model):
                        writer.save_checkpoint(step + 1, trainer.model)
                    if step + 1 < cfg.steps and resume.can_resume(cfg):
                        resume.save(folder, step + 1, trainer)
            if on_step:
                on_step(result)
    except (StopRequested, KeyboardInterrupt):
        writer.finish("stopped", f"stopped after step {writer.status['step']} of {cfg.steps}")
    except (NonFiniteLoss, DivvizInputError) as err:
        writer.finish("failed", str(err))
    except Exception as err:  # noqa: BLE001 — the run folder must say what happened, whatever it was
        writer.finish("failed", f"{type(err).__name__}: {err}")
        raise
    else:
        writer.finish("done", f"{cfg.steps} steps")
        resume.forget(folder)
    return folder
