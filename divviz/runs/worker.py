"""Train the run whose config.json is in a run folder, in a process of its own: a fork of the pool (`pool.py`),
so that a crash in training cannot take the app or other runs down and SIGTERM stops it at once.
"""

import json
import time
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.runs.store import read_status, write_status
from divviz.runs.train import StopRequested, stop_on_sigterm, train


def main(folder: str) -> None:
    """Train the run; however it ends — even stopped or failing before its first step — its status says so."""
    folder = Path(folder)
    stop_on_sigterm()
    try:
        cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
        if cfg.backend == "trl":  # this process entry point picks the backend; the engine never imports TRL
            from divviz.trl.run import train as train_with_trl

            train_with_trl(cfg, folder.parent, folder=folder)
        else:
            train(cfg, folder.parent, folder=folder)
    except (StopRequested, KeyboardInterrupt):
        _ended(folder, "stopped", "stopped before its first step")
    except Exception as err:  # noqa: BLE001 — e.g. a model that will not load: say so in the run folder
        _ended(folder, "failed", str(err) if isinstance(err, DivvizInputError) else f"{type(err).__name__}: {err}")


def _ended(folder: Path, state: str, message: str) -> None:
    """Record how the run ended, unless training already did."""
    status = read_status(folder)
    if status["state"] in ("queued", "running", "interrupted"):
        write_status(folder, {**status, "state": state, "message": message, "updated": time.time()})
