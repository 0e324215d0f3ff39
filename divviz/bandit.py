"""The exact softmax bandit: GRPO on a single state with K actions, where everything is computable.

Policy π_θ = softmax(θ) over K actions, θ ∈ R^K. Each iteration (one GRPO step):

    1. π_old ← π_θ; sample `groups` groups of G actions from π_old
    2. rewards r(a); group-relative advantages A = (r − mean_group) [/ (std_group + 1e-4)]  (TRL)
    3. μ gradient steps (TRL's num_iterations) of the `Objective` on the sampled actions, plain SGD on θ
       (each action is a one-token completion, so the loss is exactly the training loss)
    4. record the whole distribution: exact entropy, top-1 mass, mass on the initially likely actions,
       exact KL(π_old‖π_new), clip fractions

Plain SGD keeps the picture honest: the step is the loss's gradient, not an optimiser's rescaling.
Penalties use the start policy π_0 as the reference.

The step's gradient is the chain rule through the softmax, ∂/∂θ Σ_i g_i log π(a_i) = Σ_i g_i (e_{a_i} − π),
with g = ∂loss/∂log π(a_i) from `policy_loss_gradient`, the loss's closed-form gradient: 0.05–0.08 ms a
step on a 2-core CPU (200 iterations × μ = 4 at K = 1000: ~60 ms). With `autograd` the same step goes
through `policy_loss` and torch autograd, as training does (0.6–1 ms a step); tests/test_bandit.py checks
that both give the same run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from divviz.losses import (LossGradient, LossOutput, Objective, aggregation_weights, group_advantages,
                           policy_loss_gradient)
from divviz.params import DivvizInputError, Param, check_params

INIT_SHAPES = ("zipf", "uniform", "random")
REWARDS = ("one_correct", "top_k", "graded", "random")

BANDIT_PARAMS = (
    Param("k", 50, 2, 1000, high_open=False, kind="int", typical=(2, 1000, 1), doc="number of actions K"),
    Param("sharpness", 1.0, 0.0, 5.0, high_open=False, typical=(0.0, 3.0, 0.05),
          doc="zipf: exponent s of π_0(rank r) ∝ (r+1)^−s; random: std of the initial logits"),
    Param("correct_rank", 2, 0, 999, high_open=False, kind="int", typical=(0, 999, 1),
          doc="one_correct: rank of the rewarded action under π_0 (0 = most likely); top_k: k − 1"),
    Param("group_size", 8, 2, 256, high_open=False, kind="int", typical=(2, 64, 1), doc="G, samples per group"),
    Param("groups", 2, 1, 64, high_open=False, kind="int", typical=(1, 32, 1), doc="groups per iteration"),
    Param("mu", 4, 1, 16, high_open=False, kind="int", typical=(1, 8, 1),
          doc="inner steps per batch (TRL's num_iterations)"),
    Param("lr", 2.0, 0.0, 100.0, low_open=True, high_open=False, typical=(0.05, 20.0, 0.05), doc="SGD step size on the logits"),
    Param("iterations", 80, 1, 2000, high_open=False, kind="int", typical=(1, 500, 1), doc="GRPO iterations"),
    Param("seed", 0, 0, 2**31 - 1, high_open=False, kind="int", typical=(0, 999, 1), doc="sampling seed"),
    Param("scale_rewards", True, kind="bool", doc="divide advantages by the group's reward std (GRPO) or not (Dr. GRPO)"),
    Param("autograd", False, kind="bool",
          doc="take each step's gradient by autograd through policy_loss, as training does (~10× slower)"),
)


@dataclass(frozen=True)
class BanditConfig:
    """The bandit's setting; built through `BanditConfig.make`, which checks every field."""

    k: int = 50
    init: str = "zipf"
    sharpness: float = 1.0
    reward: str = "top_k"
    correct_rank: int = 2
    group_size: int = 8
    groups: int = 2
    mu: int = 4
    lr: float = 2.0
    iterations: int = 80
    seed: int = 0
    scale_rewards: bool = True
    autograd: bool = False

    @staticmethod
    def make(**values) -> "BanditConfig":
        init = values.pop("init", "zipf")
        reward = values.pop("reward", "top_k")
        if init not in INIT_SHAPES:
            raise DivvizInputError(f"bandit: unknown initial shape '{init}'; known: {', '.join(INIT_SHAPES)}")
        if reward not in REWARDS:
            raise DivvizInputError(f"bandit: unknown reward '{reward}'; known: {', '.join(REWARDS)}")
        checked = check_params("bandit", BANDIT_PARAMS, values)
        if checked["correct_rank"] >= checked["k"]:
            raise DivvizInputError(f"bandit: parameter 'correct_rank' must be below k = {checked['k']}; "
                                   f"got {checked['correct_rank']}")
        return BanditConfig(init=init, reward=reward, **checked)

    def to_dict(self) -> dict:
        return asdict(self)


def initial_logits(cfg: BanditConfig) -> np.ndarray:
    """θ_0, sorted so that action 0 is the most likely (ranks are action indices)."""
    ranks = np.arange(cfg.k, dtype=np.float64)
    if cfg.init == "uniform":
        return np.zeros(cfg.k)
    if cfg.init == "zipf":
        return -cfg.sharpness * np.log1p(ranks)
    return np.sort(cfg.sharpness * np.random.default_rng(cfg.seed + 1).standard_normal(cfg.k))[::-1].copy()


def reward_vector(cfg: BanditConfig) -> np.ndarray:
    """r(a) for each action (actions are indexed by their rank under π_0)."""
    ranks = np.arange(cfg.k, dtype=np.float64)
    if cfg.reward == "one_correct":
        return (ranks == cfg.correct_rank).astype(np.float64)
    if cfg.reward == "top_k":
        return (ranks <= cfg.correct_rank).astype(np.float64)
    if cfg.reward == "graded":
        return 1.0 - ranks / max(cfg.k - 1, 1)
    return np.random.default_rng(cfg.seed + 2).random(cfg.k)


@dataclass
class BanditRun:
    """What one objective did: probs[t] is π after t iterations (probs[0] = π_0)."""

    label: str
    probs: np.ndarray  # (iterations + 1, K)
    rewards: np.ndarray  # (K,)
    history: dict[str, np.ndarray]  # metric name -> (iterations,)

    @property
    def initial_entropy(self) -> float:
        """Entropy of π_0, in nats."""
        p = self.probs[0][self.probs[0] > 0]
        return float(-(p * np.log(p)).sum())


def softmax(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log π, π) with log π = θ − logsumexp(θ), shifted by max θ so that nothing overflows."""
    shifted = theta - theta.max()
    e = np.exp(shifted)
    z = e.sum()
    return shifted - math.log(z), e / z


@dataclass
class Batch:
    """One iteration's samples: actions (n,); advantages (n,); log-probs under π_old and π_0, the mask and
    the aggregation's weights ∂loss/∂ℓ_i, all (n, 1): each action is a one-token completion."""

    actions: np.ndarray
    adv: np.ndarray
    logp_old: np.ndarray
    logp_ref: np.ndarray
    mask: np.ndarray
    weights: np.ndarray


def closed_form_step(objective: Objective, theta: np.ndarray, batch: Batch) -> tuple[np.ndarray, LossGradient]:
    """∂loss/∂θ = Σ_i g_i (e_{a_i} − π) with g = `policy_loss_gradient`; also the clip flags.

    Written for speed at K = 1000: log π is formed only at the sampled actions, π = e^{θ − max θ}/z."""
    shifted = theta - theta.max()
    e = np.exp(shifted)
    z = e.sum()
    logp = shifted[batch.actions, None] - math.log(z)
    out = policy_loss_gradient(logp, batch.logp_old, batch.adv, batch.weights, objective, batch.logp_ref)
    g = out.grad[:, 0]
    return np.bincount(batch.actions, weights=g, minlength=theta.size) - (g.sum() / z) * e, out


def autograd_step(objective: Objective, theta: np.ndarray, batch: Batch) -> tuple[np.ndarray, LossOutput]:
    """∂loss/∂θ by torch autograd through log-softmax and `policy_loss`, as in training."""
    theta_t = torch.from_numpy(theta).requires_grad_()
    logp_new = torch.log_softmax(theta_t, dim=-1)[torch.from_numpy(batch.actions)].unsqueeze(1)
    old, ref, adv, mask = (torch.from_numpy(x) for x in (batch.logp_old, batch.logp_ref, batch.adv, batch.mask))
    out = objective(logp_new, old, adv, mask, logp_ref=ref)
    (grad,) = torch.autograd.grad(out.loss, theta_t)
    return grad.numpy(), out


def sample_batch(cfg: BanditConfig, rng: np.random.Generator, logp_old: np.ndarray, p_old: np.ndarray,
                 logp_ref: np.ndarray, rewards: np.ndarray, mask: np.ndarray,
                 weights: np.ndarray) -> tuple[Batch, np.ndarray]:
    """`groups` × G actions from π_old (inverse CDF) with their group-relative advantages; also the rewards.
    `mask` and the aggregation's `weights` are the same every iteration."""
    n = cfg.groups * cfg.group_size
    cdf = np.cumsum(p_old)
    actions = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), cfg.k - 1)
    r = rewards[actions]
    adv = group_advantages(r.reshape(cfg.groups, cfg.group_size), cfg.scale_rewards)
    return Batch(actions, adv.reshape(n), logp_old[actions, None], logp_ref[actions, None], mask, weights), r


def run_bandit(cfg: BanditConfig, objective: Objective) -> BanditRun:
    """Run `cfg.iterations` GRPO iterations of `objective` from π_0 with the sampling seed `cfg.seed`."""
    rng = np.random.default_rng(cfg.seed)
    step = autograd_step if cfg.autograd else closed_form_step
    theta = initial_logits(cfg)
    logp_ref, p_new = softmax(theta)
    rewards = reward_vector(cfg)
    initial_top = np.argsort(-logp_ref, kind="stable")[: max(1, cfg.k // 10)]
    mask = np.ones((cfg.groups * cfg.group_size, 1))  # each action is a one-token completion
    weights = aggregation_weights(mask, objective.aggregation)

    probs = np.empty((cfg.iterations + 1, cfg.k))
    probs[0] = p_new
    keys = ("reward", "entropy", "top1_mass", "initial_top_mass", "kl", "clip_ratio/low_mean",
            "clip_ratio/high_mean", "clip_ratio/region_mean", "expected_reward")
    history = {key: np.zeros(cfg.iterations) for key in keys}
    logp_new = logp_ref
    for it in range(cfg.iterations):
        logp_old, p_old = logp_new, p_new
        batch, r = sample_batch(cfg, rng, logp_old, p_old, logp_ref, rewards, mask, weights)
        low = high = 0
        with np.errstate(over="ignore", invalid="ignore"):  # a step that overflows is caught just below
            for _ in range(cfg.mu):
                grad, out = step(objective, theta, batch)
                theta = theta - cfg.lr * grad
                low += np.count_nonzero(out.clipped_low)
                high += np.count_nonzero(out.clipped_high)
        if not np.isfinite(theta).all():
            raise DivvizInputError(f"bandit diverged to NaN/inf at iteration {it + 1}; lower lr (now {cfg.lr:g})")
        logp_new, p_new = softmax(theta)
        probs[it + 1] = p_new
        tokens = cfg.mu * r.size
        history["reward"][it] = r.mean()
        history["entropy"][it] = -(p_new * logp_new).sum()
        history["top1_mass"][it] = p_new.max()
        history["initial_top_mass"][it] = p_new[initial_top].sum()
        history["kl"][it] = p_old @ (logp_old - logp_new)
        history["expected_reward"][it] = p_new @ rewards
        history["clip_ratio/low_mean"][it] = low / tokens
        history["clip_ratio/high_mean"][it] = high / tokens
        history["clip_ratio/region_mean"][it] = (low + high) / tokens
    return BanditRun(objective.label, probs, rewards, history)
