"""The run pages' reading of run folders: every run a page lists (the runs folder's, then the published ones) and
every step of some runs as one CSV, the Runs page's download."""

from __future__ import annotations

import pandas as pd

from divviz.engine.config import setting_of
from divviz.runs import published, store
from divviz.views.figures import spreadsheet_csv
from divviz.views.run_text import run_label, task_label


def metrics_csv(runs) -> str:
    """Every step of `runs` as one CSV (the Runs page's download): each run's metrics rows and its held-out
    evaluations joined on the step (an evaluation's columns empty at the steps it did not evaluate; step 0's
    evaluation a row of its own), with the columns that say which run a row is of — its folder, objective, model,
    setting, task and seed."""
    frames = []
    for run in runs:
        metrics, evals = pd.DataFrame(store.read_metrics(run.folder)), pd.DataFrame(store.read_evals(run.folder))
        steps = (metrics.merge(evals, on="step", how="outer") if len(metrics) and len(evals)
                 else metrics if len(metrics) else evals)
        if len(steps):
            who = {"run": run.name, "objective": run_label(run), "model": run.config.get("model", ""),
                   "setting": setting_of(run.config), "task": task_label(run.config), "seed": run.config.get("seed")}
            frames.append(pd.DataFrame({**who, **steps.sort_values("step").reset_index(drop=True)}))
    return spreadsheet_csv(pd.concat(frames)) if frames else ""


def every_run(root) -> list:
    """The runs folder's runs, newest first, then the published runs (`runs/published.py`), read-only: what the
    Runs page and the Step inspector list. A published run's folder is in the published runs' folder."""
    shared = published.folder()
    return [*store.list_runs(root), *(store.list_runs(shared) if shared else ())]
