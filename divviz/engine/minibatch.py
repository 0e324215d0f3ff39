"""Mini-batch updates: each pass over a rollout batch as K optimiser steps, as real trainers take them.

TRL (`GRPOTrainer._prepare_inputs`) shuffles a generation batch once (`shuffle_sequence_dict`), splits it into
`steps_per_generation` consecutive slices (`split_tensor_dict`), and trains the slices in order, one optimiser step
each, in every one of its `num_iterations` passes; verl splits its batch into `ppo_mini_batch_size` pieces for each
of `ppo_epochs`. divviz splits by completion, as TRL does, with one seeded shuffle per rollout batch shared by the μ
passes, so its mini-batches match a TRL run's given the same permutation (tests/engine/test_trl_runs.py). Every
mini-batch is trained against π_old, the policy before the update (π_roll, the sampler, in verl's bypass mode): the
first one of the first pass is on-policy (its ratios are exactly 1, π_old and π coming from the same forward on the
same rows), every later one is off-policy by the steps before it, which is where a clip test starts to bind. One
optimiser step per pass (K = 1) is simply one mini-batch, the whole batch.
"""

from __future__ import annotations

from dataclasses import fields

import torch

from divviz.losses import LossOutput


def minibatch_rows(n: int, k: int, seed: int) -> list[torch.Tensor]:
    """The rows of each of K mini-batches of a batch of n completions: a permutation seeded by `seed` cut into K
    equal slices, each slice's rows in ascending order (a prompt's completions stay together, so its prompt runs
    once in the forward, `rollout.prefill`). K = 1: one mini-batch, the whole batch in its order."""
    if k == 1:
        return [torch.arange(n)]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return [part.sort().values for part in order.view(k, n // k)]


def minibatch_index(parts: list[torch.Tensor], n: int) -> torch.Tensor:
    """(n,) the mini-batch (0-based) each completion was trained in."""
    index = torch.zeros(n, dtype=torch.long)
    for k, rows in enumerate(parts):
        index[rows] = k
    return index


def in_batch_order(parts: list[tuple[torch.Tensor, LossOutput]], n: int) -> LossOutput:
    """One LossOutput for the whole batch from each mini-batch's (rows, output): every per-token fact put back at
    its completion's row; the loss is the mean of the mini-batches' losses; no graph is kept."""
    joined = {}
    for field in fields(LossOutput):
        values = [getattr(out, field.name) for _, out in parts]
        if field.name == "loss":
            joined["loss"] = torch.stack([value.detach() for value in values]).mean()
        elif field.name == "token_loss" or values[0] is None:
            joined[field.name] = None
        else:
            full = values[0].new_zeros((n, *values[0].shape[1:]))
            for (rows, _), value in zip(parts, values):
                full[rows.to(full.device)] = value.detach()
            joined[field.name] = full
    return LossOutput(**joined)
