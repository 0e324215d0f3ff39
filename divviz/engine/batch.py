"""What one GRPO step passes from its algorithm (`grpo.py`) to what it measures (`step_metrics.py`): the batch it
sampled and scored, and what its update did. Their own module, so that the step and its metrics both import them
and neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from divviz.catalogue.rollout_correction import Correction
from divviz.engine.frozen_prefix import FrozenPrefix
from divviz.engine.rollout import Rollout
from divviz.losses import LossOutput


@dataclass
class Batch:
    """One step's rollouts and what the reward made of them."""

    rollout: Rollout
    prompts: list[str]  # one per completion, as a person reads it (the compact prompt, or the chat question)
    texts: list[str]
    rewards: torch.Tensor  # (N,)
    correct: list[bool]
    adv: torch.Tensor  # (N,)
    prefix: FrozenPrefix | None = None  # the trained policy's frozen blocks over the batch, once (`frozen_prefix.py`)


@dataclass
class Update:
    """What `update` did: the last pass's LossOutput (each completion's from its mini-batch), π_old, the clip
    fractions averaged over its μ × K optimiser steps (and by optimiser step when K > 1), the gradient norms, the
    rollout correction (None when the batch is on-policy), the loss's mask (the completions' less the tokens the
    correction rejected) and the mini-batch each completion trained in (None for K = 1)."""

    out: LossOutput
    logp_old: torch.Tensor
    fractions: dict[str, float]
    grad_norms: list[float]
    correction: Correction | None
    mask: torch.Tensor
    minibatch: torch.Tensor | None = None  # (N,) 0-based
