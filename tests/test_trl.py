"""divviz inside TRL (`divviz.trl`): DivvizGRPOTrainer against TRL 1.16's own `_compute_loss` on the same batch
(loss, gradients, clip metrics), its refusals, real TRL runs on the built-in model (CLI, callback on a plain
GRPOTrainer, SIGKILL), and two processes under `accelerate launch`."""

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from divviz import cli, theory  # noqa: E402
from divviz.aggregation import group_advantages  # noqa: E402
from divviz.divergences import clip_test  # noqa: E402
from divviz.engine import store  # noqa: E402
from divviz.engine.completions import check_record  # noqa: E402
from divviz.engine.model import builtin_policy  # noqa: E402
from divviz.engine.tasks import get_task  # noqa: E402
from divviz.losses import Objective  # noqa: E402
from divviz.params import DivvizInputError  # noqa: E402
from divviz.penalties import penalty  # noqa: E402
from divviz.rollout_correction import rollout_weights  # noqa: E402
from divviz.surrogates import surrogate  # noqa: E402
from divviz.trl import DivvizGRPOTrainer, DivvizRunCallback, trl_args_for  # noqa: E402
from divviz.trl.trainer import REWARDS  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "app.py"
TASK = get_task("reverse")
TRL_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
               "clip_ratio/high_max", "entropy")


@pytest.fixture(scope="module")
def policy():
    return builtin_policy(TASK)


def config(tmp_path, **settings) -> GRPOConfig:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                bf16=False, use_cpu=True, gradient_checkpointing=False, report_to="none", save_strategy="no",
                disable_tqdm=True, seed=0, learning_rate=1e-3)
    return GRPOConfig(**{**base, **settings})


def make_trainer(cls, policy, args, **kwargs):
    model, tokenizer = policy
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, 8)])
    trainer = cls(model=copy.deepcopy(model), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                  args=args, train_dataset=data, processing_class=tokenizer, **kwargs)
    trainer.current_gradient_accumulation_steps = 2  # set by TRL's loop; 2 puts its normalisers to the test
    trainer.model.train()
    return trainer


def same_batch(policy) -> dict:
    """8 completions of 2 prompts with padding, advantages, and old/ref log-probs scattered around the current ones
    so that ratios fall on both sides of every bound (seeded)."""
    model, tokenizer = policy
    g = torch.Generator().manual_seed(0)
    prompts = tokenizer([p for p, _ in TASK.batch(1, 2)], padding=True, return_tensors="pt")
    prompt_ids = prompts["input_ids"].repeat_interleave(4, dim=0)
    prompt_mask = prompts["attention_mask"].repeat_interleave(4, dim=0)
    completion_ids = torch.randint(3, len(tokenizer), (8, 6), generator=g)
    lengths = torch.tensor([6, 3, 5, 6, 2, 6, 4, 1])
    completion_mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    probe = make_trainer(GRPOTrainer, policy, config("/tmp/divviz-probe"))
    with torch.no_grad():
        logp, _, _ = probe._get_per_token_logps_and_entropies(
            probe.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), 6)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.randn(8, generator=g),
            "old_per_token_logps": logp + 0.35 * torch.randn(8, 6, generator=g),
            "ref_per_token_logps": logp + 0.2 * torch.randn(8, 6, generator=g),
            "num_items_in_batch": completion_mask.sum()}


@pytest.fixture(scope="module")
def batch(policy):
    return same_batch(policy)


def loss_and_grads(trainer, inputs):
    loss = trainer._compute_loss(trainer.model, dict(inputs))
    loss.backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    return loss.detach(), grads, metrics


def assert_same(ours, theirs, metrics=TRL_METRICS, exact=False, gradient=1e-6):
    """Loss and metrics to 1e-6 relative, the gradient (all parameters as one vector) to `gradient` of its norm
    (float32); with `exact`, the loss and every gradient bit for bit."""
    (loss, grads, logged), (want_loss, want_grads, want_logged) = ours, theirs
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-9)
    assert grads.keys() == want_grads.keys()
    got, want = (torch.cat([g[name].ravel() for name in sorted(g)]) for g in (grads, want_grads))
    assert (got - want).norm() <= gradient * want.norm()
    assert not exact or (torch.equal(got, want) and torch.equal(loss, want_loss))
    for key in metrics:
        assert logged[key] == pytest.approx(want_logged[key], rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_clip_higher_equals_trl(tmp_path, policy, batch, loss_type, beta):
    """The same batch through TRL's GRPOTrainer (ε_low 0.2, ε_high 0.28, TRL's k3 penalty importance-weighted by
    default) and through DivvizGRPOTrainer with clip_higher and k3(importance_weight=1): loss, every gradient and
    TRL's clip metrics agree to float32 rounding; without the penalty, bit for bit (with it, divviz's k3 is
    expm1(y) − y where TRL writes exp(y) − y − 1)."""
    theirs = make_trainer(GRPOTrainer, policy, config(tmp_path, loss_type=loss_type, epsilon_high=0.28, beta=beta))
    objective = Objective(clip=clip_test("clip_higher", eps_low=0.2, eps_high=0.28),
                          penalty=penalty("k3", importance_weight=True) if beta else None, beta=beta,
                          aggregation=loss_type)
    ours = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type=loss_type), objective=objective)
    want, got = loss_and_grads(theirs, batch), loss_and_grads(ours, batch)
    assert 0 < want[2]["clip_ratio/region_mean"] < 1  # the batch clips some tokens and not others
    assert_same(got, want, TRL_METRICS + (("kl",) if beta else ()), exact=beta == 0)


def test_kl3_equals_trl_box_on_its_interval(tmp_path, policy, batch):
    """ATR-GRPO's KL3 test at δ is TRL's box with ε_low = 1 − l_δ, ε_high = u_δ − 1 (theory.md §1.3)."""
    delta = 0.05
    lower, upper = theory.kl3_bounds(delta)
    theirs = make_trainer(GRPOTrainer, policy, config(tmp_path, loss_type="dapo", epsilon=1 - lower,
                                                      epsilon_high=upper - 1))
    ours = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type="dapo"),
                        objective=Objective(clip=clip_test("kl3", delta=delta), aggregation="dapo"))
    want, got = loss_and_grads(theirs, batch), loss_and_grads(ours, batch)
    assert 0 < want[2]["clip_ratio/region_mean"] < 1
    assert_same(got, want)
    # divviz's own per-token metrics: k1/k2/k3 of the current ratio, and k3 itself is kl3's measure
    assert got[2]["divviz/measure_mean"] == pytest.approx(got[2]["kl/k3"], rel=1e-6)
    assert got[2]["divviz/grad_masked_mean"] == pytest.approx(got[2]["clip_ratio/region_mean"])
    assert got[2]["divviz/outside_mean"] >= got[2]["clip_ratio/region_mean"]


def test_dual_clip_and_trl_weights_enter_the_loss(tmp_path, policy, batch):
    """What TRL has no counterpart for still trains: dual-clip caps the loss of A < 0 tokens (it changes the loss
    here). TRL's top-entropy token mask and off-policy sequence mask are honoured, bit for bit (TRL's own masks as
    the policy term's weight)."""
    base = Objective(clip=clip_test("kl3", delta=0.02), aggregation="grpo")
    plain = loss_and_grads(make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type="grpo"),
                                        objective=base), batch)
    capped = loss_and_grads(make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type="grpo"),
                                         objective=Objective(clip=base.clip, dual_clip_c=1.05, aggregation="grpo")),
                            batch)
    assert capped[0] != plain[0]
    for weighting, mask in (({"top_entropy_quantile": 0.5}, None), ({"off_policy_mask_threshold": 0.01}, 0.01)):
        theirs = make_trainer(GRPOTrainer, policy, config(tmp_path, loss_type="bnpo", **weighting))
        ours = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type="bnpo", **weighting),
                            objective=Objective(clip=clip_test("ratio"), aggregation="bnpo", off_policy_mask=mask))
        assert_same(loss_and_grads(ours, batch), loss_and_grads(theirs, batch), exact=True)


@pytest.mark.parametrize("settings, objective", [
    (dict(loss_type="bnpo", off_policy_mask_threshold=0.05),
     Objective(clip=clip_test("ratio"), aggregation="bnpo", off_policy_mask=0.05)),
    (dict(loss_type="vespo"), Objective(surrogate=surrogate("vespo"), aggregation="dapo")),
], ids=["ppo-with-opsm", "vespo"])
def test_vllms_importance_sampling_correction_is_trls(tmp_path, policy, batch, settings, objective):
    """With vLLM beside it, TRL hands `_compute_loss` the sampler's log-probs and its importance-sampling ratio
    π_old/π_vllm (here divviz's token TIS of them, which is TRL's token_truncate): TRL weighs the policy term by the
    ratio, puts it into VESPO's sequence ratio instead, and judges the off-policy mask against the sampler.
    DivvizGRPOTrainer does each the same, to float32 rounding, and the record's ρ is what multiplied the policy term."""
    mask = batch["completion_mask"].float()
    sampling = batch["old_per_token_logps"] + 0.3 * torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    ratio, _ = rollout_weights(batch["old_per_token_logps"] - sampling, mask, "token", 1.5)
    ratio = ratio + (1 - mask)  # 1 on padding, as TRL's ratio exp((old − sampling)·mask) is there
    inputs = {**batch, "sampling_per_token_logps": sampling, "importance_sampling_ratio": ratio}
    callback = DivvizRunCallback(tmp_path, inspect_prompts=2)
    theirs = make_trainer(GRPOTrainer, policy, config(tmp_path, **settings))
    ours = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type=settings["loss_type"]),
                        objective=objective, callbacks=[callback])
    for trainer in (theirs, ours):  # as if vLLM sampled: set after construction, which would start a vLLM server
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    want = loss_and_grads(theirs, inputs)
    # VESPO's φ: TRL sums log w and log ratio apart, divviz their sum per token (the same numbers, float32's order)
    assert_same(loss_and_grads(ours, {**inputs, REWARDS: torch.zeros(8)}), want, ("entropy",),
                gradient=1e-5 if objective.surrogate else 1e-6)
    without = make_trainer(GRPOTrainer, policy, config(tmp_path, **settings))
    assert want[0] != loss_and_grads(without, batch)[0]  # the correction changed TRL's loss
    rho = [c["tokens"]["rho"] for g in check_record(callback._inspected, "record")["groups"] for c in g["completions"]]
    if objective.surrogate:  # VESPO took the ratio into W: nothing multiplies its policy term
        assert rho == [None] * 8
    else:
        rho = [r for completion in rho for r in completion]
        assert len(rho) == int(mask.sum()) and min(rho) >= 0 and max(rho) <= 1.5 and len(set(rho)) > 2


GSPO_BOX = dict(eps_low=0.03, eps_high=0.04)  # the batch's sequence ratios fall on both sides of it


@pytest.mark.parametrize("settings, objective, metrics", [
    (dict(loss_type="cispo", epsilon_high=1.1), Objective(surrogate=surrogate("cispo", hi=1.1), aggregation="dapo"),
     ("cispo_clip_ratio", "entropy")),
    (dict(loss_type="sapo", sapo_temperature_neg=2.0), Objective(surrogate=surrogate("sapo", tau_neg=2.0)),
     ("entropy",)),
    (dict(loss_type="vespo"), Objective(surrogate=surrogate("vespo"), aggregation="dapo"),
     ("vespo/phi_seq_mean", "entropy")),
    (dict(loss_type="luspo", epsilon_high=0.28),
     Objective(clip=clip_test("clip_higher", eps_high=0.28), aggregation="luspo"), TRL_METRICS),
    (dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.03, epsilon_high=0.04),
     Objective(clip=clip_test("clip_higher", **GSPO_BOX), importance_sampling_level="sequence"), ("entropy",)),
    (dict(loss_type="sapo", importance_sampling_level="sequence"),
     Objective(surrogate=surrogate("sapo"), importance_sampling_level="sequence"), ("entropy",)),
    (dict(loss_type="bnpo", delta=1.5, epsilon_high=0.28),
     Objective(clip=clip_test("clip_higher", eps_high=0.28), ratio_cap=1.5, aggregation="bnpo"), TRL_METRICS),
    (dict(loss_type="grpo", delta=1.1, epsilon_high=0.28),
     Objective(clip=clip_test("clip_higher", eps_high=0.28), ratio_cap=1.1), ("clip_ratio/low_mean", "entropy")),
    (dict(loss_type="grpo", off_policy_mask_threshold=0.01, epsilon_high=0.28),
     Objective(clip=clip_test("clip_higher", eps_high=0.28), off_policy_mask=0.01), TRL_METRICS),
], ids=["cispo", "sapo", "vespo", "luspo", "gspo", "sapo-sequence", "delta", "delta-below-u", "off-policy-mask"])
def test_trls_own_surrogates_levels_and_caps_equal_trl(tmp_path, policy, batch, settings, objective, metrics):
    """TRL's cispo, sapo, vespo and luspo losses, GSPO's sequence level, INTELLECT-2's delta and DeepSeek-V3.2's
    off-policy sequence mask, through TRL's own
    `_compute_loss` and through DivvizGRPOTrainer with the catalogue's surrogate, level or ratio cap: loss, every
    gradient and the metrics TRL logs for that loss agree to float32 rounding. (With δ < u TRL counts a capped
    A > 0 token as not clipped high, so only its low clip metric is compared.)"""
    theirs = make_trainer(GRPOTrainer, policy, config(tmp_path, **settings))
    ours = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type=settings["loss_type"]),
                        objective=objective)
    want, got = loss_and_grads(theirs, batch), loss_and_grads(ours, batch)
    # at the sequence level TRL's gradient reaches a token through the row's mean and divviz's directly (GSPO-token):
    # the same value, summed in another order in float32
    assert_same(got, want, metrics, gradient=1e-5 if objective.importance_sampling_level == "sequence" else 1e-6)
    assert want[0] != loss_and_grads(make_trainer(GRPOTrainer, policy, config(tmp_path, loss_type="grpo")), batch)[0]
    if "cispo_clip_ratio" in metrics:
        assert 0 < want[2]["cispo_clip_ratio"] < 1
    if "off_policy_mask_threshold" in settings:  # it drops some completion of this batch
        unmasked = {k: v for k, v in settings.items() if k != "off_policy_mask_threshold"}
        assert want[0] != loss_and_grads(make_trainer(GRPOTrainer, policy, config(tmp_path, **unmasked)), batch)[0]


@pytest.mark.parametrize("settings, objective, says", [
    (dict(loss_type="dapo"), Objective(clip=clip_test("kl3")), "set loss_type='grpo'"),
    (dict(loss_type="cispo"), Objective(clip=clip_test("kl3")), "whose loss_type is 'grpo'"),
    (dict(loss_type="grpo"), Objective(surrogate=surrogate("cispo"), aggregation="dapo"), "set loss_type='cispo'"),
    (dict(loss_type="cispo"), Objective(surrogate=surrogate("cispo")), "set the objective's aggregation to 'dapo'"),
    (dict(loss_type="cispo", epsilon_high=4.0), Objective(surrogate=surrogate("cispo"), aggregation="dapo"),
     "drop epsilon_high"),
    (dict(loss_type="bnpo"), Objective(aggregation="token_sum"), "TRL has no loss_type for it"),
    (dict(loss_type="grpo", epsilon=0.3), Objective(clip=clip_test("kl3")), "drop epsilon"),
    (dict(loss_type="grpo", epsilon_high=0.28), Objective(clip=clip_test("ratio")), "drop epsilon_high"),
    (dict(loss_type="grpo", delta=2.0), Objective(clip=clip_test("kl3")), "or drop delta"),
    (dict(loss_type="grpo", off_policy_mask_threshold=0.1), Objective(clip=clip_test("kl3"), off_policy_mask=0.2),
     "contradicts the objective's off-policy mask 0.2"),
    (dict(loss_type="grpo", beta=0.04), Objective(clip=clip_test("kl3")), "drop beta"),
    (dict(loss_type="grpo", beta=0.04), Objective(penalty=penalty("ufkl"), beta=0.04), "drop beta"),
    (dict(loss_type="grpo", use_bias_correction_kl=False),
     Objective(penalty=penalty("k3", importance_weight=True), beta=0.1), "use_bias_correction_kl=False"),
    (dict(loss_type="grpo", importance_sampling_level="sequence"), Objective(), "drop importance_sampling_level"),
    (dict(loss_type="grpo", entropy_coef=0.01), Objective(), "entropy bonus"),
])
def test_a_contradicting_trl_option_is_refused_before_training(tmp_path, settings, objective, says):
    with pytest.raises(DivvizInputError, match=says.replace("(", r"\(").replace(")", r"\)")):
        trl_args_for(objective, config(tmp_path, **settings))


def test_agreeing_options_are_accepted_and_beta_loads_the_reference(tmp_path):
    same_box = trl_args_for(Objective(clip=clip_test("clip_higher", eps_low=0.2, eps_high=0.28), aggregation="dapo"),
                            config(tmp_path, loss_type="dapo", epsilon_high=0.28))
    assert same_box.beta == 0.0
    k3 = Objective(clip=clip_test("kl3"), penalty=penalty("k3", importance_weight=True), beta=0.04)
    assert trl_args_for(k3, config(tmp_path, loss_type="grpo")).beta == 0.04  # TRL then loads the reference model
    rpg = Objective(penalty=penalty("ufkl"), beta=0.1)  # a penalty to π_old needs no reference model
    assert trl_args_for(rpg, config(tmp_path, loss_type="grpo")).beta == 0.0
    gbmpo = Objective(penalty=penalty("ufkl"), beta=0.1, second_penalty=penalty("prob_l2"), second_beta=0.3)
    assert trl_args_for(gbmpo, config(tmp_path, loss_type="grpo")).beta == 0.3  # the second one reads π_ref


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_the_step_inspectors_record_of_a_trl_micro_batch(tmp_path, policy, batch, loss_type):
    """DivvizGRPOTrainer's record of a micro-batch holds its completions grouped by prompt, TRL's own numbers for
    each token, no π after the update, and weights with TRL's normalisers: Σ weight·ℓ is the loss it returns (with
    two accumulation steps, and dapo's token count)."""
    callback = DivvizRunCallback(tmp_path, inspect_prompts=5)
    objective = Objective(clip=clip_test("kl3", delta=0.05), penalty=penalty("k3"), beta=0.04, aggregation=loss_type)
    trainer = make_trainer(DivvizGRPOTrainer, policy, config(tmp_path, loss_type=loss_type, beta=0.04),
                           objective=objective, callbacks=[callback])
    rewards = torch.linspace(-1, 2, 8)
    loss = trainer._compute_loss(trainer.model, {**batch, REWARDS: rewards})
    record = check_record(callback._inspected, "record")
    groups = record["groups"]
    assert len(groups) == 2 and [len(g["completions"]) for g in groups] == [4, 4]  # both prompts, 4 completions each
    total, lengths = 0.0, batch["completion_mask"].sum(1).tolist()
    for row, completion in enumerate(c for g in groups for c in g["completions"]):
        tokens, n = completion["tokens"], lengths[row]
        assert tokens["id"] == batch["completion_ids"][row, :n].tolist()
        assert completion["reward"] == pytest.approx(float(rewards[row]), rel=1e-6)
        assert completion["advantage"] == pytest.approx(float(batch["advantages"][row]), rel=1e-6)
        assert tokens["pi_old"] == pytest.approx(batch["old_per_token_logps"][row, :n].exp().tolist(), rel=1e-6)
        assert tokens["pi_ref"] == pytest.approx(batch["ref_per_token_logps"][row, :n].exp().tolist(), rel=1e-6)
        assert tokens["pi_new"] is None and len(tokens["measure"]) == n and 0 < sum(tokens["weight"])
        total += sum(w * l for w, l in zip(tokens["weight"], tokens["loss"]))
    assert set(s for g in groups for c in g["completions"] for s in c["tokens"]["state"]) > {0}  # some are clipped
    assert total == pytest.approx(float(loss), rel=1e-5)
    assert groups[0]["prompt"] == TASK.batch(1, 2)[0][0]


def train_cli(tmp_path, *extra) -> dict:
    code = cli.main(["train", "--backend", "trl", "--steps", "2", "--prompts", "2", "--group-size", "4",
                     "--max-new-tokens", "6", "--runs-dir", str(tmp_path), *extra])
    assert code == 0
    (run,) = store.list_runs(tmp_path)
    return run


@pytest.mark.parametrize("extra", [
    ("--measure", "kl3", "--param", "delta=0.05"),
    ("--measure", "kl3", "--penalty", "k3", "--penalty-param", "importance_weight=1", "--beta", "0.04",
     "--dual-clip", "3", "--aggregation", "dapo", "--scale-rewards", "batch"),
])
def test_real_trl_steps_on_the_builtin_model(tmp_path, capsys, extra):
    run = train_cli(tmp_path, *extra, "--mu", "2")
    assert run.state == "done" and run.config["backend"] == "trl"
    rows = store.read_metrics(run.folder)
    assert [r["step"] for r in rows] == [1, 2] and [r["trl/global_step"] for r in rows] == [2, 4]
    for key in ("reward", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "kl/k3", "divviz/measure_mean",
                "divviz/outside_last_mean", "rewards/accuracy/mean"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert ("kl" in rows[0]) == ("--penalty" in extra)
    tokens = store.read_tokens(run.folder, 2)
    assert tokens is not None and ((tokens["pi_old"] > 0) & (tokens["pi_old"] <= 1)).all()
    assert store.completion_steps(run.folder) == [1, 2]  # the step inspector's records, as the engine writes them
    answers = dict(get_task("reverse").batch(seed=1, n=2))  # step 2's prompts (seed 0): prompt → answer
    groups = store.read_completions(run.folder, 2)["groups"]
    for group in groups:
        assert len(group["completions"]) == 4 and all(c["tokens"]["pi_new"] is None for c in group["completions"])
        for completion in group["completions"]:  # TRL's reward of the completion's text
            assert completion["reward"] == TASK.reward(group["prompt"], answers[group["prompt"]], completion["text"])
    # TRL's advantages (group std, or with --scale-rewards batch the std of all 8 rewards) are divviz's
    rewards = torch.tensor([[c["reward"] for c in group["completions"]] for group in groups], dtype=torch.float64)
    want = group_advantages(rewards, run.config["scale_rewards"])
    assert run.config["scale_rewards"] == ("batch" if "batch" in extra else "group")
    assert [c["advantage"] for g in groups for c in g["completions"]] == pytest.approx(want.flatten().tolist(),
                                                                                      rel=1e-5, abs=1e-6)
    capsys.readouterr()
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["state"] == "done" and listed["clip"] == "kl3"


def test_the_callback_writes_a_plain_grpo_trainer_run(tmp_path, policy):
    """A plain TRL GRPOTrainer with DivvizRunCallback: metrics per GRPO step, TRL's box as the run's objective."""
    model, tokenizer = policy
    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in TASK.batch(0, 8)])
    reward = lambda prompts, completions, answer, **_: [TASK.reward(p, a, c) for p, c, a in  # noqa: E731
                                                         zip(prompts, completions, answer)]
    callback = DivvizRunCallback(tmp_path / "runs", task="reverse")
    GRPOTrainer(model=copy.deepcopy(model), reward_funcs=reward, train_dataset=data, processing_class=tokenizer,
                args=config(tmp_path, max_steps=4, num_iterations=2, logging_steps=1, epsilon_high=0.28),
                callbacks=[callback]).train()
    (run,) = store.list_runs(tmp_path / "runs")
    assert run.state == "done" and run.step == 2 == run.steps
    assert run.config["clip"] == "clip_higher" and run.config["clip_params"] == {"eps_low": 0.2, "eps_high": 0.28}
    assert [r["step"] for r in store.read_metrics(run.folder)] == [1, 2]
    assert store.read_tokens(run.folder, 2) is None  # TRL's own loss hands over no per-token facts


def test_a_failing_trl_run_reads_failed_with_its_message(tmp_path, policy):
    def broken(completions, **_):
        raise RuntimeError("reward server unreachable")

    model, tokenizer = policy
    callback = DivvizRunCallback(tmp_path)
    trainer = DivvizGRPOTrainer(model=copy.deepcopy(model), reward_funcs=broken, processing_class=tokenizer,
                                train_dataset=Dataset.from_list([{"prompt": "rev:abc="}] * 8),
                                args=config(tmp_path, max_steps=2), callbacks=[callback],
                                objective=Objective(clip=clip_test("kl3"), aggregation="dapo"))
    with pytest.raises(RuntimeError):
        trainer.train()
    (run,) = store.list_runs(tmp_path)
    assert run.state == "failed" and "reward server unreachable" in run.message


def test_a_sigkilled_trl_run_reads_interrupted_and_a_sigtermed_one_stopped(tmp_path):
    runs = {}
    for sig in (signal.SIGKILL, signal.SIGTERM):
        root = tmp_path / sig.name
        proc = subprocess.Popen([sys.executable, "-m", "divviz", "train", "--backend", "trl", "--steps", "500",
                                 "--prompts", "2", "--group-size", "4", "--runs-dir", str(root)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and not any(run.step >= 1 for run in store.list_runs(root)):
            time.sleep(0.2)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        (runs[sig],) = store.list_runs(root)
    assert runs[signal.SIGKILL].state == "interrupted"
    assert runs[signal.SIGTERM].state == "stopped" and runs[signal.SIGTERM].step >= 1


def test_two_processes_under_accelerate_write_one_gathered_run(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 … --device cpu`: two gloo processes each train their half
    of the completions; the main one writes the one run folder. Gathered: the per-token facts of the last inner step
    come from both processes, and the logged share outside the region at that step is the share over both."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
         "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "divviz", "train", "--backend", "trl",
         "--device", "cpu", "--steps", "2", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "6",
         "--mu", "2", "--lr", "0.05", "--measure", "kl3", "--param", "delta=0.001", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "process 1 of 2 trained" in done.stderr
    (run,) = store.list_runs(tmp_path)
    assert run.state == "done" and run.config["backend"] == "trl"
    last = store.read_metrics(run.folder)[-1]
    tokens = store.read_tokens(run.folder, 2)
    assert set(np.unique(tokens["rank"])) == {0, 1}
    outside = tokens["measure"] > 0.001  # every token of the step is kept at this size (≤ 128 per process)
    assert last["divviz/outside_last_mean"] == pytest.approx(outside.mean(), abs=1e-6)
    assert math.isfinite(last["reward"])


def test_the_runs_page_lists_and_overlays_a_trl_run_with_an_engine_run(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from divviz.engine.config import RunConfig
    from divviz.engine.train import train

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    trl_run = train_cli(tmp_path, "--measure", "kl3")
    train(RunConfig.make(steps=2, prompts=2, group_size=4, max_new_tokens=6, clip="ratio"), tmp_path)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert trl_run.name in set(table["run"]) and set(table["state"]) == {"done"}
    assert "kl3 δ=0.05 (TRL)" in set(table["objective"])
    assert len(at.get("plotly_chart")) == 6  # both runs overlaid: five metric panels and the mass by π_old
    at.switch_page("app_pages/step_inspector.py").run()
    at.sidebar.selectbox(key="inspector:run").set_value(trl_run.name).run()  # the TRL run's completions, explained
    assert not at.exception, at.exception
    assert any("π after the update is not known" in c.value for c in at.caption) and not at.warning
    assert any("This token's loss" in h.value for h in at.subheader)
    assert len(at.get("plotly_chart")) == 1  # the token on the clipping regions, at its last inner step


def test_the_training_lab_trains_with_the_trl_backend(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update({"m": "kl3", "backend": "trl", "steps": "2", "prompts": "2", "group_size": "4"})
    at.run()
    at.switch_page("app_pages/training_lab.py").run()
    assert not at.exception, at.exception
    next(b for b in at.button if b.label == "Start").click().run()
    (name,) = at.session_state["lab_runs"]
    deadline = time.time() + 180
    while time.time() < deadline and store.read_run(tmp_path / name).state in ("queued", "running"):
        time.sleep(0.5)
    run = store.read_run(tmp_path / name)
    assert run.state == "done", run.message
    at.run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == 7  # five metric panels, the mass by π_old and the token scatter
