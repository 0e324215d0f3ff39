"""One GRPO step, in paper order: prompts → G completions each → rewards → group-relative advantages →
μ passes of K optimiser steps of the chosen objective → the step's metrics (`step_metrics.py`).

    for each step:
        sample `prompts` prompts; G completions each with the KV cache (temperature τ), by the trained policy or by
            a rollout policy π_roll in lower precision or some updates behind (`sampler.py`)
        r_i = task reward (or a seeded coin);  A_i = (r_i − mean_group) [/ (std_group + 1e-4)]   (Shao et al. 2024)
        h = the frozen blocks' hidden states over prompts and completions, once, where only the last blocks train:
            every forward below runs the trained blocks from h (`frozen_prefix.py`)
        split the completions into K mini-batches (K = 1: the whole batch; `minibatch.py`)
        π_before = the policy before the update on every completion (the first mini-batch's from its own first
            forward, detached; the others' by a no-grad forward first)
        π_old = π_before, or π_roll in verl's bypass mode
        ρ, loss_mask = verl's rollout correction of π_before against π_roll: importance weights and the completion
            mask less the tokens its rejection takes out
        repeat μ times, for each mini-batch:
            loss = Objective(logp_new, logp_old, A, loss_mask, logp_ref, weight=ρ [· TRL's top-entropy mask])
            AdamW step
        one no-grad forward after the update for the KL, the mass that moved and the entropy's change at the
            positions of ENTROPY_ROWS completions (full distributions before and after); π_roll synced
"""

from __future__ import annotations

import copy
import functools
import operator
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from divviz.catalogue.aggregation import dapo_tokens, group_advantages
from divviz.engine.batch import Batch, Update
from divviz.engine.config import RunConfig
from divviz.engine.frozen_prefix import FrozenPrefix, frozen_prefix
from divviz.engine.memory import keep_freed_memory
from divviz.engine.minibatch import in_batch_order, minibatch_index, minibatch_rows
from divviz.engine.policy import load_policy, pick_device, pick_dtype, train_last_blocks
from divviz.engine.prompts import asked_ids, resolve_format, shown_prompts
from divviz.engine.rollout import (NonFiniteLoss, Rollout, completion_logits, completion_logps, decode_completions,
                                  encode_prompts, sample, token_logps)
from divviz.engine.sampler import RolloutPolicy, rollout_policy
from divviz.engine.step_metrics import (ENTROPY_ROWS, MeasuredRows, StepTally, inspected_record, measured_rows,
                                        step_metrics, token_sample)
from divviz.engine.tasks import Task, coin_rewards, get_task
from divviz.loss_checks import NonFiniteInput
from divviz.losses import LossOutput, Objective
from divviz.metrics import entropy_change
from divviz.catalogue.rollout_correction import RolloutCorrection


def grpo_step(tr: Trainer, step: int) -> StepResult:
    """Run GRPO step `step` (0-based) and return what it measured, in the module docstring's order. Raises
    NonFiniteLoss on NaN/inf."""
    start = time.perf_counter()
    batch = make_batch(tr, step)
    logp_ref = reference_logps(tr, batch)
    measured = measured_rows(tr.cfg, len(batch.adv), step, tr.device)
    done = update(tr, batch, tr.objective, logp_ref, step, measured=measured)
    if tr.sampler is not None:
        tr.sampler.after_update(tr.model)
    seen = measured.after
    rescored, logp_after, changed = policy_after(tr, batch, measured, step)
    metrics = step_metrics(tr.cfg, tr.objective, batch, done, seen, rescored, logp_after, logp_ref, changed, step,
                           time.perf_counter() - start)
    return StepResult(metrics, token_sample(batch, done, seen, rescored, logp_after, seed=tr.cfg.seed * 31 + step),
                      shown_groups(tr.cfg, batch),
                      inspected_record(tr.cfg, tr.tokenizer, tr.objective, batch, done, logp_after, logp_ref, step))


def reference_logps(tr: Trainer, batch: Batch) -> torch.Tensor | None:
    """π_ref's log-probs of the sampled tokens (the run's start policy, kept where a penalty needs it), no grad."""
    if tr.reference is None:
        return None
    with torch.no_grad():
        return completion_logps(tr.reference, batch.rollout, tr.cfg.temperature, tr.autocast, prefix=batch.prefix)


def policy_after(tr: Trainer, batch: Batch, measured: MeasuredRows, step: int):
    """One no-grad forward after the update, on at most AFTER_ROWS completions (`measured.after`, a seeded subset):
    the only cost divviz adds to a bare GRPO step; its log-probs feed metrics only, never autograd, hence inference
    mode. Returns the rows re-scored, their log-probs after and the entropy's change on the first ENTROPY_ROWS of
    them (against their logits before, `measured.before`)."""
    seen = measured.after
    rescored = batch.rollout.rows(seen)
    with torch.inference_mode():
        logits_after = completion_logits(tr.model, rescored, tr.cfg.temperature, tr.autocast,
                                         rows_of(batch.prefix, seen))
        logp_after = token_logps(logits_after, rescored)
        changed = entropy_change(measured.before, logits_after[:ENTROPY_ROWS], rescored.completion_mask[:ENTROPY_ROWS])
        del logits_after
    if not torch.isfinite(logp_after).all():
        raise NonFiniteLoss(f"the policy's log-probs became NaN/inf after step {step + 1}; "
                            f"try a smaller learning rate (now {tr.cfg.lr:g})")
    return rescored, logp_after, changed


def shown_groups(cfg: RunConfig, batch: Batch) -> list[tuple[str, str, float]]:
    """The first completion of each of the first 8 groups, (prompt, text, reward): what the run's samples show."""
    return [(batch.prompts[i], batch.texts[i], float(batch.rewards[i]))
            for i in range(0, len(batch.rewards), cfg.group_size)][:8]


def finite_loss(objective: Objective, where: str, lr: float, *args, **kwargs) -> LossOutput:
    """`objective(*args, **kwargs)`, or NonFiniteLoss naming `where` ("step 3 (pass 1, mini-batch 2)") and the
    learning rate when the policy's log-probs or the loss are not finite (divviz's engine and its TRL trainer alike)."""
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
    dtype: torch.dtype | None = None  # the forward passes' autocast precision (`policy.pick_dtype`); None: float32

    def autocast(self):
        """Autocast to the run's precision (bf16 on a GPU or CPU that has it, `policy.pick_dtype`), else nothing."""
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
    if device.type == "cpu":
        keep_freed_memory()  # a step's large logit tensors reuse freed pages (`memory.py`): about a fifth of a step
    model, tokenizer = load_policy(cfg.model, task, trust_remote_code=cfg.trust_remote_code)  # the shipped seed-0 model
    fmt = resolve_format(cfg.prompt_format, tokenizer)
    model.to(device)
    train_last_blocks(model, cfg.trainable_blocks)
    objective = cfg.objective
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


def make_batch(tr: Trainer, step: int) -> Batch:
    """Sample G completions for each of step `step`'s prompts (seeded by the run seed and the step), and run the
    trained policy's frozen blocks over them once (`frozen_prefix.py`; None where every block trains)."""
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
    prefix = frozen_prefix(tr.model, rollout, tr.autocast, cfg.trainable_blocks)
    return Batch(rollout, prompts, texts, rewards, correct, adv, prefix)


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's top-entropy token mask (`get_high_entropy_mask`, after Wang et al. 2025, "Beyond the 80/20 rule"): the
    completion tokens whose entropy is at least the batch's (1 − quantile)-quantile of them; the policy term acts on
    those alone. Bool (N, T)."""
    completion = mask > 0
    if not completion.any():
        return torch.zeros_like(completion)
    threshold = torch.quantile(entropy[completion].float(), 1 - quantile)
    return (entropy * mask >= threshold) & completion


def update(tr: Trainer, batch: Batch, objective: Objective, logp_ref, step: int,
           correction: RolloutCorrection | None = None, bypass: bool | None = None,
           measured: MeasuredRows | None = None) -> Update:
    """μ passes of `objective` over `batch`, each K = `minibatches` optimiser steps on the mini-batches of
    `minibatch.minibatch_rows`, all against π_old, as the module's docstring reads. With a sampler or an active
    rollout correction (default: the run's), the correction of π_before against the sampler's π_roll weighs and
    masks every step and its metrics measure the mismatch; in verl's bypass mode (default: the run's) π_old is
    π_roll. TRL's off-policy sequence mask compares π_θ with π_roll, as TRL does with vLLM's log-probs. The
    `measured` rows' logits before the update are kept in it as its forwards pass them (`step_metrics.MeasuredRows`)."""
    cfg, rollout, mask = tr.cfg, batch.rollout, batch.rollout.completion_mask
    correction = tr.correction if correction is None else correction
    bypass = cfg.bypass_mode if bypass is None else bypass
    parts = minibatch_rows(len(batch.adv), cfg.minibatches, cfg.seed * 104_729 + step)
    tally = StepTally(cfg.mu * len(parts), by_minibatch=len(parts) > 1)
    logp_roll = rollout.logp if tr.sampler is not None else None  # π_roll, when a sampler other than π_θ drew
    measured = measured or MeasuredRows(torch.zeros(0, dtype=torch.long))  # none: no logits kept
    logp_before, logp_first, top_first = policy_before(tr, batch, parts, measured)
    logp_old = rollout.logp if bypass else logp_before
    mismatched = tr.sampler is not None or correction.active
    corrected = correction.apply(logp_before, rollout.logp, mask) if mismatched else None
    loss_mask = mask if corrected is None else corrected.mask
    rho = None if corrected is None else corrected.weight
    tokens = dapo_tokens(loss_mask, len(parts)) if objective.aggregation == "dapo" else None
    for inner in range(cfg.mu):
        for k, rows in enumerate(parts):
            logp_new, top_entropy = ((logp_first, top_first) if inner == k == 0
                                     else training_forward(tr, batch, rows)[:2])
            weight = product(top_entropy, rows_of(rho, rows))
            where = f"pass {inner + 1}" + (f", mini-batch {k + 1}" if len(parts) > 1 else "")
            out = finite_loss(objective, f"step {step + 1} ({where})", cfg.lr, logp_new, logp_old[rows],
                              batch.adv[rows], loss_mask[rows], logp_ref=rows_of(logp_ref, rows),
                              max_completion_length=cfg.max_new_tokens, weight=weight, num_items_in_batch=tokens,
                              logp_sampling=rows_of(logp_roll, rows))
            tr.optimiser.zero_grad(set_to_none=True)
            out.loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(tr.model.parameters(), cfg.max_grad_norm))
            tr.optimiser.step()
            tally.add(inner * len(parts) + k + 1, out, loss_mask[rows], logp_new.detach() - logp_old[rows], grad_norm)
            if inner == cfg.mu - 1:
                tally.last_pass.append((rows, out))
    tr.model.eval()
    return Update(in_batch_order(tally.last_pass, len(batch.adv)), logp_old, tally.fractions, tally.grad_norms,
                  corrected, loss_mask, minibatch_index(parts, len(batch.adv)) if len(parts) > 1 else None)


def policy_before(tr: Trainer, batch: Batch, parts: list[torch.Tensor], measured: MeasuredRows):
    """π_before, the policy before the update, on every completion, in one place: each later mini-batch's log-probs
    by a no-grad forward with the shapes its training forwards will have, then (the model put in training mode) the
    first mini-batch's from its own first training forward, detached, so that its ratios are exactly 1, as TRL's
    with one optimiser step per batch. Returns the (N, T) log-probs and that first forward's log-probs (with grad)
    and top-entropy mask, which the update's first optimiser step trains on; the `measured` rows' logits are kept."""
    rollout = batch.rollout
    logp_before = torch.zeros_like(rollout.logp)
    with torch.no_grad():
        for rows in parts[1:]:
            part = rollout.rows(rows)
            logits = completion_logits(tr.model, part, tr.cfg.temperature, tr.autocast, rows_of(batch.prefix, rows))
            logp_before[rows] = token_logps(logits, part)
            measured.keep(rows, logits)
            del logits
    tr.model.train()
    logp_first, top_first, logits = training_forward(tr, batch, parts[0])
    logp_before[parts[0]] = logp_first.detach()
    measured.keep(parts[0], logits)
    return logp_before, logp_first, top_first


def training_forward(tr: Trainer, batch: Batch, rows: torch.Tensor):
    """One mini-batch's forward with grad: (log-probs of its sampled tokens, TRL's top-entropy mask of them or None,
    the tempered logits), from the batch's frozen prefix where it has one."""
    part = batch.rollout.rows(rows)
    logits = completion_logits(tr.model, part, tr.cfg.temperature, tr.autocast, rows_of(batch.prefix, rows))
    logp, top_entropy = policy_logps(logits, part, batch.rollout.completion_mask[rows], tr.cfg.top_entropy_quantile)
    return logp, top_entropy, logits


def rows_of(x: torch.Tensor | FrozenPrefix | None, rows: torch.Tensor):
    return None if x is None else x[rows]


def product(*factors: torch.Tensor | None) -> torch.Tensor | None:
    """The product of the factors that are not None, in order (None if none is)."""
    present = [f for f in factors if f is not None]
    return None if not present else functools.reduce(operator.mul, present)


def policy_logps(logits: torch.Tensor, part: Rollout, mask: torch.Tensor,
                 top_entropy_quantile: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sampled tokens' log-probs under the tempered `logits` (with grad), and TRL's top-entropy mask of them
    where the run keeps only the top `top_entropy_quantile` by entropy (None where it keeps every token)."""
    if top_entropy_quantile == 1.0:
        return token_logps(logits, part), None
    logp, entropy = token_logps(logits, part, with_entropy=True)
    return logp, top_entropy_mask(entropy, mask, top_entropy_quantile)
