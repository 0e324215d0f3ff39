"""The run pages' words about a run (Training lab, Runs, Step inspector): its label in a legend and in a list, its
task, its progress line while it is queued or trains (its place in the queue, what it is doing before its first step,
its time left, a busy machine's share of the CPU), the inspector's kept steps, and durations in plain numbers."""

from __future__ import annotations

import os
import re
import time

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import config_label, setting_of
from divviz.runs import runner, store
from divviz.runs.pool import worker_threads
from divviz.runs.processes import cpu_share
from divviz.runs.runner import TIMING
from divviz.safetext import literal


def run_label(run, unique: bool = False) -> str:
    """A legend label for a run: its objective, where it came from when not divviz's engine ("(TRL)", "· imported
    (unipo)"), and with `unique` its folder's own id (`folder_id`)."""
    try:
        label = config_label(run.config)
    except (DivvizInputError, TypeError, AttributeError):  # a config written by another version, or none
        return run.name
    if run.config.get("backend") == "trl":
        label = f"{label} (TRL)"
    if run.config.get("backend") == "import":  # its file's format, as `importers.source.source_config` keeps it
        source = run.config.get("source") if isinstance(run.config.get("source"), dict) else {}
        label = f"{label} · imported ({source.get('format', 'unknown format')})"
    return f"{label} · {folder_id(run.name)}" if unique else label


def folder_id(name: str) -> str:
    """The random id that ends a folder `store.new_run_folder` made ("…-0bc013"), else the whole name (a published
    run's "mu4-K8-lr5e-5-ppo", whose last six characters name nothing)."""
    return name[-6:] if re.fullmatch(r".+-[0-9a-f]{6}", name) else name


def task_label(config: dict) -> str:
    """A run's task as lists show it, with "random reward" where the task's checker did not give the rewards ("task
    not given" where its config names none, as an imported file may not)."""
    task = config.get("task") or "task not given"
    return f"{task} (random reward)" if config.get("reward") == "random" else task


def run_choice(run) -> str:
    """A run as a list shows it: its measure, model (and the model's setting) and task, seed, state and steps
    ("kl3 δ=0.05 · add · seed 1 · done, 20 steps · 20261125-143529", "ratio ε=0.2 · smollm2-135m · stress · add · …"),
    so runs are picked by what they are, not by their folder's name. An imported run has no seed (its file gives
    none): its label says "imported (format)" instead."""
    config = run.config
    setting = setting_of(config)
    model = ("" if config.get("model", "builtin") == "builtin"
             else f"{config.get('model')} · {f'{setting} · ' if setting else ''}")
    seed = "" if config.get("backend") == "import" else f"seed {config.get('seed', '?')} · "
    timing = "timing run · " if run.status.get("kind") == TIMING else ""
    return (f"{timing}{run_label(run)} · {model}{task_label(config)} · {seed}{run.state}, "
            f"{run.step} step{'s' if run.step != 1 else ''} · {run.name[:15]}")


def progress_text(run, rows: list[dict], now: float) -> str:
    """The lab's line for one of its runs (Markdown, the label escaped): queued, its place in the queue and when it
    starts; before its first step, what it is doing; else its step, time, speed, device and time left, or the final
    evaluation it is answering; and, while it trains, when it gets too little of the CPU (`starved_text`)."""
    timing = "timing run · " if run.status.get("kind") == TIMING else ""
    label = f"**{timing}{literal(run_label(run))} · seed {run.config.get('seed')}**"
    if run.state == "queued":
        ahead, eta = runner.queue_position(run.folder)
        slots = runner.max_runs()
        return (f"{label} — queued, {ahead} ahead" + (f", starts in about {duration(eta)}" if eta is not None else "")
                + f" (this machine trains {slots} run{'s' if slots != 1 else ''} at a time)")
    started = run.status.get("started", now)
    if not rows:
        return f"{label} — {run.state}, {before_first_step(run, now - started)}{starved_text(run)}"
    elapsed = run.status.get("updated", now) - started
    if run.state == "running" and run.step >= run.steps and int(run.config.get("eval_every") or 0) > 0:
        return (f"{label} — running, step {run.step}/{run.steps}, answering its held-out problems after the last "
                f"step ({duration(now - run.status.get('updated', now))} so far){starved_text(run)}")
    return (f"{label} — {run.state}, step {run.step}/{run.steps}, {elapsed:.0f} s, "
            f"{rows[-1].get('tokens_per_s', 0):.0f} tokens/s on {literal(run.status.get('device') or '…')}"
            + (" (a Ray worker)" if run.status.get("executor") == "ray" else "")
            + time_left_text(run, elapsed) + starved_text(run))


STARVED_AFTER_S = 30.0  # a run's share of the CPU is judged once it has been alive this long


STARVED_SHARE = 0.5  # of the cores its threads could use


def starved_text(run) -> str:
    """For a running run whose process has had under half the CPU its threads could use since it started
    (`processes.cpu_share`): that the machine is busy, that the app's pool trains below the user's own work, and
    how to give it an even share; "" otherwise (and for a run not yet alive `STARVED_AFTER_S`)."""
    if run.state != "running" or time.time() - run.status.get("started", time.time()) < STARVED_AFTER_S:
        return ""
    share = cpu_share(run.status)
    threads = run.status.get("threads") or worker_threads()
    if share is None or share >= STARVED_SHARE * min(threads, os.cpu_count() or 1):
        return ""
    return (f". It has had {share:.0%} of a core since it started: this machine is busy with other work, and the "
            "app's pool trains below the priority of your own work so that the app stays quick. To give training "
            "an even share, start the app with `DIVVIZ_POOL_PRIORITY=normal` (docs/workshop.md)")


def kept_steps_label(steps: list[int]) -> str:
    """The Step inspector's step slider's label: which steps the run kept, "Step (3 kept: 1, 15, 30)", so that a
    slider between 1 and 30 does not read as 30 steps to choose from."""
    kept = ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}, {steps[1]}, …, {steps[-1]}"
    return f"Step ({len(steps)} kept: {kept})"


def time_left_text(run, elapsed: float) -> str:
    """", about 4 min left at its pace" for a running run: its steps to go at the wall time per step so far
    (evaluations included); "" otherwise."""
    if run.state != "running" or not run.step or run.step >= run.steps:
        return ""
    return f", about {duration((run.steps - run.step) * elapsed / run.step)} left at its pace so far"


def before_first_step(run, elapsed: float) -> str:
    """What a run that has trained no step is doing, in words, `elapsed` seconds after it started: loading its model
    and answering its held-out problems before the first step (a SmolLM2 run's first evaluation takes minutes on a
    CPU, with no step to show), or sampling that step; "no step trained yet" when it is not running."""
    if run.state != "running":
        return "no step trained yet"
    evaluates = int(run.config.get("eval_every") or 0) > 0
    if evaluates and not store.read_evals(run.folder):
        return (f"loading the model, then answering its held-out problems before the first step ({duration(elapsed)} "
                "so far; this evaluation comes before any update, so the bars stay empty until it is done)")
    return f"loading the model and sampling the first step's completions ({duration(elapsed)} so far)"


def duration(seconds: float) -> str:
    """"40 s", "3 min", "1 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def seconds_text(seconds: float) -> str:
    """A few seconds in plain numbers: "0.42 s", "8.7 s", "87 s", "174 s"."""
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def timed_beside(side_by_side: int | None) -> str:
    """How a step time was measured: alone, or beside how many other runs (`runs_training`)."""
    if side_by_side is None:
        return "whether other runs trained beside it was not recorded"
    return "timed alone" if side_by_side <= 1 else f"timed while {side_by_side} runs trained side by side"
