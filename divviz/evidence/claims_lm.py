"""The claims on the built-in LM: the comparisons each claim declares in `lm_comparisons`, trained by divviz's engine
on the `reverse` task with the lab's default settings, `seeds` runs per measure on the same seeds.

Each run is an ordinary run of the runs folder, queued to its pool like the Training lab's: it shares the machine's
limit with everyone's runs, shows on the Runs page, and survives a restart. A finished run is the cache: a run whose
config.json equals a cell's config is read, not trained again (a run that failed, e.g. diverged, is a result too;
a stopped or interrupted one is queued again).

Readings: the mean of a metric over an early window (steps T/6 + 1 … T/3) and over the last T/6 steps, paired seed by
seed; a seed whose candidate or baseline run failed drops out of the pair, so n says how many remain.

    plan = LMPlan.read(root, seeds=8, steps=60)   # which runs exist
    plan.queue_missing(owner)                    # queue the others (returns at once)
    rows = plan.rows()                           # once plan.finished: the report's cells
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from divviz.evidence import claims, intervals
from divviz.engine import runner, store
from divviz.engine.config import RunConfig, objective_settings
from divviz.engine.models import BUILTIN, model_defaults
from divviz.catalogue.params import DivvizInputError, Param

TASK = "reverse"
SEEDS_PARAM = Param("lm_seeds", 8, 2, 64, high_open=False, kind="int", typical=(2, 16, 1),
                    doc="runs per measure on the built-in LM (seeds 0, 1, …)")
STEPS_PARAM = Param("lm_steps", 60, 2, 1000, high_open=False, kind="int", typical=(6, 120, 1),
                    doc="GRPO steps of each built-in LM run")
FINAL = ("done", "failed")  # a run in one of these states is a result; any other ends in the queue again


def measures() -> list[tuple[str, str]]:
    """The (measure, reward) pairs some claim compares on the built-in LM, in the catalogue's order, the task's
    rewards first: a claim of the random-reward control trains its measures with random rewards."""
    named = {(name, claim.reward) for claim in claims.CLAIMS for c in claim.lm_comparisons
             for name in (c.candidate, c.baseline)}
    return [(name, reward) for reward in ("task", "random") for name in claims.OBJECTIVES if (name, reward) in named]


def run_config(measure: str, seed: int, steps: int, model: str = BUILTIN, reward: str = "task") -> RunConfig:
    """A cell's run: the lab's defaults on TASK with the measure's objective (another built-in model: its own task and
    settings, `engine/models.py`), rewarded by the task or by a coin (`reward`); no checkpoints."""
    task = {} if model_defaults(model) else {"task": TASK}
    return RunConfig.make(model=model, **task, reward=reward, steps=steps, seed=seed, checkpoint_every=0,
                          **objective_settings(claims.OBJECTIVES[measure]))


def windows(steps: int) -> dict[str, range]:
    """The early and late readings, as step ranges (1-based, inclusive of both ends' steps)."""
    width = max(1, steps // 6)
    return {"early": range(width + 1, max(width + 1, steps // 3) + 1), "late": range(steps - width + 1, steps + 1)}


@dataclass(frozen=True)
class LMPlan:
    """The built-in LM's cells and the run (if any) that holds each: `runs[(measure, seed)]`."""

    root: Path
    seeds: int
    steps: int
    runs: dict
    model: str = BUILTIN

    @staticmethod
    def read(root, seeds: int = SEEDS_PARAM.default, steps: int = STEPS_PARAM.default, model: str = BUILTIN) -> "LMPlan":
        wanted = {(m, r, s): _how_it_trains(run_config(m, s, steps, model, r)) for m, r in measures()
                  for s in range(seeds)}
        found: dict = {}
        for run in store.list_runs(root):  # newest first: a final run wins over a later one still queued
            if run.state not in (*FINAL, "queued", "running"):
                continue
            config = _training(run.config)
            if config is None:
                continue
            for key, wanted_config in wanted.items():
                if config == wanted_config:
                    if key not in found or (run.state in FINAL and found[key].state not in FINAL):
                        found[key] = run
        return LMPlan(root, seeds, steps, {key: found.get(key) for key in wanted}, model)

    @property
    def missing(self) -> list[tuple[str, str, int]]:
        return [key for key, run in self.runs.items() if run is None]

    @property
    def finished(self) -> bool:
        return self.done == len(self.runs)

    @property
    def done(self) -> int:
        """How many cells have a final run."""
        return sum(run is not None and run.state in FINAL for run in self.runs.values())

    @property
    def pending(self) -> bool:
        """Whether some cell's run is queued or running."""
        return any(run is not None and run.state not in FINAL for run in self.runs.values())

    @property
    def progress(self) -> float:
        """The share of all the cells' steps trained (a final run counts whole)."""
        done = sum(self.steps if run.state in FINAL else run.step for run in self.runs.values() if run is not None)
        return done / (self.steps * len(self.runs))

    @property
    def failed(self) -> list[str]:
        """"measure · seed s: message" for each cell whose run failed (it drops out of its pairs)."""
        return [f"{m}{' (random reward)' if r == 'random' else ''} · seed {s}: {run.message}"
                for (m, r, s), run in self.runs.items() if run is not None and run.state == "failed"]

    @property
    def text(self) -> str:
        cfg = run_config(measures()[0][0], 0, self.steps, self.model)
        return (f"{'the built-in LM' if self.model == BUILTIN else self.model} ({cfg.task}, {cfg.steps} steps of {cfg.prompts} prompts × {cfg.group_size}, "
                f"μ = {cfg.mu}, lr {cfg.lr:g}) with {self.seeds} seeds per measure")

    def queue_missing(self, owner: str = "") -> list:
        """Queue a run for every cell without one; returns their folders."""
        return [runner.start_run(run_config(m, s, self.steps, self.model, r), self.root, owner)
                for m, r, s in self.missing]

    def refreshed(self) -> "LMPlan":
        return LMPlan.read(self.root, self.seeds, self.steps, self.model)

    def rows(self) -> list[dict]:
        """The report's cells: per claim, comparison and reading, the paired difference over the seeds whose two
        runs both finished."""
        readings = {key: _readings(run, self.steps) for key, run in self.runs.items()
                    if run is not None and run.state == "done"}
        out = []
        for claim in claims.CLAIMS:
            for c in claim.lm_comparisons:
                for reading, steps in windows(self.steps).items():
                    def value(name: str, seed: int) -> float | None:
                        """The seed's reading of the measure `name` (its candidate's step 1 for START, 0 for ZERO)."""
                        own = readings.get((c.candidate if name in (claims.START, claims.ZERO) else name,
                                            claim.reward, seed))
                        if own is None:
                            return None
                        return 0.0 if name == claims.ZERO else own["start" if name == claims.START else reading][c.metric]

                    pairs = [(a, b) for a, b in ((value(c.candidate, s), value(c.baseline, s)) for s in range(self.seeds))
                             if a is not None and b is not None]
                    d = intervals.paired(*zip(*pairs)) if pairs else intervals.Paired(np.nan, np.nan, np.nan, 0, 0)
                    span = f"step {steps.start}" if len(steps) == 1 else f"steps {steps.start}–{steps.stop - 1}"
                    task = run_config(c.candidate, 0, self.steps, self.model).task
                    rewarded = " · random rewards" if claim.reward == "random" else ""
                    condition = (f"{'' if self.model == BUILTIN else self.model + ' · '}{task}{rewarded} · {reading} "
                                 f"(mean of {span})")
                    out.append(claims.comparison_row(claim, claims.LM, condition, c, d))
        return out

    def report(self, bandit: claims.Report) -> claims.Report:
        """The bandit report with these cells added (call once `finished`)."""
        return replace(bandit, rows=bandit.rows + self.rows(), lm=self.text)


KEPT_ONLY = ("checkpoint_every", "inspect_prompts", "inspect_bytes")  # what a run keeps, not how it trains


def _how_it_trains(cfg: RunConfig) -> dict:
    return {k: v for k, v in cfg.to_dict().items() if k not in KEPT_ONLY}


def _training(config: dict) -> dict | None:
    """A run folder's config.json as the settings that decide how it trains, with the defaults of settings added
    since it was written (None for a config that is not a valid run config)."""
    try:
        return _how_it_trains(RunConfig.from_dict(config))
    except (DivvizInputError, TypeError, ValueError):
        return None


def _readings(run: store.RunInfo, steps: int) -> dict[str, dict[str, float]]:
    """Per reading, the mean of each compared metric over its window of steps; "start": step 1's (its entropy was
    measured on completions sampled before any update)."""
    rows = {row["step"]: row for row in store.read_metrics(run.folder)}
    metrics = {c.metric for claim in claims.CLAIMS for c in claim.lm_comparisons}
    return {reading: {m: float(np.mean([rows[s][m] for s in window if m in rows.get(s, {})] or [np.nan]))
                      for m in metrics}
            for reading, window in {**windows(steps), "start": range(1, 2)}.items()}
