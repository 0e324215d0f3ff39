"""`python -m divviz.engine.worker RUN_FOLDER`: train the run whose config.json is in RUN_FOLDER.

Started by `runner.start_run` in its own process and session, so that the app stays responsive, a crash in
training cannot take the app down, closing the browser tab does not end the run, and SIGTERM stops it at once.
"""

import json
import os
import sys
from pathlib import Path

from divviz.engine.config import RunConfig
from divviz.engine.train import stop_on_sigterm, train


def main(folder: str) -> None:
    folder = Path(folder)
    os.nice(10)  # below the app and the browser, which then stay responsive on a small CPU
    stop_on_sigterm()
    cfg = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    train(cfg, folder.parent, folder=folder)


if __name__ == "__main__":
    main(sys.argv[1])
