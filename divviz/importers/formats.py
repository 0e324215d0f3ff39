"""Which format a file is in, told from its content (not its extension), and its reader.

    a folder             holding trainer_state.json: TRL's checkpoint; holding <algo>_metrics.json (or named <algo>
                         beside one): UNIPO's build_data.py output
    a JSONL file         by its first line: {"type": "header", …} UNIPO; {"step": N, "data": {…}} verl's file
                         logger; {"prompts": …} or {"header": …} divviz's JSONL
    a JSON document      by its keys: "log_history" TRL's trainer_state.json; "entries" or "header" UNIPO's JSON
                         (a document written on one line is one, and so is a one-line file without a JSONL line's
                         keys "type", "data", "prompts")

`--format` names one instead (then the file is read as that format, and refused where it is not).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers import jsonl, trainer_state, unipo, verl_log
from divviz.importers.files import first_line, read_document
from divviz.importers.steps import Step
from divviz.safetext import quoted

FORMATS = ("unipo", "trl", "verl", "jsonl")
LINE_READERS = {"unipo": unipo.read_jsonl, "verl": verl_log.read, "jsonl": jsonl.read}
DOCUMENT_READERS = {"unipo": unipo.read, "trl": trainer_state.read}
FOLDER_READERS = {"unipo": unipo.read_folder, "trl": trainer_state.read}
DOCUMENT_KEYS = {"log_history": "trl", "entries": "unipo", "header": "unipo"}  # a JSON document's format by its keys
LINE_KEYS = {"type", "data", "prompts"}  # a line with none of them, alone in its file, is read as a JSON document


def read(path: Path, fmt: str | None = None) -> tuple[str, dict, Iterator[Step]]:
    """(the format, the run's config, its steps) of `path` in format `fmt`, else in the format its content shows."""
    if fmt is not None and fmt not in FORMATS:
        raise DivvizInputError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if path.is_dir():
        fmt = fmt or folder_format(path)
        if fmt not in FOLDER_READERS:
            raise DivvizInputError(f"{path.name} is a folder; --format {fmt} reads a file")
        return fmt, *FOLDER_READERS[fmt](path)
    if not path.is_file():
        raise DivvizInputError(f"no file {quoted(str(path))}")
    if path.stat().st_size == 0:
        raise DivvizInputError(f"{path.name} is empty: it holds no step")
    first, alone = (None, False) if fmt == "trl" else first_line(path)
    if fmt in ("verl", "jsonl") or is_jsonl(first, alone):
        fmt = fmt or line_format(first, path.name)
        return fmt, *LINE_READERS[fmt](path)
    document = read_document(path)
    fmt = fmt or next((DOCUMENT_KEYS[k] for k in DOCUMENT_KEYS if isinstance(document, dict) and k in document), None)
    if fmt is None:
        keys = f"keys {quoted(list(document)[:5], 60)}" if isinstance(document, dict) else \
            f"a {type(document).__name__}"
        raise DivvizInputError(f"{path.name}: a JSON document with neither 'entries' (UNIPO) nor 'log_history' (TRL's "
                               f"trainer_state.json) but {keys}; name its format with --format")
    return fmt, *DOCUMENT_READERS[fmt](path, document)


def is_jsonl(first: object, alone: bool) -> bool:
    """Whether a file whose first line holds `first` (None: not JSON) is JSONL: that line is an object, not a whole
    document ('entries', 'log_history'), and not alone in its file without a JSONL line's keys."""
    if not isinstance(first, dict) or {"entries", "log_history"} & first.keys():
        return False
    return not alone or bool(LINE_KEYS & first.keys())


def folder_format(path: Path) -> str:
    if (path / "trainer_state.json").is_file():
        return "trl"
    if any(path.glob("*_metrics.json")) or (path.parent / f"{path.name}_metrics.json").is_file():
        return "unipo"
    raise DivvizInputError(f"{path.name} is a folder with neither trainer_state.json (a TRL checkpoint) nor "
                           "<algo>_metrics.json (UNIPO's build_data.py output)")


def line_format(first: dict, name: str) -> str:
    """The JSONL format whose first line `first` is."""
    if first.get("type") == "header":
        return "unipo"
    if "step" in first and "data" in first:
        return "verl"
    if "prompts" in first or "header" in first:
        return "jsonl"
    raise DivvizInputError(f"{name}: line 1 is a JSON object with none of the keys that tell a format ('type': "
                           f"'header', 'step' and 'data', 'prompts', 'header'): {quoted(list(first)[:5], 60)}; name "
                           "its format with --format")
