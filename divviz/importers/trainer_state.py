"""TRL's `trainer_state.json` as a divviz run of metrics: the file that `transformers.Trainer` writes into every
checkpoint folder (`TrainerState.save_to_json`; TRL 1.16's `GRPOTrainer` inherits it), or such a folder.

Its `log_history` is a list of rows, each the numbers logged at one optimiser step with that `step` (TRL's
`global_step`): the training metrics (TRL's names, which are divviz's), an evaluation's `eval_*`, and at the end of
training a summary row (`train_runtime`, `train_loss`, …) at the last step. Rows of one step are merged into its
divviz row; the steps must not go back, and a step's name given twice must give the same number. A divviz step here
is TRL's optimiser step: with μ = `num_iterations` × `steps_per_generation` > 1, a generation batch spans μ of them
(divviz's own TRL backend averages them into one).

The GRPO settings are in the checkpoint folder's `training_args.bin`, a pickle, which is never loaded (unpickling a
file runs code from it). They are read from a `training_args.json` beside it where there is one (save it with
`open("training_args.json", "w").write(trainer.args.to_json_string())`): `epsilon`, `epsilon_high` (the clip),
`loss_type` (the algorithm), and the other GRPO fields kept below. The model's name is its `config.json`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers.files import read_document
from divviz.importers.names import finite, metrics_row, names_for
from divviz.importers.source import ASSUMED, clip_setting, source_config
from divviz.importers.steps import Step, check_order
from divviz.safetext import quoted

ARGS_KEPT = ("loss_type", "beta", "epsilon", "epsilon_high", "num_generations", "num_iterations",
             "steps_per_generation", "learning_rate", "scale_rewards", "importance_sampling_level", "max_steps")
STATE_KEPT = ("global_step", "max_steps", "logging_steps", "train_batch_size", "num_train_epochs")


def read(path: Path, document: object | None = None) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps) of `path`, a trainer_state.json (`document`: its JSON, when already read) or a
    checkpoint folder holding one; DivvizInputError naming the first fault."""
    state_file = path / "trainer_state.json" if path.is_dir() else path
    if not state_file.is_file():
        raise DivvizInputError(f"{path.name} holds no trainer_state.json")
    state = read_document(state_file) if document is None else document
    if not isinstance(state, dict) or "log_history" not in state:
        raise DivvizInputError(f"{state_file.name}: not TRL's trainer_state.json (no 'log_history')")
    history = state["log_history"]
    if not isinstance(history, list):
        raise DivvizInputError(f"{state_file.name}: 'log_history' is {type(history).__name__}, not a list")
    folder = state_file.parent
    args, args_file = _training_args(folder)
    config = source_config("trl", "checkpoint folder" if path.is_dir() else "trainer_state.json", path,
                           model=_model_name(folder), algorithm=args.get("loss_type"),
                           clip=clip_setting(args, "training_args.json") if args else ASSUMED,
                           extra={"trainer_state": _kept(state, STATE_KEPT),
                                  "training_args": {"file": args_file, **_kept(args, ARGS_KEPT)}})
    return config, iter(_steps(history))


def _kept(values: dict, names: tuple[str, ...]) -> dict:
    """The settings `names` of `values` that are a finite number, true/false, null or short text (cut at 80)."""
    kept = {}
    for name in (n for n in names if n in values):
        value = values[name]
        if value is None or isinstance(value, bool) or finite(value) is not None:
            kept[name] = value
        elif isinstance(value, str):
            kept[name] = value[:80]
    return kept


def _training_args(folder: Path) -> tuple[dict, str | None]:
    """(the GRPO settings of a `training_args.json` in `folder`, which file gave them): ({}, a note) where there is
    only the pickle, ({}, None) where there is neither."""
    given = folder / "training_args.json"
    if given.is_file():
        args = read_document(given)
        if not isinstance(args, dict):
            raise DivvizInputError(f"{given.name} holds a {type(args).__name__}, not TRL's settings (an object)")
        return args, given.name
    if (folder / "training_args.bin").exists():
        return {}, "training_args.bin, not read (a pickle): save training_args.json beside it to import the settings"
    return {}, None


def _model_name(folder: Path) -> str:
    """The model's name from the checkpoint's `config.json` (a transformers model config: `_name_or_path`, else its
    architecture), "" where there is none."""
    path = folder / "config.json"
    model = read_document(path) if path.is_file() else None
    if not isinstance(model, dict) or "model_type" not in model:
        return ""
    architectures = model.get("architectures")
    named = model.get("_name_or_path") or (architectures[0] if isinstance(architectures, list) and architectures
                                           else model["model_type"])
    return named if isinstance(named, str) else ""


def _steps(history: list) -> list[Step]:
    """One Step per logged `step`, its rows merged, or the first fault: a row that is not an object or has no step,
    a step going back, a name given twice in one step with two numbers."""
    names = names_for("trl")
    steps: list[Step] = []
    for r, row in enumerate(history):
        where = f"log_history row {r + 1}"
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DivvizInputError(f"{where}: 'step' is {quoted(step, 30)}, not a count" if isinstance(row, dict)
                                   else f"{where} is {quoted(row, 30)}, not an object")
        numbers, dropped = metrics_row({k: v for k, v in row.items() if k != "step"}, names, f"step {step}")
        if steps and steps[-1].number == step:
            _merge(steps[-1], numbers, where)
            steps[-1].dropped.extend(dropped)
            continue
        check_order(step, steps[-1].number if steps else None, where)
        steps.append(Step(None, numbers, step, dropped))
    return steps


def _merge(into: Step, numbers: dict[str, float], where: str) -> None:
    """Another row's `numbers` of the step `into`: a name it already has must come with the same number."""
    for name, value in numbers.items():
        if into.metrics.get(name, value) != value:
            raise DivvizInputError(f"{where}: step {into.number}'s {quoted(name, 40)} again, as {value:g} after "
                                   f"{into.metrics[name]:g}")
        into.metrics[name] = value
