"""divviz inside TRL (`divviz.trl`): DivvizGRPOTrainer against TRL 1.16's own `_compute_loss` on the same batch
(loss, gradients, clip and surrogate metrics, TRL's masks and vLLM's correction), its refusals, and the step
inspector's record of a micro-batch. Real TRL runs are in `test_trl_runs.py`."""

import copy

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from divviz.catalogue import theory  # noqa: E402
from divviz.catalogue.divergences import clip_test  # noqa: E402
from divviz.engine.completions import check_record  # noqa: E402
from divviz.losses import Objective  # noqa: E402
from divviz.catalogue.params import DivvizInputError  # noqa: E402
from divviz.catalogue.penalties import penalty  # noqa: E402
from divviz.catalogue.rollout_correction import rollout_weights  # noqa: E402
from divviz.catalogue.surrogates import surrogate  # noqa: E402
from divviz.trl import DivvizGRPOTrainer, DivvizRunCallback, trl_args_for  # noqa: E402
from divviz.trl.trainer import REWARDS  # noqa: E402
from tests.trl_support import TASK, config, load_policy  # noqa: E402

TRL_METRICS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
               "clip_ratio/high_max", "entropy")


@pytest.fixture(scope="module")
def policy():
    return load_policy()


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
    """ATR-GRPO's KL3 test at δ is TRL's box with ε_low = 1 − l_δ, ε_high = u_δ − 1 (docs/theory.md §1.3)."""
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
                            objective=Objective(clip=clip_test("ratio"), aggregation="bnpo", off_policy_mask_threshold=mask))
        assert_same(loss_and_grads(ours, batch), loss_and_grads(theirs, batch), exact=True)


@pytest.mark.parametrize("settings, objective", [
    (dict(loss_type="bnpo", off_policy_mask_threshold=0.05),
     Objective(clip=clip_test("ratio"), aggregation="bnpo", off_policy_mask_threshold=0.05)),
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
     Objective(clip=clip_test("clip_higher", eps_high=0.28), off_policy_mask_threshold=0.01), TRL_METRICS),
], ids=["cispo", "sapo", "vespo", "luspo", "gspo", "sapo-sequence", "delta", "delta-below-u", "off-policy-mask"])
def test_trls_own_surrogates_levels_and_caps_equal_trl(tmp_path, policy, batch, settings, objective, metrics):
    """TRL's cispo, sapo, vespo and luspo losses, GSPO's sequence level, INTELLECT-2's delta and DeepSeek-V3.2's
    off-policy sequence mask, through TRL's own
    `_compute_loss` and through DivvizGRPOTrainer with the catalogue's surrogate, level or ratio cap: loss, every
    gradient and the metrics TRL logs for that loss agree to float32 rounding. (With δ < u TRL counts a capped
    A > 0 token as not masked high, so only its low clip metric is compared.)"""
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
    (dict(loss_type="grpo", off_policy_mask_threshold=0.1), Objective(clip=clip_test("kl3"), off_policy_mask_threshold=0.2),
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
