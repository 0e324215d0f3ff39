"""Other tools' files read as JSON, safely: a JSON document whole (after a size check, before any byte is read), a
JSONL file a line at a time (any size streams); every fault is one `DivvizInputError` line naming the file and where.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError

MAX_BYTES = 256 * 2**20  # a JSON document is parsed whole: 256 MB at most (JSONL streams instead)
MAX_LINE_BYTES = 64 * 2**20  # one line of a JSONL file


def read_document(path: Path) -> object:
    """The JSON value of the whole file `path`; a file above `MAX_BYTES` is refused before it is read."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise DivvizInputError(f"{path.name} is {size / 2**20:.0f} MB; a JSON document (UNIPO's JSON, TRL's "
                               f"trainer_state.json) is read whole, at most {MAX_BYTES // 2**20} MB (JSONL streams "
                               f"any size)")
    return parsed(path.read_bytes(), path.name)


def parsed(raw: bytes, where: str) -> object:
    """`raw` as JSON, or the fault in one line: where it broke, and "truncated" when the text stops mid-value."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DivvizInputError(f"{where} is not JSON (not UTF-8 text at byte {err.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise DivvizInputError(f"{where} is not JSON (nested too deeply)") from None
    except json.JSONDecodeError as err:
        stops = err.pos >= len(text.rstrip()) or err.msg.startswith("Unterminated string")
        cut = "; the text stops mid-value: truncated?" if stops else ""
        raise DivvizInputError(f"{where} is not JSON ({err.msg} at line {err.lineno}, column {err.colno}{cut})") \
            from None


def json_lines(handle, name: str) -> Iterator[tuple[int, object]]:
    """(line number from 1, its JSON value) for each non-blank line of the open binary file `handle`."""
    number = 0
    while True:
        raw = handle.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise DivvizInputError(f"{name}: line {number} is longer than {MAX_LINE_BYTES // 2**20} MB")
        if raw.strip():
            yield number, parsed(raw, f"{name}: line {number}")


def first_line(path: Path) -> tuple[object | None, bool]:
    """(the JSON value of the first non-blank line of `path` if that line is JSON, else None; whether it is the
    file's only non-blank line). A JSONL file's first line, or a whole document written on one line; None for a
    document spread over lines, or a file that is not JSON at all."""
    with open(path, "rb") as handle:
        lines = iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b"")
        raw = next((line for line in lines if line.strip()), b"")
        if len(raw) > MAX_LINE_BYTES:
            return None, False
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return None, False
        return value, not any(line.strip() for line in lines)
