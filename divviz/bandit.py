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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from divviz.losses import Objective, group_advantages
from divviz.metrics import clip_fractions, entropy_from_logits
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


def initial_logits(cfg: BanditConfig) -> torch.Tensor:
    """θ_0, sorted so that action 0 is the most likely (ranks are action indices)."""
    ranks = torch.arange(cfg.k, dtype=torch.float64)
    if cfg.init == "uniform":
        return torch.zeros(cfg.k, dtype=torch.float64)
    if cfg.init == "zipf":
        return -cfg.sharpness * torch.log1p(ranks)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.sort(cfg.sharpness * torch.randn(cfg.k, generator=g, dtype=torch.float64), descending=True).values


def reward_vector(cfg: BanditConfig) -> torch.Tensor:
    """r(a) for each action (actions are indexed by their rank under π_0)."""
    ranks = torch.arange(cfg.k, dtype=torch.float64)
    if cfg.reward == "one_correct":
        return (ranks == cfg.correct_rank).to(torch.float64)
    if cfg.reward == "top_k":
        return (ranks <= cfg.correct_rank).to(torch.float64)
    if cfg.reward == "graded":
        return 1.0 - ranks / max(cfg.k - 1, 1)
    g = torch.Generator().manual_seed(cfg.seed + 2)
    return torch.rand(cfg.k, generator=g, dtype=torch.float64)


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


def run_bandit(cfg: BanditConfig, objective: Objective) -> BanditRun:
    """Run `cfg.iterations` GRPO iterations of `objective` from π_0 with the sampling seed `cfg.seed`."""
    g = torch.Generator().manual_seed(cfg.seed)
    theta = initial_logits(cfg).clone().requires_grad_()
    logp_ref_all = torch.log_softmax(theta.detach(), dim=-1)
    r = reward_vector(cfg)
    n = cfg.groups * cfg.group_size
    mask = torch.ones(n, 1, dtype=torch.float64)
    initial_top = torch.argsort(logp_ref_all, descending=True)[: max(1, cfg.k // 10)]

    probs = [logp_ref_all.exp().numpy().copy()]
    keys = ("reward", "entropy", "top1_mass", "initial_top_mass", "kl", "clip_ratio/low_mean",
            "clip_ratio/high_mean", "clip_ratio/region_mean", "expected_reward")
    history = {key: np.zeros(cfg.iterations) for key in keys}
    for it in range(cfg.iterations):
        logp_old_all = torch.log_softmax(theta.detach(), dim=-1)
        actions = torch.multinomial(logp_old_all.exp(), n, replacement=True, generator=g)  # (n,)
        rewards = r[actions].view(cfg.groups, cfg.group_size)
        adv = group_advantages(rewards, cfg.scale_rewards).reshape(n)
        logp_old = logp_old_all[actions].unsqueeze(1)  # (n, 1)
        logp_ref = logp_ref_all[actions].unsqueeze(1)
        fractions = {}
        for _ in range(cfg.mu):
            logp_new = torch.log_softmax(theta, dim=-1)[actions].unsqueeze(1)
            out = objective(logp_new, logp_old, adv, mask, logp_ref=logp_ref)
            (grad,) = torch.autograd.grad(out.loss, theta)
            with torch.no_grad():
                theta -= cfg.lr * grad
            for key, value in clip_fractions(out, mask).items():
                fractions[key] = fractions.get(key, 0.0) + value / cfg.mu
        if not torch.isfinite(theta).all():
            raise DivvizInputError(f"bandit diverged to NaN/inf at iteration {it + 1}; lower lr (now {cfg.lr:g})")
        logp_new_all = torch.log_softmax(theta.detach(), dim=-1)
        p_new = logp_new_all.exp()
        probs.append(p_new.numpy().copy())
        history["reward"][it] = float(rewards.mean())
        history["entropy"][it] = float(entropy_from_logits(theta.detach()))
        history["top1_mass"][it] = float(p_new.max())
        history["initial_top_mass"][it] = float(p_new[initial_top].sum())
        history["kl"][it] = float((logp_old_all.exp() * (logp_old_all - logp_new_all)).sum())
        history["expected_reward"][it] = float((p_new * r).sum())
        for key, value in fractions.items():
            history[key][it] = value
    return BanditRun(objective.label, np.stack(probs), r.numpy(), history)
