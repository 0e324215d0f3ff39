"""verl's file logger as a divviz run of metrics (verl 0.9.1, `verl/utils/tracking.py`, class `FileLogger`, the
`trainer.logger=['file']` backend; it writes to $VERL_FILE_LOGGER_PATH, else
$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl).

Each line is `{"step": N, "data": {name: value, …}}`, written by orjson (a NaN becomes null), once per training step
(`global_steps`, from 1; a validation before training logs step 0). The lines are streamed: any size reads. Steps
must increase; values that are not finite numbers (null, text) are dropped and counted; names are mapped as
`names.DIVVIZ_NAMES["verl"]` says. The file holds no settings: the clip is verl's default ε = 0.2, said to be assumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers.files import json_lines
from divviz.importers.names import metrics_row, names_for
from divviz.importers.source import source_config
from divviz.importers.steps import Step, check_order


def read(path: Path) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps as they are read); a line that is not verl's is refused, naming it."""
    names = names_for("verl")

    def steps() -> Iterator[Step]:
        last = None
        with open(path, "rb") as handle:
            for line, value in json_lines(handle, path.name):
                step = value.get("step") if isinstance(value, dict) else None
                if not isinstance(step, int) or isinstance(step, bool) or step < 0 \
                        or not isinstance(value.get("data"), dict):
                    raise DivvizInputError(f"{path.name}: line {line} is not verl's {{\"step\": N, \"data\": {{…}}}}")
                check_order(step, last, f"line {line}")
                last = step
                metrics, dropped = metrics_row(value["data"], names, f"step {step}")
                yield Step(None, metrics, step, dropped)

    return source_config("verl", "file logger", path), steps()
