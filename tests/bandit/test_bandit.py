"""The exact softmax bandit: configuration checks, reproducibility, exact bookkeeping."""

import warnings

import numpy as np
import pytest
import torch

from divviz.catalogue.aggregation import group_advantages
from divviz.bandit.grpo import run_bandit, run_bandits
from divviz.bandit.setting import BANDIT_PARAMS, BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective
from divviz.metrics import PI_OLD_BINS, mass_shift_by_bin
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import penalty
from divviz.catalogue.rollout_correction import RolloutCorrection

SMALL = dict(k=20, iterations=15)


def test_defaults_agree_between_params_and_dataclass():
    defaults = BanditConfig()
    for p in BANDIT_PARAMS:
        assert getattr(defaults, p.name) == p.default, p.name
    assert BanditConfig.make() == defaults


def test_group_advantages_like_trl():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = group_advantages(r, scale=True)
    assert adv[0].tolist() == pytest.approx([0.5 / (0.57735 + 1e-4)] * 1 + [-0.5 / (0.57735 + 1e-4)] * 2 +
                                            [0.5 / (0.57735 + 1e-4)], rel=1e-5)
    assert adv[1].abs().max() == 0  # a group with one reward carries no signal
    assert group_advantages(r, scale=False)[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_batch_scaled_advantages_like_trl():
    """TRL's scale_rewards="batch": r − its group's mean, over TRL's nanstd of every reward + 1e-4; per run in the
    bandit's (runs, groups, G); the older bools mean group and none."""
    from trl.trainer.utils import nanstd

    r = torch.rand(3, 4, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for run in range(3):  # nanstd's Bessel factor count / (count − 1) is a float32 tensor: 1e-8 relative
        want = (r[run] - r[run].mean(1, keepdim=True)) / (nanstd(r[run].flatten()) + 1e-4)
        assert torch.allclose(group_advantages(r, "batch")[run], want, rtol=1e-7, atol=0)
        assert np.allclose(group_advantages(r.numpy(), "batch")[run], want.numpy(), rtol=1e-7, atol=0)
    assert not torch.allclose(group_advantages(r, "batch"), group_advantages(r, "group"))
    assert torch.equal(group_advantages(r, True), group_advantages(r, "group"))
    assert torch.equal(group_advantages(r, False), group_advantages(r, "none"))
    with pytest.raises(DivvizInputError, match="unknown scale_rewards 'batches'; choose group, batch or none"):
        group_advantages(r, "batches")


def test_group_advantages_same_for_numpy_and_torch():
    r = torch.rand(5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-4)  # torch's std, as TRL
    assert torch.allclose(group_advantages(r, True), want, rtol=0, atol=1e-14)
    assert np.allclose(group_advantages(r.numpy(), True), want.numpy(), rtol=0, atol=1e-14)


@pytest.mark.parametrize("objective", [
    Objective(clip=clip_test("kl3", delta=0.02)),
    Objective(clip=clip_test("prob_tv", delta=0.05), dual_clip_c=1.2, aggregation="dr_grpo"),
    Objective(clip=clip_test("clip_higher"), penalty=penalty("k3", importance_weight=True), beta=0.2),
    Objective(clip=clip_test("kl1"), penalty=penalty("mirror", init_scale=0.3), beta=0.2),
    Objective(penalty=penalty("rkl_rf"), beta=0.5, aggregation="bnpo"),
], ids=lambda o: o.label)
def test_closed_form_run_equals_autograd_run(objective):
    """The fast step (closed-form gradient) and the training code's step (autograd through policy_loss)
    give the same run: same samples, same clip fractions, the same distribution at every iteration."""
    fast = run_bandit(BanditConfig.make(**SMALL, reward="graded", lr=4.0), objective)
    slow = run_bandit(BanditConfig.make(**SMALL, reward="graded", lr=4.0, autograd=True), objective)
    assert np.abs(fast.final - slow.final).max() < 1e-12
    assert np.abs(fast.final - fast.initial).max() > 0.05  # the policy moved
    for key in fast.history:
        assert np.allclose(fast.history[key], slow.history[key], rtol=0, atol=1e-12), key
    if objective.clip is not None:
        assert fast.history["clip_ratio/region_mean"].max() > 0


@pytest.mark.parametrize("autograd", [False, True])
def test_runs_side_by_side_are_each_run_alone(autograd):
    """`run_bandits` steps several objectives as one (R, K) array: each run is what it would be alone, to the
    last bits (same samples, same clip counts)."""
    objectives = [Objective(clip=clip_test("kl3", delta=0.02)), Objective(),
                  Objective(clip=clip_test("prob_tv", delta=0.05), dual_clip_c=1.2, aggregation="dr_grpo"),
                  Objective(clip=clip_test("clip_higher"), penalty=penalty("k3", importance_weight=True), beta=0.2)]
    cfg = BanditConfig.make(**SMALL, reward="graded", lr=4.0, autograd=autograd)
    together = run_bandits(cfg, objectives)
    for objective, run in zip(objectives, together):
        alone = run_bandit(cfg, objective)
        assert run.label == alone.label
        assert np.abs(run.final - alone.final).max() < 1e-14
        for key in run.history:
            assert np.allclose(run.history[key], alone.history[key], rtol=0, atol=1e-14), key
    assert together[0].history["reward"][0] == together[1].history["reward"][0]  # the same first samples


def test_reproducible_and_exact_bookkeeping():
    cfg = BanditConfig.make(**SMALL)
    objective = Objective(clip=clip_test("kl3"))
    a, b = run_bandit(cfg, objective), run_bandit(cfg, objective)
    assert np.array_equal(a.final, b.final) and a.history.keys() == b.history.keys()
    assert all(np.array_equal(a.history[k], b.history[k]) for k in a.history)
    assert a.final.sum() == pytest.approx(1.0, abs=1e-12)
    p = a.final
    assert a.history["entropy"][-1] == pytest.approx(-(p * np.log(p)).sum(), abs=1e-10)
    assert a.history["expected_reward"][-1] == pytest.approx(p @ a.rewards)
    assert a.history["top1_mass"][-1] == pytest.approx(p.max())
    assert a.initial_entropy == pytest.approx(-(a.initial * np.log(a.initial)).sum())
    # the KL of each update, summed over the run, against the distributions one iteration at a time
    shorter = run_bandit(BanditConfig.make(**{**SMALL, "iterations": SMALL["iterations"] - 1}), objective)
    q = shorter.final
    assert a.history["kl"][-1] == pytest.approx((q * (np.log(q) - np.log(p))).sum(), abs=1e-12)
    for key, values in a.history.items():
        assert np.isfinite(values).all(), key


def test_clipping_binds_and_measures_differ_at_the_defaults():
    cfg = BanditConfig.make()
    runs = {name: run_bandit(cfg, Objective(clip=clip_test(name))) for name in ("ratio", "clip_higher", "kl3")}
    for run in runs.values():
        assert run.history["clip_ratio/region_mean"].max() > 0
        assert run.history["expected_reward"][-1] > run.history["expected_reward"][0]
    assert not np.array_equal(runs["ratio"].final, runs["kl3"].final)
    # same start and seed: the first iteration's samples are shared, so the runs start together
    assert runs["ratio"].history["reward"][0] == runs["kl3"].history["reward"][0]


def test_mu_one_never_clips():
    # with one optimiser step the ratio is exactly 1 when the gradient is taken: no test can bind
    run = run_bandit(BanditConfig.make(mu=1, **SMALL), Objective(clip=clip_test("ratio", eps=0.01)))
    assert run.history["clip_ratio/region_mean"].max() == 0


def test_penalty_toward_start_slows_the_policy():
    cfg = BanditConfig.make(**SMALL)
    free = run_bandit(cfg, Objective(clip=clip_test("ratio")))
    drift = lambda run: np.abs(run.final - run.initial).sum()  # noqa: E731
    for name in ("k3", "prob_l2"):
        held = run_bandit(cfg, Objective(clip=clip_test("ratio"), penalty=penalty(name), beta=1.0))
        assert drift(held) < 0.8 * drift(free), name


def test_a_diverging_run_stops_with_a_clear_message():
    cfg = BanditConfig.make(lr=100, mu=16, iterations=50, k=1000, sharpness=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy overflow warnings on the way
        with pytest.raises(DivvizInputError, match=r"bandit diverged to NaN/inf at iteration 1 \(no clip \+ 1·k3\); "
                                                   r"lower lr \(now 100\)"):
            run_bandits(cfg, [Objective(clip=clip_test("ratio")),
                              Objective(penalty=penalty("k3"), beta=1.0)])


def test_mass_shift_by_bin_conserves_mass():
    before = np.array([0.005, 0.3, 0.5, 0.195])
    after = np.array([0.001, 0.2, 0.7, 0.099])
    shift = mass_shift_by_bin(before, after)
    assert len(shift) == len(PI_OLD_BINS) - 1
    assert shift.sum() == pytest.approx(0.0, abs=1e-12)
    assert shift[0] == pytest.approx(-0.004) and shift[5] == pytest.approx(0.2)  # 0.5 falls in [0.4, 0.6)


@pytest.mark.parametrize("autograd", [False, True])
def test_seeds_times_measures_are_each_run_alone(autograd):
    """Several seeds × several measures in one (R, K) array: each run equals that measure alone with that seed,
    even where π_0 and the rewards are drawn from the seed."""
    objectives = [Objective(clip=clip_test("kl3", delta=0.02)), Objective(clip=clip_test("ratio"))]
    cfg = BanditConfig.make(**SMALL, init="random", reward="random_correct", correct_percent=20, lr=1.0,
                            autograd=autograd, optimizer="adam" if autograd else "sgd")
    together = run_bandits(cfg, objectives, seeds=[3, 4, 9])
    assert [(run.seed, run.label) for run in together] == [(s, o.label) for s in (3, 4, 9) for o in objectives]
    for run in together:
        alone = run_bandit(BanditConfig.make(**{**cfg.to_dict(), "seed": run.seed}),
                           objectives[[o.label for o in objectives].index(run.label)])
        assert np.array_equal(run.initial, alone.initial) and np.array_equal(run.rewards, alone.rewards)
        assert np.abs(run.final - alone.final).max() < 1e-14
        for key in run.history:
            assert np.allclose(run.history[key], alone.history[key], rtol=0, atol=1e-14), key
    assert not np.array_equal(together[0].rewards, together[2].rewards)  # each seed draws its correct actions


def test_random_correct_rewards_a_share_of_the_actions():
    cfg = BanditConfig.make(k=200, reward="random_correct", correct_percent=15)
    from divviz.bandit.setting import reward_vector

    r = reward_vector(cfg, seed=7)
    assert r.sum() == 30 and set(np.unique(r)) == {0.0, 1.0}
    assert np.array_equal(r, reward_vector(cfg, seed=7)) and not np.array_equal(r, reward_vector(cfg, seed=8))


def test_adam_equals_torch_adam():
    from divviz.bandit.grpo import Adam

    rng = np.random.default_rng(0)
    theta = rng.normal(size=(3, 7))
    mine, param = Adam(theta.shape, lr=0.05), torch.nn.Parameter(torch.from_numpy(theta.copy()))
    theirs = torch.optim.Adam([param], lr=0.05)
    for _ in range(25):
        grad = rng.normal(size=theta.shape) * rng.uniform(0.01, 10)
        mine(theta, grad.copy())
        param.grad = torch.from_numpy(grad.copy())
        theirs.step()
        assert np.abs(theta - param.detach().numpy()).max() < 1e-12


def test_adam_in_the_bandit_equals_autograd_with_adam():
    objective = Objective(clip=clip_test("clip_higher"), penalty=penalty("k3"), beta=0.1)
    fast = run_bandit(BanditConfig.make(**SMALL, optimizer="adam", lr=0.05), objective)
    slow = run_bandit(BanditConfig.make(**SMALL, optimizer="adam", lr=0.05, autograd=True), objective)
    assert np.abs(fast.final - slow.final).max() < 1e-10 and np.abs(fast.final - fast.initial).max() > 0.05


def test_first_step_past_high_warns_at_a_large_step_only():
    """The share of A > 0 samples above u after the first optimiser step: none at the default lr (the clip acts
    from the second optimiser step on, as designed), a large share when one step leaps past the box."""
    objective = Objective(clip=clip_test("ratio"))
    calm = run_bandits(BanditConfig.make(), [objective], seeds=range(4))
    leap = run_bandits(BanditConfig.make(lr=5.0), [objective], seeds=range(4))
    early = lambda runs: np.mean([run.history["clip_ratio/first_step_past_high"][:10] for run in runs])  # noqa: E731
    assert early(calm) == 0 and early(leap) > 0.2
    assert run_bandit(BanditConfig.make(lr=5.0), Objective()).history["clip_ratio/first_step_past_high"].max() == 0


ROLLOUTS = [(RolloutCorrection(), False), (RolloutCorrection("token", 1.1), False),
            (RolloutCorrection("sequence", "0.9_1.1", rollout_is_batch_normalize=True), False),
            (RolloutCorrection(rollout_rs="token_k1,token_k3", rollout_rs_threshold="0.95_1.05,0.001"), False),
            (RolloutCorrection(), True)]
ROLLOUT_OBJECTIVES = [Objective(clip=clip_test("kl3", delta=0.02)), Objective(clip=clip_test("ratio"),
                                                                               off_policy_mask_threshold=0.01),
                      Objective(clip=clip_test("clip_higher"), penalty=penalty("k3"), beta=0.1, aggregation="bnpo"),
                      Objective(clip=clip_test("ratio"), aggregation="dr_grpo"), Objective(clip=clip_test("kl3"))]


def test_a_lagging_low_precision_sampler_with_corrections_is_autograds_run_and_each_run_alone():
    """A bfloat16 sampler two iterations behind, and per run no correction, token TIS, sequence IcePop with batch
    normalisation, two rejection options and bypass mode: the closed-form step equals autograd through policy_loss
    (weights, the rejection's mask and the off-policy mask's sampler included), every run equals itself alone, the
    corrections act (weights below 1, samples rejected) and the sampler is off the policy."""
    cfg = dict(**SMALL, reward="graded", lr=1.0, rollout_dtype="bfloat16", rollout_lag=2)
    fast = run_bandits(BanditConfig.make(**cfg), ROLLOUT_OBJECTIVES, [0, 1], ROLLOUTS)
    slow = run_bandits(BanditConfig.make(**cfg, autograd=True), ROLLOUT_OBJECTIVES, [0, 1], ROLLOUTS)
    for a, b in zip(fast, slow):
        assert np.abs(a.final - b.final).max() < 1e-12
        for key in a.history:
            np.testing.assert_allclose(a.history[key], b.history[key], rtol=0, atol=1e-12, err_msg=key)
    for i, (objective, rollout) in enumerate(zip(ROLLOUT_OBJECTIVES, ROLLOUTS)):
        alone = run_bandits(BanditConfig.make(**cfg, seed=1), [objective], None, [rollout])[0]
        assert np.abs(fast[len(ROLLOUTS) + i].final - alone.final).max() < 1e-14
    first = fast[:len(ROLLOUTS)]
    assert first[0].history["rollout_corr/kl"][0] < 1e-4 < first[0].history["rollout_corr/kl"][5]
    assert np.nanmin(first[1].history["rollout_corr/rollout_is_mean"]) < 1
    assert np.isnan(first[0].history["rollout_corr/rollout_is_mean"]).all()
    assert first[3].history["rollout_corr/rollout_rs_masked_fraction"].max() > 0
    assert not np.allclose(first[0].final, first[4].final)  # bypass mode changes the run


def test_without_a_sampler_corrections_change_nothing():
    """On-policy, the bandit's π_roll is π_old exactly: every weight is 1, nothing is rejected, and bypass mode divides
    by the same π_old, so each corrected run is the plain run to the last bit."""
    cfg = BanditConfig.make(**SMALL, reward="graded", lr=4.0)
    plain = run_bandits(cfg, ROLLOUT_OBJECTIVES[:1], [0])[0]
    for rollout in ROLLOUTS[1:]:
        run = run_bandits(cfg, ROLLOUT_OBJECTIVES[:1], [0], [rollout])[0]
        assert np.array_equal(run.final, plain.final), rollout
        assert (run.history["rollout_corr/kl"] == 0).all()


def test_the_sampler_draws_from_the_policy_of_lag_iterations_ago_rounded_to_its_precision():
    from divviz.bandit.rollout import BanditRollout
    from divviz.bandit.setting import softmax

    cfg = BanditConfig.make(**SMALL, rollout_dtype="bfloat16", rollout_lag=2)
    logits = [np.log(np.random.default_rng(i).dirichlet(np.ones(20)))[None] for i in range(5)]
    sampler = BanditRollout(cfg, [(RolloutCorrection(), False)], softmax(logits[0]))
    for it in range(1, 5):
        sampler.push(softmax(logits[it]))
        lagged = softmax(logits[max(it - 2, 0)])[0]
        rounded = torch.from_numpy(lagged).to(torch.bfloat16).double().numpy()
        logp, p = sampler.policy()
        assert np.array_equal(p, softmax(rounded)[1]) and not np.allclose(p, softmax(logits[max(it - 2, 0)])[1],
                                                                          rtol=0, atol=1e-6)


def test_bad_sampler_settings_are_refused():
    with pytest.raises(DivvizInputError, match="unknown rollout_dtype 'fp8'"):
        BanditConfig.make(rollout_dtype="fp8")
    with pytest.raises(DivvizInputError, match="rollout_lag"):
        BanditConfig.make(rollout_lag=65)
