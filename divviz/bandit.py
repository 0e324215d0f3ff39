"""The exact softmax bandit: GRPO on a single state with K actions, where everything is computable.

Policy π_θ = softmax(θ) over K actions, θ ∈ R^K. Each iteration (one GRPO step):

    1. π_old ← π_θ; sample `groups` groups of G actions from π_old
    2. rewards r(a); group-relative advantages A = (r − mean_group) [/ (std_group + 1e-4)]  (TRL)
    3. μ gradient steps (TRL's num_iterations) of the `Objective` on the sampled actions, by plain SGD on θ
       or by Adam with its moments kept across iterations, as GRPO trainers run (each action is a one-token
       completion, so the loss is exactly the training loss)
    4. record the whole distribution: exact entropy, top-1 mass, mass on the initially likely actions,
       exact KL(π_old‖π_new), clip fractions, and how far the update went past the clip

Plain SGD keeps the picture honest: the step is the loss's gradient, not an optimiser's rescaling; Adam shows
what a trainer's optimiser does to the same comparison. Penalties use the start policy π_0 as the reference.
Many seeds run side by side as easily as many objectives: a page shows means with intervals, not one seed.

A sampler unlike the policy (`BanditRollout`): step 1 may draw from π_roll, the policy of `rollout_lag` iterations
ago with its logits rounded to bfloat16 or float16, as an inference engine beside a trainer samples; π_old stays the
current policy, and each run may correct with verl's rollout corrections (`rollout_correction.py`), exactly as
training does, or take π_old from the sampler (verl's bypass mode).

The step's gradient is the chain rule through the softmax, ∂/∂θ Σ_i g_i log π(a_i) = Σ_i g_i (e_{a_i} − π),
with g = ∂loss/∂log π(a_i) from `PolicyLossGradient`, the loss's closed-form gradient. Several objectives
and seeds run side by side as one (R, K) array of logits (`run_bandits`), so a step of all the page's runs
costs far less than one step per run (bench/explorer.py prints the figures). With `autograd` the same step
goes through `policy_loss` and torch autograd, as training does (about 10× slower); tests/test_bandit.py
checks that all give the same runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
import torch

from divviz.aggregation import BASELINES, SCALE_REWARDS, aggregation_weights, check_scale_rewards, group_advantages
from divviz.loss_gradient import PolicyLossGradient
from divviz.losses import Objective
from divviz.params import DivvizInputError, Param, check_params
from divviz.rollout_correction import SAMPLER_DTYPES, RolloutCorrection, rejection_mask, rollout_weights
from divviz.safetext import quoted

INIT_SHAPES = ("zipf", "uniform", "random")
REWARDS = ("one_correct", "top_k", "graded", "random", "random_correct")
OPTIMIZERS = ("sgd", "adam")
DEFAULT_LR = {"sgd": 0.5, "adam": 0.05}  # what the page sets when the optimiser is switched
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults

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
          doc="inner steps per batch (TRL's num_iterations)"),
    Param("lr", DEFAULT_LR["sgd"], 0.0, 100.0, low_open=True, high_open=False, typical=(0.005, 20.0, 0.005),
          doc="step size on the logits (SGD), or Adam's learning rate"),
    Param("iterations", 80, 1, 2000, high_open=False, kind="int", typical=(1, 500, 1), doc="GRPO iterations"),
    Param("seed", 0, 0, 2**31 - 1, high_open=False, kind="int", typical=(0, 999, 1),
          doc="sampling seed (the first of the seeds)"),
    Param("rollout_lag", 0, 0, 64, high_open=False, kind="int", typical=(0, 16, 1),
          doc="the sampler draws from the policy of this many iterations ago (0: the current one)"),
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

    @staticmethod
    def make(**values) -> "BanditConfig":
        choices = {"init": ("initial shape", INIT_SHAPES), "reward": ("reward", REWARDS),
                   "optimizer": ("optimizer", OPTIMIZERS), "scale_rewards": ("scale_rewards", SCALE_REWARDS),
                   "baseline": ("baseline", BASELINES), "rollout_dtype": ("rollout_dtype", tuple(SAMPLER_DTYPES))}
        if isinstance(values.get("scale_rewards"), bool):  # the older bool
            values["scale_rewards"] = check_scale_rewards(values["scale_rewards"])
        picked = {}
        for name, (what, known) in choices.items():
            picked[name] = values.pop(name, BanditConfig.__dataclass_fields__[name].default)
            if picked[name] not in known:
                raise DivvizInputError(f"bandit: unknown {what} {quoted(picked[name])}; known: {', '.join(known)}")
        checked = check_params("bandit", BANDIT_PARAMS, values)
        if checked["correct_rank"] >= checked["k"]:
            raise DivvizInputError(f"bandit: parameter 'correct_rank' must be below k = {checked['k']}; "
                                   f"got {checked['correct_rank']}")
        return BanditConfig(**picked, **checked)

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
    """r(a) for each action (actions are indexed by their rank under π_0); the random rewards are the seed's."""
    ranks = np.arange(cfg.k, dtype=np.float64)
    rng = np.random.default_rng((cfg.seed if seed is None else seed) + 2)
    if cfg.reward == "one_correct":
        return (ranks == cfg.correct_rank).astype(np.float64)
    if cfg.reward == "top_k":
        return (ranks <= cfg.correct_rank).astype(np.float64)
    if cfg.reward == "graded":
        return 1.0 - ranks / max(cfg.k - 1, 1)
    if cfg.reward == "random_correct":
        correct = rng.choice(cfg.k, size=max(1, round(cfg.k * cfg.correct_percent / 100)), replace=False)
        return np.isin(np.arange(cfg.k), correct).astype(np.float64)
    return rng.random(cfg.k)


@dataclass
class BanditRun:
    """What one objective did with one seed: π_0 and π_T, the rewards, and the per-iteration metrics."""

    label: str
    seed: int
    initial: np.ndarray  # (K,) π_0
    final: np.ndarray  # (K,) π after the last iteration
    rewards: np.ndarray  # (K,)
    history: dict[str, np.ndarray]  # metric name -> (iterations,)

    @property
    def initial_entropy(self) -> float:
        """Entropy of π_0, in nats."""
        p = self.initial[self.initial > 0]
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
    completion); the mask (n, 1); the runs' loss gradient, prepared for these samples; and from a sampler unlike the
    policy, π_roll's log-probs, the correction's weights and each run's mask less its rejected samples (R, n, 1)."""

    actions: np.ndarray
    flat_actions: np.ndarray
    adv: np.ndarray
    logp_old: np.ndarray
    logp_ref: np.ndarray
    mask: np.ndarray
    gradient: PolicyLossGradient
    logp_roll: np.ndarray | None = None
    weight: np.ndarray | None = None
    kept: np.ndarray | None = None


def sampled_logp(theta: np.ndarray, batch: Batch) -> np.ndarray:
    """log π_θ of each run's sampled actions, (R, n, 1)."""
    top = theta.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(theta - top).sum(axis=1)) + top[:, 0]
    return theta.reshape(-1)[batch.flat_actions] - log_z[:, None, None]


def closed_form_gradient(objectives: list[Objective], theta: np.ndarray,
                         batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """∂loss/∂θ of every run, (R, K): Σ_i g_ri (e_{a_ri} − π_r) with g = `batch.gradient` at log π_r(a_ri) (which
    holds the objectives; the argument is `autograd_gradient`'s). Also TRL's clip flags (low, high), (R, n, 1).

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
    e *= (-out.grad.sum(axis=(1, 2)) / z)[:, None]
    np.add.at(e.reshape(-1), batch.flat_actions, out.grad)
    return e, out.clipped_low, out.clipped_high


def autograd_gradient(objectives: list[Objective], theta: np.ndarray,
                      batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same gradient by torch autograd through log-softmax and `policy_loss`, as in training, one run at a
    time."""
    grads, outs = [], []
    for r, objective in enumerate(objectives):
        theta_t = torch.from_numpy(theta[r].copy()).requires_grad_()
        logp_new = torch.log_softmax(theta_t, dim=-1)[torch.from_numpy(batch.actions[r])].unsqueeze(1)
        old, ref, adv = (torch.from_numpy(x[r]) for x in (batch.logp_old, batch.logp_ref, batch.adv))
        row = {name: None if x is None else torch.from_numpy(x[r])
               for name, x in (("weight", batch.weight), ("logp_sampling", batch.logp_roll))}
        mask = torch.from_numpy(batch.mask if batch.kept is None else batch.kept[r])
        out = objective(logp_new, old, adv, mask, logp_ref=ref, **row)
        grads.append(torch.autograd.grad(out.loss, theta_t)[0].numpy())
        outs.append(out)
    flags = (np.stack([getattr(out, flag).numpy() for out in outs]) for flag in ("clipped_low", "clipped_high"))
    return np.stack(grads), *flags


class Adam:
    """torch.optim.Adam's update on the logits (β = (0.9, 0.999), ε = 1e-8, no weight decay), its moments kept
    across iterations as a GRPO trainer keeps them (tests/test_bandit.py checks it against torch's):

        m ← β1 m + (1−β1) g,  v ← β2 v + (1−β2) g²,  θ ← θ − lr · (m / (1−β1^t)) / (√(v / (1−β2^t)) + ε)

    The bandit resets θ to log π at each iteration's start, a shift by a constant; Adam's state holds only
    gradients, which such a shift leaves unchanged."""

    def __init__(self, shape: tuple[int, ...], lr: float):
        self.lr, self.t = lr, 0
        self.m, self.v = np.zeros(shape), np.zeros(shape)

    def __call__(self, theta: np.ndarray, grad: np.ndarray) -> None:
        (b1, b2), self.t = ADAM_BETAS, self.t + 1
        self.m *= b1
        self.m += (1 - b1) * grad
        self.v *= b2
        self.v += (1 - b2) * grad * grad
        denom = np.sqrt(self.v) / np.sqrt(1 - b2 ** self.t) + ADAM_EPS
        theta -= (self.lr / (1 - b1 ** self.t)) * self.m / denom


class SGD:
    """Plain gradient descent on the logits: θ ← θ − lr · g, the step the loss itself asks for."""

    def __init__(self, shape: tuple[int, ...], lr: float):
        self.lr = lr

    def __call__(self, theta: np.ndarray, grad: np.ndarray) -> None:
        grad *= self.lr
        theta -= grad


def sample_batch(cfg: BanditConfig, u: np.ndarray, gradient: PolicyLossGradient, logp_old: np.ndarray,
                 p_old: np.ndarray, logp_ref: np.ndarray, rewards: np.ndarray, mask: np.ndarray,
                 rollout: "BanditRollout | None" = None) -> tuple[Batch, np.ndarray]:
    """`groups` × G actions from each run's π_old (R, K), or from the `rollout`'s sampler, by inverse CDF of its
    uniform numbers u (R, n), with their group-relative advantages; also the rewards (R, n). The runs' `gradient`
    is set to this batch, with the rollout's corrections where it has a sampler."""
    runs, n = len(p_old), cfg.groups * cfg.group_size
    logp_roll, p_roll = (logp_old, p_old) if rollout is None else rollout.policy()
    actions = np.array([np.searchsorted(cdf, row * cdf[-1], side="right")
                        for cdf, row in zip(np.cumsum(p_roll, 1), u)])
    np.minimum(actions, cfg.k - 1, out=actions)
    flat_actions = (actions + cfg.k * np.arange(runs)[:, None])[..., None]
    r = np.take_along_axis(rewards, actions, 1)
    adv = group_advantages(r.reshape(runs, cfg.groups, cfg.group_size), cfg.scale_rewards, cfg.baseline).reshape(runs, n)
    old, ref = logp_old.reshape(-1)[flat_actions], np.take_along_axis(logp_ref, actions, 1)[..., None]
    if rollout is None:
        return Batch(actions, flat_actions, adv, old, ref, mask, gradient.batch(old, adv, ref)), r
    roll = logp_roll.reshape(-1)[flat_actions]
    old, weight, kept = rollout.correct(old, roll, mask)
    return Batch(actions, flat_actions, adv, old, ref, mask,
                 gradient.batch(old, adv, ref, weight=weight, mask=kept, logp_sampling=roll), roll, weight, kept), r


class BanditRollout:
    """The sampler of bandit runs stepped together and their rollout corrections, one per run: (correction,
    bypass). π_roll is the policy of `rollout_lag` iterations ago (the start policy until then), its logits rounded
    to `rollout_dtype`. With ρ = π_old/π_roll of each sample, a run's `RolloutCorrection` gives its weights and
    rejected samples as `rollout_weights` and `rejection_mask` give them to training (each sample a one-token
    completion); in bypass mode the run's π_old is π_roll."""

    def __init__(self, cfg: BanditConfig, rows: list[tuple[RolloutCorrection, bool]],
                 policy: tuple[np.ndarray, np.ndarray]):
        self.dtype, self.history = SAMPLER_DTYPES[cfg.rollout_dtype], deque([policy], maxlen=cfg.rollout_lag + 1)
        self.roll = self._sampler()
        self.rows, self.bypass = rows, np.array([bypass for _, bypass in rows])
        self.weighs = any(c.rollout_is is not None for c, _ in rows)
        self.rejects = any(c.rollout_rs is not None for c, _ in rows)
        self.groups: dict[RolloutCorrection, list[int]] = {}  # the runs of each correction, corrected in one call
        for r, (correction, _) in enumerate(rows):
            self.groups.setdefault(correction, []).append(r)

    @staticmethod
    def needed(cfg: BanditConfig, rows: list[tuple[RolloutCorrection, bool]]) -> bool:
        """Whether these settings sample or correct otherwise than on-policy."""
        return cfg.rollout_dtype != "same" or cfg.rollout_lag > 0 or any(c.active or b for c, b in rows)

    def policy(self) -> tuple[np.ndarray, np.ndarray]:
        """π_roll's (log π, π), (R, K), for this iteration."""
        return self.roll

    def _sampler(self) -> tuple[np.ndarray, np.ndarray]:
        """The oldest policy kept, its logits rounded to the sampler's precision (with none, itself to the last bit)."""
        logp, p = self.history[0]
        if self.dtype is None:
            return logp, p
        return softmax(torch.from_numpy(logp).to(self.dtype).double().numpy())

    def push(self, policy: tuple[np.ndarray, np.ndarray]) -> None:
        """The policy (log π, π) after an iteration: the sampler reaches it `rollout_lag` iterations later."""
        self.history.append(policy)
        self.roll = self._sampler()

    def correct(self, logp_old: np.ndarray, logp_roll: np.ndarray, mask: np.ndarray):
        """(π_old the loss divides by, the policy term's weights or None, each run's kept samples or None), each
        (R, n, 1), from the samples' log-probs under π_old and π_roll."""
        weight = np.ones_like(logp_old) if self.weighs else None
        kept = np.broadcast_to(mask, logp_old.shape).copy() if self.rejects else None
        log_ratio = torch.from_numpy(logp_old - logp_roll)
        for correction, rows in self.groups.items():
            # every sample is a one-token completion, so the runs' samples stack into one batch, (runs · n, 1), but
            # for batch normalisation, whose mean is each run's own
            parts = [[r] for r in rows] if correction.rollout_is_batch_normalize else [rows]
            for part in parts:
                ratio = log_ratio[part].reshape(-1, 1)
                ones = torch.ones_like(ratio)
                if correction.rollout_is is not None:
                    weight[part] = rollout_weights(ratio, ones, correction.rollout_is, correction.rollout_is_threshold,
                                                   correction.rollout_is_batch_normalize, with_metrics=False)[0].reshape(
                        len(part), -1, 1).numpy()
                if correction.rollout_rs is not None:
                    kept[part] *= rejection_mask(ratio, ones, correction.rollout_rs, correction.rollout_rs_threshold,
                                                 with_metrics=False)[0].reshape(len(part), -1, 1).numpy()
        old = np.where(self.bypass[:, None, None], logp_roll, logp_old) if self.bypass.any() else logp_old
        return old, weight, kept


def run_bandits(cfg: BanditConfig, objectives: list[Objective], seeds: list[int] | None = None,
                rollouts: list[tuple[RolloutCorrection, bool]] | None = None) -> list[BanditRun]:
    """Run `cfg.iterations` GRPO iterations of each objective with each seed (default: `cfg.seed` alone), from π_0;
    `rollouts` gives each objective its rollout correction and bypass flag (default: none, which with no sampler set
    in `cfg` is on-policy GRPO).

    Returns the runs seed by seed: [(seed 0, objective 0), (seed 0, objective 1), …, (seed 1, objective 0), …].
    All runs step together as one (R, K) array of logits, which is several times faster than one by one; each
    run is exactly what it would be alone (`run_bandit`): runs of one seed share its random numbers (the same
    seed giving the same draws), and each seed has its own generator, π_0 and rewards where those are random."""
    seeds = [cfg.seed] if seeds is None else list(seeds)
    rows = [o for _ in seeds for o in objectives]  # run r = (seed r // M, objective r % M)
    corrections = [x for _ in seeds for x in (rollouts or [(RolloutCorrection(), False)] * len(objectives))]
    runs, each, n = len(rows), len(objectives), cfg.groups * cfg.group_size
    generators = [np.random.default_rng(seed) for seed in seeds]
    gradient_of = autograd_gradient if cfg.autograd else closed_form_gradient
    logp, p = softmax(np.repeat(np.stack([initial_logits(cfg, s) for s in seeds]), each, axis=0))
    logp_ref, initial = logp, p
    rewards = np.repeat(np.stack([reward_vector(cfg, s) for s in seeds]), each, axis=0)
    mask = np.ones((n, 1))  # each action is a one-token completion
    gradient = PolicyLossGradient(rows, np.stack([aggregation_weights(mask, o.aggregation) for o in rows]))
    optimiser = (Adam if cfg.optimizer == "adam" else SGD)((runs, cfg.k), cfg.lr)

    rollout = BanditRollout(cfg, corrections, (logp, p)) if BanditRollout.needed(cfg, corrections) else None
    history = {name: np.full((runs, cfg.iterations), np.nan) for name in HISTORY + (ROLLOUT_HISTORY if rollout else ())}
    for it in range(cfg.iterations):
        u = np.repeat(np.stack([g.random(n) for g in generators]), each, axis=0)
        batch, sampled = sample_batch(cfg, u, gradient, logp, p, logp_ref, rewards, mask, rollout)
        theta = logp.copy()
        low_count, high_count = np.zeros(batch.logp_old.shape, dtype=int), np.zeros(batch.logp_old.shape, dtype=int)
        with np.errstate(over="ignore", invalid="ignore"):  # a step that overflows is caught just below
            for inner in range(cfg.mu):
                grad, low, high = gradient_of(rows, theta, batch)
                optimiser(theta, grad)
                low_count += low
                high_count += high
                if inner == 0:
                    first_past_high = gradient.past_upper(sampled_logp(theta, batch)).sum(axis=(1, 2))
        finite = np.isfinite(theta.sum(axis=1))  # a NaN or ±inf anywhere in a run makes its sum NaN or ±inf
        if not finite.all():
            label = rows[int(np.argmin(finite))].label
            raise DivvizInputError(f"bandit diverged to NaN/inf at iteration {it + 1} ({label}); "
                                   f"lower lr (now {cfg.lr:g})")
        new_logp, new_p = softmax(theta)
        overshot = gradient.overshoot(new_logp.reshape(-1)[batch.flat_actions]).sum(axis=(1, 2))
        positive = np.maximum((batch.adv > 0).sum(axis=1), 1)
        record(history, it, initial, logp, p, new_logp, new_p, rewards, sampled.mean(axis=1),
               low_count.sum(axis=(1, 2)), high_count.sum(axis=(1, 2)), cfg.mu * n, overshot / n,
               first_past_high / positive)
        if rollout is not None:
            record_rollout(history, it, rollout, logp, batch)
            rollout.push((new_logp, new_p))
        logp, p = new_logp, new_p
    return [BanditRun(o.label, seeds[r // each], initial[r], p[r], rewards[r],
                      {name: values[r] for name, values in history.items()}) for r, o in enumerate(rows)]


def run_bandit(cfg: BanditConfig, objective: Objective) -> BanditRun:
    """One objective's run (`run_bandits` with one objective)."""
    return run_bandits(cfg, [objective])[0]


HISTORY = ("reward", "entropy", "top1_mass", "initial_top_mass", "kl", "expected_reward", "clip_ratio/low_mean",
           "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/overshoot_mean",
           "clip_ratio/first_step_past_high", "initial_top_moved", "initial_rare_moved")


ROLLOUT_HISTORY = ("rollout_corr/kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction")


def record_rollout(history: dict[str, np.ndarray], it: int, rollout: BanditRollout, logp_old: np.ndarray,
                   batch: Batch) -> None:
    """Iteration `it`'s sampler against the policy: the exact KL(π_roll ‖ π_old) over actions (verl logs its sample
    estimate under this name), the mean weight of the runs that weigh (NaN for the others) and the share of samples
    the rejection took out (0 where nothing rejects)."""
    logp_roll, p_roll = rollout.policy()
    history["rollout_corr/kl"][:, it] = (p_roll * (logp_roll - logp_old)).sum(axis=1)
    weighs = np.array([c.rollout_is is not None for c, _ in rollout.rows])
    if batch.weight is not None:
        history["rollout_corr/rollout_is_mean"][weighs, it] = batch.weight[weighs].mean(axis=(1, 2))
    kept = batch.mask if batch.kept is None else batch.kept
    history["rollout_corr/rollout_rs_masked_fraction"][:, it] = 1 - np.broadcast_to(kept, batch.logp_old.shape).mean(
        axis=(1, 2))


def record(history: dict[str, np.ndarray], it: int, initial: np.ndarray, old_logp: np.ndarray, old: np.ndarray,
           logp: np.ndarray, new: np.ndarray, rewards: np.ndarray, sampled_reward: np.ndarray,
           clipped_low: np.ndarray, clipped_high: np.ndarray, tokens: int, overshoot: np.ndarray,
           first_past_high: np.ndarray) -> None:
    """Iteration `it`'s metrics of every run, from π_old and π_new (R, K): exact entropy, top-1 mass, mass on
    the initially likely actions (the top tenth: actions are ranked by π_0), exact KL(π_old‖π_new) of the update,
    expected reward; TRL's clip fractions from the clip counts over `tokens` = μ × samples per iteration;
    `reward`, the sampled actions' mean reward; `overshoot`, the share of the iteration's samples the update
    carried past the bound their advantage pushes toward (after the μ steps); `first_step_past_high`, the share
    of positive-advantage samples already above u after the first inner step (a warning: a step that large makes
    a comparison of boxes mostly a comparison of how far each lets one step overshoot); how far π moved from π_0
    (Σ |π − π_0|) on the initially likely actions (top tenth) and on the initially rare ones (bottom half)."""
    k = new.shape[1]
    moved = np.abs(new - initial)
    values = {
        "initial_top_moved": moved[:, : max(1, k // 10)].sum(axis=1),
        "initial_rare_moved": moved[:, k // 2:].sum(axis=1),
        "reward": sampled_reward,
        "entropy": -(new * logp).sum(axis=1),
        "top1_mass": new.max(axis=1),
        "initial_top_mass": new[:, : max(1, new.shape[1] // 10)].sum(axis=1),
        "kl": (old * (old_logp - logp)).sum(axis=1),
        "expected_reward": (new * rewards).sum(axis=1),
        "clip_ratio/low_mean": clipped_low / tokens,
        "clip_ratio/high_mean": clipped_high / tokens,
        "clip_ratio/region_mean": (clipped_low + clipped_high) / tokens,
        "clip_ratio/overshoot_mean": overshoot,
        "clip_ratio/first_step_past_high": first_past_high,
    }
    for name, value in values.items():
        history[name][:, it] = value
