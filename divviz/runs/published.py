"""The published runs: the claims grids trained for divviz's own evidence, kept in the repository as data.

    published/<grid>/manifest.json      the grid: model, setting, device, CPU kernels, precision, versions, the
                                        commit that trained it, and per run its cell, state, times (`wall_s`,
                                        `steps_s`: see `publish`) and files' SHA-256
    published/<grid>/<run id>/          one run, the run store's layout (`store.py`) made compact:
        config.json, status.json        as the run wrote them (status without its process id)
        metrics.jsonl.gz, eval.jsonl.gz, samples.jsonl.gz   the run's JSONL files, gzip-compressed
        tokens/step_NNNNNN.npz           the per-token record of the kept steps (first, middle, last)
        completions/step_NNNNNN.json.gz  the inspector's record of the same steps

A reader needs nothing of divviz to use them: `gzip` and `json` read every metric and evaluation
(docs/claims.md shows a cell recomputed with numpy alone). divviz itself opens them as an ordinary runs folder
(`folder()`): the files are unpacked once into a cache named by the manifests' content, so the store's readers, the
Claims page, the Runs page and the Step inspector read them as they read any run — never written, never queued.

Every file there is untrusted: a grid is used only if each file its manifest names is a regular file (no link
followed), no larger than MAX_FILE_BYTES, with the SHA-256 the manifest records; a file no manifest names is never
read; a gzip stops at MAX_INFLATED_BYTES. A grid that fails is hidden, and `damaged()` names the file and the fault
(the pages and the CLI say it in one line); every other grid, and the user's own runs, stay as they are.

`publish` is the maintainer's half (`scripts/publish_runs.py`): it copies a finished run into its grid and records it
in the manifest, so a grid is published run by run while it trains. `differences` is a reader's check: a run
trained again from a published run's config.json against the published run (`scripts/retrain_published.py`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np

import divviz
from divviz.runs import store
from divviz.runs.tail import open_regular

ROOT = Path(divviz.__file__).resolve().parent.parent / "published"  # beside the package in a checkout
JSONL = ("metrics.jsonl", "eval.jsonl", "samples.jsonl")
MAX_FILE_BYTES = 32 * 2**20  # a published file as stored (the largest today: a few hundred kB)
MAX_INFLATED_BYTES = 256 * 2**20  # what one gzip-compressed file may inflate to (the largest: a few MB)


class DamagedGrid(ValueError):
    """A published grid whose files are not what its manifest says: its message names the file and the fault."""


def cpu_kernels() -> str:
    """What decides a CPU run's bits besides its code and seeds: torch's CPU capability and the bf16 / AMX
    instructions oneDNN picks its kernels by ("AVX512 avx512_bf16"). Runs trained where this differs are the same
    runs only to rounding."""
    import torch

    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    wanted = ("avx512_bf16", "amx_bf16", "amx_tile")
    return " ".join([torch.backends.cpu.get_cpu_capability(), *[f for f in wanted if f in flags.split()]])


def root() -> Path:
    """Where the published grids are: $DIVVIZ_PUBLISHED, else the checkout's published/ folder."""
    return Path(os.environ.get("DIVVIZ_PUBLISHED") or ROOT)


_read: dict[tuple, tuple[dict, str, dict]] = {}  # manifest files' identities → (held, content key, damaged grids)


def manifests(where: Path | None = None) -> dict[str, dict]:
    """Each published grid's manifest by grid name ({} when nothing is published); a manifest that cannot be read, or
    that names a run that is not a folder beside it, hides its own grid and no other. Parsed again only when a
    manifest file changes (the Runs page asks on every refresh)."""
    return _read_manifests(where or root())[0]


def damaged(where: Path | None = None) -> dict[str, str]:
    """Each published grid hidden because a file is not what its manifest says: grid name → the file and the fault.
    Checked once per state of the manifest files (a repaired file is seen once its grid's manifest changes, or in a
    new process)."""
    return _read_manifests(where or root())[2]


def damaged_lines(where: Path | None = None) -> list[str]:
    """One line per hidden grid, as the pages and the CLI say it."""
    return [f"published grid {grid} is hidden, the rest is shown: {fault}" for grid, fault in damaged(where).items()]


def _read_manifests(where: Path) -> tuple[dict, str, dict]:
    """(the manifests of the sound grids, a key naming their content, the damaged grids' faults), parsed and checked
    once per state of the manifest files."""
    identity = _identity(where)
    if identity not in _read:
        _read.clear()  # one published folder at a time is asked for; an old entry is stale
        found, faults = _parse([Path(path) for path, _, _ in identity]), {}
        for grid, manifest in list(found.items()):
            try:
                _check_files(where / grid, manifest)
            except DamagedGrid as err:
                faults[grid] = str(err)
                del found[grid]
        key = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()[:16]
        _read[identity] = found, key, faults
    return _read[identity]


def _stored(path: Path, shown: str) -> bytes:
    """A published file's bytes: a regular file, not a link, at most MAX_FILE_BYTES; else DamagedGrid."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise DamagedGrid(f"{shown}: missing, a link or not a regular file ({err.strerror or err})") from None
    if len(data) > MAX_FILE_BYTES:
        raise DamagedGrid(f"{shown}: larger than {MAX_FILE_BYTES:,} bytes")
    return data


def _check_files(grid: Path, manifest: dict) -> None:
    """DamagedGrid naming the first file of `grid` that is not what the manifest's SHA-256 says."""
    for name, cell in manifest["runs"].items():
        hashes = cell.get("sha256") if isinstance(cell, dict) else None
        if not isinstance(hashes, dict) or not hashes:
            raise DamagedGrid(f"{grid.name}/{name}: the manifest records no SHA-256 of its files")
        for relative, digest in hashes.items():
            shown = f"{grid.name}/{name}/{relative}"
            if not isinstance(relative, str) or not all(_plain_name(part) for part in relative.split("/")):
                raise DamagedGrid(f"{shown}: not a path inside the run")
            if hashlib.sha256(_stored(grid / name / relative, shown)).hexdigest() != digest:
                raise DamagedGrid(f"{shown}: its SHA-256 is not the one the manifest records (damaged or edited)")


def _identity(where: Path) -> tuple:
    """The manifest files under `where` as (path, modification time, size): what they hold changes only with it."""
    return tuple((str(path), path.stat().st_mtime_ns, path.stat().st_size)
                 for path in sorted(where.glob("*/manifest.json")))


def _parse(paths: list[Path]) -> dict[str, dict]:
    out = {}
    for path in paths:
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(manifest, dict) and isinstance(manifest.get("runs"), dict)
                and all(_plain_name(name) and (path.parent / name).is_dir() for name in manifest["runs"])):
            out[path.parent.name] = manifest
    return out


def grids_of_runs(where: Path | None = None) -> dict[str, str]:
    """Each published run's folder name → its grid."""
    return {name: grid for grid, manifest in manifests(where).items() for name in manifest["runs"]}


def _plain_name(name: str) -> bool:
    """A run's name is one folder's: no separator, not hidden, not "." or ".." (a manifest cannot point elsewhere)."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def folder(where: Path | None = None) -> Path | None:
    """A runs folder holding every published run, unpacked (made once per content of the manifests, in divviz's
    cache folder); None when nothing is published."""
    where = where or root()
    found, key, _ = _read_manifests(where)
    if not found:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "divviz" / "published" / key
    if cache.is_dir():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    unpacking = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache.parent))
    try:
        for grid, manifest in found.items():
            for run, cell in manifest["runs"].items():
                _unpack(where / grid / run, unpacking / run, cell["sha256"], f"{grid}/{run}")
        os.replace(unpacking, cache)
    except (OSError, DamagedGrid):  # another process unpacked it first, or a file changed since it was checked
        shutil.rmtree(unpacking, ignore_errors=True)
        if not cache.is_dir():
            _read.clear()  # check again next time
            return None
    return cache


def unpacked(run: Path) -> Path:
    """The folder to read a run from: for a published run given as its place in a published folder
    (published/<grid>/<run>, whose files are compressed), the same run unpacked (`folder`); any other folder as
    given."""
    grid = run.resolve().parent
    if run.name in _read_manifests(grid.parent)[0].get(grid.name, {}).get("runs", {}):
        return folder(grid.parent) / run.name
    return run


def _unpack(source: Path, target: Path, hashes: dict, shown: str) -> None:
    """The files the manifest names (and no other), each decompressed at most to MAX_INFLATED_BYTES."""
    for relative in hashes:
        data = _stored(source / relative, f"{shown}/{relative}")
        if relative.endswith(".gz"):
            try:
                with gzip.GzipFile(fileobj=io.BytesIO(data)) as inflating:
                    data = inflating.read(MAX_INFLATED_BYTES + 1)
            except (OSError, EOFError, zlib.error) as err:
                raise DamagedGrid(f"{shown}/{relative}: not a whole gzip file ({err})") from None
            if len(data) > MAX_INFLATED_BYTES:
                raise DamagedGrid(f"{shown}/{relative}: inflates past {MAX_INFLATED_BYTES:,} bytes")
        out = target / (relative.removesuffix(".gz"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)


def kept_steps(steps: int) -> tuple[int, ...]:
    """The steps whose per-token and inspector records are published: the first, the middle and the last."""
    return tuple(sorted({1, max(1, steps // 2), steps}))


def steps_seconds(metrics: Path) -> float:
    """The seconds a run's training steps took, summed from its metrics rows' `step_time` (0 without rows)."""
    if not metrics.exists():
        return 0.0
    return sum(json.loads(line).get("step_time", 0.0) for line in metrics.read_text().splitlines() if line.strip())


def publish(run: Path, grid: Path, cell: dict, trained_by: dict, name: str | None = None) -> dict:
    """Copy the finished run folder `run` into the grid folder `grid` (compact, as above) and record it in the
    grid's manifest under its name (`name`, else the folder's), with `cell` (measure, reward, seed), its state and two times: `wall_s`, from the
    status's start to its end (model load and evaluations included, but only since the last start: a run resumed
    after an interruption counts its last stretch), and `steps_s`, its training steps' own times summed (the metrics'
    `step_time`, which a resume keeps). `trained_by` (model, setting, device, precision, versions, commit) is the
    grid's and must agree with what it already holds. Returns the manifest."""
    status = json.loads((run / "status.json").read_text())
    if status["state"] not in ("done", "failed"):
        raise ValueError(f"{run.name} is {status['state']}: only a finished run is published")
    manifest_path = grid / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {**trained_by, "runs": {}}
    clash = {k: (manifest.get(k), v) for k, v in trained_by.items() if manifest.get(k) != v}
    if clash:
        raise ValueError(f"{run.name} was not trained as {grid.name}'s runs were: {clash}")
    run_name = name or run.name
    target = grid / run_name
    shutil.rmtree(target, ignore_errors=True)
    (target / "tokens").mkdir(parents=True)
    status = {k: v for k, v in status.items() if k != "pid"}
    files = {"config.json": (run / "config.json").read_bytes(), "status.json": json.dumps(status).encode()}
    files.update({f"{name}.gz": gzip.compress((run / name).read_bytes(), mtime=0)
                  for name in JSONL if (run / name).exists()})
    for step in kept_steps(status["steps"]):
        tokens = run / "tokens" / f"step_{step:06d}.npz"
        if tokens.exists():
            files[f"tokens/{tokens.name}"] = tokens.read_bytes()
        record = run / "completions" / f"step_{step:06d}.json"
        if record.exists():
            files[f"completions/{record.name}.gz"] = gzip.compress(record.read_bytes(), mtime=0)
    for name, data in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
    manifest["runs"][run_name] = {**cell, "state": status["state"], "steps": status["step"],
                                  "wall_s": round(status["updated"] - status["started"], 1),
                                  "steps_s": round(steps_seconds(run / "metrics.jsonl"), 1),
                                  "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
    manifest["runs"] = dict(sorted(manifest["runs"].items()))
    for total in ("wall_s", "steps_s"):
        manifest[total] = round(sum(r[total] for r in manifest["runs"].values()), 1)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def differences(published_run: Path, retrained: Path) -> list[str]:
    """What a run trained again from a published run's config.json (`retrained`, a run folder) has that the published
    run does not: for each JSONL file its first step that differs (the wall clock's figures, `store.CLOCK_KEYS`,
    left out), and each kept step's per-token and inspector record that is not the same to the bit. Empty: the same
    run (scripts/retrain_published.py)."""
    found = []
    for name in JSONL:
        want, got = _rows(published_run / f"{name}.gz"), _rows(retrained / name)
        wrong = next((w.get("step") for w, g in zip(want, got) if w != g), None)
        if wrong is not None or len(want) != len(got):
            found.append(f"{name}: step {wrong} differs" if wrong is not None else
                         f"{name}: {len(got)} rows, {len(want)} published")
    for path in sorted((published_run / "tokens").glob("step_*.npz")):
        again = retrained / "tokens" / path.name
        with np.load(path) as want:
            same = again.exists() and _same_arrays(want, again)
        if not same:
            found.append(f"tokens/{path.name} differs")
    for path in sorted((published_run / "completions").glob("step_*.json.gz")):
        again = retrained / "completions" / path.with_suffix("").name
        if not again.exists() or json.loads(gzip.decompress(path.read_bytes())) != json.loads(again.read_text()):
            found.append(f"completions/{path.with_suffix('').name} differs")
    return found


def _rows(path: Path) -> list[dict]:
    """A JSONL file's rows (gzip-compressed if its name says so) without the wall clock's figures."""
    if not path.exists():
        return []
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [{k: v for k, v in json.loads(line).items() if k not in store.CLOCK_KEYS}
            for line in text.splitlines() if line.strip()]


def _same_arrays(want, path: Path) -> bool:
    with np.load(path) as got:
        return set(want.files) == set(got.files) and all(np.array_equal(want[k], got[k]) for k in want.files)
