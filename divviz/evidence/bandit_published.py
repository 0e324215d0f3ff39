"""The bandit grid's cells at 64 seeds, published with the repository as data: each cell's per-seed values of its
candidate and its baseline, from which `claims_report.build` makes the cell (interval, tests, verdict) exactly as
it makes one it computes. A fresh clone's Claims page and `divviz claims` open on them instead of running the grid
(about 50 s on 2 cores; the cells' statistics are still computed, about 10 s), and a reader can recompute any bandit
cell from them.

    published/claims-bandit-64.json.gz   {"key", "seeds", "commit", "numpy", "cpu", "wall_s", "cells": [...]}
    a cell                               {"claim" (its key), "condition" (as the report shows it), "reading",
                                          "candidate", "baseline", "metric", "candidate_values", "baseline_values"}
                                         (values seed by seed: 0, 1, …)

`key` names what decides the values: the seeds, the grid's bandit settings, the objectives' settings, the compared
cells and `DESIGN`. A file whose key is not this code's is not read (the grid is computed instead), and
tests/evidence/test_evidence_tables.py fails until it is published again (`python scripts/evidence_tables.py`).
The bandit's own code, which no key can name, the same test checks: it computes three of the grid's conditions
again and compares them with the published values.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from divviz.engine.config import identity_keys, objective_settings
from divviz.evidence.claims import CLAIMS, LATE, OBJECTIVES
from divviz.runs import published

FILE = "claims-bandit-64.json.gz"
DESIGN = 1  # bumped when what a cell holds changes


@lru_cache(maxsize=16)
def key(seeds: int, grid: tuple) -> str:
    """The hash of what decides a grid's cells (see the module's docstring)."""
    what = {"seeds": seeds, "design": DESIGN, "grid": [condition.config(LATE).to_dict() for condition in grid],
            "objectives": {name: identity_keys(objective_settings(o)) for name, o in OBJECTIVES.items()},
            "comparisons": [(claim.key, claim.reward, c.candidate, c.baseline, c.metric, c.sign)
                            for claim in CLAIMS for c in claim.comparisons]}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def path() -> Path:
    return published.root() / FILE


def read(seeds: int, grid: tuple) -> dict | None:
    """The published grid when it is this grid at `seeds` seeds (its key is this code's); None when it is not, or
    when the file is absent or cannot be read (then the grid is computed, and nothing is lost)."""
    try:
        stat = path().stat()
    except OSError:
        return None
    return _checked(str(path()), stat.st_mtime_ns, stat.st_size, seeds, key(seeds, grid))


@lru_cache(maxsize=4)
def _checked(where: str, mtime_ns: int, size: int, seeds: int, wanted: str) -> dict | None:
    """The file's content if it is the grid keyed `wanted` and whole at `seeds` seeds: checked once per state of the
    file (the page asks on every rerun)."""
    found = _parsed(where)
    if not isinstance(found, dict) or found.get("key") != wanted or not _whole(found, seeds):
        return None
    return found


CELL = ("claim", "condition", "reading", "candidate", "baseline", "metric", "candidate_values", "baseline_values")


def _whole(found: dict, seeds: int) -> bool:
    """Whether a parsed file holds what `source` and `claims_report.build` read: its provenance, and cells of the
    claims' comparisons with every field and `seeds` numbers in each list of values."""
    compared = {(claim.key, c.candidate, c.baseline, c.metric) for claim in CLAIMS for c in claim.comparisons}
    return (all(isinstance(found.get(k), str) for k in ("commit", "cpu", "numpy"))
            and isinstance(found.get("wall_s"), (int, float)) and isinstance(found.get("cells"), list)
            and all(isinstance(cell, dict) and all(k in cell for k in CELL)
                    and (cell["claim"], cell["candidate"], cell["baseline"], cell["metric"]) in compared
                    and all(isinstance(cell[k], list) and len(cell[k]) == seeds
                            and all(isinstance(v, (int, float)) for v in cell[k])
                            for k in ("candidate_values", "baseline_values"))
                    for cell in found["cells"]))


def _parsed(where: str) -> object:
    """The file's content (read once per state of the file: `_checked` keeps it); None if unreadable."""
    try:
        with gzip.open(where, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, EOFError):
        return None


def source(found: dict) -> str:
    """Where published cells come from, as a phrase: "read from published/claims-bandit-64.json.gz, computed by
    commit 3f9879e on <its CPU> with numpy 2.4.6 in 47 s"."""
    return (f"read from published/{FILE}, computed by commit {found['commit']} on {found['cpu']} with numpy "
            f"{found['numpy']} in {found['wall_s']:.0f} s")


def write(cells: list[dict], seeds: int, grid: tuple, wall_s: float, commit: str) -> Path:
    """Publish a grid's cells (the maintainer's half: `scripts/evidence_tables.py`), atomically; a published file
    that already holds these cells of this grid is left as it is (its commit and time stay the first ones)."""
    target = path()
    if (found := read(seeds, grid)) is not None and found["cells"] == json.loads(json.dumps(cells)):
        return target
    about = {"key": key(seeds, grid), "seeds": seeds, "commit": commit, "numpy": np.__version__, "cpu": cpu_name(),
             "wall_s": round(wall_s, 1), "cells": cells}
    temporary = target.with_name(target.name + ".tmp")
    with gzip.GzipFile(temporary, "wb", mtime=0) as f:  # no time stamp: the same cells give the same bytes
        f.write(json.dumps(about, separators=(",", ":")).encode())
    os.replace(temporary, target)
    return target


def cpu_name() -> str:
    """This CPU's model name (/proc/cpuinfo), or "a CPU" where it cannot be read."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "a CPU"
