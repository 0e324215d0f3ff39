"""The GRPO step (`engine/grpo.py`) against the published runs (published/): step 1 of a PPO and a KL3 run of the
SmolLM2 stress grid, trained again here from their config.json, gives every metric, the per-token sample and the
step inspector's record the run published — to the bit on a CPU with the kernels the grid was trained with
(`published.cpu_kernels`), so a change to the step that changes a run cannot pass unnoticed."""

import gzip
import json

import numpy as np
import pytest
import torch

from divviz.engine import published
from divviz.engine.store import CLOCK_KEYS
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_trainer
from divviz.evidence import claims

GRID = published.ROOT / "smollm2-135m-stress-cpu"


def first_run_of(measure: str) -> str:
    manifest = json.loads((GRID / "manifest.json").read_text())
    return min((cell["seed"], name) for name, cell in manifest["runs"].items() if cell["measure"] == measure)[1]


@pytest.fixture
def one_thread():
    """A pool's run trains on one thread (`pool.main`); the bits of a sum depend on how it is split."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_step_one_of_a_published_run_comes_back_to_the_bit(one_thread):
    """The headline's candidate, KL3 δ = 0.05 (its asymmetric box, the loss's every term): a minute on one thread."""
    measure = claims.KL3_WIDE
    manifest = json.loads((GRID / "manifest.json").read_text())
    if manifest["cpu"] != published.cpu_kernels():
        pytest.skip(f"this CPU's kernels ({published.cpu_kernels()}) are not the grid's ({manifest['cpu']})")
    run = GRID / first_run_of(measure)
    config = json.loads((run / "config.json").read_text())
    result = grpo_step(make_trainer(RunConfig.from_dict(config)), 0)  # from_dict drops what the run recorded

    with gzip.open(run / "metrics.jsonl.gz", "rt") as handle:
        want = json.loads(handle.readline())
    stability = [key for key in want if key.startswith("stability/")]  # the run's record so far, added by train()
    assert {k: v for k, v in result.metrics.items() if k not in CLOCK_KEYS} == \
        {k: v for k, v in want.items() if k not in (*CLOCK_KEYS, *stability)}
    with np.load(run / "tokens" / "step_000001.npz") as tokens:
        assert set(tokens.files) == set(result.tokens)
        assert all(np.array_equal(tokens[name], result.tokens[name]) for name in tokens.files)
    with gzip.open(run / "completions" / "step_000001.json.gz", "rt") as handle:
        assert json.loads(json.dumps(result.inspected)) == json.load(handle)
