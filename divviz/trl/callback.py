"""`DivvizRunCallback`: a `transformers.TrainerCallback` that writes a TRL GRPO run as a divviz run folder.

The folder is the engine's contract (`divviz.runs.store`): `config.json`, `metrics.jsonl` appended and flushed,
`status.json` (running / done / stopped / failed, with a message and the pid), and, with `DivvizGRPOTrainer`,
per-token facts in `tokens/`. Only the main process writes. The Runs page then shows the run live, overlays it with
engine runs, exports it, and draws its tokens in the scatter.

One metrics row per GRPO step, as the engine writes them: TRL takes μ = `num_iterations` optimiser steps (times
`steps_per_generation`) per generation batch and logs every `logging_steps` of them; the callback averages what TRL
logged during one generation batch into the row of that step (the engine averages its clip fractions over μ too),
with `trl/global_step` beside it.

How a run ends: done (TRL's `on_train_end`); stopped (Ctrl-C, or SIGTERM in a divviz worker); failed with the
exception's message (with `DivvizGRPOTrainer` at once, else when the uncaught exception ends the process);
interrupted (the process died: the readers find its pid gone).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RUN_PARAMS, objective_settings
from divviz.engine.stability import Stability
from divviz.engine.step_metrics import TOKEN_SAMPLE
from divviz.losses import Objective
from divviz.runs.store import RunWriter, new_run_folder, runs_dir
from divviz.runs.train import StopRequested, writing
from divviz.trl.options import trl_objective

__all__ = ["DivvizRunCallback", "TOKEN_SAMPLE", "run_end"]

INSPECT_PROMPTS, INSPECT_BYTES = (next(p for p in RUN_PARAMS if p.name == name)
                                  for name in ("inspect_prompts", "inspect_bytes"))


def run_end(err: BaseException) -> tuple[str, str]:
    """(state, message) of a run that ended with `err`: Ctrl-C and SIGTERM stop it, anything else fails it."""
    if isinstance(err, (KeyboardInterrupt, StopRequested)):
        return "stopped", ""
    if isinstance(err, DivvizInputError):
        return "failed", str(err)
    return "failed", f"{type(err).__name__}: {err}"


class DivvizRunCallback(TrainerCallback):
    """Writes the run of a TRL `GRPOTrainer` (metrics) or `DivvizGRPOTrainer` (metrics and per-token facts) to a
    divviz run folder, from the main process only.

    runs_folder: where the run folder is made (default: $DIVVIZ_RUNS_DIR, else ./runs); folder: an existing run
    folder to write instead (divviz's own worker); config: what config.json holds (default: the run's settings read
    from the trainer's GRPOConfig and objective); task: a name shown with the run; inspect_prompts, inspect_bytes:
    how many prompts' completions `DivvizGRPOTrainer` keeps whole per step for the step inspector (0: none), and the
    byte cap of each step's record (the engine's run settings of the same names); evaluate, eval_steps: a function of
    the model giving the held-out `eval/*` metrics (`engine.evaluate`), called after each step in `eval_steps` (0:
    before the first). Every metrics row also gets the run's stability so far (`engine.stability`)."""

    def __init__(self, runs_folder: str | os.PathLike | None = None, *, folder: Path | None = None,
                 config: dict | None = None, task: str | None = None, on_row=None,
                 inspect_prompts: int = INSPECT_PROMPTS.default, inspect_bytes: int = INSPECT_BYTES.default,
                 evaluate=None, eval_steps: set[int] = frozenset()):
        self.root, self.folder, self.config = runs_dir(runs_folder), folder, config
        self.task, self.on_row = task, on_row
        self.inspect_prompts = INSPECT_PROMPTS.check(inspect_prompts, "DivvizRunCallback")
        self.inspect_bytes = INSPECT_BYTES.check(inspect_bytes, "DivvizRunCallback")
        self.objective: Objective | None = None  # DivvizGRPOTrainer sets it before training
        self.writer: RunWriter | None = None
        self._pending: list[dict] = []
        self._tokens = self._inspected = None
        self._hook = None
        self.evaluate, self.eval_steps, self.stability = evaluate, set(eval_steps), Stability()

    # -- TRL's events --------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        config = self.config or self._config(args, model)
        self.per_step = getattr(args, "num_iterations", 1) * (getattr(args, "steps_per_generation", 1) or 1)
        steps = math.ceil(state.max_steps / self.per_step)
        label = config.get("clip") or config.get("trl", {}).get("loss_type", "run")
        self.folder = self.folder or new_run_folder(self.root, f"trl-{config.get('task') or 'grpo'}-{label}")
        self.writer = RunWriter(self.folder, {**config, "steps": config.get("steps", steps)}, steps)
        self.writer.set_device(str(args.device), torch.get_num_threads())
        self._hook = sys.excepthook  # a plain GRPOTrainer's exception reaches the callback only this way
        sys.excepthook = self._excepthook
        self._evaluate(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.writer is not None and state.global_step % self.per_step == 0:
            self._evaluate(state.global_step // self.per_step, model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.writer is None or not logs or "train_runtime" in logs:  # the last call sums up the whole run
            return
        numbers = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) and not k.startswith("eval_")}
        self._pending.append(numbers)
        if state.global_step % self.per_step == 0:
            self._flush(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.writer is not None and self.writer.status["state"] == "running":
            self._flush(state.global_step)
            self.end("done", f"{self.writer.status['step']} steps")

    # -- from DivvizGRPOTrainer ----------------------------------------------------------------------------------

    def add_tokens(self, facts: dict) -> None:
        """The per-token facts of the latest last-inner-step micro-batch, written with the next metrics row."""
        self._tokens = facts

    def add_completions(self, record: dict) -> None:
        """The step inspector's record of the latest step (`completions.step_record`), written with its metrics row."""
        self._inspected = record

    def end(self, state: str, message: str = "") -> None:
        """Record how the run ended (a no-op once it has ended, and on other processes)."""
        if self.writer is None or self.writer.status["state"] != "running":
            return
        if state == "stopped" and not message:
            message = f"stopped after step {self.writer.status['step']} of {self.writer.status['steps']}"
        self.writer.finish(state, message)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._hook

    # -- inside --------------------------------------------------------------------------------------------------

    def _flush(self, global_step: int) -> None:
        if not self._pending:
            return
        keys = {k for row in self._pending for k in row}
        row = {k: sum(r[k] for r in self._pending if k in r) / sum(k in r for r in self._pending) for k in sorted(keys)}
        step = math.ceil(global_step / self.per_step)
        row.update({"step": step, "trl/global_step": global_step})
        row.update(self.stability.update(step, row))
        inspected = None if self._inspected is None else {**self._inspected, "step": step}
        with writing():  # a SIGTERM waits for the write to end (engine.train)
            self.writer.append(step, row, self._tokens, [], inspected)
        self._pending, self._tokens, self._inspected = [], None, None
        if self.on_row:
            self.on_row(row)

    def _evaluate(self, step: int, model) -> None:
        """The held-out evaluation after `step` updates (`evaluate.evaluate`), when the run asked for one then."""
        if self.evaluate is None or step not in self.eval_steps or model is None:
            return
        scores = self.evaluate(getattr(model, "module", model))  # the model itself, not a DDP wrapper
        with writing():
            self.writer.add_eval(step, scores)

    def _excepthook(self, kind, err, traceback):
        self.end(*run_end(err))
        (self._hook or sys.__excepthook__)(kind, err, traceback)

    def _config(self, args, model) -> dict:
        """config.json of a run started outside divviz: the engine's keys where TRL has the same setting."""
        objective = self.objective or trl_objective(args)
        world = args.world_size
        completions = args.per_device_train_batch_size * world * args.steps_per_generation
        return {
            "backend": "trl", "task": self.task,
            "model": getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__,
            **(objective_settings(objective) if objective else {"clip": None}),
            "prompts": completions // args.num_generations, "group_size": args.num_generations,
            "mu": args.num_iterations, "lr": args.learning_rate, "temperature": args.temperature,
            "max_new_tokens": args.max_completion_length, "seed": args.seed, "world_size": world,
            "inspect_prompts": self.inspect_prompts, "inspect_bytes": self.inspect_bytes,
            "trl": {name: getattr(args, name) for name in (
                "loss_type", "epsilon", "epsilon_high", "delta", "beta", "use_bias_correction_kl", "scale_rewards",
                "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "use_vllm",
                "bf16", "max_steps")},
        }
