"""A run's `metrics.jsonl`, read once and then only the bytes appended since: one cache for the whole process (every
session of the app, every reader of a CLI command), bounded in memory.

The run folder's contract makes metrics.jsonl append-only, a line per step, flushed. So for each file the cache
keeps its identity (device and inode), the offset up to the last complete line read, and the rows parsed so far:

    same identity, grown     read the bytes from the offset; a last line without its newline (torn: the writer
                             is mid-write) is left for next time
    same identity and size   nothing read, unless its modification time changed (rewritten in place): read again
    replaced or shorter      (a new inode, or truncated) read again from the start

A corrupt line is skipped, as a full read skips it; what is returned equals a fresh full read of the file's complete
lines (tests/runs/test_tail.py checks that for any sequence of appends, torn writes, truncations and replacements).
When the rows cached over all files pass `max_rows`, the least recently read files are forgotten (and read again
from the start if asked for).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_ROWS = 1_000_000  # at most about 1.5 GB: a row of 28 metrics takes about 1.5 kB (measured with tracemalloc)


def parse_row(line: bytes) -> dict | None:
    """A metrics line as its numbers ({name: finite number}), or None for a line that is not a step's row."""
    try:
        row = json.loads(line.decode("utf-8", errors="replace"))
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        return None
    return {sys.intern(k): v for k, v in row.items() if isinstance(k, str) and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}  # interned: every row shares its names


CHECK = 64  # bytes before the offset that must still be there: a file cut and written again is read again


@dataclass
class _File:
    identity: tuple[int, int]
    offset: int = 0  # bytes up to and including the last complete line read
    mtime_ns: int = 0
    rows: list[dict] = field(default_factory=list)
    seen: bytes = b""  # the last CHECK bytes before the offset
    columns: dict = field(default_factory=dict)  # metric name -> its values as float64, for the rows converted
    derived: OrderedDict = field(default_factory=OrderedDict)  # key -> (rows it was computed from, value)
    counted: int = 0  # its rows in the cache's running total

    def column(self, name: str, upto: int) -> np.ndarray:
        """The first `upto` rows' values of `name` (NaN where a row lacks it), converting only rows not yet
        converted: a chart of a 50,000-step run costs a conversion once, then its new steps."""
        have = self.columns.get(name, np.empty(0))
        if len(have) < upto:
            new = np.fromiter((row.get(name, math.nan) for row in self.rows[len(have):upto]), np.float64,
                              upto - len(have))
            have = self.columns[name] = np.concatenate([have, new])
        return have[:upto]


    def memo(self, key, upto: int, compute):
        """compute(), the first time it is asked for under `key` for the first `upto` rows; kept until the file
        grows (rows are only ever appended to a `_File`: a rewritten file gets a new one), for the last few keys."""
        known = self.derived.get(key)
        if known is None or known[0] != upto:
            known = self.derived[key] = (upto, compute())
            while len(self.derived) > MEMO_KEYS:
                self.derived.popitem(last=False)
        self.derived.move_to_end(key)
        return known[1]


MEMO_KEYS = 4  # what is derived from one file and kept: e.g. a chart's curves at a few smoothing widths


class Rows(list):
    """A file's rows as a list, with `column(name)`: the values of one metric over them as a numpy array, from the
    cache's columns (each row converted once over the file's life); and `memo(key, compute)`: anything computed
    from these rows, computed again only once the file has grown."""

    def __init__(self, rows: list[dict], source: _File):
        super().__init__(rows)
        self._source = source

    def column(self, name: str) -> np.ndarray:
        return self._source.column(name, len(self))

    def memo(self, key, compute):
        return self._source.memo(key, len(self), compute)


class MetricsCache:
    """Rows of metrics files, kept and extended as the files grow (thread-safe: Streamlit serves each session from
    its own thread). `bytes_read` counts what was read from disk, for tests and benchmarks."""

    def __init__(self, max_rows: int = MAX_ROWS):
        self.max_rows = max_rows
        self.bytes_read = 0
        self._files: OrderedDict[Path, _File] = OrderedDict()
        self._rows = 0  # rows cached over all files: a read costs what it reads, not a sum over every file
        self._lock = threading.Lock()

    def rows(self, path: Path) -> list[dict]:
        """Every complete, readable row of `path` (a new list, with `Rows.column`; [] if it cannot be read)."""
        try:
            stat = os.stat(path)
        except OSError:
            with self._lock:
                gone = self._files.pop(path, None)
                self._rows -= gone.counted if gone is not None else 0
            return []
        with self._lock:
            known = self._files.get(path)
            identity = (stat.st_dev, stat.st_ino)
            stale = known is None or known.identity != identity or stat.st_size < known.offset or (
                stat.st_size == known.offset and stat.st_mtime_ns != known.mtime_ns)
            entry = _File(identity) if stale else known
            if stat.st_size > entry.offset and not self._extend(path, entry):
                entry = _File(identity)  # what was read is no longer the file's start: read it all again
                if not self._extend(path, entry):
                    return []
            entry.mtime_ns = stat.st_mtime_ns
            if known is not None and known is not entry:
                self._rows -= known.counted
            self._rows += len(entry.rows) - entry.counted
            entry.counted = len(entry.rows)
            self._files[path] = entry
            self._files.move_to_end(path)
            self._bound()
            return Rows(entry.rows, entry)

    def _extend(self, path: Path, entry: _File) -> bool:
        """Parse the complete lines appended after `entry.offset`; False if the file cannot be read or the bytes
        before the offset are not those read before (cut and written again)."""
        try:
            with open_regular(path) as handle:
                handle.seek(entry.offset - len(entry.seen))
                data = handle.read()
        except OSError:
            return False
        self.bytes_read += len(data)
        if not data.startswith(entry.seen):
            return False
        data = data[len(entry.seen):]
        end = data.rfind(b"\n") + 1  # 0 when no line is complete yet
        for line in data[:end].splitlines():
            row = parse_row(line)
            if row is not None:
                entry.rows.append(row)
        entry.offset += end
        entry.seen = (entry.seen + data[:end])[-CHECK:]
        return True

    def _bound(self) -> None:
        while self._rows > self.max_rows and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._rows -= dropped.counted

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._rows = 0


METRICS = MetricsCache()


def file_identity(path) -> tuple | None:
    """What changes when a file is written, replaced or removed: its device, inode, size and modification time (None
    where there is no file)."""
    try:
        return stat_identity(os.stat(path))
    except OSError:
        return None


def stat_identity(s: os.stat_result) -> tuple:
    return s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns


def open_regular(path: Path):
    """`path` opened for binary reading if it is a regular file and not a symbolic link, else OSError: a run folder
    from elsewhere may hold a FIFO, whose read would wait for a writer forever, or a link to /dev/zero, whose read
    would never end. Opened without blocking and checked on the open file, so nothing can swap it in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def last_row(path: Path, window: int = 65_536) -> dict | None:
    """The last complete row of a metrics file, from its last `window` bytes only (a run's overview needs no
    more); None if it has none there."""
    try:
        with open_regular(path) as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - window))
            data = handle.read()
    except OSError:
        return None
    for line in reversed(data[:data.rfind(b"\n") + 1].splitlines()):
        row = parse_row(line)
        if row is not None:
            return row
    return None
