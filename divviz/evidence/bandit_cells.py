"""The bandit claims' cells (`claims.CLAIMS`' `comparisons` on the grid `claims.GRID`, `claims.RANDOM_GRID`): each
cell's candidate and baseline values seed by seed, read from exact bandit runs (`bandit.grpo.run_bandits`) at an
early and a late iteration (`claims.EARLY`, `claims.LATE`) — what `claims_report.build` makes cells of, and what
`bandit_published` publishes.
"""

from __future__ import annotations

from typing import Callable

from divviz.bandit.grpo import run_bandits
from divviz.evidence.claims import CLAIMS, EARLY, LATE, OBJECTIVES, START, ZERO, Comparison


def bandit_cells(seeds: int, grid: tuple, progress: Callable[[float, str], None] | None = None) -> list[dict]:
    """The bandit claims' cells on `grid` with `seeds` seeds, each as its candidate's and baseline's values seed by
    seed (with what names the cell: `bandit_published` publishes them so)."""
    cells, names = [], list(OBJECTIVES)
    for done, condition in enumerate(grid):
        if progress:
            progress(done / len(grid), f"bandit: {condition.text}")
        runs = run_bandits(condition.config(LATE), list(OBJECTIVES.values()), seeds=range(seeds))
        by_name = {name: runs[i::len(names)] for i, name in enumerate(names)}
        for claim in (c for c in CLAIMS if (c.reward == "random") == (condition.reward == "coin")):
            for c in claim.comparisons:
                for reading, iteration in (("early", EARLY), ("late", LATE)):
                    window = range(iteration - EARLY, iteration) if c.metric in PER_UPDATE else range(iteration - 1,
                                                                                                      iteration)
                    candidate, baseline = (bandit_readings(by_name, name, c, window) for name in (c.candidate,
                                                                                                 c.baseline))
                    span = (f"iterations {window.start + 1}–{window.stop}" if len(window) > 1
                            else f"iteration {iteration}")
                    cells.append({"claim": claim.key, "condition": f"{condition.text} · {reading} ({span})",
                                  "reading": reading, "candidate": c.candidate, "baseline": c.baseline,
                                  "metric": c.metric, "candidate_values": candidate, "baseline_values": baseline})
    if progress:
        progress(1.0, "done")
    return cells


PER_UPDATE = ("entropy/would_masked_low", "entropy/would_masked_high")  # read as their mean over a window of updates


def bandit_readings(by_name: dict, name: str, c: Comparison, window: range) -> list[float]:
    """Each seed's value of `c.metric` for the measure `name`, the mean over the iterations in `window` (0-based):
    the candidate's own start (its entropy before any update) for START, and 0 for ZERO."""
    if name == ZERO:
        return [0.0] * len(by_name[c.candidate])
    if name == START:
        return [run.initial_entropy for run in by_name[c.candidate]]
    return [float(run.history[c.metric][window.start:window.stop].mean()) for run in by_name[name]]
