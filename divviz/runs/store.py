"""The run store: one folder per run, the contract between the backend and the app.

    RUNS_DIR/<run id>/
        config.json        RunConfig.to_dict(), written once
        status.json        {"state", "message", "pid", "process", "step", "steps", "device", "started", "updated"},
                           replaced atomically (write to a temp file, then os.replace); "process" tells the pid's
                           process from a later one (`processes.process_identity`)
        metrics.jsonl      one JSON object per step, appended and flushed
        tokens/step_NNNNNN.npz   a bounded sample of per-token facts per step, each written atomically (runs of
                           a plain TRL GRPOTrainer have none)
        samples.jsonl      a few (prompt, completion, reward) per step
        completions/step_NNNNNN.json   the step inspector's record of whole completions (`completions.step_record`),
                           each written atomically, at the steps the run keeps them
        checkpoints/step_NNNNNN.safetensors   the weights every `checkpoint_every` steps (small models only)
        eval.jsonl         one held-out evaluation per line (`evaluate.py`), appended
        resume.pt          what the run needs to go on after its latest `checkpoint_every` step (`resume.py`),
                           replaced atomically, removed when the run is done

Every write is atomic or append-only, so a folder read while a run writes it, or after a hard kill, is
readable: a torn last line of metrics.jsonl is skipped. A run whose status says "running" but whose process
is gone, or is not the process that wrote it, reads as "interrupted". Every read is defensive, whoever wrote the folder: a status.json or config.json
that is not what the contract says (binary junk, a list, text where a number belongs) makes that run read as
"corrupt" with the reason, and never hides the other runs; metric values that are not numbers are dropped.

The runs folder is `--runs-dir`, else $DIVVIZ_RUNS_DIR, else ./runs (the app uses the same rule).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from divviz.catalogue.params import DivvizInputError
from divviz.engine.completions import MAX_BYTES, check_record
from divviz.runs.processes import process_alive, run_process_alive, running
from divviz.runs.tail import METRICS, last_row, open_regular, stat_identity
from divviz.safetext import quoted, shorten

CLOCK_KEYS = ("step_time", "tokens_per_s", "eval/time", "runs_training")  # the wall clock's figures in a run's rows
                     # and what shared the machine with them: every other value comes back to the bit when trained again


def _step_of(line: str) -> int | None:
    """The step of one line of a run's JSONL files (None for a torn or foreign line)."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def runs_dir(given: str | os.PathLike | None = None) -> Path:
    return Path(given or os.environ.get("DIVVIZ_RUNS_DIR") or "runs").expanduser()


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file beside it and `os.replace`: a reader sees the old file or the new
    one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_status(folder: Path, status: dict) -> None:
    write_atomic(folder / "status.json", json.dumps(status))


def finite_json(value) -> str:
    """`value` as strict JSON: every non-finite number (NaN, ±inf, which Python's json writes as NaN or Infinity,
    not JSON) as null; at the top of a row, the keys it nulled are named under "nonfinite" with their values (an
    imported log-prob of −1e308 makes kl/k3 −inf: the reader sees why the number is missing)."""
    nulled = []

    def clean(x, key=None):
        if isinstance(x, float) and not math.isfinite(x):
            if key is not None:
                nulled.append(f"{key} = {x}")
            return None
        if isinstance(x, dict):
            return {k: clean(v, k if x is value else None) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    cleaned = clean(value)
    if nulled and isinstance(cleaned, dict):
        cleaned["nonfinite"] = ", ".join(nulled)
    return json.dumps(cleaned, allow_nan=False)


class RunWriter:
    """Writes one run folder; used by the training process only."""

    def __init__(self, folder: Path, config: dict, steps: int, resume_step: int = 0):
        """Start writing `folder`; with `resume_step` (`resume.py`), go on after the rows of steps ≤ it, the
        files' later rows dropped, and start the clock as far back as those steps took (their `step_time`, so that
        `updated − started` stays the run's time, however long it waited in between); without, any rows of an
        earlier start are dropped (a stopped run queued again)."""
        self.folder = folder
        (folder / "tokens").mkdir(parents=True, exist_ok=True)
        queued = read_status(folder) if (folder / "status.json").exists() else {}
        self.config = config
        write_atomic(folder / "config.json", json.dumps(config, indent=2))
        self._keep_until(resume_step if resume_step else -1)  # from step 0: not even step 0's evaluation stays
        trained = sum(row.get("step_time", 0.0) for row in read_metrics(folder))
        self.status = {"state": "running", "message": "", **running(os.getpid()), "step": resume_step, "steps": steps,
                       "device": "", "started": time.time() - trained, "updated": time.time(),
                       **{k: queued[k] for k in ("owner", "queued_at", "kind") if k in queued}}  # who, when, why
        self._write_status()
        self._metrics = open(folder / "metrics.jsonl", "a", buffering=1)
        self._samples = open(folder / "samples.jsonl", "a", buffering=1)

    def _keep_until(self, step: int) -> None:
        """Drop what the folder holds of steps after `step` (from a start that stopped later than it resumes)."""
        for name in ("metrics.jsonl", "samples.jsonl", "eval.jsonl"):
            path = self.folder / name
            if path.exists():
                rows = [line for line in path.read_text().splitlines()
                        if (at := _step_of(line)) is not None and at <= step]
                write_atomic(path, "".join(f"{line}\n" for line in rows))
        for pattern in ("tokens/step_*.npz", "completions/step_*.json", "checkpoints/step_*.safetensors"):
            for path in self.folder.glob(pattern):
                if int(path.name.split(".")[0][5:]) > step:
                    path.unlink()

    def _write_status(self) -> None:
        self.status["updated"] = time.time()
        write_status(self.folder, self.status)

    def add_to_config(self, extra: dict) -> None:
        """Add what the run learnt when its model loaded (what it asked: `prompts.prompting`) to its config.json."""
        self.config = {**self.config, **extra}
        write_atomic(self.folder / "config.json", json.dumps(self.config, indent=2))

    def set_device(self, device: str, threads: int) -> None:
        """Where the run trains: its device and the CPU threads it computes with (what its step times depend on)."""
        self.status.update(device=device, threads=threads)
        self._write_status()

    def append(self, step: int, metrics: dict, tokens: dict[str, np.ndarray] | None, samples: list,
               inspected: dict | None = None) -> None:
        if tokens is not None:
            tmp = self.folder / "tokens" / f".step_{step:06d}.tmp.npz"
            np.savez_compressed(tmp, **tokens)
            os.replace(tmp, self.folder / "tokens" / f"step_{step:06d}.npz")
        if inspected is not None:
            (self.folder / "completions").mkdir(exist_ok=True)
            write_atomic(self.folder / "completions" / f"step_{step:06d}.json", finite_json(inspected))
        self._samples.write(finite_json({"step": step, "samples": samples}) + "\n")
        self._metrics.write(finite_json(metrics) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        self.status["step"] = step
        self._write_status()

    def add_eval(self, step: int, metrics: dict) -> None:
        """One held-out evaluation (`evaluate.evaluate`) after `step` updates (0: before the first) to eval.jsonl."""
        with open(self.folder / "eval.jsonl", "a") as handle:
            handle.write(finite_json({"step": step, **metrics}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def save_checkpoint(self, step: int, model) -> None:
        from safetensors.torch import save_model  # handles tied weights (embedding = LM head)

        folder = self.folder / "checkpoints"
        folder.mkdir(exist_ok=True)
        tmp = folder / f".step_{step:06d}.tmp"
        save_model(model, str(tmp))
        os.replace(tmp, checkpoint_path(self.folder, step))

    def finish(self, state: str, message: str = "") -> None:
        self.status.update(state=state, message=message)
        self._write_status()
        self._metrics.close()
        self._samples.close()


def writable_runs_folder(root: Path) -> Path:
    """`root`, made if missing and checked by writing a file in it, one without a name where the system allows
    (`tempfile.TemporaryFile`: Linux's O_TMPFILE), so that no listing of the folder ever sees it; a runs folder that
    is a file, cannot be read or cannot be written is a `DivvizInputError`, raised before any work starts."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(prefix=".probe.", dir=root) as probe:  # a dot-file without O_TMPFILE
            probe.write(b"0")
    except (NotADirectoryError, FileExistsError) as err:
        if root.is_file():
            raise DivvizInputError(f"the runs folder {quoted(str(root))} is a file, not a folder") from None
        try:
            root.stat()  # the reason mkdir hides (a dangling or looping link, …)
        except OSError as cause:
            err = cause
        raise DivvizInputError(f"the runs folder {quoted(str(root))} is not a folder that can be used "
                               f"({err.strerror or err})") from None
    except OSError as err:
        raise DivvizInputError(f"cannot write a run into {quoted(str(root))} ({err.strerror or err})") from None
    return root


def new_run_folder(root: Path, label: str) -> Path:
    """A new, empty run folder under `root` (made if missing); a runs folder that cannot hold one is a
    `DivvizInputError`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:40].strip("-.")
    folder = writable_runs_folder(root) / f"{stamp}-{slug}-{secrets.token_hex(3)}"
    try:
        folder.mkdir(exist_ok=False)
    except OSError as err:
        raise DivvizInputError(f"cannot write a run into {quoted(str(root))} ({err.strerror or err})") from None
    return folder


@dataclass
class RunInfo:
    """What the app and `divviz runs` show about one run folder."""

    folder: Path
    state: str
    message: str
    step: int
    steps: int
    config: dict
    status: dict

    @property
    def name(self) -> str:
        return self.folder.name


STATES = ("queued", "running", "done", "stopped", "failed", "interrupted")


class CorruptRun(ValueError):
    """A run folder's file does not hold what the contract says."""


_kept_json: dict[Path, tuple[tuple, str]] = {}  # a JSON file → (its `stat_identity`; its checked text)
KEPT_JSON_BYTES = 65_536  # status.json and config.json are a few kB
JSON_CAP = MAX_BYTES + 1_000_000  # the largest JSON file a run holds: a step's completions at the largest cap


def _read_json(path: Path) -> object:
    """The JSON value in `path`. A small file's (status.json, config.json) text is kept, checked, and read again
    only when the file changed (a new inode, size or modification time: `write_status` replaces the file), so a page
    listing hundreds of runs every 2 s reads each once per change; each caller gets its own value, parsed from the
    kept text (twice as fast as a deep copy). `CorruptRun` if it is not JSON."""
    try:
        stat = os.stat(path)
        seen = stat_identity(stat)
        known = _kept_json.get(path)
        if known is None or known[0] != seen:
            with open_regular(path) as handle:
                data = handle.read(JSON_CAP + 1)
            if len(data) > JSON_CAP:
                raise CorruptRun(f"{path.name} is larger than any file divviz writes ({JSON_CAP:,} bytes)")
            text = data.decode("utf-8")
            value = json.loads(text)
            if stat.st_size <= KEPT_JSON_BYTES:  # a step's completions are read when asked for, not kept
                _kept_json[path] = (seen, text)
                while len(_kept_json) > 4096:  # bounded: the files least recently read are read again if asked for
                    _kept_json.pop(next(iter(_kept_json)), None)
            return value
        return json.loads(known[1])
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CorruptRun(f"{path.name} is not JSON ({shorten(str(err), 60)})") from None
    except OSError as err:
        raise CorruptRun(f"{path.name} cannot be read ({err.strerror or err})") from None


def _checked_status(status: object) -> dict:
    """The status dict if it has the contract's fields and types, else CorruptRun naming the first fault."""
    if not isinstance(status, dict):
        raise CorruptRun(f"status.json holds a {type(status).__name__}, not an object")
    if status.get("state") not in STATES:
        raise CorruptRun(f"status.json has an unknown state {quoted(status.get('state'), 40)}")
    for name in ("step", "steps", "pid"):
        value = status.get(name, 0)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise CorruptRun(f"status.json: '{name}' is {quoted(value, 40)}, not a count")
    for name in ("started", "updated"):
        value = status.get(name, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise CorruptRun(f"status.json: '{name}' is {quoted(value, 40)}, not a time")
    if not isinstance(status.get("message", ""), str):
        raise CorruptRun("status.json: 'message' is not text")
    if not isinstance(status.get("process", ""), (str, type(None))):
        raise CorruptRun("status.json: 'process' is not text")
    return status


def read_status(folder: Path) -> dict:
    """The run's status; state "interrupted" if it says running but its process is gone, "corrupt" (with the
    reason as its message) if status.json is not what the contract says."""
    path = folder / "status.json"
    if not path.exists():
        return {"state": "failed", "message": "no status.json in the run folder", "step": 0, "steps": 0}
    try:
        status = _checked_status(_read_json(path))
    except CorruptRun as err:
        return {"state": "corrupt", "message": str(err), "step": 0, "steps": 0}
    if status["state"] == "running" and not run_process_alive(status):
        status["state"] = "interrupted"
        gone = not process_alive(status.get("pid"))
        status["message"] = ((status.get("message") or "the training process ended without finishing the run") if gone
                             else "the process its status names is not the one that trained it (a reused pid, or a "
                                  "folder from another machine): no signal is sent to it")
    return status


def read_run(folder: Path) -> RunInfo:
    status = read_status(folder)
    try:
        config = _read_json(folder / "config.json")
        if not isinstance(config, dict):
            raise CorruptRun(f"config.json holds a {type(config).__name__}, not an object")
    except CorruptRun as err:
        config = {}
        if status["state"] != "corrupt":  # the first fault found is the one reported
            status = {**status, "state": "corrupt", "message": str(err)}
    return RunInfo(folder, status["state"], status.get("message", ""), status.get("step") or 0,
                   status.get("steps") or 0, config, status)


def read_metrics(folder: Path) -> list[dict]:
    """All complete, readable lines of metrics.jsonl, numbers only (a torn or corrupt line is skipped), read
    incrementally: only what was appended since the last call is read from disk (`tail.MetricsCache`)."""
    return METRICS.rows(folder / "metrics.jsonl")


def read_evals(folder: Path) -> list[dict]:
    """The run's held-out evaluations (eval.jsonl: `step`, the updates done before it, and the `eval/*` metrics), in
    order; [] for a run that evaluated nothing. Read as metrics.jsonl is (a torn or corrupt line is skipped)."""
    return METRICS.rows(folder / "eval.jsonl")


def last_metrics(folder: Path) -> dict:
    """The run's latest metrics row ({} before its first step), from the end of metrics.jsonl alone."""
    return last_row(folder / "metrics.jsonl") or {}


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps whose weights were saved in the run folder."""
    return sorted(int(p.stem[5:]) for p in (folder / "checkpoints").glob("step_*.safetensors"))


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / "checkpoints" / f"step_{step:06d}.safetensors"


TOKEN_COLUMNS = ("pi_old", "ratio", "adv", "state")  # what every writer writes and the scatter needs
TOKENS_CAP = 64 * 2**20  # bytes a step's token sample may inflate to (divviz writes 256 tokens: a few kB)


def read_tokens(folder: Path, step: int, columns: tuple[str, ...] | None = None) -> dict[str, np.ndarray] | None:
    """The step's per-token facts (only `columns` where given, which must include `TOKEN_COLUMNS`), or None if
    there are none or they are not numeric columns of one length."""
    path = folder / "tokens" / f"step_{step:06d}.npz"
    try:
        with open_regular(path) as handle, np.load(handle, allow_pickle=False) as data:
            if sum(info.file_size for info in data.zip.infolist()) > TOKENS_CAP:  # what it would inflate to
                return None
            tokens = {k: data[k] for k in data.files if columns is None or k in columns}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    lengths = {v.shape for v in tokens.values()}
    numeric = all(v.dtype.kind in "biuf" and v.ndim == 1 for v in tokens.values())
    return tokens if numeric and len(lengths) == 1 and all(k in tokens for k in TOKEN_COLUMNS) else None


def token_steps(folder: Path) -> list[int]:
    """The steps whose per-token sample the run kept (`tokens/step_*.npz`)."""
    return sorted(int(p.stem[5:]) for p in (folder / "tokens").glob("step_*.npz") if p.stem[5:].isdigit())


_listed: dict[Path, tuple[int, list[int]]] = {}  # completions/ → (its modification time, the steps in it)


def completion_steps(folder: Path) -> list[int]:
    """The steps whose whole completions the run kept (for the step inspector). The folder is listed again only
    when its modification time says a file came or went: a 10,000-step run is not scanned on every rerun."""
    where = folder / "completions"
    try:
        mtime = where.stat().st_mtime_ns
    except OSError:
        return []
    known = _listed.get(where)
    if known is None or known[0] != mtime:
        names = where.glob("step_*.json")
        known = _listed[where] = (mtime, sorted(int(p.stem[5:]) for p in names if p.stem[5:].isdigit()))
        while len(_listed) > 512:  # bounded: the runs least recently listed are listed again if asked for
            _listed.pop(next(iter(_listed)))
    return list(known[1])


def read_completions(folder: Path, step: int) -> dict:
    """A step's record of whole completions (`completions.step_record`), checked; `CorruptRun` saying what is wrong
    with a file that is not such a record."""
    path = folder / "completions" / f"step_{step:06d}.json"
    if not path.is_file():
        raise CorruptRun(f"the run kept no completions for step {step}")
    if path.stat().st_size > MAX_BYTES + 1_000_000:
        raise CorruptRun(f"{path.name} is larger than any record divviz writes")
    try:
        return check_record(_read_json(path), path.name)
    except ValueError as err:  # CorruptRun included
        raise CorruptRun(str(err)) from None


def list_runs(root: Path) -> list[RunInfo]:
    """Every run folder under `root`, newest first (a folder is a run if it has a status.json or config.json).
    A runs folder that is not a readable folder is a `DivvizInputError`."""
    if not root.exists():
        return []
    try:
        folders = [p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()
                   and ((p / "status.json").exists() or (p / "config.json").exists())]
    except NotADirectoryError:
        raise DivvizInputError(f"the runs folder {quoted(str(root))} is a file, not a folder") from None
    except OSError as err:
        raise DivvizInputError(f"the runs folder {quoted(str(root))} cannot be read ({err.strerror or err})") from None
    return [read_run(p) for p in sorted(folders, key=lambda p: p.name, reverse=True)]


def runs_training(root: Path) -> int:
    """How many of `root`'s runs are training now (their status says running): what a step's time was shared with."""
    try:
        folders = [p for p in root.iterdir() if not p.name.startswith(".") and (p / "status.json").is_file()]
    except OSError:
        return 0
    return sum(read_status(p).get("state") == "running" for p in folders)


def delete_run(folder: Path) -> None:
    """Remove a finished run's folder; a running one is refused."""
    if read_status(folder).get("state") == "running":
        raise DivvizInputError(f"run '{folder.name}' is still running; stop it before deleting it")
    shutil.rmtree(folder)
