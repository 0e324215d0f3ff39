"""The claims on a language model: the comparisons each claim declares in `lm_comparisons`, trained by divviz's engine,
`seeds` runs per measure on the same seeds — on the built-in LM (the `reverse` task, the lab's defaults, a held-out
evaluation every T/4 steps) or on SmolLM2-135M at one of its settings (`engine/models.py`: "learn", or "stress",
where a measure may collapse), which bring their own task, held-out evaluations and length.

Each run is an ordinary run of the runs folder, queued to its pool like the Training lab's: it shares the machine's
limit with everyone's runs, shows on the Runs page, and survives a restart. A finished run is the cache: a run whose
config.json equals a cell's config is read, not trained again (a run that failed, e.g. diverged, is a result too;
a stopped or interrupted one is queued again in its own folder, where it resumes from the resume state it keeps
every `CHECKPOINT_EVERY` steps, `runs/resume.py`).

The published runs (`runs/published.py`: SmolLM2's grids, trained for divviz's own evidence) hold every cell whose
run the user's folder does not have finished: on a fresh clone the SmolLM2 cells are read, not trained.

Runs are queued in `queue_order`: PPO and KL3 δ = 0.05 on every seed first (the pilot whose spread says how many
seeds resolve what), then the others seed by seed, the random-reward control last.

    plan = LMPlan.read(root, seeds=8, steps=60)   # which runs exist (model=, setting= for SmolLM2; pilot_seeds=
                                                 # for the pilot pair on more seeds than the rest)
    plan.queue_missing(owner)                    # queue the others (returns at once)
    lm_evidence.LMEvidence(plan).rows()          # the report's cells, of the pairs finished so far
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from divviz.catalogue.params import DivvizInputError, Param
from divviz.engine.config import KEPT_ONLY, RunConfig, objective_settings
from divviz.engine.models import BUILTIN, evaluated_settings, model_defaults, model_settings
from divviz.engine.policy import pick_device
from divviz.evidence import claims
from divviz.runs import published, runner, store
from divviz.runs.pool import max_runs

TASK = "reverse"
SEEDS_PARAM = Param("lm_seeds", 8, 0, 64, high_open=False, kind="int", typical=(0, 16, 1),
                    doc="runs per measure on the language model (seeds 0, 1, …): 0 (the pilot pair's seeds alone) or "
                        "2 to 64")
PILOT_EXTRA_PARAM = Param("lm_pilot_extra", 0, 0, 56, high_open=False, kind="int", typical=(0, 16, 1),
                          doc="seeds the pilot pair (PPO ε = 0.2 and KL3 δ = 0.05) trains beyond the seeds per "
                              "measure S (seeds S, S + 1, …): the headline's paired difference at more seeds")
STEPS_PARAM = Param("lm_steps", 60, 2, 1000, high_open=False, kind="int", typical=(6, 120, 1),
                    doc="GRPO steps of each built-in LM run (SmolLM2's come with its setting)")
FINAL = ("done", "failed")  # a run in one of these states is a result; any other ends in the queue again
CHECKPOINT_EVERY = 5  # a cell's run keeps what it needs to resume every 5 steps (`runs/resume.py`)


def measures() -> list[tuple[str, str]]:
    """The (measure, reward) pairs some claim compares on a language model, in the catalogue's order, the task's
    rewards first: a claim of the random-reward control trains its measures with random rewards."""
    named = {(name, claim.reward) for claim in claims.CLAIMS for c in claim.lm_comparisons
             for name in (c.candidate, c.baseline)}
    return [(name, reward) for reward in ("task", "random") for name in claims.OBJECTIVES if (name, reward) in named]


PILOT = (claims.PPO, claims.KL3_WIDE)  # trained first, every seed: the spread of the headline's paired difference
# SmolLM2's grids as declared, by setting and the kind of device that trains them: (seeds per measure, the pilot
# pair's seeds). Each pilot's extension was sized before it ran: on this CPU at the learn setting by the half-width its
# first 4 seeds left (a second stage, since they did not resolve it); at the stress setting by the seeds for 80% power
# at 5.5 points from its first 4 seeds' spread (11; 12 declared). On a GPU, the stress setting's pilot pair alone, to
# 80% power at 5.5 points from the spread of the 4 seeds an H100 trained (sd 0.126 of the paired difference, read
# from their interval, +0.049 [−0.151, +0.249]: 43 seeds); a GPU's runs are another kind of device's, never filling
# the CPU's cells (its bf16 rounds otherwise).
DECLARED = {("learn", "cpu"): (4, 8), ("stress", "cpu"): (4, 12), ("stress", "cuda"): (0, 43)}
# Grids closed before their declared pilot seeds, for a reason that does not depend on their data: the pilot pair's
# seeds at the close. The GPU pair: one lease trained seeds 0–15; no GPU was lent in the three sessions after it.
CLOSED_AT = {("stress", "cuda"): 16}
OPENING_MODEL = "smollm2-135m"  # the model the Claims page opens on
OPENING_SETTING = "stress"  # where the Claims page and `divviz claims --lm` open on SmolLM2: the setting powered most


def opening_setting(settings) -> str:
    """The setting a report opens on among a model's `settings` with evaluations: OPENING_SETTING where it has it,
    else its first ("" with none) — one choice for the page and the CLI."""
    settings = list(settings)
    return OPENING_SETTING if OPENING_SETTING in settings else next(iter(settings), "")


def declared_seeds(model: str, setting: str, device: str = "cpu") -> tuple[int, int]:
    """(seeds per measure, the pilot pair's extra seeds) of the grid declared for `model` at `setting` on `device`'s
    kind (`DECLARED`; a closed grid's pilot pair at its seeds when closed, `CLOSED_AT`), else the default seeds and
    no extra: what the CLI and the Claims page start from."""
    if model == BUILTIN or (setting, device) not in DECLARED:
        return SEEDS_PARAM.default, 0
    seeds, pilot = DECLARED[(setting, device)]
    pilot = min(pilot, CLOSED_AT.get((setting, device), pilot))
    return seeds, max(0, pilot - seeds)


def opening_plan(root, device: str) -> "LMPlan":
    """The plan the Claims page opens on: OPENING_MODEL at its opening setting, with the seeds of the grid declared
    there for `device`'s kind (`declared_seeds`), the setting's own steps."""
    setting = opening_setting(evaluated_settings(OPENING_MODEL))
    seeds, extra = declared_seeds(OPENING_MODEL, setting, device)
    return LMPlan.read(root, seeds, None, OPENING_MODEL, setting, seeds + extra, device=device)


def queue_order(seeds: int, pilot_seeds: int = 0) -> list[tuple[str, str, int]]:
    """The cells (measure, reward, seed) in the order they are queued: the pilot's (PPO and KL3 δ = 0.05, on
    seeds 0 … max(seeds, pilot_seeds) − 1) first, then the other measures seed by seed, the random-reward control
    last, so that a grid stopped half-way holds whole pairs, the headline's first."""
    pilot = [(m, "task", s) for s in range(max(seeds, pilot_seeds)) for m in PILOT]
    rest = [(m, r, s) for r in ("task", "random") for s in range(seeds) for m, rr in measures() if rr == r]
    return pilot + [key for key in rest if key not in pilot]


def default_steps(model: str = BUILTIN, setting: str = "") -> int:
    """The steps of a run: the model's setting's (SmolLM2: 30), else `STEPS_PARAM`'s default."""
    return int({**model_defaults(model), **model_settings(model).get(setting, {})}.get("steps", STEPS_PARAM.default))


def run_config(measure: str, seed: int, steps: int, model: str = BUILTIN, reward: str = "task",
               setting: str = "") -> RunConfig:
    """A cell's run: on the built-in model, the lab's defaults on TASK with a held-out evaluation every T/4 steps;
    on a model with settings, its `setting` (its defaults when ""), which names its task and evaluations; with the
    measure's objective, rewarded by the task or by a coin (`reward`), checkpointed for resuming."""
    evaluated = evaluated_settings(model)
    if setting and setting not in evaluated:
        raise DivvizInputError(f"{model} has no setting {setting!r} with held-out evaluations"
                               + (f" (it has {', '.join(evaluated)})" if evaluated else ""))
    own = ({"task": TASK, "eval_every": max(1, steps // 4)} if not model_defaults(model)
           else dict(model_settings(model).get(setting, {})))
    return RunConfig.make(**{**own, "model": model, "reward": reward, "steps": steps, "seed": seed,
                             "checkpoint_every": CHECKPOINT_EVERY, **objective_settings(claims.OBJECTIVES[measure])})


@dataclass(frozen=True)
class LMPlan:
    """A language model's cells and the run (if any) that holds each: `runs[(measure, reward, seed)]`; `seeds` per
    measure, `pilot_seeds` (≥ seeds) for the pilot pair with the task's rewards."""

    root: Path
    seeds: int
    steps: int
    runs: dict  # (measure, reward, seed) → RunInfo or None, in the order they are queued
    model: str = BUILTIN
    setting: str = ""
    pilot_seeds: int = 0
    published: Path | None = None  # the published runs' folder when they are read too (`runs/published.py`)
    device: str = "cpu"  # the kind of device whose runs hold the cells (`device_kind`)

    @staticmethod
    def read(root, seeds: int = SEEDS_PARAM.default, steps: int | None = None, model: str = BUILTIN,
             setting: str = "", pilot_seeds: int = 0, with_published: bool = True, device: str = "cpu") -> "LMPlan":
        """The plan's cells and their runs in `root` that trained (or will train) on `device`'s kind; with
        `with_published`, a cell none of whose runs there is final is held by its published run of that kind if
        there is one (a user's finished run of a cell is always the one read). Runs of one cell on two kinds of
        device are two results, never one plan; two CPUs whose kernels differ are read together, the provenance
        saying so (`published_grids`)."""
        if seeds == 1:
            raise DivvizInputError("1 seed per measure gives no interval: 0 (the pilot pair's seeds alone) or 2 to "
                                   f"{SEEDS_PARAM.high}")
        steps = steps or default_steps(model, setting)
        pilot_seeds = max(seeds, pilot_seeds)
        wanted = {_cell_training(key[0], key[2], steps, model, key[1], setting): key
                  for key in queue_order(seeds, pilot_seeds)}
        shared = published.folder() if with_published else None
        found: dict = {}
        runs = [*store.list_runs(root), *(store.list_runs(shared) if shared else ())]
        for run in runs:  # newest first: a final run wins over a later one still queued
            if run.state not in (*FINAL, "queued", "running", *runner.RESUMABLE):
                continue
            if device_kind(run) not in ("", device):  # trained on another kind of device: another grid's
                continue
            key = wanted.get(_training(json.dumps(run.config, sort_keys=True)))
            if key is not None and (key not in found or _rank(run, shared) > _rank(found[key], shared)):
                found[key] = run
        return LMPlan(root, seeds, steps, {key: found.get(key) for key in wanted.values()}, model, setting,
                      pilot_seeds, shared, device)

    @staticmethod
    def declared(root, model: str, setting: str = "", with_published: bool = True, device: str = "cpu") -> "LMPlan":
        """The plan of the grid declared for `model` at `setting` on `device`'s kind (`declared_seeds`: its seeds and
        its pilot pair's)."""
        seeds, extra = declared_seeds(model, setting, device)
        return LMPlan.read(root, seeds, model=model, setting=setting, pilot_seeds=seeds + extra,
                           with_published=with_published, device=device)

    def is_published(self, run: store.RunInfo | None) -> bool:
        return run is not None and self.published is not None and run.folder.parent == self.published

    @property
    def provenance(self) -> str:
        """Where the cells' runs come from, in a line: how many are published, from which grid and how it was
        trained, and how many are the user's own ("" when no run is published)."""
        held = [run for run in self.runs.values() if run is not None]
        shared = sum(self.is_published(run) for run in held)
        return (f"{shared} of the {len(self.runs)} runs are published: {self.published_grids}; {len(held) - shared} "
                f"are your own (runs folder {self.root})") if shared else ""

    @property
    def published_grids(self) -> str:
        """The published grids that hold some of the cells: each one's name, how many cells and how it was trained
        (on a GPU, its name; on a CPU, the kernels that decide its bits, `published.cpu_kernels`); where the grids'
        CPU kernels differ, that a pair's two runs across them share neither their first completions nor their step-0
        evaluation."""
        found, grid_of = published.manifests(), published.grids_of_runs()
        grids = Counter(grid_of.get(run.name) for run in self.runs.values() if self.is_published(run))
        manifests = {grid: m for grid in grids if (m := found.get(grid))}
        text = "; ".join(f"{grid} ({grids[grid]} runs, trained on {m['device']} "
                         f"({m.get('gpu') or m.get('cpu') or 'kernels not recorded'}) in {m['precision']}, "
                         f"torch {m['torch']}, transformers {m['transformers']}, commit {m['commit']})"
                         for grid, m in manifests.items())
        kernels = {m.get("cpu") for m in manifests.values() if not m.get("gpu")}
        return text + ("; the CPUs' kernels differ, so a pair's two runs across these grids are the same design, not "
                       "the same bits: they share neither their first completions nor their step-0 evaluation"
                       if len(kernels) > 1 else "")

    def seeds_of(self, *measures: str, reward: str = "task") -> range:
        """The seeds on which all of `measures` (with `reward`) train: the pilot pair's own, else the plan's."""
        pilot = reward == "task" and all(m in PILOT for m in measures)
        return range(self.pilot_seeds if pilot else self.seeds)

    @property
    def missing(self) -> list[tuple[str, str, int]]:
        """The cells with no run, or only one that stopped half-way (queued again, it resumes)."""
        return [key for key, run in self.runs.items() if run is None or run.state in runner.RESUMABLE]

    @property
    def finished(self) -> bool:
        return self.done == len(self.runs)

    @property
    def done(self) -> int:
        """How many cells have a final run."""
        return sum(run is not None and run.state in FINAL for run in self.runs.values())

    @property
    def pending_count(self) -> int:
        """How many cells' runs are queued or running (or stopped half-way, to be resumed)."""
        return sum(run is not None and run.state not in FINAL for run in self.runs.values())

    @property
    def pending(self) -> bool:
        return self.pending_count > 0

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
    def name(self) -> str:
        """The model and setting, as a row's condition starts: "the built-in LM", "smollm2-135m (learn)"."""
        return ("the built-in LM" if self.model == BUILTIN else
                f"{self.model} ({self.setting or 'its defaults'}{on_device(self.device)})")

    @property
    def text(self) -> str:
        cfg = run_config(measures()[0][0], 0, self.steps, self.model, setting=self.setting)
        devices = Counter(run.status.get("device") or "an unrecorded device" for run in self.runs.values()
                          if run is not None and run.state in FINAL)
        return (f"{self.name}: {cfg.task}, {cfg.steps} steps of {cfg.prompts} prompts × {cfg.group_size}, μ = {cfg.mu}, "
                f"{cfg.minibatches} mini-batch{'es' if cfg.minibatches > 1 else ''}, lr {cfg.lr:g}, held-out "
                f"evaluation every {cfg.eval_every} steps, "
                + (f"the pilot pair alone ({' and '.join(PILOT)}) on {self.pilot_seeds} seeds" if not self.seeds else
                   f"with {self.seeds} seeds per measure"
                   + (f" ({self.pilot_seeds} for the pilot pair, {' and '.join(PILOT)})"
                      if self.pilot_seeds > self.seeds else ""))
                + (f"; trained on {', '.join(f'{d} ({n} runs)' for d, n in devices.most_common())}" if devices else ""))

    def queue_missing(self, owner: str = "") -> list:
        """Queue a run for every cell without one, seed by seed, and resume those that stopped half-way; returns
        their folders."""
        folders = []
        for key in self.missing:
            run = self.runs[key]
            if run is None:
                m, r, s = key
                folders.append(runner.start_run(run_config(m, s, self.steps, self.model, r, self.setting), self.root,
                                                owner))
            else:
                runner.resume_run(run.folder)
                folders.append(run.folder)
        return folders

    def refreshed(self) -> "LMPlan":
        return LMPlan.read(self.root, self.seeds, self.steps, self.model, self.setting, self.pilot_seeds,
                           self.published is not None, self.device)

    def time_left(self) -> float | None:
        """Seconds until every cell has a final run, at the pace of this plan's runs so far (wall time per step,
        evaluations included, with the pool's runs side by side) that trained on the kind of device the rest would
        train on here — a grid trained on a GPU and copied to a CPU says nothing of the CPU's pace; None before such
        a step is done. The other runs the pool trains before this plan's last one (`ahead`) are in it too."""
        here = pick_device().type
        spent = steps = 0.0
        for run in self.runs.values():
            if (run is not None and run.step and run.status.get("started")
                    and run.status.get("device", "") in ("", here)):
                spent += max(0.0, run.status.get("updated", 0.0) - run.status["started"])
                steps += run.step
        if not steps:
            return None
        left = (self.steps * len(self.runs) * (1 - self.progress)
                + sum(max(0, run.steps - run.step) for run in self.ahead))
        remaining = len(self.runs) - self.done + len(self.ahead)
        return left * spent / steps / max(1, min(max_runs(), remaining))

    @cached_property
    def ahead(self) -> list:
        """The runs folder's other runs that train before this plan is done: the pool takes its queue in order, so
        those running or queued before this plan's last queued run — all of them while a cell still waits to be
        queued (or queued again), since it will queue behind them. Read once per plan (`refreshed` reads again)."""
        mine = {run.folder for run in self.runs.values() if run is not None}
        waiting = [run for run in self.runs.values() if run is not None and run.state in ("queued", "running")]
        last = (max(run.status.get("queued_at", 0.0) for run in waiting) if waiting and not self.missing
                else float("inf"))
        return [run for run in store.list_runs(self.root) if run.folder not in mine
                and run.state in ("queued", "running") and run.status.get("queued_at", 0.0) <= last]


DEVICE_KINDS = {"cpu": "a CPU", "cuda": "a GPU", "mps": "an Apple GPU"}  # the kinds of device a run trains on


def on_device(kind: str) -> str:
    """What a grid's name adds for the kind of device it trained on: nothing for a CPU's, " on a GPU" for CUDA's."""
    return "" if kind == "cpu" else f" on {DEVICE_KINDS[kind]}"


def device_kind(run: store.RunInfo) -> str:
    """The kind of device a run trained on ("cpu", "cuda", "mps"; "" before it started)."""
    return (run.status.get("device") or "").split(":")[0]


def _rank(run: store.RunInfo, shared: Path | None) -> float:
    """Which of two runs of a cell holds it: the user's final one, else a published one (final), else the user's
    queued or running one, else one to resume."""
    if run.folder.parent == shared:
        return 1.5
    return 2 if run.state in FINAL else 0 if run.state in runner.RESUMABLE else 1


def _how_it_trains(cfg: RunConfig) -> str:
    """The settings that decide how a run trains (its config less what is kept only), as JSON text with sorted keys:
    two runs train alike when these are equal."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in KEPT_ONLY}, sort_keys=True)


@lru_cache(maxsize=4096)
def _cell_training(measure: str, seed: int, steps: int, model: str, reward: str, setting: str) -> str:
    """How a cell's run trains (`_how_it_trains`), made once per cell: a page rerun reads the plan again, and
    checking a run config costs about a millisecond."""
    return _how_it_trains(run_config(measure, seed, steps, model, reward, setting))


@lru_cache(maxsize=4096)
def _training(config: str) -> str | None:
    """A run folder's config.json (its JSON text, keys sorted) as how it trains (`_how_it_trains`), with the
    defaults of settings added since it was written (None for a config that is not a valid run config); made once
    per distinct config."""
    try:
        return _how_it_trains(RunConfig.from_dict(json.loads(config)))
    except (DivvizInputError, TypeError, ValueError):
        return None
