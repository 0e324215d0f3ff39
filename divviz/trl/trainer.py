"""`DivvizGRPOTrainer`: TRL's `GRPOTrainer` whose policy loss is divviz's one `policy_loss`.

It replaces one method of TRL 1.16's `GRPOTrainer`, `_compute_loss`: TRL writes its loss formula inline, between
the forward pass and the metrics, so no smaller override can swap it. The new `_compute_loss` keeps, as TRL does
them, the forward pass (`_get_per_token_logps_and_entropies`, TRL's fused LM head at its temperature), the old
log-probs (with μ = 1 the current ones, detached), the top-entropy token mask, the off-policy sequence mask and
vLLM's importance-sampling correction (all three as `policy_loss`'s per-token weight; for VESPO the correction goes
into its sequence ratio instead, as TRL puts it), the MoE auxiliary loss, the
normalisers for gradient accumulation and processes, and TRL's cross-process gathering of metrics. It replaces
TRL's loss (its clip `epsilon`/`epsilon_high`, `delta`, k3 penalty `beta`, and its own surrogates cispo, sapo and
vespo) by the objective's clip test or surrogate, penalty, β, caps and level; GRPOConfig's loss_type must name the
objective (`options.trl_loss_type`). `train` is wrapped only to record how a run ended in a `DivvizRunCallback`'s
run folder.

Generation (vLLM included), reward functions, the reference model, PEFT, gradient accumulation and DeepSpeed/FSDP
through accelerate stay TRL's. Not honoured (refused at construction): the entropy bonus, and verl's token_sum
aggregation, which has no TRL loss_type.

    trainer = DivvizGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(loss_type="dapo", ...),
                                train_dataset=..., objective=Objective(clip=clip_test("kl3", delta=0.05),
                                                                       aggregation="dapo"),
                                callbacks=[DivvizRunCallback()])
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from divviz.catalogue.aggregation import aggregation_weights
from divviz.engine.completions import step_record
from divviz.engine.grpo import finite_loss
from divviz.catalogue.estimators import k1, k2, k3
from divviz.losses import LossOutput, Objective
from divviz.metrics import entropy_covariance
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.surrogates import VESPO_FLOOR, vespo_sequence_phi
from divviz.trl.callback import TOKEN_SAMPLE, DivvizRunCallback, run_end
from divviz.trl.options import trl_args_for

# each completion's reward, added to TRL's generation batch for the step inspector (TRL keeps only advantages)
REWARDS = "divviz_rewards"
# inputs that TRL's forward passes on to multimodal models, by the names `_get_per_token_logps_and_entropies` takes
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


class DivvizGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the policy loss of a divviz `Objective` (see the module docstring).

    Takes every argument of `GRPOTrainer` plus `objective`. Logs TRL's metrics under TRL's names (`entropy`, `kl`,
    `clip_ratio/low_mean`, `…/high_mean`, `…/region_mean`, `…/low_min`, `…/high_max`), gathered across processes
    as TRL gathers them, and divviz's per-token ones, which need no extra forward pass:

        kl/k1, kl/k2, kl/k3          k1/k2/k3 of the current ratio w = π_θ/π_old at each optimiser step
        divviz/measure_mean          the clip test's own measure (e.g. k3 for kl3)
        divviz/penalty_mean          the penalty's value (TRL's `kl` too when the penalty is toward the reference)
        divviz/grad_masked_mean      share of tokens whose gradient through w is masked (clipped or dual-capped)
        divviz/outside_mean          share of tokens outside the clip test's region, whatever their advantage
        divviz/outside_last_mean     the same at the last of the μ optimiser steps only (after μ − 1 updates)
        entropy/cov_<clip state>     Cov(log π_old, A) over the micro-batch's tokens, summed by clip state
                                     (`metrics.entropy_covariance`); entropy/change is not known: TRL makes no
                                     forward pass after its update

    With a `DivvizRunCallback` among its callbacks it also hands over, at the last optimiser step, a sample of per-token
    facts gathered from every process (≤ 256 tokens), which the callback writes as the run's `tokens/`, and the step
    inspector's record of whole completions (`completions/`, see `_hand_over_completions`).
    """

    def __init__(self, *args, objective: Objective, **kwargs):
        if not isinstance(objective, Objective):
            raise DivvizInputError(f"objective must be a divviz.losses.Objective, got {type(objective).__name__}")
        if len(args) >= 3:  # (model, reward_funcs, args, ...) given by position
            args = (*args[:2], trl_args_for(objective, args[2] or GRPOConfig()), *args[3:])
        else:
            kwargs["args"] = trl_args_for(objective, kwargs.get("args") or GRPOConfig())
        self.objective = objective
        # TRL's own mask is a weight (`_token_weight`)
        self._loss_objective = replace(objective, off_policy_mask_threshold=None)
        super().__init__(*args, **kwargs)

    def _run_callbacks(self) -> list[DivvizRunCallback]:
        return [cb for cb in self.callback_handler.callbacks if isinstance(cb, DivvizRunCallback)]

    def train(self, *args, **kwargs):
        """TRL's `train`; a `DivvizRunCallback` learns the objective first, and how the run ended if it raised."""
        callbacks = self._run_callbacks()
        for callback in callbacks:
            callback.objective = self.objective
        try:
            return super().train(*args, **kwargs)
        except BaseException as err:
            for callback in callbacks:
                callback.end(*run_end(err))
            raise

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        logp_new, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1), completion_ids.size(1),
            compute_entropy=True, compute_aux_loss=self.aux_loss_enabled, **{k: inputs.get(k) for k in _MODEL_INPUTS})
        adv = inputs["advantages"]
        adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # (B, 1), or (B, T) from a subclass
        logp_old = inputs.get("old_per_token_logps")
        logp_old = logp_new.detach() if logp_old is None else logp_old

        out = finite_loss(self._loss_objective, f"step {self.state.global_step + 1}", self.args.learning_rate,
                          logp_new, self._vespo_old(inputs, logp_old), adv, mask,
                          logp_ref=inputs.get("ref_per_token_logps"), max_completion_length=self.max_completion_length,
                          num_items_in_batch=self._dapo_normaliser(inputs, mode),
                          weight=self._token_weight(inputs, adv, logp_new, logp_old, entropies, mask))
        # grpo, bnpo, dr_grpo: TRL divides by the accumulation steps; dapo's normaliser already counts them
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = out.loss if self.objective.aggregation == "dapo" else out.loss / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_facts(mode, out, logp_new.detach() - logp_old, adv, entropies, mask)
        for name, value in entropy_covariance(logp_old, adv.expand_as(mask), mask, out.clip_state(),
                                              self.objective.dual_clip_c is not None).items():
            self._metrics[mode][name].append(value)  # this process's micro-batch: means over its tokens
        if mode == "train" and self._last_inner_step():
            self._hand_over_tokens(out, logp_old, adv, mask)
            if self._step % self.args.steps_per_generation == 0:  # the pass's first micro-batch
                self._hand_over_completions(inputs, out, logp_old, adv, mask, accumulation)
        return loss

    def _calculate_rewards(self, *args, **kwargs):
        """TRL's rewards per function (every process's completions), kept for `_generate_and_score_completions`."""
        self._rewards_per_func = super()._calculate_rewards(*args, **kwargs)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        """TRL's generation batch, plus this process's rewards (as TRL logs them) when a callback inspects steps."""
        output = super()._generate_and_score_completions(inputs)
        if any(callback.inspect_prompts for callback in self._run_callbacks()):
            per_func = self._rewards_per_func
            rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
            rewards[torch.isnan(per_func).all(dim=1)] = torch.nan  # unscorable, as TRL marks them
            n, rank = len(output["advantages"]), self.accelerator.process_index
            output[REWARDS] = rewards[rank * n:(rank + 1) * n]
        return output

    def _dapo_normaliser(self, inputs, mode: str):
        """TRL's dapo normaliser: the generation batch's tokens over all processes, per accumulation window."""
        if self.objective.aggregation != "dapo":
            return None
        normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normaliser

    def _token_weight(self, inputs, adv, logp_new, logp_old, entropies, mask):
        """The product of TRL's per-token multipliers of the policy term that this configuration switches on."""
        weight = None
        if self.off_policy_mask_threshold is not None:  # vLLM's sampling log-probs where there are any
            weight = self.get_off_policy_mask(
                advantages=adv, per_token_logps=logp_new, mask=mask, sampling_per_token_logps=inputs.get(
                    "sampling_per_token_logps", logp_old), off_policy_threshold=self.off_policy_mask_threshold)
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            weight = entropy_mask if weight is None else weight * entropy_mask
        if self._vllm_correction() and not self._vespo():
            ratio = inputs["importance_sampling_ratio"]
            weight = ratio if weight is None else weight * ratio
        return weight

    def _vllm_correction(self) -> bool:
        return bool(self.use_vllm and self.vllm_importance_sampling_correction)

    def _vespo(self) -> bool:
        return self.objective.surrogate is not None and self.objective.surrogate.name == "vespo"

    def _vespo_old(self, inputs, logp_old):
        """The old log-probs VESPO's loss reads. TRL puts vLLM's importance-sampling ratio π_old/π_vllm into VESPO's
        sequence ratio W instead of weighing the loss by it (`get_gamma_weights`: log W = Σ log w + Σ log ratio, the
        ratio's log clamped to [log 1e-8, 20]); VESPO's loss reads π_old only through W, so dividing π_old by the
        ratio is the same."""
        if not (self._vllm_correction() and self._vespo()):
            return logp_old
        return logp_old - inputs["importance_sampling_ratio"].log().clamp(VESPO_FLOOR, 20.0)

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """TRL's `global_masked_mean`: Σ x·mask / Σ mask over every process."""
        totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum().float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _log_facts(self, mode: str, out: LossOutput, log_ratio, adv, entropies, mask) -> None:
        metrics, mean = self._metrics[mode], lambda x: self._global_masked_mean(x.float(), mask)
        if out.penalty is not None:
            metrics["divviz/penalty_mean"].append(mean(out.penalty))
            if self.objective.penalty.entry.needs_ref:
                metrics["kl"].append(metrics["divviz/penalty_mean"][-1])
        metrics["entropy"].append(mean(entropies))
        if self.objective.surrogate is None or self.objective.surrogate.entry.clip == "needs":
            for name, clipped in (("low", out.masked_low), ("high", out.masked_high),
                                  ("region", out.masked_region)):
                metrics[f"clip_ratio/{name}_mean"].append(mean(clipped))
            per_completion = lambda x: (x.float() * mask).sum(-1) / mask.sum(-1)  # noqa: E731 — TRL's masked_seq_mean
            metrics["clip_ratio/low_min"].append(nanmin(self.accelerator.gather(per_completion(out.masked_low))).item())
            metrics["clip_ratio/high_max"].append(
                nanmax(self.accelerator.gather(per_completion(out.masked_high))).item())
        self._log_surrogate(metrics, out, log_ratio, adv, mask)
        for name, estimator in (("k1", k1), ("k2", k2), ("k3", k3)):
            metrics[f"kl/{name}"].append(mean(estimator(log_ratio)))
        if out.clip_value is not None:
            metrics["divviz/measure_mean"].append(mean(out.clip_value))
        metrics["divviz/grad_masked_mean"].append(mean(out.grad_masked))
        metrics["divviz/outside_mean"].append(mean(out.outside))
        if mode == "train" and self._last_inner_step():
            metrics["divviz/outside_last_mean"].append(metrics["divviz/outside_mean"][-1])

    def _log_surrogate(self, metrics, out: LossOutput, log_ratio, adv, mask) -> None:
        """TRL's metrics of its own surrogates: `cispo_clip_ratio`, the share of tokens with A > 0 whose weight is
        capped (w > hi), and `vespo/phi_seq_mean`, the mean over completions of φ(W)."""
        surrogate = self.objective.surrogate
        if surrogate is None or surrogate.name not in ("cispo", "vespo"):
            return
        if surrogate.name == "cispo":
            capped = (out.ratio > surrogate.params["hi"]) & (adv > 0)
            metrics["cispo_clip_ratio"].append(self._global_masked_mean(capped.float(), mask))
            return
        phi = vespo_sequence_phi(log_ratio, adv[:, :1], mask, surrogate.params)[:, 0]
        totals = self.accelerator.reduce(torch.stack([phi.sum(), torch.tensor(float(len(phi)), device=phi.device)]),
                                         reduction="sum")
        metrics["vespo/phi_seq_mean"].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def _last_inner_step(self) -> bool:
        """Whether this micro-batch belongs to the last of the μ passes over its generation batch."""
        per_generation = self.args.steps_per_generation
        return (self._step % (per_generation * self.num_iterations)) // per_generation == self.num_iterations - 1

    def _hand_over_tokens(self, out: LossOutput, logp_old, adv, mask) -> None:
        """A sample of this micro-batch's per-token facts from every process, to the run callbacks of the main one.

        Columns as in the engine's `tokens/` (π after the update is not known without another forward, so there is
        no `pi_new`): pi_old, ratio, adv, state (0 inside, 1 masked low, 2 masked high, 3 dual-clip), measure,
        completion and position (row and column in this process's micro-batch), rank."""
        callbacks = self._run_callbacks()
        if not callbacks:
            return
        rows, cols = (mask > 0).nonzero(as_tuple=True)
        share = math.ceil(TOKEN_SAMPLE / self.accelerator.num_processes)
        generator = torch.Generator().manual_seed(self.args.seed * 31 + self.state.global_step)
        keep = torch.randperm(len(rows), generator=generator)[:share].sort().values.to(rows.device)
        rows, cols = rows[keep], cols[keep]
        pick = lambda x: x[rows, cols].detach().float().cpu().numpy()  # noqa: E731
        adv = adv.expand_as(mask)
        facts = {"pi_old": pick(logp_old.exp()), "ratio": pick(out.ratio), "adv": pick(adv),
                 "state": pick(out.clip_state()).astype(np.int8), "completion": rows.cpu().numpy().astype(np.int32),
                 "position": cols.cpu().numpy().astype(np.int32),
                 "rank": np.full(len(rows), self.accelerator.process_index, dtype=np.int16)}
        if out.clip_value is not None:
            facts["measure"] = pick(out.clip_value)
        gathered = gather_object([facts])
        if self.accelerator.is_main_process:
            merged = {key: np.concatenate([part[key] for part in gathered]) for key in facts}
            for callback in callbacks:
                callback.add_tokens(merged)

    def _hand_over_completions(self, inputs, out: LossOutput, logp_old, adv, mask, accumulation: float) -> None:
        """The step inspector's record (`completions.step_record`) of this micro-batch, on the main process.

        TRL shuffles a generation batch before splitting it into micro-batches, so the record takes this micro-batch's
        first `inspect_prompts` distinct prompts, each with its completions found here (all G when the generation batch
        is one micro-batch, as in `divviz train --backend trl`). π after the update is not known (`pi_new` is None):
        TRL makes no forward after its update. The weights are ∂loss/∂ℓ_t of the loss this trainer returns, with TRL's
        normalisers (accumulation steps, and dapo's token count over processes)."""
        callbacks = [callback for callback in self._run_callbacks() if callback.inspect_prompts]
        if not callbacks or REWARDS not in inputs or not self.accelerator.is_main_process:
            return
        tokenizer = getattr(self.processing_class, "tokenizer", self.processing_class)  # a processor holds one
        completion_mask = inputs["completion_mask"]  # whole completions; `mask` also drops tool tokens from the loss
        prompt_keys = [tuple(ids[keep > 0].tolist()) for ids, keep in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
        how, normaliser = self.objective.aggregation, self._dapo_normaliser(inputs, "train")
        weight = aggregation_weights(mask.cpu().numpy(), how, self.max_completion_length,
                                     None if normaliser is None else float(normaliser))
        weight = weight if how == "dapo" else weight / accumulation
        for callback in callbacks:
            chosen = list(dict.fromkeys(prompt_keys))[:callback.inspect_prompts]
            groups = [(tokenizer.decode(list(key), skip_special_tokens=True),
                       [i for i, other in enumerate(prompt_keys) if other == key]) for key in chosen]
            rows = [i for _, members in groups for i in members]
            lengths = completion_mask[rows].sum(-1).long().tolist()
            texts = dict(zip(rows, tokenizer.batch_decode(
                [inputs["completion_ids"][i][:n].tolist() for i, n in zip(rows, lengths)], skip_special_tokens=True)))
            callback.add_completions(step_record(
                step=0, tokenizer=tokenizer, groups=groups, texts=texts, rewards=inputs[REWARDS].float().cpu(),
                adv=adv, completion_ids=inputs["completion_ids"], mask=completion_mask, out=out, logp_old=logp_old,
                logp_after=None, logp_ref=inputs.get("ref_per_token_logps"), weight=weight,
                byte_cap=callback.inspect_bytes, prompt_ids=[list(key) for key in chosen]))
