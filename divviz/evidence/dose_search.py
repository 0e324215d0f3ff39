"""The dose searches, read: where on SmolLM2-135M does a constraint bind enough that PPO and KL3 can differ?

`scripts/dose_search.py` trains each declared search's points — PPO ε = 0.2 and KL3 δ = 0.05 at seed 0 on the learn
setting's batch for `STEPS` steps — and publishes its summary as `published/<search>.json`:

    {"rule": RULE, "steps", "flags", "points": {point: {"mu", "minibatches", "lr", ["temperature"], "commit",
                                                        "ppo": run, "kl3": run, "reading"}}, "choice"}
    a run  {"state", "steps", "clip", "entropy", "disagreement", "reward" (one value a step, None where unread),
            "collapse_step", "evals": [{"step", "eval/accuracy", "eval/accuracy_greedy"}], "step_s" (median s a step)}

The **disagreement** of a step is the share of its sampled tokens whose clip state the other objective would set
otherwise (`rescore.disagreement`). **The rule** (docs/claims.md; fixed before the first search's first run, 6af9705):
the experiment's setting is the cheapest point (CPU seconds a run) at which
  1. PPO's clip fraction, averaged over the run, is at least 3%;
  2. the disagreement, averaged over the pair's two runs, is at least 2% of tokens;
  3. PPO's sampled held-out accuracy at the end is above its start;
  4. PPO's run collapses (`engine/stability.py`) or its entropy's last-10-step mean falls below half its first step's.
Failing 4, the point meeting 1–3 with the largest disagreement (the stability claim then not testable); none meeting
1–3, no binding regime at this cost. The script and the Claims page read the searches through this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from divviz.catalogue.params import DivvizInputError
from divviz.runs.tail import open_regular

STEPS = 100
RULE = {"ppo_clip": 0.03, "disagreement": 0.02, "entropy_fraction": 0.5, "entropy_window": 10}
CONDITIONS = ("binds", "differ", "learns", "destabilises")  # the rule's 1–4, as a reading names them
MAX_SUMMARY_BYTES = 8 * 2**20  # a summary as published (the first search's 18 points: 0.3 MB)


@dataclass(frozen=True)
class Search:
    """One declared search: its points (name: μ, K, learning rate and sampling temperature, None for the model's
    0.7), the likeliest to bind first, and the name its summary and runs are published under."""

    name: str
    points: dict[str, tuple[int, int, float, float | None]]

    def design(self, point: str) -> dict:
        """A point's μ, K and learning rate, and its temperature where it sets one: as its summary and its runs'
        manifest record them."""
        mu, k, lr, temperature = self.points[point]
        return {"mu": mu, "minibatches": k, "lr": lr, **({"temperature": temperature} if temperature else {})}


SEARCHES = {
    "first": Search("smollm2-135m-dose-search", {  # μ, K and the learning rate over the ranges (6af9705)
        "mu2-K8-lr5e-5": (2, 8, 5e-5, None), "mu1-K4-lr1e-4": (1, 4, 1e-4, None), "mu2-K8-lr1e-4": (2, 8, 1e-4, None),
        "mu4-K8-lr5e-5": (4, 8, 5e-5, None), "mu1-K8-lr1e-4": (1, 8, 1e-4, None), "mu2-K4-lr1e-4": (2, 4, 1e-4, None),
        "mu1-K4-lr2e-4": (1, 4, 2e-4, None), "mu2-K8-lr2e-4": (2, 8, 2e-4, None), "mu4-K8-lr1e-4": (4, 8, 1e-4, None),
        "mu1-K4-lr5e-5": (1, 4, 5e-5, None), "mu1-K8-lr5e-5": (1, 8, 5e-5, None), "mu2-K4-lr5e-5": (2, 4, 5e-5, None),
        "mu1-K8-lr2e-4": (1, 8, 2e-4, None), "mu2-K4-lr2e-4": (2, 4, 2e-4, None), "mu4-K4-lr5e-5": (4, 4, 5e-5, None),
        "mu4-K4-lr1e-4": (4, 4, 1e-4, None), "mu4-K4-lr2e-4": (4, 4, 2e-4, None), "mu4-K8-lr2e-4": (4, 8, 2e-4, None)}),
    "second": Search("smollm2-135m-second-dose-search", {  # a policy that keeps its entropy (scripts/dose_search.py)
        "mu4-K8-lr5e-5-T1": (4, 8, 5e-5, 1.0), "mu2-K8-lr5e-5-T1": (2, 8, 5e-5, 1.0),
        "mu4-K8-lr2.5e-5-T1": (4, 8, 2.5e-5, 1.0), "mu4-K8-lr2.5e-5": (4, 8, 2.5e-5, None)}),
}


def mean(values) -> float | None:
    """The mean of the values read (None where a step was not), None if none was."""
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def reading(point: dict) -> dict | None:
    """The rule's four conditions on a point whose two runs are done (None otherwise)."""
    ppo, kl3 = point.get("ppo"), point.get("kl3")
    if not ppo or not kl3 or ppo["state"] != "done" or kl3["state"] != "done":
        return None
    window = RULE["entropy_window"]
    clip, dose = mean(ppo["clip"]), mean(ppo["disagreement"] + kl3["disagreement"])
    start, end = ppo["evals"][0]["eval/accuracy"], ppo["evals"][-1]["eval/accuracy"]
    fell = mean(ppo["entropy"][-window:]) < RULE["entropy_fraction"] * ppo["entropy"][0]
    return {"ppo_clip": clip, "disagreement": dose, "ppo_accuracy": [start, end],
            "binds": clip >= RULE["ppo_clip"], "differ": dose >= RULE["disagreement"], "learns": end > start,
            "destabilises": ppo["collapse_step"] is not None or fell,
            "cpu_s_per_run": (ppo["step_s"] + kl3["step_s"]) / 2 * STEPS}


@dataclass(frozen=True)
class Choice:
    """The rule's choice among a search's points read so far: the point (None where it chose none), why, and whether
    every point the search declares was read."""

    point: str | None
    why: str
    all_read: bool

    @property
    def words(self) -> str:
        """As the published summaries keep it: the point, then why; or "none" (all read) or "none yet", then why."""
        if self.point is not None:
            return f"{self.point}: {self.why}"
        return f"none: {self.why}" if self.all_read else f"none yet ({self.why})"


def choose(points: dict, declared: int) -> Choice:
    """The rule's choice among the points read so far; `declared`: how many points the search declares."""
    read = {name: r for name, p in points.items() if (r := p.get("reading"))}
    all_read = len(read) == declared
    full = [n for n, r in read.items() if all(r[c] for c in CONDITIONS)]
    if full:
        return Choice(min(full, key=lambda n: read[n]["cpu_s_per_run"]), "all four conditions", all_read)
    partial = [n for n, r in read.items() if all(r[c] for c in CONDITIONS[:3])]
    if partial:
        best = max(partial, key=lambda n: read[n]["disagreement"])
        return Choice(best, "conditions 1–3 (the stability claim not testable)", all_read)
    if all_read:
        return Choice(None, f"no binding regime at this cost (all {len(read)} points read, none meets conditions "
                            "1–3)", True)
    return Choice(None, f"{len(read)} of {declared} points read", False)


PREREGISTRATION = "published/smollm2-135m-bind/preregistration.md"


def experiment_setting(choices: dict[str, Choice | None]) -> str:
    """The pre-registered experiment's setting, in words, from each search's choice (`choose`; None: nothing published
    yet), in `SEARCHES`' order, as the pre-registration reads them: the first search's choice if it makes one, else
    the next's; while a search that decides is unread, none yet; where none makes one, the experiment is not run."""
    for label, choice in choices.items():
        if choice is None or (choice.point is None and not choice.all_read):
            return f"none yet: the {label} search is still being read"
        if choice.point is not None:
            return f"{choice.point}, the {label} search's choice"
    return ("none: neither search chose a point, so by the pre-registration the experiment is not run — no setting "
            "was found on SmolLM2-135M at this cost where PPO ε = 0.2 and KL3 δ = 0.05 act differently on enough "
            "tokens, for long enough, to test the papers' claims")


def read_count(summary: dict) -> int:
    """How many of a summary's points the rule has read (both runs done)."""
    return sum(1 for p in summary["points"].values() if p.get("reading"))


TABLE_HEADERS = ("point", "runs", "PPO clip", "KL3 clip", "disagreement", "PPO entropy step 1 → last 10 steps",
                 "PPO collapse step", "PPO held-out start → end", "PPO s/step", "rule 1 2 3 4")


def rows(summary: dict) -> list[tuple[str, ...]]:
    """One row of text a point, in `TABLE_HEADERS`' order: the means over the run (three decimals of a percent:
    2.999% fails 3%), PPO's entropy at its first step and its last 10 steps' mean, the step it collapsed at, its
    held-out accuracy at the start and the end, its median seconds a step and each of the rule's conditions met (✓)
    or not (✗); "—" where not read."""
    found = []
    for name, p in summary["points"].items():
        ppo, kl3, r = p.get("ppo"), p.get("kl3"), p.get("reading")
        pct = lambda x: "—" if x is None else f"{100 * x:.3f}%"  # noqa: E731
        runs = ", ".join(f"{o} {p[o]['state']} {p[o]['steps']}" for o in ("ppo", "kl3") if o in p)
        entropy = f"{ppo['entropy'][0]:.3f} → {mean(ppo['entropy'][-10:]):.3f}" if ppo and ppo["entropy"] else "—"
        held = (f"{ppo['evals'][0]['eval/accuracy']:.3f} → {ppo['evals'][-1]['eval/accuracy']:.3f}"
                if ppo and ppo["evals"] else "—")
        found.append((name, runs, pct(mean(ppo["clip"]) if ppo else None), pct(mean(kl3["clip"]) if kl3 else None),
                      pct(mean((ppo or {}).get("disagreement", []) + (kl3 or {}).get("disagreement", []))),
                      entropy, "no" if not ppo or ppo["collapse_step"] is None else f"{ppo['collapse_step']:.0f}", held,
                      str(ppo and ppo["step_s"] and round(ppo["step_s"], 1)),
                      " ".join("✓" if r[c] else "✗" for c in CONDITIONS) if r else "—"))
    return found


def table(summary: dict) -> str:
    """The summary as a Markdown table and the rule's choice under it (what the script prints and docs/claims.md
    holds)."""
    lines = ["| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(summary)]
    return "\n".join(lines + ["", f"The rule's choice so far: {summary['choice']}"])


def per_step(summary: dict) -> dict[str, dict[str, list]]:
    """Each point's dose and entropy step by step: {point: {"step", "disagreement" (the pair's mean where both runs
    read the step, else the one that did), "ppo_clip", "ppo_entropy"}}."""
    found = {}
    for name, p in summary["points"].items():
        ppo, kl3 = p.get("ppo") or {}, p.get("kl3") or {}
        steps = max(len(ppo.get("clip", [])), len(kl3.get("clip", [])))
        at = lambda run, key, t: (run.get(key) or [])[t] if t < len(run.get(key) or []) else None  # noqa: E731
        found[name] = {"step": list(range(1, steps + 1)),
                       "disagreement": [mean([at(ppo, "disagreement", t), at(kl3, "disagreement", t)])
                                        for t in range(steps)],
                       "ppo_clip": [at(ppo, "clip", t) for t in range(steps)],
                       "ppo_entropy": [at(ppo, "entropy", t) for t in range(steps)]}
    return found


def published_summary(search: Search, where: Path) -> dict | None:
    """The search's published summary in the folder `where` (untrusted: a regular file of at most
    `MAX_SUMMARY_BYTES` whose points are of this search and carry what `rows` and `per_step` read), None where
    there is none yet; DivvizInputError naming the file where it is damaged."""
    path = where / f"{search.name}.json"
    try:
        stat = path.lstat()
    except FileNotFoundError:
        return None
    return _checked(str(path), stat.st_mtime_ns, stat.st_size, tuple(search.points))


@lru_cache(maxsize=8)
def _checked(where: str, mtime_ns: int, size: int, declared: tuple[str, ...]) -> dict:
    """`published_summary`'s file, read and checked once per state of the file (the Claims page asks on every
    rerun), against the search's `declared` points; DivvizInputError where it is damaged (read again at every call:
    an exception is not kept)."""
    path = Path(where)
    shown = f"published/{path.name}"
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_SUMMARY_BYTES + 1)
    except FileNotFoundError:
        raise DivvizInputError(f"{shown}: gone while it was read") from None
    except OSError as err:
        raise DivvizInputError(f"{shown}: not a regular file ({err.strerror or err})") from None
    if len(data) > MAX_SUMMARY_BYTES:
        raise DivvizInputError(f"{shown}: larger than {MAX_SUMMARY_BYTES:,} bytes")
    try:
        found = json.loads(data)
        _check(found, declared)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise DivvizInputError(f"{shown}: not a dose search's summary ({type(err).__name__}: {err})") from None
    return found


def _check(found: dict, declared: tuple[str, ...]) -> None:
    """ValueError, TypeError, KeyError, IndexError or AttributeError where the summary is not one this module can
    read for a search declaring the points `declared`: its points are among them, and the rule, `rows` and `per_step`
    read each of them."""
    if not isinstance(found, dict) or not isinstance(found["points"], dict) or not isinstance(found["choice"], str):
        raise TypeError("no points or choice")
    unknown = set(found["points"]) - set(declared)
    if unknown:
        raise ValueError(f"points this search does not declare: {', '.join(sorted(unknown))[:200]}")
    for p in found["points"].values():
        for run in (p.get(o) for o in ("ppo", "kl3")):
            if run is None:
                continue
            if not isinstance(run["state"], str) or not isinstance(run["steps"], int):
                raise TypeError("a run without its state or steps")
            for key in ("clip", "entropy", "disagreement"):
                if not all(v is None or isinstance(v, (int, float)) for v in run[key]):
                    raise TypeError(f"a run's {key} is not numbers")
            if not all(isinstance(e["eval/accuracy"], (int, float)) for e in run["evals"]):
                raise TypeError("an evaluation without its accuracy")
        reading_found = p.get("reading")
        if reading_found is not None and not all(isinstance(reading_found[c], bool) for c in CONDITIONS):
            raise TypeError("a reading without its four conditions")
        reading(p)  # what the rule reads of a finished pair: its first and last entropies, evaluations, step times
    rows(found), per_step(found)  # and what the table and the chart read


README_ROW = "| where the constraint binds (the dose searches) |"  # README's row of the searches, `readme_row`


def readme_row(summaries: dict[str, dict | None]) -> str:
    """README's row: each declared search (its published summary, None where there is none) — how many points
    are read, the largest disagreement and where, and the rule's choice."""
    said = []
    for label, search in SEARCHES.items():
        summary = summaries.get(label)
        read = {name: p["reading"] for name, p in (summary or {"points": {}})["points"].items() if p.get("reading")}
        text = f"{label} search: {len(read)} of {len(search.points)} points read"
        if read:
            top = max(read, key=lambda name: read[name]["disagreement"])
            text += (f", the largest disagreement {100 * read[top]['disagreement']:.3f}% of tokens ({top}) where the "
                     f"rule asks {100 * RULE['disagreement']:g}%; its choice: {summary['choice']}")
        said.append(text)
    return (f"{README_ROW} PPO ε = 0.2 and KL3 δ = 0.05 at seed 0, {STEPS} steps a point: {'; '.join(said)} | "
            "[docs/claims.md](docs/claims.md#where-the-constraint-binds-the-dose-search) |\n")


def published_runs(search: Search, manifests: dict[str, dict]) -> dict[str, dict[str, tuple[str, str]]]:
    """Where each of the search's runs is published: {point: {"ppo" | "kl3": (grid, its CPU kernels)}} from the
    published grids' manifests (`runs.published.manifests`): its grid, then one per further CPU (<grid>-2, …)."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for grid, manifest in manifests.items():
        if grid != search.name and not (grid.startswith(f"{search.name}-") and grid.rsplit("-", 1)[1].isdigit()):
            continue
        for cell in manifest["runs"].values():
            if isinstance(cell, dict) and cell.get("point") in search.points:
                objective = "ppo" if cell.get("measure") == "ratio" else "kl3"
                found.setdefault(cell["point"], {})[objective] = (grid, str(manifest.get("cpu", "")))
    return found
