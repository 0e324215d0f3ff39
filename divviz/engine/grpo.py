"""One GRPO step, in paper order: prompts → G completions each → rewards → group-relative advantages →
μ optimisation steps of the chosen objective → metrics from the step's facts.

    for each step:
        sample `prompts` prompts; G completions each with the KV cache (temperature τ), by the trained policy or by
            a rollout policy π_roll in lower precision or some updates behind (`sampler.py`)
        r_i = task reward (or a seeded coin);  A_i = (r_i − mean_group) [/ (std_group + 1e-4)]   (Shao et al. 2024)
        logp_old = the pre-update policy's log-probs (with μ = 1: the current ones, detached, as TRL; in verl's
            bypass mode: π_roll's)
        verl's rollout correction of π_old against π_roll: importance weights ρ and a rejection mask
        repeat μ times: loss = Objective(logp_new, logp_old, A, mask, logp_ref, weight=ρ); AdamW step
        metrics, plus one no-grad forward after the update for the KL, the mass that moved and the entropy's change
            at the positions of ENTROPY_ROWS completions (full distributions before and after); π_roll synced
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from divviz.catalogue.aggregation import aggregation_weights, group_advantages
from divviz.engine.completions import step_record
from divviz.engine.config import RunConfig
from divviz.engine.minibatch import in_batch_order, minibatch_index, minibatch_rows, policy_before
from divviz.engine.model import load_policy, pick_device, pick_dtype, train_last_blocks
from divviz.engine.prompts import asked_ids, resolve_format, shown_prompts
from divviz.engine.rollout import (Rollout, completion_logits, completion_logps, decode_completions, encode_prompts,
                                  sample, token_logps)
from divviz.engine.sampler import RolloutPolicy, rollout_policy
from divviz.engine.tasks import Task, coin_rewards, get_task
from divviz.catalogue.estimators import k1, k2, k3
from divviz.losses import LossOutput, NonFiniteInput, Objective
from divviz.metrics import PI_OLD_BINS, bin_labels, clip_fractions, entropy_change, entropy_covariance, overshoot
from divviz.catalogue.rollout_correction import Correction, RolloutCorrection

TOKEN_SAMPLE = 256  # per-token facts kept per step for the scatter plots
AFTER_ROWS = 256  # completions re-scored after the update for the KL and mass metrics (all, in small batches)
ENTROPY_ROWS = 32  # of those, the completions whose full distributions before and after give entropy/change (a
# (rows, T, vocabulary) copy of the logits is kept through the update: 150 MB for SmolLM2 at 24 tokens)


class NonFiniteLoss(RuntimeError):
    """The loss or the weights became NaN/inf: the run stops as failed, keeping the metrics so far."""


def finite_loss(objective: Objective, where: str, lr: float, *args, **kwargs) -> LossOutput:
    """`objective(*args, **kwargs)`, or NonFiniteLoss naming `where` ("step 3 (inner step 2)") and the learning rate
    when the policy's log-probs or the loss are not finite (divviz's engine and its TRL trainer alike)."""
    try:
        out = objective(*args, **kwargs)
    except NonFiniteInput as err:
        if err.name != "logp_new":
            raise
        raise NonFiniteLoss(f"the loss became nan at {where}: the policy's log-probs are not finite; try a smaller "
                            f"learning rate (now {lr:g})") from None
    if not torch.isfinite(out.loss):
        raise NonFiniteLoss(f"the loss became {out.loss.item()} at {where}; try a smaller learning rate (now {lr:g})")
    return out


@dataclass
class Trainer:
    cfg: RunConfig
    task: Task
    model: torch.nn.Module
    reference: torch.nn.Module | None
    tokenizer: object
    optimiser: torch.optim.Optimizer
    objective: Objective
    device: torch.device
    correction: RolloutCorrection
    sampler: RolloutPolicy | None = None  # None: the trained model samples its own completions
    prompt_format: str = "compact"  # `prompts.py`: the compact prompt, or the question through the chat template
    dtype: torch.dtype | None = None  # the forward passes' autocast precision (`model.pick_dtype`); None: float32

    def autocast(self):
        """Autocast to the run's precision (bf16 on a GPU or CPU that has it, `model.pick_dtype`), else nothing."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def sampling(self) -> tuple[torch.nn.Module, object]:
        """The model that samples and its autocast: the sampler in its own precision, or the trained model."""
        if self.sampler is None:
            return self.model, self.autocast
        return self.sampler.model, self.autocast if self.cfg.rollout_dtype == "same" else nullcontext


def make_trainer(cfg: RunConfig) -> Trainer:
    torch.manual_seed(cfg.seed)
    task = get_task(cfg.task)
    device = pick_device(cfg.device)
    model, tokenizer = load_policy(cfg.model, task, trust_remote_code=cfg.trust_remote_code)  # the shipped seed-0 model
    fmt = resolve_format(cfg.prompt_format, tokenizer)
    model.to(device)
    train_last_blocks(model, cfg.trainable_blocks)
    objective = cfg.objective()
    reference = None
    if objective.needs_ref:
        reference = copy.deepcopy(model).eval().requires_grad_(False)  # frozen copy of the start policy
    return Trainer(cfg, task, model, reference, tokenizer, make_optimiser(model, cfg), objective, device,
                   cfg.correction(), rollout_policy(model, cfg.rollout_dtype, cfg.rollout_lag), fmt,
                   pick_dtype(cfg.dtype, device, cfg.model))


def make_optimiser(model, cfg: RunConfig) -> torch.optim.AdamW:
    """AdamW without weight decay over the parameters that train; foreach: the same updates, bit for bit, as a few
    multi-tensor ops rather than a loop over parameters."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0,
                             foreach=True)


@dataclass
class StepResult:
    metrics: dict[str, float]
    tokens: dict[str, np.ndarray]  # a bounded sample of per-token facts
    completions: list[tuple[str, str, float]]  # a few (prompt, completion, reward) for display
    inspected: dict | None = None  # whole completions with every token's facts (`completions.step_record`)


@dataclass
class Batch:
    """One step's rollouts and what the reward made of them."""

    rollout: Rollout
    prompts: list[str]  # one per completion, as a person reads it (the compact prompt, or the chat question)
    texts: list[str]
    rewards: torch.Tensor  # (N,)
    correct: list[bool]
    adv: torch.Tensor  # (N,)


def make_batch(tr: Trainer, step: int) -> Batch:
    """Sample G completions for each of step `step`'s prompts (seeded by the run seed and the step)."""
    cfg, tok = tr.cfg, tr.tokenizer
    pairs = tr.task.batch(seed=cfg.seed * 1_000_003 + step, n=cfg.prompts)
    asked = shown_prompts(tr.task, [p for p, _ in pairs], tr.prompt_format)
    compact = [p for p, _ in pairs for _ in range(cfg.group_size)]
    prompts = [p for p in asked for _ in range(cfg.group_size)]
    references = [r for _, r in pairs for _ in range(cfg.group_size)]
    prompt_ids, prompt_mask = encode_prompts(asked_ids(tok, asked, tr.prompt_format), tok.pad_token_id,
                                             cfg.group_size, tr.device)
    generator = torch.Generator(device=tr.device).manual_seed(cfg.seed * 7_919 + step)
    tr.model.eval()
    sampler, autocast = tr.sampling()
    rollout = sample(sampler, prompt_ids, prompt_mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, generator=generator,
                     autocast=autocast)
    texts = decode_completions(tok, rollout)
    chat = tr.prompt_format == "chat"
    scored = (coin_rewards(cfg.seed, step, len(texts)) if cfg.reward == "random" else
              [tr.task.reward(p, r, c, cfg.format_reward, chat) for p, r, c in zip(compact, references, texts)])
    rewards = torch.tensor(scored, dtype=torch.float32)
    correct = [tr.task.is_correct(p, r, c, chat) for p, r, c in zip(compact, references, texts)]
    adv = group_advantages(rewards.view(cfg.prompts, cfg.group_size), cfg.scale_rewards, cfg.baseline).reshape(-1).to(tr.device)
    return Batch(rollout, prompts, texts, rewards, correct, adv)


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's top-entropy token mask (`get_high_entropy_mask`, after Wang et al. 2025, "Beyond the 80/20 rule"): the
    completion tokens whose entropy is at least the batch's (1 − quantile)-quantile of them; the policy term acts on
    those alone. Bool (N, T)."""
    kept = mask > 0
    if not kept.any():
        return torch.zeros_like(kept)
    threshold = torch.quantile(entropy[kept].float(), 1 - quantile)
    return (entropy * mask >= threshold) & kept


@dataclass
class Update:
    """What `update` did: the last pass's LossOutput (each completion's from its mini-batch), the old log-probs it
    used, the clip fractions averaged over its μ × K optimiser steps (and by mini-batch position when K > 1), the
    gradient norms, the rollout correction (None when the batch is on-policy), the loss's mask (the completions'
    less the tokens the correction rejected) and the mini-batch each completion trained in."""

    out: LossOutput
    logp_old: torch.Tensor
    fractions: dict[str, float]
    grad_norms: list[float]
    correction: Correction | None
    mask: torch.Tensor
    before: torch.Tensor | None = None  # the tempered logits of the `watch` rows before the update (B, T, V)
    minibatch: torch.Tensor | None = None  # (N,) 0-based mini-batch of each completion; None for K = 1


def update(tr: Trainer, batch: Batch, objective: Objective, logp_old, logp_ref, step: int,
           correction: RolloutCorrection | None = None, bypass: bool | None = None,
           watch: torch.Tensor | None = None) -> Update:
    """μ passes of `objective` over `batch`, each K = `minibatches` optimiser steps on the mini-batches of
    `minibatch.minibatch_rows`, from `logp_old` (None: the policy's log-probs before the update; with K = 1 and
    μ = 1 the current ones, detached, as TRL). With a sampler or an active rollout correction (default: the run's),
    the correction of π_old against the sampler's π_roll weighs and masks every step, and its metrics measure the
    mismatch; in verl's bypass mode (default: the run's) π_old is π_roll, and the metrics compare it with the policy
    before the update, as verl's do. TRL's off-policy sequence mask compares π_θ with π_roll, as TRL does with
    vLLM's log-probs. The full tempered logits of the completions `watch` (an index) are kept from the policy before
    the update, for its entropy change (`metrics.entropy_change`)."""
    cfg, rollout = tr.cfg, batch.rollout
    mask, n = rollout.completion_mask, len(batch.adv)
    correction = tr.correction if correction is None else correction
    bypass = cfg.bypass_mode if bypass is None else bypass
    measured = tr.sampler is not None or correction.active
    parts = minibatch_rows(n, cfg.minibatches, cfg.seed * 104_729 + step)
    corrected, before = None, None
    if parts is None:
        logp_old = rollout.logp if bypass else logp_old
    else:  # π_old of every mini-batch before the first one trains
        logp_pre, before = policy_before(tr.model, rollout, parts, cfg.temperature, tr.autocast, watch)
        logp_old = rollout.logp if bypass else logp_pre
        if measured:
            corrected = correction.apply(logp_pre if bypass else logp_old, rollout.logp, mask)
    steps = cfg.mu * cfg.minibatches
    tokens = mask.sum() / cfg.minibatches if objective.aggregation == "dapo" and parts is not None else None
    tr.model.train()
    fractions, grad_norms, last = {}, [], []
    for inner in range(cfg.mu):
        for k, rows in enumerate(parts or [None]):
            pick = (lambda x: x) if rows is None else (lambda x: None if x is None else x[rows])  # noqa: E731
            part = rollout if rows is None else rollout.rows(rows)
            weight = None
            logits = completion_logits(tr.model, part, cfg.temperature, tr.autocast)
            if inner == 0 and watch is not None and rows is None:
                before = logits[watch].detach().clone()
            if cfg.top_entropy_quantile < 1.0:
                logp_new, entropy = token_logps(logits, part, with_entropy=True)
                weight = top_entropy_mask(entropy, pick(mask), cfg.top_entropy_quantile)
            else:
                logp_new = token_logps(logits, part)
            del logits
            if logp_old is None:  # K = 1, μ = 1: the current policy is the old one (TRL)
                logp_old = logp_new.detach()
            if inner == 0 and measured and rows is None:
                corrected = correction.apply(logp_new.detach() if bypass else logp_old, rollout.logp, mask)
            loss_mask = pick(mask if corrected is None else corrected.mask)
            if corrected is not None and corrected.weight is not None:
                weight = pick(corrected.weight) if weight is None else weight * pick(corrected.weight)
            where = f"inner step {inner + 1}" if rows is None else f"pass {inner + 1}, mini-batch {k + 1}"
            out = finite_loss(objective, f"step {step + 1} ({where})", cfg.lr, logp_new, pick(logp_old),
                              pick(batch.adv), loss_mask, logp_ref=pick(logp_ref),
                              max_completion_length=cfg.max_new_tokens, weight=weight, num_items_in_batch=tokens,
                              **({"logp_sampling": pick(rollout.logp)} if tr.sampler is not None else {}))
            tr.optimiser.zero_grad(set_to_none=True)
            out.loss.backward()
            grad_norms.append(float(torch.nn.utils.clip_grad_norm_(tr.model.parameters(), cfg.max_grad_norm)))
            tr.optimiser.step()
            measured_here = clip_fractions(out, loss_mask)
            for key, value in measured_here.items():
                fractions[key] = fractions.get(key, 0.0) + value / steps
            if rows is not None:  # by optimiser step: 1 … K in the first pass, K + 1 … 2K in the second, …
                position = inner * cfg.minibatches + k + 1
                fractions[f"clip_ratio/region_mean_by_minibatch/{position}"] = measured_here["clip_ratio/region_mean"]
                fractions[f"kl/k3_by_minibatch/{position}"] = _masked_mean(k3(logp_new.detach() - pick(logp_old)),
                                                                           loss_mask)
            if inner == cfg.mu - 1:
                last.append((rows, out))
    tr.model.eval()
    out = out if parts is None else in_batch_order(last, n)
    return Update(out, logp_old, fractions, grad_norms, corrected, mask if corrected is None else corrected.mask,
                  before, None if parts is None else minibatch_index(parts, n))


def grpo_step(tr: Trainer, step: int) -> StepResult:
    """Run GRPO step `step` (0-based) and return its metrics. Raises NonFiniteLoss on NaN/inf."""
    cfg = tr.cfg
    start = time.perf_counter()
    batch = make_batch(tr, step)
    rollout, rewards = batch.rollout, batch.rewards
    grouped = rewards.view(cfg.prompts, cfg.group_size)
    logps = partial(completion_logps, rollout=rollout, temperature=cfg.temperature, autocast=tr.autocast)
    with torch.no_grad():
        logp_ref = logps(tr.reference) if tr.reference is not None else None
        logp_old = logps(tr.model) if cfg.mu > 1 and cfg.minibatches == 1 and not cfg.bypass_mode else None
    rows = after_rows(len(rewards), inspected_rows(cfg), step).to(tr.device)
    watch = rows[:ENTROPY_ROWS]
    done = update(tr, batch, tr.objective, logp_old, logp_ref, step, watch=watch)
    out, logp_old = done.out, done.logp_old
    if tr.sampler is not None:
        tr.sampler.after_update(tr.model)
    # one no-grad forward after the update, on at most AFTER_ROWS completions (a seeded subset): the only
    # cost divviz adds to a bare GRPO step, kept bounded for large batches; its log-probs feed metrics only,
    # never autograd, hence inference mode (no autograd bookkeeping at all)
    seen = rollout.rows(rows)
    with torch.inference_mode():
        logits_after = completion_logits(tr.model, seen, cfg.temperature, tr.autocast)
        logp_after = token_logps(logits_after, seen)
        changed = entropy_change(done.before, logits_after[:len(watch)], seen.completion_mask[:len(watch)])
        del logits_after
    if not torch.isfinite(logp_after).all():
        raise NonFiniteLoss(f"the policy's log-probs became NaN/inf after step {step + 1}; "
                            f"try a smaller learning rate (now {cfg.lr:g})")
    elapsed = time.perf_counter() - start

    metrics = {
        "step": step + 1,
        "reward": float(rewards.mean()),
        "reward_std": float(grouped.std(dim=1).mean()),
        "frac_reward_zero_std": float((grouped.std(dim=1) == 0).float().mean()),
        "accuracy": float(np.mean(batch.correct)),
        "completions/mean_length": float(rollout.completion_mask.sum(1).mean()),
        **done.fractions,
        **(done.correction.metrics if done.correction else {}),
        **update_metrics(seen, logp_old[rows], logp_after, None if logp_ref is None else logp_ref[rows]),
        "clip_ratio/overshoot_mean": overshoot((logp_after - logp_old[rows]).exp(), batch.adv[rows],
                                               seen.completion_mask, tr.objective.clip, logp_old[rows].exp()),
        "entropy": _masked_mean(rollout.entropy, rollout.completion_mask),  # over every completion
        **changed,
        **entropy_covariance(logp_old, batch.adv, done.mask, out.clip_state(), tr.objective.dual_clip_c is not None),
        "top1_mass": _masked_mean(rollout.top1, rollout.completion_mask),
        "loss": float(out.loss.detach()),
        "grad_norm": float(np.mean(done.grad_norms)),
        "step_time": elapsed,
        "tokens_per_s": float(rollout.completion_mask.sum()) / elapsed,
    }
    tokens = _token_sample(seen, done.mask[rows], logp_old[rows], logp_after, out.rows(rows), batch.adv[rows],
                           seed=cfg.seed * 31 + step)
    shown = [(batch.prompts[i], batch.texts[i], float(rewards[i])) for i in range(0, len(rewards), cfg.group_size)][:8]
    return StepResult(metrics, tokens, shown, inspected_record(tr, batch, done, logp_after, logp_ref, step))


def inspected_rows(cfg: RunConfig) -> int:
    """How many completions the step inspector keeps whole: the first `inspect_prompts` prompts' groups."""
    return min(cfg.inspect_prompts, cfg.prompts) * cfg.group_size


def after_rows(n: int, inspected: int, step: int) -> torch.Tensor:
    """The completions re-scored after the update: the inspected ones (rows 0 … inspected − 1), then a subset of
    the others seeded by the step, AFTER_ROWS in all (every row when the batch is that small)."""
    others = torch.randperm(n - inspected, generator=torch.Generator().manual_seed(step))
    return torch.cat([torch.arange(inspected), inspected + others[:max(AFTER_ROWS - inspected, 0)].sort().values])


def inspected_record(tr: Trainer, batch: Batch, done: Update, logp_after, logp_ref, step: int,
                     objective: Objective | None = None, rows: int | None = None):
    """The step inspector's record (`completions.step_record`) of the first `rows` completions (default: the
    `inspect_prompts` prompts' groups; None when that is none) under `objective` (default: the run's), with the
    sampler's π_roll where the batch may be off-policy."""
    cfg, rows = tr.cfg, inspected_rows(tr.cfg) if rows is None else rows
    if not rows:
        return None
    mask = batch.rollout.completion_mask
    weight = aggregation_weights(done.mask.cpu().numpy(), (objective or tr.objective).aggregation, cfg.max_new_tokens)
    size = cfg.group_size
    groups = [(batch.prompts[start], list(range(start, start + size))) for start in range(0, rows, size)]
    prompt_ids = [ids[keep > 0].tolist() for ids, keep in zip(batch.rollout.prompt_ids[:rows:size],
                                                                  batch.rollout.prompt_mask[:rows:size])]
    return step_record(step=step + 1, tokenizer=tr.tokenizer, groups=groups, texts=batch.texts, prompt_ids=prompt_ids,
                       rewards=batch.rewards, adv=batch.adv, completion_ids=batch.rollout.completion_ids, mask=mask,
                       out=done.out, logp_old=done.logp_old, logp_after=logp_after, logp_ref=logp_ref, weight=weight,
                       byte_cap=cfg.inspect_bytes, kept=None if done.correction is None else done.mask,
                       entropy=batch.rollout.entropy, top1=batch.rollout.top1,
                       logp_roll=None if done.correction is None else batch.rollout.logp, minibatch=done.minibatch)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def update_metrics(rollout: Rollout, logp_old, logp_after, logp_ref) -> dict[str, float]:
    """KL of the update (k1/k2/k3 of w = π_after/π_old) and to the reference (GRPO's direction,
    r = π_ref/π), and where probability mass moved, binned by π_old."""
    mask = rollout.completion_mask
    log_ratio = (logp_after - logp_old) * mask
    metrics = {
        "kl/k1": _masked_mean(k1(log_ratio), mask),
        "kl/k2": _masked_mean(k2(log_ratio), mask),
        "kl/k3": _masked_mean(k3(log_ratio), mask),
    }
    if logp_ref is not None:
        ref_ratio = (logp_ref - logp_after) * mask
        metrics.update({f"kl_ref/{name}": _masked_mean(fn(ref_ratio), mask) for name, fn in
                        (("k1", k1), ("k2", k2), ("k3", k3))})
    pi_old, change = logp_old.exp()[mask > 0], (logp_after.exp() - logp_old.exp())[mask > 0]
    tokens = max(int(pi_old.numel()), 1)
    index = torch.bucketize(pi_old, torch.tensor(PI_OLD_BINS[1:-1], device=pi_old.device), right=True)
    per_bin = torch.zeros(len(PI_OLD_BINS) - 1, device=pi_old.device).index_add_(0, index, change.float())
    metrics.update({f"mass_shift/{label}": float(v) / tokens for label, v in zip(bin_labels(), per_bin)})
    gained = change.clamp(min=0)
    metrics["mass_to_argmax"] = float(gained[rollout.was_argmax[mask > 0]].sum() / gained.sum().clamp(min=1e-12))
    return metrics


def _token_sample(rollout: Rollout, kept, logp_old, logp_after, out, adv, seed: int) -> dict[str, np.ndarray]:
    """Up to TOKEN_SAMPLE of the tokens the loss `kept` (a rollout correction may have rejected some): π_old, the
    ratio at the last inner step, π after the update, the advantage and the clip state (0 inside, 1 clipped low,
    2 clipped high, 3 dual-clipped)."""
    mask = kept > 0
    rows, cols = mask.nonzero(as_tuple=True)
    g = torch.Generator().manual_seed(seed)
    keep = torch.randperm(len(rows), generator=g)[:TOKEN_SAMPLE].sort().values.to(rows.device)
    rows, cols = rows[keep], cols[keep]
    pick = lambda x: x[rows, cols].detach().float().cpu().numpy()  # noqa: E731
    return {
        "pi_old": pick(logp_old.exp()), "ratio": pick(out.ratio), "pi_new": pick(logp_after.exp()),
        "adv": adv[rows].detach().float().cpu().numpy(), "state": pick(out.clip_state()).astype(np.int8),
        "was_argmax": pick(rollout.was_argmax).astype(bool), "completion": rows.cpu().numpy().astype(np.int32),
        "position": cols.cpu().numpy().astype(np.int32),
    }
