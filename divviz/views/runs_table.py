"""The Runs page's table: a line per run (its status, config and last metrics, whose run it is, the claims' name for
its objective), the filter over them and what the page was drawn from."""

from __future__ import annotations

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import objective_from, setting_of
from divviz.evidence import claims
from divviz.importers.source import source_of
from divviz.runs import published, store
from divviz.runs.runner import TIMING
from divviz.views.run_text import run_choice, run_label, task_label


ACTIVE = ("queued", "running")  # states whose files still change
PAGE_SIZE = 50  # the Runs page's table shows this many runs at a time


def overview_rows(runs: list, viewer) -> list[dict]:
    """The Runs page's table, a line per run (`overview_row`); the published grids' manifests are read once for all."""
    shared, found, grid_of = published.folder(), published.manifests(), published.grids_of_runs()
    return [overview_row(run, viewer, grid_of.get(run.name) if shared is not None and run.folder.parent == shared
                         else None, found) for run in runs]


def overview_row(run, viewer, grid: str | None, manifests: dict[str, dict]) -> dict:
    """A run's line in the Runs page's table: its status, its config's main fields and its last metrics row (read
    from the end of metrics.jsonl alone: the table needs no history); `grid`, the published grid it belongs to (None
    for a run of the runs folder), whose manifest in `manifests` names the commit that trained it."""
    last, evals = store.last_metrics(run.folder), store.read_evals(run.folder)
    collapsed = last.get("stability/collapse_step")
    return {"run": run.name, "state": run.state, "step": f"{run.step}/{run.steps}",
            "owner": owner_label(run.status, viewer, grid), "model": run.config.get("model", ""),
            "setting": setting_of(run.config),  # the model's named setting it trains at (learn, stress), if any
            "device": run.status.get("device") or "",  # where it trained (a runs folder may come from a GPU machine)
            "task": task_label(run.config), "objective": run_label(run), "claims measure": claims_measure(run.config),
            "seed": run.config.get("seed"),
            "reward": last.get("reward", float("nan")), "accuracy": last.get("accuracy", float("nan")),
            "held-out": (f"{evals[0]['eval/accuracy']:.2f} → {evals[-1]['eval/accuracy']:.2f}" if len(evals) > 1 else
                         f"{evals[0]['eval/accuracy']:.2f}" if evals else ""),
            "entropy": last.get("entropy", float("nan")), "max KL": last.get("stability/max_kl", float("nan")),
            "collapsed": "" if collapsed is None else f"at step {collapsed:.0f}",
            "source": ("timing run (Measure one step)" if run.status.get("kind") == TIMING
                       else f"published: trained by commit {manifests[grid].get('commit', '?')}" if grid
                       else source_of(run.config) or "trained here"), "message": run.message or ""}


def claims_measure(config: dict) -> str:
    """The name the claims give a run's objective (`claims.measure_of`: "box [0.716, 1.2] (KL3 δ=0.05's lower edge
    only)" where the objective's label reads clip_higher ε_low=0.2838 ε_high=0.2); "" for any other objective, or a
    config another version wrote."""
    try:
        return claims.measure_of(objective_from(config)) or ""
    except (DivvizInputError, TypeError, AttributeError):
        return ""


def matching(runs: list, query: str) -> list:
    """The runs whose description (`run_choice`: measure, model, task, seed, state, folder; an imported run's source,
    `importers.source.source_of`; the device it trained on; a published run's grid) contains every word of `query`,
    case aside; all of them for an empty query."""
    words = (query or "").lower().split()
    if not words:
        return list(runs)
    grid_of = published.grids_of_runs()
    described = ((run, f"{run_choice(run)} {run.name} {source_of(run.config)} {run.status.get('device') or ''} "
                       f"{grid_of.get(run.name, '')}".lower()) for run in runs)  # once per run, not once per word
    return [run for run, text in described if all(word in text for word in words)]


def seen(runs: list) -> tuple:
    """What the Runs page was drawn from: the runs' names and which of them were still active. When it changes (a
    run came, went, started or ended), the page is drawn again."""
    return tuple((run.name, run.state in ACTIVE) for run in runs)


def owner_label(status: dict, viewer, grid: str | None = None) -> str:
    """Whose run it is, as the Runs page says it: published (read-only, with its grid), you, another browser, or the
    terminal (identities stay hidden but for the teacher, who sees their first characters)."""
    if grid:
        return f"published: {grid}"
    owner = status.get("owner") or ""
    if not owner:
        return "terminal"
    if owner == viewer.who:
        return "you"
    return f"browser {owner[:6]}" if viewer.teacher else "another browser"
