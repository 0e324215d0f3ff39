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
with g = ∂loss/∂log π(a_i) from `PolicyLossGradient`, the loss's closed-form gradient. Several objectives
run side by side as one (R, K) array of logits (`run_bandits`), so a step of all the page's runs costs
about what one run's step does: on a 2-core CPU, three runs of 200 iterations × μ = 4 at K = 1000 take
90–150 ms, one at a time 200–320 ms (bench/explorer.py). With `autograd` the same step goes through
`policy_loss` and torch autograd, as training does (about 10× slower); tests/test_bandit.py checks that
all give the same runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from divviz.losses import Objective, PolicyLossGradient, aggregation_weights, group_advantages
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
    """(log π, π) over the last axis: log π = θ − logsumexp(θ), shifted by max θ so that nothing overflows."""
    shifted = theta - theta.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    z = e.sum(axis=-1, keepdims=True)
    return shifted - np.log(z), e / z


@dataclass
class Batch:
    """One iteration's samples for R runs stepped together: actions (R, n) and their indices into θ.ravel(),
    (R, n, 1); advantages (R, n); log-probs under π_old and π_0, (R, n, 1) (each action is a one-token
    completion); the mask (n, 1); the runs' loss gradient, prepared for these samples."""

    actions: np.ndarray
    flat_actions: np.ndarray
    adv: np.ndarray
    logp_old: np.ndarray
    logp_ref: np.ndarray
    mask: np.ndarray
    gradient: PolicyLossGradient


def closed_form_step(objectives: list[Objective], theta: np.ndarray, batch: Batch,
                     lr: float) -> tuple[np.ndarray, np.ndarray]:
    """One SGD step of every run, in place on θ (R, K): θ_r ← θ_r − lr·Σ_i g_ri (e_{a_ri} − π_r), with g =
    `batch.gradient` at log π_r(a_ri) (which holds the objectives; the argument is `autograd_step`'s).
    Returns TRL's clip flags (low, high), (R, n, 1).

    Written for speed at K = 1000: four (R, K)-sized operations and no max-shift. `run_bandits` sets
    θ = log π at each iteration's start, so e^θ ≤ 1 there; if θ has risen out of exp's range since, it is
    shifted back (softmax does not change)."""
    e = np.exp(theta)
    z = e.sum(axis=1)
    if z.max() > 1e100:
        theta -= theta.max(axis=1, keepdims=True)
        e = np.exp(theta)
        z = e.sum(axis=1)
    out = batch.gradient(theta.reshape(-1)[batch.flat_actions] - np.log(z)[:, None, None])
    g = lr * out.grad
    e *= (g.sum(axis=(1, 2)) / z)[:, None]
    theta += e
    np.subtract.at(theta.reshape(-1), batch.flat_actions, g)
    return out.clipped_low, out.clipped_high


def autograd_step(objectives: list[Objective], theta: np.ndarray, batch: Batch,
                  lr: float) -> tuple[np.ndarray, np.ndarray]:
    """The same step with ∂loss/∂θ by torch autograd through log-softmax and `policy_loss`, as in training,
    one run at a time."""
    outs = []
    for r, objective in enumerate(objectives):
        theta_t = torch.from_numpy(theta[r].copy()).requires_grad_()
        logp_new = torch.log_softmax(theta_t, dim=-1)[torch.from_numpy(batch.actions[r])].unsqueeze(1)
        old, ref, adv = (torch.from_numpy(x[r]) for x in (batch.logp_old, batch.logp_ref, batch.adv))
        out = objective(logp_new, old, adv, torch.from_numpy(batch.mask), logp_ref=ref)
        (grad,) = torch.autograd.grad(out.loss, theta_t)
        theta[r] -= lr * grad.numpy()
        outs.append(out)
    return tuple(np.stack([getattr(out, flag).numpy() for out in outs]) for flag in ("clipped_low", "clipped_high"))


def sample_batch(cfg: BanditConfig, rng: np.random.Generator, gradient: PolicyLossGradient, logp_old: np.ndarray,
                 p_old: np.ndarray, logp_ref: np.ndarray, rewards: np.ndarray,
                 mask: np.ndarray) -> tuple[Batch, np.ndarray]:
    """`groups` × G actions from each run's π_old (R, K) by inverse CDF, with their group-relative advantages;
    also the rewards (R, n). Every run uses the same uniform numbers, so that each run samples exactly what
    it would alone with this seed. The runs' `gradient` is set to this batch."""
    runs, n = len(p_old), cfg.groups * cfg.group_size
    u = rng.random(n)
    actions = np.array([np.searchsorted(cdf, u * cdf[-1], side="right") for cdf in map(np.cumsum, p_old)])
    np.minimum(actions, cfg.k - 1, out=actions)
    flat_actions = (actions + cfg.k * np.arange(runs)[:, None])[..., None]
    r = rewards[actions]
    adv = group_advantages(r.reshape(runs * cfg.groups, cfg.group_size), cfg.scale_rewards).reshape(runs, n)
    old, ref = logp_old.reshape(-1)[flat_actions], logp_ref[actions][..., None]
    return Batch(actions, flat_actions, adv, old, ref, mask, gradient.batch(old, adv, ref)), r


def run_bandits(cfg: BanditConfig, objectives: list[Objective]) -> list[BanditRun]:
    """Run `cfg.iterations` GRPO iterations of each objective from π_0, with the sampling seed `cfg.seed`.

    The runs step together as one (R, K) array of logits, which is several times faster than one by one;
    each run is exactly what it would be alone (`run_bandit`): runs side by side share their random
    numbers, the same seed giving the same draws."""
    runs = len(objectives)
    rng = np.random.default_rng(cfg.seed)
    step = autograd_step if cfg.autograd else closed_form_step
    logp_ref, p_ref = softmax(initial_logits(cfg))
    rewards = reward_vector(cfg)
    mask = np.ones((cfg.groups * cfg.group_size, 1))  # each action is a one-token completion
    gradient = PolicyLossGradient(objectives, np.stack([aggregation_weights(mask, o.aggregation) for o in objectives]))

    logps, probs = np.empty((cfg.iterations + 1, runs, cfg.k)), np.empty((cfg.iterations + 1, runs, cfg.k))
    logps[0], probs[0] = logp_ref, p_ref
    sampled_rewards = np.empty((cfg.iterations, runs, cfg.groups * cfg.group_size))
    clipped_low, clipped_high = np.zeros((runs, cfg.iterations)), np.zeros((runs, cfg.iterations))
    overshot = np.zeros((runs, cfg.iterations))
    for it in range(cfg.iterations):
        batch, sampled_rewards[it] = sample_batch(cfg, rng, gradient, logps[it], probs[it], logp_ref, rewards, mask)
        theta = logps[it].copy()
        low_count, high_count = np.zeros(batch.logp_old.shape, dtype=int), np.zeros(batch.logp_old.shape, dtype=int)
        with np.errstate(over="ignore", invalid="ignore"):  # a step that overflows is caught just below
            for _ in range(cfg.mu):
                low, high = step(objectives, theta, batch, cfg.lr)
                low_count += low
                high_count += high
        clipped_low[:, it], clipped_high[:, it] = low_count.sum(axis=(1, 2)), high_count.sum(axis=(1, 2))
        finite = np.isfinite(theta.sum(axis=1))  # a NaN or ±inf anywhere in a run makes its sum NaN or ±inf
        if not finite.all():
            label = objectives[int(np.argmin(finite))].label
            raise DivvizInputError(f"bandit diverged to NaN/inf at iteration {it + 1} ({label}); "
                                   f"lower lr (now {cfg.lr:g})")
        logps[it + 1], probs[it + 1] = softmax(theta)
        overshot[:, it] = gradient.overshoot(logps[it + 1].reshape(-1)[batch.flat_actions]).sum(axis=(1, 2))
    sampled_reward, tokens = sampled_rewards.mean(axis=2).T, cfg.mu * sampled_rewards.shape[2]
    return [BanditRun(o.label, np.ascontiguousarray(probs[:, i]), rewards,
                      history(logps[:, i], probs[:, i], rewards, sampled_reward[i], clipped_low[i], clipped_high[i],
                              tokens, overshot[i] / sampled_rewards.shape[2]))
            for i, o in enumerate(objectives)]


def run_bandit(cfg: BanditConfig, objective: Objective) -> BanditRun:
    """One objective's run (`run_bandits` with one objective)."""
    return run_bandits(cfg, [objective])[0]


def history(logps: np.ndarray, probs: np.ndarray, rewards: np.ndarray, sampled_reward: np.ndarray,
            clipped_low: np.ndarray, clipped_high: np.ndarray, tokens: int,
            overshoot: np.ndarray) -> dict[str, np.ndarray]:
    """Per-iteration metrics of a run from its distributions π_0 … π_T (rows of `logps`/`probs`): exact
    entropy, top-1 mass, mass on the initially likely actions (the top tenth: actions are ranked by π_0),
    exact KL(π_old‖π_new) of each update, expected reward; TRL's clip fractions from the clip counts over
    `tokens` = μ × samples per iteration; `reward`, the sampled actions' mean reward; `overshoot`, the share of
    the iteration's samples the update carried past the bound their advantage pushes toward (after the μ steps)."""
    new, old = probs[1:], probs[:-1]
    return {
        "reward": sampled_reward,
        "entropy": -(new * logps[1:]).sum(axis=1),
        "top1_mass": new.max(axis=1),
        "initial_top_mass": new[:, : max(1, probs.shape[1] // 10)].sum(axis=1),
        "kl": (old * (logps[:-1] - logps[1:])).sum(axis=1),
        "expected_reward": new @ rewards,
        "clip_ratio/low_mean": clipped_low / tokens,
        "clip_ratio/high_mean": clipped_high / tokens,
        "clip_ratio/region_mean": (clipped_low + clipped_high) / tokens,
        "clip_ratio/overshoot_mean": overshoot,
    }
