"""The run store: one folder per run, the contract between the backend and the app.

    RUNS_DIR/<run id>/
        config.json        RunConfig.to_dict(), written once
        status.json        {"state", "message", "pid", "step", "steps", "device", "started", "updated"}, replaced
                           atomically (write to a temp file, then os.replace)
        metrics.jsonl      one JSON object per step, appended and flushed
        tokens/step_NNNNNN.npz   a bounded sample of per-token facts per step, each written atomically (runs of
                           a plain TRL GRPOTrainer have none)
        samples.jsonl      a few (prompt, completion, reward) per step
        checkpoints/step_NNNNNN.safetensors   the weights every `checkpoint_every` steps (small models only)

Every write is atomic or append-only, so a folder read while a run writes it, or after a hard kill, is
readable: a torn last line of metrics.jsonl is skipped. A run whose status says "running" but whose process
is gone reads as "interrupted".

The runs folder is `--runs-dir`, else $DIVVIZ_RUNS_DIR, else ./runs (the app uses the same rule).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from divviz.params import DivvizInputError

def runs_dir(given: str | os.PathLike | None = None) -> Path:
    return Path(given or os.environ.get("DIVVIZ_RUNS_DIR") or "runs").expanduser()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_status(folder: Path, status: dict) -> None:
    _write_atomic(folder / "status.json", json.dumps(status))


def process_alive(pid: int | None) -> bool:
    """True if `pid` is a live (not zombie) process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return True
    return True


class RunWriter:
    """Writes one run folder; used by the training process only."""

    def __init__(self, folder: Path, config: dict, steps: int):
        self.folder = folder
        (folder / "tokens").mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / "config.json", json.dumps(config, indent=2))
        self.status = {"state": "running", "message": "", "pid": os.getpid(), "step": 0, "steps": steps,
                       "device": "", "started": time.time(), "updated": time.time()}
        self._write_status()
        self._metrics = open(folder / "metrics.jsonl", "a", buffering=1)
        self._samples = open(folder / "samples.jsonl", "a", buffering=1)

    def _write_status(self) -> None:
        self.status["updated"] = time.time()
        write_status(self.folder, self.status)

    def set_device(self, device: str) -> None:
        self.status["device"] = device
        self._write_status()

    def append(self, step: int, metrics: dict, tokens: dict[str, np.ndarray] | None, samples: list) -> None:
        if tokens is not None:
            tmp = self.folder / "tokens" / f".step_{step:06d}.tmp.npz"
            np.savez_compressed(tmp, **tokens)
            os.replace(tmp, self.folder / "tokens" / f"step_{step:06d}.npz")
        self._samples.write(json.dumps({"step": step, "samples": samples}) + "\n")
        self._metrics.write(json.dumps(metrics) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())
        self.status["step"] = step
        self._write_status()

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


def new_run_folder(root: Path, label: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:40].strip("-")
    folder = root / f"{stamp}-{slug}-{secrets.token_hex(3)}"
    folder.mkdir(parents=True, exist_ok=False)
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


def read_status(folder: Path) -> dict:
    try:
        status = json.loads((folder / "status.json").read_text())
    except FileNotFoundError:
        return {"state": "failed", "message": "no status.json in the run folder", "step": 0, "steps": 0}
    except (OSError, json.JSONDecodeError) as err:
        return {"state": "failed", "message": f"status.json is unreadable ({err})", "step": 0, "steps": 0}
    if status.get("state") == "running" and not process_alive(status.get("pid")):
        status["state"] = "interrupted"
        status["message"] = status.get("message") or "the training process ended without finishing the run"
    return status


def read_run(folder: Path) -> RunInfo:
    status = read_status(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        config = {}
        if status.get("state") != "failed":
            status = {**status, "message": f"config.json is unreadable ({err})"}
    return RunInfo(folder, status.get("state", "failed"), status.get("message", ""), int(status.get("step", 0)),
                   int(status.get("steps", 0)), config, status)


def read_metrics(folder: Path) -> list[dict]:
    """All complete, readable lines of metrics.jsonl (a torn or corrupt line is skipped)."""
    rows = []
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps whose weights were saved in the run folder."""
    return sorted(int(p.stem[5:]) for p in (folder / "checkpoints").glob("step_*.safetensors"))


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / "checkpoints" / f"step_{step:06d}.safetensors"


def read_tokens(folder: Path, step: int) -> dict[str, np.ndarray] | None:
    path = folder / "tokens" / f"step_{step:06d}.npz"
    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError):
        return None


def list_runs(root: Path) -> list[RunInfo]:
    """Every run folder under `root`, newest first."""
    if not root.exists():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and ((p / "status.json").exists() or (p / "config.json").exists())]
    return [read_run(p) for p in sorted(folders, key=lambda p: p.name, reverse=True)]


def delete_run(folder: Path) -> None:
    """Remove a finished run's folder; a running one is refused."""
    if read_status(folder).get("state") == "running":
        raise DivvizInputError(f"run '{folder.name}' is still running; stop it before deleting it")
    shutil.rmtree(folder)
