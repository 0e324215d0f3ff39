"""The exact softmax bandit: GRPO on a single state with K actions, where everything is computable.

Policy π_θ = softmax(θ) over K actions, θ ∈ R^K. Each iteration (one GRPO step):

    1. π_old ← π_θ; sample `groups` groups of G actions from π_old
    2. rewards r(a); group-relative advantages A = (r − mean_group) [/ (std_group + 1e-4)]  (TRL)
    3. μ gradient steps (TRL's num_iterations) of the `Objective` on the sampled actions, by plain SGD on θ
       or by Adam with its moments kept across iterations, as GRPO trainers run (each action is a one-token
       completion, so the loss is exactly the training loss)
    4. record the whole distribution: exact entropy, top-1 mass, mass on the initially likely actions,
       exact KL(π_old‖π_new), clip fractions, and how far the update went past the clip; the entropy's change,
       its first-order prediction and, with `attribution`, which samples caused it, by clip state (`entropy.py`)

Rewards are each action's, or with `reward="coin"` a fair coin per sample (the random-reward control).

Plain SGD keeps the picture honest: the step is the loss's gradient, not an optimiser's rescaling; Adam shows
what a trainer's optimiser does to the same comparison. Penalties use the start policy π_0 as the reference.
Many seeds run side by side as easily as many objectives: a page shows means with intervals, not one seed.

A sampler unlike the policy (`rollout.py`): step 1 may draw from π_roll, the policy of `rollout_lag`
iterations ago with its logits rounded to bfloat16 or float16; π_old stays the current policy, and each run may
correct with verl's rollout corrections, exactly as training does, or take π_old from the sampler (bypass mode).
The setting, π_0, the rewards and `BanditConfig`, is `setting.py`.

The step's gradient is the chain rule through the softmax, ∂/∂θ Σ_i g_i log π(a_i) = Σ_i g_i (e_{a_i} − π),
with g = ∂loss/∂log π(a_i) from `PolicyLossGradient`, the loss's closed-form gradient. Several objectives
and seeds run side by side as one (R, K) array of logits (`run_bandits`), so a step of all the page's runs
costs far less than one step per run (bench/explorer.py prints the figures). With `autograd` the same step
goes through `policy_loss` and torch autograd, as training does (about 10× slower); tests/bandit/test_bandit.py
checks that all give the same runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from divviz.catalogue.aggregation import aggregation_weights, group_advantages
from divviz.bandit.rollout import BanditRollout
from divviz.bandit.setting import BanditConfig, coins_per_seed, initial_logits, reward_vector, softmax
from divviz.bandit.entropy import ATTRIBUTION, ENTROPY_HISTORY, attribute, predicted_change
from divviz.bandit.loss_gradient import LossGradient, PolicyLossGradient
from divviz.losses import Objective
from divviz.catalogue.params import DivvizInputError
from divviz.safetext import quoted
from divviz.catalogue.rollout_correction import RolloutCorrection

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


@dataclass
class BanditBatch:
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
    loss_mask: np.ndarray | None = None


def sampled_logp(theta: np.ndarray, batch: BanditBatch) -> np.ndarray:
    """log π_θ of each run's sampled actions, (R, n, 1)."""
    top = theta.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(theta - top).sum(axis=1)) + top[:, 0]
    return theta.reshape(-1)[batch.flat_actions] - log_z[:, None, None]


def closed_form_gradient(objectives: list[Objective], theta: np.ndarray,
                         batch: BanditBatch) -> tuple[np.ndarray, LossGradient, tuple[np.ndarray, np.ndarray]]:
    """∂loss/∂θ of every run, (R, K): Σ_i g_ri (e_{a_ri} − π_r) with g = `batch.gradient` at log π_r(a_ri) (which
    holds the objectives; the argument is `autograd_gradient`'s). Also each sample's slope g and TRL's clip flags
    (low, high), (R, n, 1) each, and the policy it was taken at, (log π, π), (R, K) each.

    Written for speed at K = 1000: four (R, K)-sized operations and no max-shift. `run_bandits` sets
    θ = log π at each iteration's start, so e^θ ≤ 1 there; if θ has risen out of exp's range since, it is
    shifted back (softmax does not change)."""
    e = np.exp(theta)
    z = e.sum(axis=1)
    if z.max() > 1e100:
        theta -= theta.max(axis=1, keepdims=True)
        e = np.exp(theta)
        z = e.sum(axis=1)
    log_z = np.log(z)[:, None]
    policy = (theta - log_z, e / z[:, None])
    out = batch.gradient(policy[0].reshape(-1)[batch.flat_actions])
    e *= (-out.grad.sum(axis=(1, 2)) / z)[:, None]
    np.add.at(e.reshape(-1), batch.flat_actions, out.grad)
    return e, out, policy


def autograd_gradient(objectives: list[Objective], theta: np.ndarray,
                      batch: BanditBatch) -> tuple[np.ndarray, LossGradient, tuple[np.ndarray, np.ndarray]]:
    """The same gradient by torch autograd through log-softmax and `policy_loss`, as in training, one run at a
    time (the slopes g = ∂loss/∂log π(a) first, then through the softmax)."""
    grads, slopes, outs = [], [], []
    for r, objective in enumerate(objectives):
        theta_t = torch.from_numpy(theta[r].copy()).requires_grad_()
        logp_new = torch.log_softmax(theta_t, dim=-1)[torch.from_numpy(batch.actions[r])].unsqueeze(1)
        sampled = logp_new.detach().requires_grad_()
        old, ref, adv = (torch.from_numpy(x[r]) for x in (batch.logp_old, batch.logp_ref, batch.adv))
        row = {name: None if x is None else torch.from_numpy(x[r])
               for name, x in (("weight", batch.weight), ("logp_sampling", batch.logp_roll))}
        mask = torch.from_numpy(batch.mask if batch.loss_mask is None else batch.loss_mask[r])
        out = objective(sampled, old, adv, mask, logp_ref=ref, **row)
        slope = torch.autograd.grad(out.loss, sampled)[0]
        grads.append(torch.autograd.grad(logp_new, theta_t, grad_outputs=slope)[0].numpy())
        slopes.append(slope.numpy())
        outs.append(out)
    flags = (np.stack([getattr(out, flag).numpy() for out in outs]) for flag in ("masked_low", "masked_high"))
    return np.stack(grads), LossGradient(np.stack(slopes), *flags), softmax(theta)


ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults


class Adam:
    """torch.optim.Adam's update on the logits (β = (0.9, 0.999), ε = 1e-8, no weight decay), its moments kept
    across iterations as a GRPO trainer keeps them (tests/bandit/test_bandit.py checks it against torch's):

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
                 rollout: "BanditRollout | None" = None, coins: np.ndarray | None = None) -> tuple[BanditBatch, np.ndarray]:
    """`groups` × G actions from each run's π_old (R, K), or from the `rollout`'s sampler, by inverse CDF of its
    uniform numbers u (R, n), with their group-relative advantages; also the rewards (R, n): each action's, or the
    `coins` (R, n) where given. The runs' `gradient` is set to this batch, with the rollout's corrections where it
    has a sampler."""
    runs, n = len(p_old), cfg.groups * cfg.group_size
    logp_roll, p_roll = (logp_old, p_old) if rollout is None else rollout.policy()
    actions = np.array([np.searchsorted(cdf, row * cdf[-1], side="right")
                        for cdf, row in zip(np.cumsum(p_roll, 1), u)])
    np.minimum(actions, cfg.k - 1, out=actions)
    flat_actions = (actions + cfg.k * np.arange(runs)[:, None])[..., None]
    r = np.take_along_axis(rewards, actions, 1) if coins is None else coins
    adv = group_advantages(r.reshape(runs, cfg.groups, cfg.group_size), cfg.scale_rewards, cfg.baseline).reshape(runs, n)
    old, ref = logp_old.reshape(-1)[flat_actions], np.take_along_axis(logp_ref, actions, 1)[..., None]
    if rollout is None:
        return BanditBatch(actions, flat_actions, adv, old, ref, mask, gradient.batch(old, adv, ref)), r
    roll = logp_roll.reshape(-1)[flat_actions]
    old, weight, loss_mask = rollout.correct(old, roll, mask)
    return BanditBatch(actions, flat_actions, adv, old, ref, mask,
                       gradient.batch(old, adv, ref, weight=weight, mask=loss_mask, logp_sampling=roll), roll, weight,
                       loss_mask), r


def _update(cfg: BanditConfig, rows: list[Objective], logp: np.ndarray, batch, gradient: PolicyLossGradient,
            gradient_of, optimiser) -> tuple:
    """One iteration's μ passes over `batch` from the logits `logp` (a copy is updated): the new logits, each
    sampled action's count of low and high clips over the passes, the runs' entropy attribution summed over them
    (`cfg.attribution`), and how many sampled actions the first pass took past the upper edge. A step that overflows
    leaves NaN or ±inf in the logits, which the caller refuses."""
    theta = logp.copy()
    low_count, high_count = np.zeros(batch.logp_old.shape, dtype=int), np.zeros(batch.logp_old.shape, dtype=int)
    shares = np.zeros((len(rows), len(ATTRIBUTION)))
    with np.errstate(over="ignore", invalid="ignore"):
        for inner in range(cfg.mu):
            grad, out, (now_logp, now_p) = gradient_of(rows, theta, batch)
            if cfg.attribution:
                would = gradient.unclipped_slope(now_logp.reshape(-1)[batch.flat_actions])
                shares += attribute(now_logp, now_p, batch.flat_actions, out.grad, would, out.masked_low,
                                    out.masked_high, cfg.lr)
            optimiser(theta, grad)
            low_count += out.masked_low
            high_count += out.masked_high
            if inner == 0:
                first_past_high = gradient.past_upper(sampled_logp(theta, batch)).sum(axis=(1, 2))
    return theta, low_count, high_count, shares, first_past_high


def run_bandits(cfg: BanditConfig, objectives: list[Objective], seeds: list[int] | None = None,
                rollouts: list[tuple[RolloutCorrection, bool]] | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[BanditRun]:
    """Run `cfg.iterations` GRPO iterations of each objective with each seed (default: `cfg.seed` alone), from π_0;
    `rollouts` gives each objective its rollout correction and bypass flag (default: none: with no sampler set in `cfg`,
    on-policy GRPO); `progress(done, iterations)` hears of each iteration as it ends. Returns the runs seed by seed:
    [(seed 0, objective 0), (seed 0, objective 1), …, (seed 1, objective 0), …]. All runs step together as one (R, K)
    array of logits, several times faster than one by one; each run is exactly what it would be alone (`run_bandit`):
    runs of one seed share its random numbers, and each seed has its own generator, π_0 and rewards where random."""
    if not isinstance(cfg, BanditConfig):
        raise DivvizInputError(f"run_bandits takes a BanditConfig (BanditConfig.make(k=50, …)); got a {type(cfg).__name__}")
    if isinstance(objectives, Objective) or not all(isinstance(o, Objective) for o in objectives):
        raise DivvizInputError("run_bandits takes a list of Objective(clip=clip_test('kl3'), …); "
                               f"got {quoted(objectives, 60)}")
    seeds = [cfg.seed] if seeds is None else list(seeds)
    rows = [o for _ in seeds for o in objectives]  # run r = (seed r // M, objective r % M)
    corrections = [x for _ in seeds for x in (rollouts or [(RolloutCorrection(), False)] * len(objectives))]
    runs, each, n = len(rows), len(objectives), cfg.groups * cfg.group_size
    generators = [np.random.default_rng(seed) for seed in seeds]
    coin_generators = [np.random.default_rng([seed, 3]) for seed in seeds] if cfg.reward == "coin" else None
    gradient_of = autograd_gradient if cfg.autograd else closed_form_gradient
    logp, p = softmax(np.repeat(np.stack([initial_logits(cfg, s) for s in seeds]), each, axis=0))
    logp_ref, initial = logp, p
    rewards = np.repeat(np.stack([reward_vector(cfg, s) for s in seeds]), each, axis=0)
    mask = np.ones((n, 1))  # each action is a one-token completion
    gradient = PolicyLossGradient(rows, np.stack([aggregation_weights(mask, o.aggregation) for o in rows]))
    optimiser = (Adam if cfg.optimizer == "adam" else SGD)((runs, cfg.k), cfg.lr)

    rollout = BanditRollout(cfg, corrections, (logp, p)) if BanditRollout.needed(cfg, corrections) else None
    recorded = HISTORY + (ROLLOUT_HISTORY if rollout else ()) + (ATTRIBUTION if cfg.attribution else ())
    history = {name: np.full((runs, cfg.iterations), np.nan) for name in recorded}
    for it in range(cfg.iterations):
        u = np.repeat(np.stack([g.random(n) for g in generators]), each, axis=0)
        coins = None if coin_generators is None else coins_per_seed(coin_generators, n, each)
        batch, sampled = sample_batch(cfg, u, gradient, logp, p, logp_ref, rewards, mask, rollout, coins)
        theta, low_count, high_count, shares, first_past_high = _update(cfg, rows, logp, batch, gradient,
                                                                        gradient_of, optimiser)
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
        history["entropy/change"][:, it] = history["entropy"][:, it] + (p * logp).sum(axis=1)
        history["entropy/change_predicted"][:, it] = predicted_change(logp, p, new_logp - logp)
        for k, name in enumerate(ATTRIBUTION if cfg.attribution else ()):
            history[name][:, it] = shares[:, k]
        if rollout is not None:
            record_rollout(history, it, rollout, logp, batch)
            rollout.push((new_logp, new_p))
        logp, p = new_logp, new_p
        if progress is not None:
            progress(it + 1, cfg.iterations)
    return [BanditRun(o.label, seeds[r // each], initial[r], p[r], rewards[r],
                      {name: values[r] for name, values in history.items()}) for r, o in enumerate(rows)]


def run_bandit(cfg: BanditConfig, objective: Objective) -> BanditRun:
    """One objective's run (`run_bandits` with one objective)."""
    return run_bandits(cfg, [objective])[0]


HISTORY = ("reward", "entropy", "top1_mass", "initial_top_mass", "kl", "expected_reward", "clip_ratio/low_mean",
           "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/overshoot_mean",
           "clip_ratio/first_step_past_high", "initial_top_moved", "initial_rare_moved", *ENTROPY_HISTORY[:2])


ROLLOUT_HISTORY = ("rollout_corr/kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction")


def record_rollout(history: dict[str, np.ndarray], it: int, rollout: BanditRollout, logp_old: np.ndarray,
                   batch: BanditBatch) -> None:
    """Iteration `it`'s sampler against the policy: the exact KL(π_roll ‖ π_old) over actions (verl logs its sample
    estimate under this name), the mean weight of the runs that weigh (NaN for the others) and the share of samples
    the rejection took out (0 where nothing rejects)."""
    logp_roll, p_roll = rollout.policy()
    history["rollout_corr/kl"][:, it] = (p_roll * (logp_roll - logp_old)).sum(axis=1)
    weighs = np.array([c.rollout_is is not None for c, _ in rollout.rows])
    if batch.weight is not None:
        history["rollout_corr/rollout_is_mean"][weighs, it] = batch.weight[weighs].mean(axis=(1, 2))
    loss_mask = batch.mask if batch.loss_mask is None else batch.loss_mask
    rejected = 1 - np.broadcast_to(loss_mask, batch.logp_old.shape).mean(axis=(1, 2))
    history["rollout_corr/rollout_rs_masked_fraction"][:, it] = rejected


def record(history: dict[str, np.ndarray], it: int, initial: np.ndarray, old_logp: np.ndarray, old: np.ndarray,
           logp: np.ndarray, new: np.ndarray, rewards: np.ndarray, sampled_reward: np.ndarray,
           masked_low: np.ndarray, masked_high: np.ndarray, tokens: int, overshoot: np.ndarray,
           first_past_high: np.ndarray) -> None:
    """Iteration `it`'s metrics of every run, from π_old and π_new (R, K): exact entropy, top-1 mass, mass on
    the initially likely actions (the top tenth: actions are ranked by π_0), exact KL(π_old‖π_new) of the update,
    expected reward; TRL's clip fractions from the clip counts over `tokens` = μ × samples per iteration;
    `reward`, the sampled actions' mean reward; `overshoot`, the share of the iteration's samples the update
    carried past the bound their advantage pushes toward (after the μ steps); `first_step_past_high`, the share
    of positive-advantage samples already above u after the first optimiser step (a warning: a step that large makes
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
        "clip_ratio/low_mean": masked_low / tokens,
        "clip_ratio/high_mean": masked_high / tokens,
        "clip_ratio/region_mean": (masked_low + masked_high) / tokens,
        "clip_ratio/overshoot_mean": overshoot,
        "clip_ratio/first_step_past_high": first_past_high,
    }
    for name, value in values.items():
        history[name][:, it] = value
