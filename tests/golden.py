"""The golden steps of the GRPO step (tests/engine/test_grpo_step.py): step 1 of the SmolLM2 stress grid's seed-0 PPO
and KL3 δ = 0.05 runs (their published config.json), on one thread as a pool trains, in bfloat16 (the runs' precision:
compared to the bit where this CPU's kernels are the reference's) and in float32 (compared within stated tolerances on
any CPU). Each case is one compressed .npz in tests/data/golden_step/: the step's per-token sample
(`StepResult.tokens`) as arrays and, as JSON under "meta", the CPU kernels, torch's version, the config, the metrics
(less the wall clock's) and the step inspector's record. `scripts/golden_step.py` writes them."""

import json
from pathlib import Path

import numpy as np
import torch

from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_trainer
from divviz.evidence import claims
from divviz.runs import published
from divviz.runs.store import CLOCK_KEYS

FOLDER = Path(__file__).resolve().parent / "data" / "golden_step"
GRID = published.ROOT / "smollm2-135m-stress-cpu"
CASES = {"ppo": claims.PPO, "kl3": claims.KL3_WIDE}  # file stem → the grid's measure
DTYPES = ("bfloat16", "float32")


def published_config(measure: str) -> dict:
    """The config.json of the grid's lowest-seed run of `measure`."""
    manifest = json.loads((GRID / "manifest.json").read_text())
    name = min((cell["seed"], name) for name, cell in manifest["runs"].items() if cell["measure"] == measure)[1]
    return json.loads((GRID / name / "config.json").read_text())


def golden_step(config: dict, dtype: str, threads: int = 1) -> dict:
    """Step 1 of `config` in `dtype` on `threads` threads: {"tokens": arrays, "metrics", "inspected"}."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = grpo_step(make_trainer(RunConfig.from_dict({**config, "dtype": dtype})), 0)
    finally:
        torch.set_num_threads(before)
    metrics = {key: value for key, value in result.metrics.items() if key not in CLOCK_KEYS}
    return {"tokens": result.tokens, "metrics": metrics, "inspected": json.loads(json.dumps(result.inspected))}


def path(stem: str, dtype: str) -> Path:
    return FOLDER / f"{stem}-{dtype}.npz"


def write(stem: str, dtype: str) -> dict:
    """Compute and save one golden step; returns its metrics."""
    step = golden_step(published_config(CASES[stem]), dtype)
    meta = {"cpu": published.cpu_kernels(), "torch": torch.__version__, "threads": 1, "dtype": dtype,
            "config": published_config(CASES[stem]), "metrics": step["metrics"], "inspected": step["inspected"]}
    FOLDER.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path(stem, dtype), meta=np.array(json.dumps(meta)),
                        **{f"tokens/{name}": values for name, values in step["tokens"].items()})
    return step["metrics"]


def reference(stem: str, dtype: str) -> tuple[dict, dict]:
    """(meta, tokens) of a saved golden step."""
    with np.load(path(stem, dtype)) as data:
        tokens = {name.removeprefix("tokens/"): data[name] for name in data.files if name.startswith("tokens/")}
        return json.loads(str(data["meta"])), tokens
