"""The GRPO step (`engine/grpo.py`) against its golden steps (`tests/golden.py`, written by scripts/golden_step.py):
step 1 of the SmolLM2 stress grid's seed-0 PPO and KL3 δ = 0.05 runs, trained again here from their published
config.json on one thread, gives every metric, the per-token sample and the step inspector's record the reference holds:

- bfloat16, to the bit, where this CPU's kernels are the reference's (`published.cpu_kernels`): a change to the step
  that changes a run cannot pass unnoticed;
- float32, on any CPU and two threads (the reference's one thread splits its sums otherwise): the same sampled tokens
  (ids and masks exactly) and every float within TOLERANCE of the reference, the rounding another CPU's float32
  kernels or another split of the sums may bring.

The published runs themselves come back to the bit from the commit their manifests name
(`scripts/retrain_published.py`): the step's numbers changed with the frozen prefix and again with the sampler's
inverse draw (CHANGELOG)."""

import math

import numpy as np
import pytest

from divviz.runs import published
from tests import golden

TOLERANCE = dict(rtol=1e-3, atol=1e-5)  # float32; one thread against two, measured here: relative |Δ| ≤ 4e-5


def floats_close(got, want, where: str = "") -> None:
    """`got` equals `want` in structure and in every non-float, and is within TOLERANCE in every float."""
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            floats_close(got[key], want[key], f"{where}/{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            floats_close(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert math.isnan(got) if math.isnan(want) else \
            abs(got - want) <= TOLERANCE["atol"] + TOLERANCE["rtol"] * abs(want), f"{where}: {got} against {want}"
    else:
        assert got == want, where


@pytest.mark.parametrize("stem", golden.CASES)
def test_step_one_comes_back_to_the_bit_in_bfloat16_on_the_references_kernels(stem):
    """The runs' precision: a minute's work on one thread for both."""
    meta, tokens = golden.reference(stem, "bfloat16")
    if meta["cpu"] != published.cpu_kernels():
        pytest.skip(f"this CPU's kernels ({published.cpu_kernels()}) are not the reference's ({meta['cpu']}); "
                    "the float32 tier runs here")
    step = golden.golden_step(meta["config"], "bfloat16")
    assert step["metrics"] == meta["metrics"]
    assert set(step["tokens"]) == set(tokens)
    assert all(np.array_equal(tokens[name], step["tokens"][name]) for name in tokens)
    assert step["inspected"] == meta["inspected"]


@pytest.mark.parametrize("stem", golden.CASES)
def test_step_one_comes_back_within_tolerance_in_float32_on_any_cpu(stem):
    meta, tokens = golden.reference(stem, "float32")
    step = golden.golden_step(meta["config"], "float32", threads=2)  # another split of the sums than the reference's
    assert set(step["tokens"]) == set(tokens)
    for name, want in tokens.items():
        got = step["tokens"][name]
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, err_msg=name, equal_nan=True, **TOLERANCE)
        else:
            assert np.array_equal(got, want), f"{name}: the sampled tokens differ on this CPU"
    floats_close(step["metrics"], meta["metrics"], "metrics")
    floats_close(step["inspected"], meta["inspected"], "inspected")
