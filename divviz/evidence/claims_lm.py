"""The claims on a language model: the comparisons each claim declares in `lm_comparisons`, trained by divviz's engine,
`seeds` runs per measure on the same seeds — on the built-in LM (the `reverse` task, the lab's defaults, a held-out
evaluation every T/4 steps) or on SmolLM2-135M at one of its settings (`engine/models.py`: "learn", or "stress",
where a measure may collapse), which bring their own task, held-out evaluations and length.

Each run is an ordinary run of the runs folder, queued to its pool like the Training lab's: it shares the machine's
limit with everyone's runs, shows on the Runs page, and survives a restart. A finished run is the cache: a run whose
config.json equals a cell's config is read, not trained again (a run that failed, e.g. diverged, is a result too;
a stopped or interrupted one is queued again in its own folder, where it resumes from the resume state it keeps
every `CHECKPOINT_EVERY` steps, `engine/resume.py`).

Readings, paired seed by seed (a seed whose candidate or baseline run failed drops out of the pair, so n says how many
remain):
    a per-step metric (entropy, mass_to_argmax, …)   its mean over an early window (steps T/6 + 1 … T/3) and over the
                                                     last T/6 steps
    held-out accuracy (`claims.HELD_OUT`)            at the end (the evaluation after step T) and over the run (the
                                                     trapezoid mean of the evaluations from step 0 to T)
    stability (`claims.WHOLE_RUN`)                   once for the whole run: the collapse flag (0 or 1; its paired
                                                     difference has Newcombe's interval, `intervals.paired_binary`),
                                                     the largest update KL, the largest clip fraction
                                                     (`engine/stability.py`)
Runs are queued in `queue_order`: PPO and KL3 δ = 0.05 on every seed first (the pilot whose spread says how many
seeds resolve what), then the others seed by seed, the random-reward control last.

    plan = LMPlan.read(root, seeds=8, steps=60)   # which runs exist (model=, setting= for SmolLM2; pilot_seeds=
                                                 # for the pilot pair on more seeds than the rest)
    plan.queue_missing(owner)                    # queue the others (returns at once)
    rows = plan.rows()                           # once plan.finished: the report's cells
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from divviz.evidence import claims, intervals
from divviz.engine import runner, store
from divviz.engine.config import KEPT_ONLY, RunConfig, objective_settings
from divviz.engine.model import pick_device
from divviz.engine.models import BUILTIN, evaluated_settings, model_defaults, model_settings
from divviz.engine.pool import max_runs
from divviz.metrics import proportion
from divviz.catalogue.params import DivvizInputError, Param

TASK = "reverse"
SEEDS_PARAM = Param("lm_seeds", 8, 2, 64, high_open=False, kind="int", typical=(2, 16, 1),
                    doc="runs per measure on the language model (seeds 0, 1, …)")
PILOT_EXTRA_PARAM = Param("lm_pilot_extra", 0, 0, 56, high_open=False, kind="int", typical=(0, 16, 1),
                          doc="seeds the pilot pair (PPO ε = 0.2 and KL3 δ = 0.05) trains beyond the seeds per "
                              "measure S (seeds S, S + 1, …): the headline's paired difference at more seeds")
STEPS_PARAM = Param("lm_steps", 60, 2, 1000, high_open=False, kind="int", typical=(6, 120, 1),
                    doc="GRPO steps of each built-in LM run (SmolLM2's come with its setting)")
FINAL = ("done", "failed")  # a run in one of these states is a result; any other ends in the queue again
CHECKPOINT_EVERY = 5  # a cell's run keeps what it needs to resume every 5 steps (`engine/resume.py`)


def measures() -> list[tuple[str, str]]:
    """The (measure, reward) pairs some claim compares on a language model, in the catalogue's order, the task's
    rewards first: a claim of the random-reward control trains its measures with random rewards."""
    named = {(name, claim.reward) for claim in claims.CLAIMS for c in claim.lm_comparisons
             for name in (c.candidate, c.baseline)}
    return [(name, reward) for reward in ("task", "random") for name in claims.OBJECTIVES if (name, reward) in named]


PILOT = (claims.PPO, claims.KL3_WIDE)  # trained first, every seed: the spread of the headline's paired difference


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


def windows(steps: int) -> dict[str, range]:
    """The early and late readings of a per-step metric, as step ranges (1-based, inclusive of both ends' steps)."""
    width = max(1, steps // 6)
    return {"early": range(width + 1, max(width + 1, steps // 3) + 1), "late": range(steps - width + 1, steps + 1)}


def readings(metric: str, steps: int) -> dict[str, str]:
    """The readings of `metric` (name → how the condition describes it)."""
    if metric in claims.HELD_OUT:
        return {"end": f"step {steps}", "over the run": f"trapezoid mean of steps 0–{steps}"}
    if metric in claims.WHOLE_RUN:
        return {"whole run": f"steps 1–{steps}"}
    return {name: f"mean of step {w.start}" if len(w) == 1 else f"mean of steps {w.start}–{w.stop - 1}"
            for name, w in windows(steps).items()}


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

    @staticmethod
    def read(root, seeds: int = SEEDS_PARAM.default, steps: int | None = None, model: str = BUILTIN,
             setting: str = "", pilot_seeds: int = 0) -> "LMPlan":
        steps = steps or default_steps(model, setting)
        pilot_seeds = max(seeds, pilot_seeds)
        wanted = {key: _cell_training(key[0], key[2], steps, model, key[1], setting)
                  for key in queue_order(seeds, pilot_seeds)}
        found: dict = {}
        for run in store.list_runs(root):  # newest first: a final run wins over a later one still queued
            if run.state not in (*FINAL, "queued", "running", *runner.RESUMABLE):
                continue
            config = _training(json.dumps(run.config, sort_keys=True))
            if config is None:
                continue
            for key, wanted_config in wanted.items():
                if config == wanted_config:
                    if key not in found or _rank(run) > _rank(found[key]):
                        found[key] = run
        return LMPlan(root, seeds, steps, {key: found.get(key) for key in wanted}, model, setting, pilot_seeds)

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
        return "the built-in LM" if self.model == BUILTIN else f"{self.model} ({self.setting or 'its defaults'})"

    @property
    def text(self) -> str:
        cfg = run_config(measures()[0][0], 0, self.steps, self.model, setting=self.setting)
        devices = Counter(run.status.get("device") or "an unrecorded device" for run in self.runs.values()
                          if run is not None and run.state in FINAL)
        return (f"{self.name}: {cfg.task}, {cfg.steps} steps of {cfg.prompts} prompts × {cfg.group_size}, μ = {cfg.mu}, "
                f"{cfg.minibatches} mini-batch{'es' if cfg.minibatches > 1 else ''}, lr {cfg.lr:g}, held-out "
                f"evaluation every {cfg.eval_every} steps, with {self.seeds} seeds per measure"
                + (f" ({self.pilot_seeds} for the pilot pair, {' and '.join(PILOT)})"
                   if self.pilot_seeds > self.seeds else "")
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
        return LMPlan.read(self.root, self.seeds, self.steps, self.model, self.setting, self.pilot_seeds)

    @cached_property
    def finished_series(self) -> dict:
        """Each finished run's (metrics by step, held-out evaluations by step), read from its folder once for the
        cells, the learning curves and the pilot."""
        return {key: ({row["step"]: row for row in store.read_metrics(run.folder)},
                      {row["step"]: row for row in store.read_evals(run.folder)})
                for key, run in self.runs.items() if run is not None and run.state == "done"}

    def rows(self) -> list[dict]:
        """The report's cells: per claim, comparison and reading, the paired difference over the seeds whose two
        runs both finished."""
        read = {key: _readings(*series, self.steps) for key, series in self.finished_series.items()}
        task = run_config(measures()[0][0], 0, self.steps, self.model, setting=self.setting).task  # every cell's
        out = []
        for claim in claims.CLAIMS:
            for c in claim.lm_comparisons:
                for reading, span in readings(c.metric, self.steps).items():
                    def value(name: str, seed: int) -> float | None:
                        """The seed's reading of the measure `name` (its candidate's step 1 for START, 0 for ZERO)."""
                        own = read.get((c.candidate if name in (claims.START, claims.ZERO) else name, claim.reward,
                                        seed))
                        if own is None:
                            return None
                        return 0.0 if name == claims.ZERO else own["start" if name == claims.START else reading][c.metric]

                    compared = [m for m in (c.candidate, c.baseline) if m not in (claims.START, claims.ZERO)]
                    pairs = [(a, b) for a, b in ((value(c.candidate, s), value(c.baseline, s))
                                                 for s in self.seeds_of(*compared, reward=claim.reward))
                             if a is not None and b is not None and np.isfinite(a) and np.isfinite(b)]
                    difference = intervals.paired_binary if c.metric in claims.BINARY else intervals.paired
                    d = difference(*zip(*pairs)) if pairs else intervals.Paired(np.nan, np.nan, np.nan, 0, 0)
                    rewarded = " · random rewards" if claim.reward == "random" else ""
                    # the row's setting (claims.LM_TRAINING) names the model; the condition, its setting
                    where = "" if self.model == BUILTIN else f"{self.setting or 'defaults'} · "
                    out.append(claims.comparison_row(claim, claims.LM if self.model == BUILTIN else claims.LM_TRAINING,
                                                     f"{where}{task}{rewarded} · {reading} ({span})", c, d))
        return out

    def collapses(self) -> list[dict]:
        """Per measure (task rewards), over its finished seeds: how many collapsed (`engine/stability.py`'s flag at
        the end, or a run that failed on a non-finite value), the share with its Wilson 95% interval, and the steps
        of collapse; and the spread of its reward curve over seeds — the standard deviation over the seeds that ran to
        the end of each run's mean reward over steps 1–T, with its 95% interval (`intervals.sd_interval`)."""
        out = []
        for measure in dict.fromkeys(m for m, r, _ in self.runs if r == "task"):
            steps, mean_rewards = [], []
            n = 0
            for seed in self.seeds_of(measure):
                run = self.runs[(measure, "task", seed)]
                if run is None or run.state not in FINAL:
                    continue
                n += 1
                rows = self.finished_series[(measure, "task", seed)][0] if run.state == "done" else {}
                step = _collapse_step(run, rows)
                if step is not None:
                    steps.append(step)
                if rows:
                    mean_rewards.append(np.mean([row["reward"] for row in rows.values()]))
            share, low, high = proportion(len(steps), n)
            sd, sd_low, sd_high = intervals.sd_interval(mean_rewards)
            out.append({"measure": measure, "n": n, "collapsed": len(steps), "share": share, "low": low, "high": high,
                        "steps": sorted(steps), "reward_sd": sd, "reward_sd_low": sd_low, "reward_sd_high": sd_high,
                        "reward_n": len(mean_rewards)})
        return out

    def curves(self, metric: str) -> dict[str, dict]:
        """Per measure (task rewards), `metric` over the run: the steps and, over the finished seeds, the mean with
        its band (`intervals.summarize`, within [0, 1] for an accuracy or a reward). Held-out metrics are read at
        their evaluations, the others at every step."""
        out = {}
        bounds = (0.0, 1.0) if metric in (*claims.HELD_OUT, "reward", "accuracy") else (0.0, np.inf)
        for measure in dict.fromkeys(m for m, r, _ in self.runs if r == "task"):
            series = []
            for seed in self.seeds_of(measure):
                if (measure, "task", seed) in self.finished_series:
                    rows, evals = self.finished_series[(measure, "task", seed)]
                    by_step = evals if metric in claims.HELD_OUT else rows
                    series.append({step: row[metric] for step, row in by_step.items() if metric in row})
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if steps:
                summary = intervals.summarize([[s[t] for t in steps] for s in series], bounds=bounds)
                out[measure] = {"steps": steps, "mean": summary.mean, "low": summary.low, "high": summary.high,
                                "n": summary.n}
        return out

    def pilot(self, metric: str = "eval/accuracy", sizes: tuple[int, ...] = (4, 8, 16)) -> dict | None:
        """The pilot's spread: over the seeds where both of `PILOT`'s runs are done, the final `metric` of each, the
        standard deviation (ddof 1) of PPO's and of the paired difference KL3 − PPO, and the smallest paired difference
        S seeds could resolve at that spread (`intervals.half_width`) for each S in `sizes`; None below 2 seeds."""
        series = self.finished_series
        seeds = [s for s in self.seeds_of(*PILOT) if all((m, "task", s) in series for m in PILOT)]
        finals = {(m, s): _readings(*series[(m, "task", s)], self.steps)["end"][metric] for m in PILOT for s in seeds}
        if len(seeds) < 2:
            return None
        ppo = np.array([finals[(PILOT[0], s)] for s in seeds])
        diff = np.array([finals[(PILOT[1], s)] for s in seeds]) - ppo
        sd = float(diff.std(ddof=1))
        return {"metric": metric, "n": len(seeds), "planned": self.pilot_seeds, "ppo_mean": float(ppo.mean()),
                "ppo_sd": float(ppo.std(ddof=1)),
                "difference_mean": float(diff.mean()), "difference_sd": sd,
                "resolvable": {size: intervals.half_width(sd, size) for size in sizes}}

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

    def report(self, bandit: claims.Report) -> claims.Report:
        """The bandit report with these cells added: those of the finished runs' pairs (n says how many seeds)."""
        finished = "" if self.finished else f" ({self.done} of {len(self.runs)} runs finished so far)"
        collapses = [f"collapsed, {row['measure']}: {row['collapsed']}, share {row['share [95% Wilson]'] or '—'}, "
                     f"at step {row['steps of collapse']}; the reward's spread over seeds (sd of each run's mean "
                     f"reward) {row[SPREAD] or '—'}"
                     for row in collapse_table(self.collapses())]
        pilot = self.pilot()
        return replace(bandit, rows=bandit.rows + self.rows(), lm=self.text + finished,
                       lm_details=(*collapses, *([pilot_text(pilot)] if pilot else ())))


CURVES = ("eval/accuracy", "eval/accuracy_greedy", "reward", "entropy")  # the learning curves the page draws


SPREAD = "reward's spread over seeds: sd [95%]"  # the column of `collapse_table`


def collapse_table(collapses: list[dict]) -> list[dict]:
    """`LMPlan.collapses` as the page and the docs print it."""
    return [{"measure": row["measure"], "collapsed": f"{row['collapsed']} of {row['n']}",
             "share [95% Wilson]": "" if not row["n"] else f"{row['share']:.2f} [{row['low']:.2f}, {row['high']:.2f}]",
             "steps of collapse": ", ".join(map(str, row["steps"])) or "—",
             SPREAD: "" if row["reward_n"] < 2 else
             f"{row['reward_sd']:.3f} [{row['reward_sd_low']:.3f}, {row['reward_sd_high']:.3f}], n = {row['reward_n']}"}
            for row in collapses]


def pilot_text(pilot: dict) -> str:
    """`LMPlan.pilot` in a sentence."""
    sizes = " / ".join(map(str, pilot["resolvable"]))
    reach = " / ".join(f"±{v:.3f}" for v in pilot["resolvable"].values())
    done = f"{pilot['n']} seeds" + (f" of its {pilot['planned']} done" if pilot["n"] < pilot["planned"] else "")
    return (f"Pilot ({' and '.join(PILOT)}, {done}): {pilot['metric']} at the end, PPO "
            f"{pilot['ppo_mean']:.3f} (sd {pilot['ppo_sd']:.3f} over seeds); the paired difference KL3 − PPO "
            f"{pilot['difference_mean']:+.3f} (sd {pilot['difference_sd']:.3f}). At that spread, {sizes} seeds "
            f"resolve a mean difference of {reach} (the paired 95% interval's half-width).")


def _rank(run: store.RunInfo) -> int:
    """Which of two runs of a cell holds it: a final one, else a queued or running one, else one to resume."""
    return 2 if run.state in FINAL else 0 if run.state in runner.RESUMABLE else 1


def _how_it_trains(cfg: RunConfig) -> dict:
    return {k: v for k, v in cfg.to_dict().items() if k not in KEPT_ONLY}


@lru_cache(maxsize=4096)
def _cell_training(measure: str, seed: int, steps: int, model: str, reward: str, setting: str) -> dict:
    """How a cell's run trains (`run_config` less what is kept only), made once per cell: a page rerun reads the
    plan again, and checking a run config costs about a millisecond. Read, never changed."""
    return _how_it_trains(run_config(measure, seed, steps, model, reward, setting))


@lru_cache(maxsize=4096)
def _training(config: str) -> dict | None:
    """A run folder's config.json (its JSON text, keys sorted) as the settings that decide how it trains, with the
    defaults of settings added since it was written (None for a config that is not a valid run config); made once
    per distinct config."""
    try:
        return _how_it_trains(RunConfig.from_dict(json.loads(config)))
    except (DivvizInputError, TypeError, ValueError):
        return None


def _readings(rows: dict[int, dict], evals: dict[int, dict], steps: int) -> dict[str, dict[str, float]]:
    """Per reading, each compared metric's value in one run, from its metrics and its evaluations by step
    (`readings`); "start": step 1's (its entropy was measured on completions sampled before any update)."""
    metrics = {c.metric for claim in claims.CLAIMS for c in claim.lm_comparisons}
    out = {reading: {m: float(np.mean([rows[s][m] for s in window if m in rows.get(s, {})] or [np.nan]))
                     for m in metrics}
           for reading, window in {**windows(steps), "start": range(1, 2)}.items()}
    last = rows.get(steps, {})
    out["whole run"] = {m: float(last.get(m, np.nan)) for m in claims.WHOLE_RUN}
    for m in claims.HELD_OUT:
        points = sorted((t, row[m]) for t, row in evals.items() if m in row)
        at = dict(points)
        out.setdefault("end", {})[m] = float(at.get(steps, np.nan))
        whole = len(points) > 1 and points[0][0] == 0 and points[-1][0] == steps
        out.setdefault("over the run", {})[m] = (float(np.trapezoid([v for _, v in points], [t for t, _ in points])
                                                       / steps) if whole else np.nan)
    return out


def _collapse_step(run: store.RunInfo, rows: dict[int, dict]) -> int | None:
    """The step at which a finished run collapsed (`stability/collapse_step` of its last metrics row, `rows` by step),
    or where it stopped on a non-finite value; None when it did neither."""
    if run.state == "failed":
        return run.step + 1 if "became" in run.message else None  # `train`: "metric 'loss' became nan at step s"
    last = rows[max(rows)] if rows else {}
    return int(last["stability/collapse_step"]) if last.get("stability/collapsed") else None
