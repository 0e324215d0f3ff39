"""Mini-batches as TRL takes them: divviz's engine with K mini-batches and μ passes against TRL 1.16's GRPOTrainer
loop with `steps_per_generation` = K and `num_iterations` = μ on the same rollouts, the same start weights and the
same split (TRL's shuffle given the engine's permutation): every token's clip state at the last pass and the clip
fraction of every optimiser step agree (but for ratios within `MARGIN` of a bound, which float rounding on another
CPU may put on either side)."""

import copy

import pytest
import torch

pytest.importorskip("trl")

import trl.trainer.grpo_trainer as grpo_trainer  # noqa: E402
from datasets import Dataset  # noqa: E402

import divviz.trl.trainer as divviz_trainer  # noqa: E402
from divviz.engine.config import RunConfig  # noqa: E402
from divviz.engine.grpo import make_batch, make_trainer, update  # noqa: E402
from divviz.engine.minibatch import minibatch_rows  # noqa: E402
from divviz.trl import DivvizGRPOTrainer  # noqa: E402
from tests.trl_support import TASK, config  # noqa: E402

K, MU, PROMPTS, G = 2, 2, 2, 4
MARGIN = 1e-5  # a ratio this close to a bound may land on either side on another CPU: such tokens are not compared


def test_minibatch_clip_states_equal_trls_steps_per_generation(tmp_path, monkeypatch):
    cfg = RunConfig.make(task=TASK.name, prompts=PROMPTS, group_size=G, mu=MU, minibatches=K, lr=3e-2, seed=5,
                         max_new_tokens=6)
    ours = make_trainer(cfg)
    start = copy.deepcopy(ours.model)
    batch = make_batch(ours, 0)
    done = update(ours, batch, ours.objective, None, 0)
    parts = minibatch_rows(PROMPTS * G, K, cfg.seed * 104_729 + 0)
    order = torch.cat(parts)
    rollout = batch.rollout
    generation = {"prompt_ids": rollout.prompt_ids, "prompt_mask": rollout.prompt_mask,
                  "completion_ids": rollout.completion_ids, "completion_mask": rollout.completion_mask.long(),
                  "advantages": batch.adv, "old_per_token_logps": done.logp_old,
                  "num_items_in_batch": rollout.completion_mask.sum()}

    seen = []  # (micro-batch index into `order`, its LossOutput) of every optimiser step TRL takes
    real_loss = divviz_trainer.finite_loss

    def watched_loss(*args, **kwargs):
        out = real_loss(*args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(divviz_trainer, "finite_loss", watched_loss)
    monkeypatch.setattr(grpo_trainer, "shuffle_sequence_dict",  # TRL's one shuffle, given the engine's permutation
                        lambda batch: {k: v[order] if isinstance(v, torch.Tensor) and v.ndim else v
                                       for k, v in batch.items()})

    class SameRollouts(DivvizGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            return dict(generation)

    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, PROMPTS)] * 4)
    theirs = SameRollouts(model=start, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=config(tmp_path, per_device_train_batch_size=PROMPTS * G // K, steps_per_generation=K,
                                      num_iterations=MU, num_generations=G, max_steps=K * MU, learning_rate=cfg.lr,
                                      lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=cfg.max_grad_norm,
                                      max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
                                      loss_type="grpo", shuffle_dataset=False),
                          train_dataset=data, processing_class=ours.tokenizer, objective=ours.objective)
    theirs.train()

    assert len(seen) == K * MU
    lower, upper = ours.objective.clip.bounds()
    near = lambda out: ((out.ratio - lower).abs() < MARGIN) | ((out.ratio - upper).abs() < MARGIN)  # noqa: E731
    for position, out in enumerate(seen, start=1):
        rows = parts[(position - 1) % K]
        tokens = float(rollout.completion_mask[rows].sum())
        fraction = float(out.masked_region.sum()) / tokens
        borderline = float((near(out) & (rollout.completion_mask[rows] > 0)).sum()) / tokens
        assert abs(fraction - done.fractions[f"clip_ratio/region_mean_by_minibatch/{position}"]) <= borderline + 1e-9
    states, unsure = torch.zeros_like(done.out.clip_state()), torch.zeros_like(rollout.completion_mask, dtype=torch.bool)
    for k, out in enumerate(seen[-K:]):
        states[parts[k]], unsure[parts[k]] = out.clip_state(), near(out)
    sure = (rollout.completion_mask > 0) & ~unsure & ~near(done.out)
    assert sure.float().sum() >= 0.9 * rollout.completion_mask.sum()  # the margin leaves out few tokens
    assert torch.equal(states[sure], done.out.clip_state()[sure])
    assert 0 < float(done.out.masked_region.float().mean()) < 1  # some tokens clip, not all
