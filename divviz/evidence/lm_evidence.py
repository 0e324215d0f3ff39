"""The evidence of a language model's claims grid (`claims_lm.LMPlan`): its cells, collapses, learning curves and
pilot, read from the finished runs.

Readings, paired seed by seed (a seed whose candidate or baseline run failed drops out of the pair, so n says how many
remain):
    a per-step metric (entropy, mass_to_argmax, …)   its mean over an early window (steps T/6 + 1 … T/3) and over the
                                                     last T/6 steps
    held-out accuracy (`claims.HELD_OUT`)            at the end (the evaluation after step T) and over the run (the
                                                     trapezoid mean of the evaluations from step 0 to T)
    stability (`claims.WHOLE_RUN`)                   once for the whole run: the collapse flag (0 or 1; its paired
                                                     difference has Newcombe's interval, `intervals.paired_binary`),
                                                     the largest update KL, the largest clip fraction
                                                     (`engine/stability.py`), and the time to collapse (the
                                                     step of collapse, T if none: `claims.TIME_TO_COLLAPSE`)

    evidence = LMEvidence(plan)
    evidence.rows()           # the report's cells (`claims_report.comparison_rows`), of the pairs finished so far
    evidence.report(bandit)   # the bandit report with them added
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from divviz.engine.models import BUILTIN
from divviz.evidence import claims, claims_lm, claims_report, intervals, significance
from divviz.evidence.claims_lm import FINAL, PILOT, LMPlan, measures, run_config
from divviz.evidence.kept import Kept
from divviz.evidence.rescore import disagreement, sampled_tokens
from divviz.metrics import metric_range, proportion
from divviz.runs import store, tail

# (run folder, its tokens folder's identity, steps, other measure) ↦ the run's disagreement with the other's clip
# test: a page's rerun re-scores no run it has re-scored before (each reads its token files)
RESCORED = Kept(most=4096)
COMPUTED = Kept()  # (a plan's `final_runs`, a computation and its arguments) ↦ its result


def final_runs(plan: LMPlan) -> tuple:
    """What a plan's evidence is read from: its design, and each final run's folder, state and message with the
    identity of every file the evidence reads (`tail.file_identity`) — so a run that finishes, is replaced by the
    user's own, or has a file changed in place gives another tuple."""
    return (plan.model, plan.setting, plan.device, plan.steps, plan.seeds, plan.pilot_seeds,
            tuple((key, str(run.folder), run.state, run.message,
                   *(tail.file_identity(run.folder / name) for name in ("metrics.jsonl", "eval.jsonl", "tokens")))
                  for key, run in plan.runs.items() if run is not None and run.state in FINAL))


def _kept(method):
    """`method`'s result computed once per `final_runs` of the plan and arguments (`COMPUTED`)."""
    @functools.wraps(method)
    def kept(self, *args, **kwargs):
        return COMPUTED.get((self.final, method.__name__, args, tuple(sorted(kwargs.items()))),
                            lambda: method(self, *args, **kwargs))
    return kept


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
    if metric == claims.TIME_TO_COLLAPSE:
        return {"whole run": f"the step of collapse, {steps} if none"}
    return {name: f"mean of step {w.start}" if len(w) == 1 else f"mean of steps {w.start}–{w.stop - 1}"
            for name, w in windows(steps).items()}


@dataclass(frozen=True)
class LMEvidence:
    """What a plan's finished runs say: each reading computed once for as long as those runs stay as they are
    (`final_runs`), so a page's rerun that reads a new plan of the same runs computes nothing again."""

    plan: LMPlan
    _samples: dict = field(default_factory=dict, compare=False, repr=False)  # run → its kept token samples

    @cached_property
    def final(self) -> tuple:
        return final_runs(self.plan)

    @cached_property
    def finished_series(self) -> dict:
        """Each finished run's (metrics by step, held-out evaluations by step), read from its folder once for the
        cells, the learning curves and the pilot."""
        return {key: ({row["step"]: row for row in store.read_metrics(run.folder)},
                      {row["step"]: row for row in store.read_evals(run.folder)})
                for key, run in self.plan.runs.items() if run is not None and run.state == "done"}

    @_kept
    def rows(self) -> list[dict]:
        """The report's cells: per claim, comparison and reading, the paired difference over the seeds whose two
        runs both finished; a comparison of a measure the plan has no seeds of (a grid of the pilot pair alone) is
        not one of its cells."""
        read = {key: _readings(*series, self.plan.steps) for key, series in self.finished_series.items()}
        task = run_config(measures()[0][0], 0, self.plan.steps, self.plan.model, setting=self.plan.setting).task  # every cell's
        cells = []
        for claim in claims.CLAIMS:
            for c in claim.lm_comparisons:
                for reading, span in readings(c.metric, self.plan.steps).items():
                    def value(name: str, seed: int) -> float | None:
                        """The seed's reading of the measure `name` (its candidate's step 1 for START, 0 for ZERO)."""
                        own = read.get((c.candidate if name in (claims.START, claims.ZERO) else name, claim.reward,
                                        seed))
                        if own is None:
                            return None
                        return 0.0 if name == claims.ZERO else own["start" if name == claims.START else reading][c.metric]

                    compared = [m for m in (c.candidate, c.baseline) if m not in (claims.START, claims.ZERO)]
                    planned = self.plan.seeds_of(*compared, reward=claim.reward)
                    if not planned:
                        continue
                    seeds = [s for s in planned
                             if all(v is not None and np.isfinite(v) for v in (value(c.candidate, s),
                                                                                 value(c.baseline, s)))]
                    rewarded = " · random rewards" if claim.reward == "random" else ""
                    # the row's setting (claims.LM_TRAINING) names the model; the condition, its setting
                    where = ("" if self.plan.model == BUILTIN else
                             f"{self.plan.setting or 'defaults'}{claims_lm.on_device(self.plan.device)} · ")
                    cells.append(dict(
                        claim=claim, setting=claims.LM if self.plan.model == BUILTIN else claims.LM_TRAINING,
                        condition=f"{where}{task}{rewarded} · {reading} ({span})", c=c,
                        candidate=[value(c.candidate, s) for s in seeds],
                        baseline=[value(c.baseline, s) for s in seeds], seeds=seeds, where=self.plan.setting,
                        reading=reading))
        rows = claims_report.comparison_rows(cells)
        for row, cell in zip(rows, cells):
            row["dose"] = self.dose(cell["c"].candidate, cell["c"].baseline, cell["claim"].reward, cell["seeds"])
        return rows

    def dose(self, candidate: str, baseline: str, reward: str, seeds: list[int]) -> dict | None:
        """How strongly the pair's constraints acted over training, on the cell's seeds: each objective's clip
        fraction (`clip_ratio/region_mean`, the mean over the run's steps, then over seeds) and the **disagreement**,
        the share of tokens whose clip state the other objective would set otherwise — each run's sampled tokens at
        the steps it kept (`rescore.sampled_tokens`; the published runs keep the first, middle and last) re-scored
        under the other's clip test (`rescore.disagreement`), averaged over its steps, the pair's two runs and the
        seeds. Against START or ZERO only the candidate's clip fraction; None without seeds."""
        measures = [m for m in (candidate, baseline) if m in claims.OBJECTIVES]
        if not seeds or not measures:
            return None
        clip = {m: float(np.mean([self._clip_fraction((m, reward, s)) for s in seeds])) for m in measures}
        differ = None
        if len(measures) == 2:
            differ = float(np.mean([np.mean([self._disagreement((m, reward, s), other)
                                             for m, other in ((candidate, baseline), (baseline, candidate))])
                                    for s in seeds]))
        return {"clip": clip, "disagreement": differ}

    def _clip_fraction(self, key: tuple) -> float:
        rows = self.finished_series[key][0].values()
        return float(np.mean([row.get("clip_ratio/region_mean", 0.0) for row in rows]))

    def _disagreement(self, key: tuple, other: str) -> float:
        """One run's disagreement with `other`'s clip test over the steps whose tokens it kept (NaN with none),
        re-scored once per process for as long as the run's token files stay as they are (`RESCORED`)."""
        folder, steps = self.plan.runs[key].folder, tuple(self.finished_series[key][0])

        def rescored() -> float:
            if key not in self._samples:  # each step's file read once for every other measure it is scored under
                kept_steps = sorted(set(store.token_steps(folder)).intersection(steps))
                self._samples[key] = [t for step in kept_steps if (t := sampled_tokens(folder, step)) is not None]
            shares = [disagreement(tokens, claims.OBJECTIVES[other]) for tokens in self._samples[key]]
            return float(np.mean(shares)) if shares else np.nan

        return RESCORED.get((str(folder), tail.file_identity(folder / "tokens"), steps, other), rescored)

    @_kept
    def collapses(self) -> list[dict]:
        """Per measure (task rewards), over its finished seeds: how many collapsed (`engine/stability.py`'s flag at
        the end, or a run that failed on a non-finite value), the share with its Wilson 95% interval, and the steps
        of collapse; and the spread of its reward curve over seeds — the standard deviation over the seeds that ran to
        the end of each run's mean reward over steps 1–T, with its 95% interval (`intervals.sd_interval`)."""
        out = []
        for measure in dict.fromkeys(m for m, r, _ in self.plan.runs if r == "task"):
            steps, mean_rewards = [], []
            n = 0
            for seed in self.plan.seeds_of(measure):
                run = self.plan.runs[(measure, "task", seed)]
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
            sd, sd_low, sd_high = intervals.sd_interval(mean_rewards, within=metric_range("reward"))
            out.append({"measure": measure, "n": n, "collapsed": len(steps), "share": share, "low": low, "high": high,
                        "steps": sorted(steps), "reward_sd": sd, "reward_sd_low": sd_low, "reward_sd_high": sd_high,
                        "reward_n": len(mean_rewards)})
        return out

    @_kept
    def curves(self, metric: str) -> dict[str, dict]:
        """Per measure (task rewards), `metric` over the run: the steps and, over the finished seeds, the mean with
        its band (`intervals.summarize`, within [0, 1] for an accuracy or a reward). Held-out metrics are read at
        their evaluations, the others at every step."""
        out = {}
        bounds = (0.0, 1.0) if metric in (*claims.HELD_OUT, "reward", "accuracy") else (0.0, np.inf)
        for measure in dict.fromkeys(m for m, r, _ in self.plan.runs if r == "task"):
            series = []
            for seed in self.plan.seeds_of(measure):
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

    @_kept
    def pilot(self, metric: str = "eval/accuracy",
              sizes: tuple[int, ...] = (significance.fewest_seeds(), 12, 24)) -> dict | None:
        """The pilot's spread: over the seeds where both of `PILOT`'s runs are done, the final `metric` of each, the
        standard deviation (ddof 1) of PPO's and of the paired difference KL3 − PPO, and the smallest paired difference
        S seeds could resolve at that spread (`intervals.half_width`) for each S in `sizes` (from the fewest at which
        a verdict is possible at all); None below 2 seeds."""
        series = self.finished_series
        seeds = [s for s in self.plan.seeds_of(*PILOT) if all((m, "task", s) in series for m in PILOT)]
        finals = {(m, s): _readings(*series[(m, "task", s)], self.plan.steps)["end"][metric] for m in PILOT for s in seeds}
        if len(seeds) < 2:
            return None
        ppo = np.array([finals[(PILOT[0], s)] for s in seeds])
        diff = np.array([finals[(PILOT[1], s)] for s in seeds]) - ppo
        sd = float(diff.std(ddof=1))
        effects = {"GBMPO's ProbL2 gain (the one gain a seed paper reports in this unit)": claims.PROBL2_EFFECT.size,
                   "the 5-point margin (fixed after the learn pair was read)": claims.SMALLEST_EFFECT[metric].size
                   } if metric in claims.SMALLEST_EFFECT else {}
        return {"metric": metric, "n": len(seeds), "planned": self.plan.pilot_seeds, "ppo_mean": float(ppo.mean()),
                "ppo_sd": float(ppo.std(ddof=1)),
                "difference_mean": float(diff.mean()), "difference_sd": sd,
                "resolvable": {size: intervals.half_width(sd, size) for size in sizes},
                "power": {name: (size, *significance.seeds_needed(diff, size)) for name, size in effects.items()},
                "declared": (claims_lm.DECLARED.get((self.plan.setting, self.plan.device))
                             if self.plan.model != BUILTIN else None),
                "closed_at": claims_lm.CLOSED_AT.get((self.plan.setting, self.plan.device))}

    def report(self, bandit: claims_report.Report) -> claims_report.Report:
        """The bandit report with these cells added: those of the finished runs' pairs (n says how many seeds)."""
        finished = "" if self.plan.finished else f" ({self.plan.done} of {len(self.plan.runs)} runs finished so far)"
        collapses = [f"collapsed, {row['measure']}: {row['collapsed']}, share {row['share [95% Wilson]']}, "
                     f"at step {row['steps of collapse']}; the reward's spread over seeds (sd of each run's mean "
                     f"reward) {row[SPREAD]}"
                     for row in collapse_table(self.collapses())]
        pilot = self.pilot()
        provenance = f"; {self.plan.provenance}" if self.plan.provenance else ""
        return replace(bandit, rows=bandit.rows + self.rows(), lm=self.plan.text + finished + provenance,
                       lm_details=(*collapses, *([pilot_text(pilot)] if pilot else ())))


CURVES = ("eval/accuracy", "eval/accuracy_greedy", "reward", "entropy")  # the learning curves the page draws


SPREAD = "reward's spread over seeds: sd [95%]"  # the column of `collapse_table`


def collapse_table(collapses: list[dict]) -> list[dict]:
    """`LMPlan.collapses` as the page and the docs print it."""
    return [{"measure": row["measure"], "collapsed": f"{row['collapsed']} of {row['n']}" if row["n"] else "no run yet",
             "share [95% Wilson]": "—" if not row["n"] else f"{row['share']:.2f} [{row['low']:.2f}, {row['high']:.2f}]",
             "steps of collapse": ", ".join(map(str, row["steps"])) or "—",
             SPREAD: "—" if row["reward_n"] < 2 else
             f"{row['reward_sd']:.3f} [{row['reward_sd_low']:.3f}, {row['reward_sd_high']:.3f}], n = {row['reward_n']}"}
            for row in collapses]


def pilot_text(pilot: dict) -> str:
    """`LMPlan.pilot` in a sentence."""
    sizes = " / ".join(map(str, pilot["resolvable"]))
    reach = " / ".join(f"±{v:.3f}" for v in pilot["resolvable"].values())
    done = f"{pilot['n']} seeds" + (f" of its {pilot['planned']} done" if pilot["n"] < pilot["planned"] else "")
    count = lambda n: "more than 10,000" if n is None else f"{n}"  # noqa: E731
    power = "; ".join(f"at {name} ({size:+.3f}) {count(n)} seeds [{count(low)}, {count(high)}]"
                      for name, (size, n, low, high) in pilot["power"].items())
    per_measure, pair = pilot["declared"] or (None, None)
    if pair is None:
        design = ""
    elif not per_measure and pilot["closed_at"]:
        design = (f" Declared: the pair alone on {pair} seeds, sized from another device's pilot before any ran; "
                  f"closed at {pilot['closed_at']} when no device was lent to train more (a stop that does not depend "
                  "on the data), and its tests are read once, there.")
    elif not per_measure:
        design = (f" Declared: the pair alone on {pair} seeds, sized from another device's pilot before any ran; its "
                  "tests are read at the n done, without correcting α for a later look.")
    else:
        design = (f" A two-stage design: {per_measure} seeds per measure first; the pilot pair's extension to {pair} "
                  "was declared from their spread before it ran, and its tests are read at the pooled n without "
                  "correcting α for that look.")
    return (f"Pilot ({' and '.join(PILOT)}, {done}): {pilot['metric']} at the end, PPO "
            f"{pilot['ppo_mean']:.3f} (sd {pilot['ppo_sd']:.3f} over seeds); the paired difference KL3 − PPO "
            f"{pilot['difference_mean']:+.3f} (sd {pilot['difference_sd']:.3f}). At that spread the paired 95% "
            f"interval's half-width at {sizes} seeds is {reach}: a true difference of that size is detected about "
            f"half the time (below {significance.fewest_seeds()} seeds no sign-flip p reaches 0.05, so never)"
            + (f"; the t-test alone needs, for 80% power, {power} (at the ends of the spread's 95% interval), and a "
               "verdict, which also needs the sign-flip test and Holm over its family, needs more (each cell's "
               "verdict power)." if power else ".") + design)


def _readings(rows: dict[int, dict], evals: dict[int, dict], steps: int) -> dict[str, dict[str, float]]:
    """Per reading, each compared metric's value in one run, from its metrics and its evaluations by step
    (`readings`); "start": step 1's (its entropy was measured on completions sampled before any update)."""
    metrics = {c.metric for claim in claims.CLAIMS for c in claim.lm_comparisons}
    out = {reading: {m: float(np.mean([rows[s][m] for s in window if m in rows.get(s, {})] or [np.nan]))
                     for m in metrics}
           for reading, window in {**windows(steps), "start": range(1, 2)}.items()}
    last = rows.get(steps, {})
    out["whole run"] = {m: float(last.get(m, np.nan)) for m in claims.WHOLE_RUN}
    out["whole run"][claims.TIME_TO_COLLAPSE] = (float(last.get("stability/collapse_step", steps))
                                                 if last.get("stability/collapsed") is not None else np.nan)
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
