"""The bandit's setting: K actions, the start policy π_0 = softmax(θ_0) in one of three shapes, the rewards, and
every other setting a run takes (`BanditConfig`, checked when built). `grpo.py` trains GRPO on it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from divviz.catalogue.aggregation import BASELINES, SCALE_REWARDS, check_scale_rewards
from divviz.catalogue.params import DivvizInputError, Param, check_params
from divviz.catalogue.rollout_correction import SAMPLER_DTYPES
from divviz.safetext import quoted, unknown

INIT_SHAPES = ("zipf", "uniform", "random")
REWARDS = ("one_correct", "top_k", "graded", "random", "random_correct", "coin")
OPTIMIZERS = ("sgd", "adam")
DEFAULT_LR = {"sgd": 0.5, "adam": 0.05}  # what the page sets when the optimiser is switched

BANDIT_PARAMS = (
    Param("k", 50, 2, 1000, high_open=False, kind="int", typical=(2, 1000, 1), doc="number of actions K"),
    Param("sharpness", 1.0, 0.0, 5.0, high_open=False, typical=(0.0, 3.0, 0.05),
          doc="zipf: exponent s of π_0(rank r) ∝ (r+1)^−s; random: std of the initial logits"),
    Param("correct_rank", 2, 0, 999, high_open=False, kind="int", typical=(0, 999, 1),
          doc="one_correct: rank of the rewarded action under π_0 (0 = most likely); top_k: k − 1"),
    Param("correct_percent", 10, 1, 100, high_open=False, kind="int", typical=(1, 100, 1),
          doc="random_correct: the share of actions, drawn at random for each seed, whose reward is 1"),
    Param("group_size", 8, 2, 256, high_open=False, kind="int", typical=(2, 64, 1), doc="G, samples per group"),
    Param("groups", 2, 1, 64, high_open=False, kind="int", typical=(1, 32, 1), doc="groups per iteration"),
    Param("mu", 4, 1, 16, high_open=False, kind="int", typical=(1, 8, 1),
          doc="optimiser steps per batch (TRL's num_iterations)"),
    Param("lr", DEFAULT_LR["sgd"], 0.0, 100.0, low_open=True, high_open=False, typical=(0.005, 20.0, 0.005),
          doc="step size on the logits (SGD), or Adam's learning rate"),
    Param("iterations", 80, 1, 2000, high_open=False, kind="int", typical=(1, 500, 1), doc="GRPO iterations"),
    Param("seed", 0, 0, 2**31 - 1, high_open=False, kind="int", typical=(0, 999, 1),
          doc="sampling seed (the first of the seeds)"),
    Param("rollout_lag", 0, 0, 64, high_open=False, kind="int", typical=(0, 16, 1),
          doc="the sampler draws from the policy of this many iterations ago (0: the current one)"),
    Param("autograd", False, kind="bool",
          doc="take each step's gradient by autograd through policy_loss, as training does (about 20× slower)"),
    Param("attribution", False, kind="bool",
          doc="attribute each update's entropy change to each clip state's samples, and to what the masked ones "
              "would have done (every optimiser step: about a third more time)"),
)


@dataclass(frozen=True)
class BanditConfig:
    """The bandit's setting, every field checked when built (`BanditConfig.make` builds it from names and values)."""

    k: int = 50
    init: str = "zipf"
    sharpness: float = 1.0
    reward: str = "top_k"
    correct_rank: int = 2
    correct_percent: int = 10
    group_size: int = 8
    groups: int = 2
    mu: int = 4
    optimizer: str = "sgd"
    lr: float = DEFAULT_LR["sgd"]
    iterations: int = 80
    seed: int = 0
    scale_rewards: str = "group"  # TRL's: the group's reward std, the batch's (each run's), or none (Dr. GRPO)
    baseline: str = "group"  # the mean subtracted: the group's, or the batch's (each run's; RPG's batch mean)
    rollout_dtype: str = "same"  # the sampler's logits rounded to bfloat16 or float16 (`BanditRollout`)
    rollout_lag: int = 0
    autograd: bool = False
    attribution: bool = False  # `entropy.attribute` at every optimiser step, as the random-reward claims ask

    def __post_init__(self):
        """Every field checked however the setting is built: options against their lists, numbers against their
        ranges (converted to their kinds), and the correct actions fewer than the actions."""
        choices = {"init": ("initial shape", INIT_SHAPES), "reward": ("reward", REWARDS),
                   "optimizer": ("optimizer", OPTIMIZERS), "scale_rewards": ("scale_rewards", SCALE_REWARDS),
                   "baseline": ("baseline", BASELINES), "rollout_dtype": ("rollout_dtype", tuple(SAMPLER_DTYPES))}
        for name, (what, known) in choices.items():
            if not isinstance(getattr(self, name), str) or getattr(self, name) not in known:
                raise DivvizInputError(f"bandit: {unknown(what, getattr(self, name), known)}")
        checked = check_params("bandit", BANDIT_PARAMS, {p.name: getattr(self, p.name) for p in BANDIT_PARAMS})
        if checked["correct_rank"] >= checked["k"]:
            raise DivvizInputError(f"bandit: parameter 'correct_rank' must be below k = {checked['k']}; "
                                   f"got {checked['correct_rank']}")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @staticmethod
    def make(**values) -> "BanditConfig":
        """A setting from names and values (a page's controls, a link): unknown names refused in one line."""
        if isinstance(values.get("scale_rewards"), bool):  # the older bool
            values["scale_rewards"] = check_scale_rewards(values["scale_rewards"])
        unknown = sorted(set(values) - set(BanditConfig.__dataclass_fields__))
        if unknown:
            raise DivvizInputError(f"bandit: unknown parameter {quoted(unknown[0])} (its parameters: "
                                   f"{', '.join(BanditConfig.__dataclass_fields__)})")
        return BanditConfig(**values)

    def to_dict(self) -> dict:
        return asdict(self)


def initial_logits(cfg: BanditConfig, seed: int | None = None) -> np.ndarray:
    """θ_0, sorted so that action 0 is the most likely (ranks are action indices); `random` draws them from
    the seed (default `cfg.seed`)."""
    ranks = np.arange(cfg.k, dtype=np.float64)
    if cfg.init == "uniform":
        return np.zeros(cfg.k)
    if cfg.init == "zipf":
        return -cfg.sharpness * np.log1p(ranks)
    seed = cfg.seed if seed is None else seed
    return np.sort(cfg.sharpness * np.random.default_rng(seed + 1).standard_normal(cfg.k))[::-1].copy()


def reward_vector(cfg: BanditConfig, seed: int | None = None) -> np.ndarray:
    """r(a) for each action (actions are indexed by their rank under π_0); the random rewards are the seed's; with
    `coin` (a random reward per sample, `coins_per_seed`) its expectation, 0.5."""
    ranks = np.arange(cfg.k, dtype=np.float64)
    rng = np.random.default_rng((cfg.seed if seed is None else seed) + 2)
    if cfg.reward == "one_correct":
        return (ranks == cfg.correct_rank).astype(np.float64)
    if cfg.reward == "top_k":
        return (ranks <= cfg.correct_rank).astype(np.float64)
    if cfg.reward == "graded":
        return 1.0 - ranks / max(cfg.k - 1, 1)
    if cfg.reward == "coin":  # a fair coin per sample, whatever the action (`coins_per_seed`): 0.5 expected
        return np.full(cfg.k, 0.5)
    if cfg.reward == "random_correct":
        correct = rng.choice(cfg.k, size=max(1, round(cfg.k * cfg.correct_percent / 100)), replace=False)
        return np.isin(np.arange(cfg.k), correct).astype(np.float64)
    return rng.random(cfg.k)


def coins_per_seed(generators: list[np.random.Generator], n: int, repeat: int) -> np.ndarray:
    """The random-reward control (Park et al. 2025, arXiv 2509.26114): a fair coin per sample, 0 or 1, drawn from
    each seed's own generator (not the sampler's: the actions drawn are those of any other reward), independent of
    the action; each seed's coins repeated for its `repeat` measures, so they are compared on the same coins."""
    return np.repeat(np.stack([(g.random(n) < 0.5).astype(np.float64) for g in generators]), repeat, axis=0)


def softmax(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log π, π) over the last axis: log π = θ − logsumexp(θ), shifted by max θ so that nothing overflows."""
    shifted = theta - theta.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    z = e.sum(axis=-1, keepdims=True)
    return shifted - np.log(z), e / z
