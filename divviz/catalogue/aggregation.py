"""Aggregations: how (B, T) per-token losses become one scalar, by TRL's loss_type names (and verl's token_sum), each
token's weight ∂loss/∂ℓ_t in that scalar, and GRPO's group-relative advantages."""

from __future__ import annotations

import numpy as np
import torch

from divviz.catalogue.params import DivvizInputError
from divviz.safetext import quoted, unknown

AGGREGATIONS = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "token_sum")
TRL_AGGREGATIONS = AGGREGATIONS[:5]  # TRL loss types that aggregate (token_sum is verl's)


def check_aggregation(name: str) -> str:
    if name not in AGGREGATIONS:
        raise DivvizInputError(unknown("aggregation", name, AGGREGATIONS))
    return name


def aggregation_weights(mask: np.ndarray, how: str, max_completion_length: int | None = None,
                        num_items_in_batch: float | None = None) -> np.ndarray:
    """∂loss/∂ℓ_t of `aggregate`: each token's weight in the loss."""
    mask = np.asarray(mask, dtype=np.float64)
    if how == "grpo":
        return mask / np.maximum(mask.sum(-1, keepdims=True), 1) / mask.shape[0]
    if how == "dapo" and num_items_in_batch is not None:
        return mask / float(num_items_in_batch)
    if how in ("bnpo", "dapo"):
        return mask / max(mask.sum(), 1)
    if how == "dr_grpo":
        return mask / (mask.shape[0] * (max_completion_length or mask.shape[-1]))
    if how == "luspo":
        return mask / mask.shape[0]
    if how == "token_sum":
        return mask
    raise ValueError(f"unknown aggregation {how!r}")


def prefix_weights(lengths: list[int], how: str, max_completion_length: int | None = None) -> np.ndarray:
    """Each row's token weight where row i's mask is its first `lengths[i]` tokens (an imported step's completions):
    row i of `aggregation_weights` on that mask, over those tokens, without making the (rows × longest) mask — a
    hostile step of one long completion beside many short ones would make it gigabytes."""
    n = np.asarray(lengths, dtype=np.float64)
    width = max_completion_length or max(int(n.max(initial=0)), 1)
    rows = max(len(n), 1)
    weight = {"grpo": 1.0 / np.maximum(n, 1) / rows, "bnpo": np.full_like(n, 1.0 / max(n.sum(), 1)),
              "dr_grpo": np.full_like(n, 1.0 / (rows * width)), "luspo": np.full_like(n, 1.0 / rows),
              "token_sum": np.ones_like(n)}
    weight["dapo"] = weight["bnpo"]
    if how not in weight:
        raise ValueError(f"unknown aggregation {how!r}")
    return weight[how]


def dapo_tokens(kept: torch.Tensor, minibatches: int) -> torch.Tensor:
    """DAPO's normaliser for one of K mini-batches, as TRL passes it (`num_items_in_batch`): the tokens the whole
    batch keeps, over K, so that the K mini-batches' losses sum to the batch's token mean (at least 1 token)."""
    return kept.sum().clamp(min=1) / minibatches


SCALE_REWARDS = ("group", "batch", "none")  # TRL's scale_rewards


def check_scale_rewards(value) -> str:
    """TRL's `scale_rewards`: "group", "batch" or "none"; True and False (divviz's and TRL's older bool) are
    "group" and "none"."""
    if isinstance(value, bool):
        return "group" if value else "none"
    if value not in SCALE_REWARDS:
        raise DivvizInputError(unknown("scale_rewards", str(value), SCALE_REWARDS))
    return value


BASELINES = ("group", "batch")


def group_advantages(rewards, scale="group", baseline="group"):
    """GRPO's group-relative advantages of rewards shaped (…, groups, G): r − mean of its group (or, with
    `baseline="batch"`, of the whole batch over the last two axes: RPG's batch-mean estimator), divided by
    std + 1e-4 where std is the group's ("group": Shao et al. 2024), or the whole batch's, over every group of the
    last two axes ("batch": TRL's scale_rewards="batch", its std around the batch mean), or left unscaled ("none":
    Dr. GRPO, Liu et al. 2025). Stds are unbiased, as TRL's nanstd. Takes a torch tensor or a numpy array (G ≥ 2)
    and returns the same kind; True and False mean "group" and "none"."""
    scale = check_scale_rewards(scale)
    if not hasattr(rewards, "shape") or rewards.ndim < 2 or rewards.shape[-1] < 2:
        raise DivvizInputError("group_advantages takes rewards as a torch tensor or numpy array shaped (…, groups, G) "
                               f"with G ≥ 2; got {quoted(rewards, 60)}")
    if baseline not in BASELINES:
        raise DivvizInputError(unknown("baseline", str(baseline), BASELINES))
    size, count = rewards.shape[-1], rewards.shape[-2] * rewards.shape[-1]
    in_group = rewards - (rewards.sum(-1) / size)[..., None] if "group" in (baseline, scale) else None
    in_batch = rewards - (rewards.sum((-2, -1)) / count)[..., None, None] if "batch" in (baseline, scale) else None
    adv = in_batch if baseline == "batch" else in_group
    if scale == "group":
        adv = adv / ((((in_group * in_group).sum(-1) / (size - 1)) ** 0.5)[..., None] + 1e-4)
    elif scale == "batch":
        adv = adv / ((((in_batch * in_batch).sum((-2, -1)) / (count - 1)) ** 0.5)[..., None, None] + 1e-4)
    return adv


def grpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO: mean over each completion's tokens, then mean over completions (Shao et al. 2024)."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def bnpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BNPO: sum over all tokens divided by the number of tokens in this batch."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def dr_grpo_aggregate(per_token: torch.Tensor, mask: torch.Tensor, max_completion_length: int) -> torch.Tensor:
    """Dr. GRPO: sum over all tokens divided by the constant B × max_completion_length (Liu et al. 2025)."""
    return (per_token * mask).sum() / (per_token.shape[0] * max_completion_length)


def dapo_aggregate(per_token: torch.Tensor, mask: torch.Tensor, num_items_in_batch: int | None) -> torch.Tensor:
    """DAPO: token-level mean over the whole global batch (Yu et al. 2025). TRL divides by the tokens of
    all processes and accumulation steps (`num_items_in_batch`); in one process with one step that is
    this batch's token count, i.e. the same number as bnpo."""
    normaliser = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return (per_token * mask).sum() / normaliser


def aggregate(per_token, mask, how: str, max_completion_length: int | None = None,
              num_items_in_batch: int | None = None) -> torch.Tensor:
    """Reduce (B, T) per-token losses to a scalar, as TRL's `loss_type` names them; "luspo" is TRL's mean over
    completions of each one's token sum (verl's seq-mean-token-sum), "token_sum" verl's plain sum of all tokens."""
    if how == "grpo":
        return grpo_aggregate(per_token, mask)
    if how == "bnpo":
        return bnpo_aggregate(per_token, mask)
    if how == "dr_grpo":
        return dr_grpo_aggregate(per_token, mask, max_completion_length or per_token.shape[-1])
    if how == "dapo":
        return dapo_aggregate(per_token, mask, num_items_in_batch)
    if how == "luspo":
        return (per_token * mask).sum(-1).mean()
    if how == "token_sum":
        return (per_token * mask).sum()
    raise ValueError(f"unknown aggregation {how!r}")
