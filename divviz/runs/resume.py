"""Resuming a stopped run where it was: every `checkpoint_every` steps a run keeps what it needs to go on as if it
had never stopped, in `resume.pt` in its folder (replaced atomically; removed once the run is done):

    step         the updates done
    parameters   the tensors that train (SmolLM2's last blocks: 14 M numbers, not the whole model)
    optimiser    AdamW's state (moments and step counts)

Everything else a step depends on is drawn from the run's seed and the step (`grpo.py`: the prompts, the sampling
generator, the mini-batch shuffle), the reference policy is the start policy made again, and the stability record is
replayed from metrics.jsonl, so a resumed run writes the rows an unbroken run would have (tests/engine/test_training.py).
A sampler that lags behind the trained model (`rollout_lag` > 0) holds weights this file does not keep: such a run
starts again from step 0 instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FILE = "resume.pt"


def can_resume(cfg) -> bool:
    """Whether a run of `cfg` can be resumed from `resume.pt`: divviz's own loop (`train.py`; TRL keeps its own
    state), without a lagging sampler."""
    return cfg.backend == "divviz" and cfg.rollout_lag == 0


def saved_step(folder: Path) -> int:
    """The step `folder`'s resume state was saved after (0: none, or unreadable)."""
    path = folder / FILE
    if not path.is_file():
        return 0
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    except Exception:  # noqa: BLE001 — a torn or foreign file: the run starts again from step 0
        return 0


def save(folder: Path, step: int, trainer) -> None:
    """Keep the trained parameters and the optimiser's state after `step` updates."""
    state = {"step": step,
             "parameters": {name: p.detach().cpu() for name, p in trainer.model.named_parameters() if p.requires_grad},
             "optimiser": trainer.optimiser.state_dict()}
    tmp = folder / f".{FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / FILE)


def restore(folder: Path, trainer) -> int:
    """Load `folder`'s resume state into a fresh trainer of the same config; returns its step."""
    state = torch.load(folder / FILE, map_location=trainer.device, weights_only=True)
    parameters = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, value in state["parameters"].items():
            parameters[name].copy_(value)
    trainer.optimiser.load_state_dict(state["optimiser"])
    if trainer.sampler is not None:
        trainer.sampler.reset(trainer.model)
    return int(state["step"])


def forget(folder: Path) -> None:
    """Remove the resume state of a run that is done."""
    (folder / FILE).unlink(missing_ok=True)
