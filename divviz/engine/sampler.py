"""The rollout policy π_roll: a sampler that is not quite the policy being trained, as in a trainer with an
inference engine beside it (vLLM or SGLang beside FSDP), so that the rollout corrections (`rollout_correction.py`)
have something to correct.

Two mismatches, the two that verl's `RolloutCorrectionConfig` names, alone or together:

    precision   the sampler's weights and activations in bfloat16 or float16, a copy cast whole as an inference
                engine holds it, while the loss runs in the trainer's precision (float32 here, bf16 autocast on CUDA)
    lag k       the sampler holds the weights of k updates ago (asynchronous RL): step s samples with the policy as
                it was at the start of step s − k (the start weights while s < k)

With neither (the default) the trained model samples its own completions and no copy is made. Otherwise the copy
is synced after every update, as a trainer pushes its weights to the inference engine, and the weights reach it
`lag` updates later: the sampler keeps `lag` copies of the weights in its own precision.
"""

from __future__ import annotations

import copy
from collections import deque

import torch

from divviz.catalogue.rollout_correction import SAMPLER_DTYPES


class RolloutPolicy:
    """The sampler: a frozen copy of the trained model in `dtype` ("same": the model's own), `lag` updates behind."""

    def __init__(self, model: torch.nn.Module, dtype: str, lag: int):
        self.dtype = SAMPLER_DTYPES[dtype] or next(model.parameters()).dtype
        self.lag = lag
        self.model = copy.deepcopy(model).to(self.dtype).eval().requires_grad_(False)
        self.pending: deque[dict[str, torch.Tensor]] = deque()  # the newer weights, oldest first

    def after_update(self, model: torch.nn.Module) -> None:
        """Hand over the trained weights after an update; the sampler takes the ones from `lag` updates ago (with no
        lag, straight from the model: `load_state_dict` copies and casts them)."""
        if self.lag == 0:
            self.model.load_state_dict(model.state_dict())
            return
        self.pending.append({k: v.detach().to(self.dtype, copy=True) for k, v in model.state_dict().items()})
        if len(self.pending) > self.lag:
            self.model.load_state_dict(self.pending.popleft())

    def reset(self, model: torch.nn.Module) -> None:
        """Sample with `model`'s present weights, forgetting any that were still on their way (a loaded checkpoint)."""
        self.pending.clear()
        self.model.load_state_dict(model.state_dict())


def rollout_policy(model: torch.nn.Module, dtype: str, lag: int) -> RolloutPolicy | None:
    """The sampler for these settings, or None when the trained model samples itself (same precision, no lag)."""
    if dtype == "same" and lag == 0:
        return None
    return RolloutPolicy(model, dtype, lag)
