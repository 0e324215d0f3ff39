"""`python -m divviz.engine.worker RUN_FOLDER`: train the run whose config.json is in RUN_FOLDER.

Started by `runner.start_run` in its own process and session, so that the app stays responsive, a crash in
training cannot take the app down, closing the browser tab does not end the run, and SIGTERM stops it at once.
"""

import json
import os
import sys
import time
from pathlib import Path

from divviz.engine.config import RunConfig
from divviz.engine.store import read_status, write_status
from divviz.params import DivvizInputError
from divviz.engine.train import stop_on_sigterm, train


def main(folder: str) -> None:
    folder = Path(folder)
    os.nice(10)  # below the app and the browser, which then stay responsive on a small CPU
    stop_on_sigterm()
    cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    if cfg.backend == "trl":  # the process entry point picks the backend; the engine itself never imports TRL
        try:
            from divviz.trl.run import train as train_with_trl

            train_with_trl(cfg, folder.parent, folder=folder)
        except Exception as err:  # noqa: BLE001 — e.g. a model that will not load: say so in the run folder
            message = str(err) if isinstance(err, DivvizInputError) else f"{type(err).__name__}: {err}"
            status = read_status(folder)
            if status.get("state") in ("running", "interrupted"):
                write_status(folder, {**status, "state": "failed", "message": message, "updated": time.time()})
    else:
        train(cfg, folder.parent, folder=folder)


if __name__ == "__main__":
    main(sys.argv[1])
