"""The claims on a real model within a CPU budget: one update of SmolLM2-135M-Instruct per batch, each measure from the
same starting weights on the same rollouts (`engine.compare.same_batch`), paired over the batches.

For each of N batches (batch b: the model's own task and prompt format, sampled with seed b from the shipped weights):
sample the completions once, then for each measure restore the weights and take μ optimiser steps, and read what that
one update did over the full vocabulary at every sampled position — the exact change of the entropy (and its first-order
prediction), of the top-1 mass, the share of the mass gained by argmax tokens, and the covariance of log π_old and A
by clip state. The claims of the random-reward control use the same batches with a coin per completion as reward.
The settings are the model's "look only" setting (`engine/models.py`: 4 prompts × 4, one full-batch step per pass,
float32) but for `SETTINGS`: a larger step and μ, chosen so that the clips bind in one update (about 10% of the tokens
clipped under PPO; at lr 1e-5 and μ = 2 none is, and every measure would make the same update). The claims over
training use the learning setting instead (`claims_lm`).

Each batch's results are cached on disk as computed (`cache_folder`): a second call trains nothing, and Ctrl-C keeps
every batch already done. The batches divviz's own report reads are published with the repository
(`published/smollm2-135m-one-update/`, the same files; `scripts/publish_one_update.py`): a fresh clone reads them
instead of computing them, and a batch computed here is read before a published one.

    plan = RealPlan(batches=16)
    plan.compute(progress)      # the batches not cached yet
    rows = plan.rows()          # the report's cells
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path


from divviz.catalogue.params import Param
from divviz.engine.config import RunConfig, identity_keys, objective_settings
from divviz.engine.models import SMOLLM2_LOOK
from divviz.evidence import claims, claims_report
from divviz.evidence.kept import Kept
from divviz.runs import tail

MODEL = "smollm2-135m"
SETTINGS = {**{k: v for k, v in SMOLLM2_LOOK.items() if k not in ("steps", "checkpoint_every")},
            "lr": 5e-5, "mu": 4, "dtype": "float32"}  # one update that clips (see the module's docstring)
BATCHES_PARAM = Param("batches", 16, 2, 256, high_open=False, kind="int", typical=(2, 64, 1),
                      doc="rollout batches of SmolLM2-135M, each updated once by every measure from the same weights")
DESIGN = 2  # bumped when what a cached batch holds changes (2: the inverse-CDF draw); older files are computed again
PUBLISHED = "smollm2-135m-one-update"  # the published batches' folder in `published.root()`
COMPUTED = Kept()  # (batches, each batch file's path and identity) ↦ the cells


def measures() -> dict[str, list[str]]:
    """Per reward ("task", "random"), the measures some claim compares on the real model, in the catalogue's order."""
    named = {(name, claim.reward) for claim in claims.CLAIMS for c in claim.real_comparisons
             for name in (c.candidate, c.baseline)}
    return {reward: [name for name in claims.OBJECTIVES if (name, reward) in named] for reward in ("task", "random")}


def config(batch: int, reward: str) -> RunConfig:
    return RunConfig.make(model=MODEL, reward=reward, steps=1, seed=batch, checkpoint_every=0, **SETTINGS)


def cache_folder() -> Path:
    from divviz.engine.policy import cache_dir

    return cache_dir() / "claims_real"


def cache_file(batch: int, reward: str) -> Path:
    """Where batch `batch`'s results under `reward` are kept: named by everything that decides them (the run config,
    the measures' objectives, the model's checkpoint, DESIGN)."""
    return cache_folder() / f"batch{batch:03d}-{reward}-{_cache_key(batch, reward)}.json"


def result_file(batch: int, reward: str) -> Path | None:
    """Batch `batch`'s results under `reward`: computed here (`cache_file`), else published with the repository (the
    same file name, so the same config, measures, checkpoint and design), else None."""
    from divviz.runs import published

    here = cache_file(batch, reward)
    shared = published.root() / PUBLISHED / here.name
    return here if here.is_file() else shared if shared.is_file() else None


@lru_cache(maxsize=1024)
def _cache_key(batch: int, reward: str) -> str:
    """The hash of what decides a batch's results: made once per batch (a page rerun asks for every batch's file)."""
    from divviz.engine import smollm2

    key = json.dumps({"config": identity_keys(config(batch, reward).to_dict()), "design": DESIGN,
                      "checkpoint": smollm2.SHA256,
                      "measures": {m: identity_keys(objective_settings(claims.OBJECTIVES[m]))
                                   for m in measures()[reward]}},
                     sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class RealPlan:
    batches: int = BATCHES_PARAM.default

    @property
    def jobs(self) -> list[tuple[int, str]]:
        return [(b, reward) for b in range(self.batches) for reward, names in measures().items() if names]

    @property
    def missing(self) -> list[tuple[int, str]]:
        return [job for job in self.jobs if result_file(*job) is None]

    @property
    def text(self) -> str:
        cfg = config(0, "task")
        return (f"SmolLM2-135M-Instruct, one update per batch ({cfg.task}, {cfg.prompts} prompts × {cfg.group_size}, "
                f"μ = {cfg.mu}, lr {cfg.lr:g}) over {self.batches} batches")

    def compute(self, progress=lambda done, total, text: None) -> None:
        """Compute and cache every batch not cached yet (the model loaded once); Ctrl-C keeps those done."""
        from divviz.engine.compare import same_batch
        from divviz.engine.grpo import make_trainer

        missing, trainer = self.missing, None
        for k, (batch, reward) in enumerate(missing):
            progress(k, len(missing), f"batch {batch + 1} of {self.batches}, {reward} rewards")
            cfg = config(batch, reward)
            trainer = make_trainer(cfg) if trainer is None else replace(trainer, cfg=cfg)
            results = same_batch(cfg, [(m, claims.OBJECTIVES[m]) for m in measures()[reward]], 0, trainer=trainer)
            _write(cache_file(batch, reward), {r.label: r.metrics for r in results})
        progress(len(missing), len(missing), "done")

    def rows(self) -> list[dict]:
        """The report's cells: per claim and comparison, the paired difference over the cached batches — computed
        once for as long as the batches' files stay as they are (`kept.Kept`)."""
        files = {job: path for job in self.jobs if (path := result_file(*job)) is not None}
        identities = ((job, str(path), tail.file_identity(path)) for job, path in files.items())
        return COMPUTED.get((self.batches, *identities), lambda: self._rows(files))

    def _rows(self, files: dict[tuple[int, str], Path]) -> list[dict]:
        found = {job: json.loads(path.read_text()) for job, path in files.items()}
        cells = []
        for claim in claims.CLAIMS:
            for c in claim.real_comparisons:
                def value(name: str, batch: int) -> float | None:
                    result = found.get((batch, claim.reward))
                    if result is None:
                        return None
                    return 0.0 if name == claims.ZERO else result[name][c.metric]

                batches = [b for b in range(self.batches) if None not in (value(c.candidate, b), value(c.baseline, b))]
                rewarded = "random rewards" if claim.reward == "random" else f"{config(0, 'task').task}"
                cells.append(dict(claim=claim, setting=claims.REAL,
                                  condition=f"{rewarded} · one update, {len(batches)} batches", c=c,
                                  candidate=[value(c.candidate, b) for b in batches],
                                  baseline=[value(c.baseline, b) for b in batches], seeds=batches))
        return claims_report.comparison_rows(cells)

    def report(self, report: claims_report.Report) -> claims_report.Report:
        return replace(report, rows=report.rows + self.rows(), real=self.text)


def _write(path: Path, result: dict) -> None:
    """Write a batch's result atomically (a file is whole or absent, whatever stops the process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result, indent=1))
    os.replace(temporary, path)
