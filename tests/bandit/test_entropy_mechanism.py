"""Why entropy moves: the first-order entropy change −Cov_π(log π, Δz) (Cui et al. 2025) against the observed one, on
the bandit and in the engine; the bandit's attribution by clip state (Park et al. 2025); the token covariance by clip
state; and the random-reward control, seeded and blind to what was sampled."""

import copy

import numpy as np
import pytest
import torch

from divviz.bandit.entropy import ATTRIBUTION, attribute, predicted_change, sample_shares
from divviz.bandit.grpo import run_bandits
from divviz.bandit.setting import BanditConfig, softmax
from divviz.catalogue.divergences import CLIP_TESTS, clip_test
from divviz.catalogue.rollout_correction import RolloutCorrection
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_batch, make_trainer
from divviz.engine.step_metrics import measured_rows
from divviz.engine.rollout import completion_logits
from divviz.engine.tasks import coin_rewards
from divviz.losses import Objective, policy_loss
from divviz.metrics import entropy_change, entropy_covariance

STATES = ("entropy/from_inside", "entropy/from_masked_low", "entropy/from_masked_high")


@pytest.mark.parametrize("name", sorted(CLIP_TESTS))
def test_bandit_prediction_converges_to_the_observed_change_as_lr_shrinks(name):
    """ΔH observed / ΔH predicted → 1 as lr → 0, for every clip test (μ = 2: the second optimiser step clips)."""
    gaps = []
    for lr in (0.4, 0.04, 0.004):
        run = run_bandits(BanditConfig.make(k=30, lr=lr, mu=2, iterations=4, reward="graded"),
                          [Objective(clip=clip_test(name))], seeds=range(3))
        observed = np.concatenate([r.history["entropy/change"] for r in run])
        predicted = np.concatenate([r.history["entropy/change_predicted"] for r in run])
        assert np.all(np.abs(predicted) > 0)
        gaps.append(np.abs(observed / predicted - 1).max())
    assert gaps[2] < gaps[1] < gaps[0] and gaps[2] < 0.01, gaps


@pytest.mark.parametrize("objective", [Objective(clip=clip_test("ratio")), Objective(clip=clip_test("kl3")),
                                       Objective(clip=clip_test("clip_higher"), dual_clip_c=3.0)],
                         ids=lambda o: o.label)
def test_bandit_shares_by_state_add_up_to_the_predicted_change_of_a_plain_step(objective):
    """SGD with μ = 1 and a sampler two iterations behind taken as π_old (verl's bypass mode: so the one step is
    off-policy and clips): the first-order shares of the samples, summed over the clip states, equal
    −Cov_π(log π, Δθ) of the whole step."""
    cfg = BanditConfig.make(k=40, lr=2.0, mu=1, iterations=6, rollout_lag=2, reward="graded", attribution=True)
    for run in run_bandits(cfg, [objective], seeds=range(2), rollouts=[(RolloutCorrection(), True)]):
        total = sum(run.history[key] for key in STATES)
        np.testing.assert_allclose(total, run.history["entropy/change_predicted"], rtol=1e-9, atol=1e-15)
        assert run.history["entropy/would_masked_low"].any() or run.history["entropy/would_masked_high"].any()
        assert not run.history["entropy/from_masked_low"].any()  # a masked sample's gradient is 0: no penalty here


def test_each_samples_share_is_its_own_step_and_a_masked_one_would_have_had_the_plain_slope():
    """The per-sample share equals the predicted change of that sample's step alone (the covariance formula on the
    whole logits), and the shares of all samples add up to the predicted change of their summed step."""
    rng = np.random.default_rng(4)
    logp, p = softmax(rng.normal(size=(2, 12)))
    actions = rng.integers(0, 12, size=(2, 5))
    flat = (actions + 12 * np.arange(2)[:, None])[..., None]
    slope = rng.normal(size=(2, 5, 1))
    shares = sample_shares(logp, p, flat, lr=0.1) * slope
    steps = np.zeros((2, 5, 12))
    for r in range(2):
        for i in range(5):
            steps[r, i] = -0.1 * slope[r, i, 0] * (np.eye(12)[actions[r, i]] - p[r])
            assert shares[r, i, 0] == pytest.approx(predicted_change(logp[r:r + 1], p[r:r + 1], steps[r, i][None])[0],
                                                    rel=1e-9)
    low, high = rng.random((2, 5, 1)) < 0.3, rng.random((2, 5, 1)) < 0.3
    high &= ~low
    parts = dict(zip(ATTRIBUTION, attribute(logp, p, flat, slope, 2 * slope, low, high, lr=0.1).T))
    total = parts["entropy/from_inside"] + parts["entropy/from_masked_low"] + parts["entropy/from_masked_high"]
    np.testing.assert_allclose(total, predicted_change(logp, p, steps.sum(axis=1)), rtol=1e-12)
    np.testing.assert_allclose(parts["entropy/from_inside"], (shares * ~(low | high)).sum(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_allclose(parts["entropy/would_masked_low"], 2 * (shares * low).sum(axis=(1, 2)), rtol=1e-12)
    np.testing.assert_allclose(parts["entropy/would_masked_high"], 2 * (shares * high).sum(axis=(1, 2)), rtol=1e-12)


def test_entropy_change_is_the_distributions_own_and_the_prediction_is_the_covariance():
    """`metrics.entropy_change` against torch's Categorical entropy and the covariance written out with numpy."""
    g = torch.Generator().manual_seed(0)
    before = torch.randn(3, 4, 9, generator=g)
    after = before + 0.01 * torch.randn(3, 4, 9, generator=g)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    out = entropy_change(before, after, mask)
    h = lambda z: torch.distributions.Categorical(logits=z.double()).entropy()  # noqa: E731
    assert out["entropy/change"] == pytest.approx(float(((h(after) - h(before)) * mask).sum() / mask.sum()), abs=1e-11)
    p, lp = torch.softmax(before.double(), -1).numpy(), torch.log_softmax(before.double(), -1).numpy()
    dz = (after.double() - before.double()).numpy()
    cov = (p * lp * dz).sum(-1) - (p * lp).sum(-1) * (p * dz).sum(-1)
    assert out["entropy/change_predicted"] == pytest.approx((-cov * mask.numpy()).sum() / mask.numpy().sum(), rel=1e-12)
    assert out["entropy/change_predicted"] == pytest.approx(out["entropy/change"], rel=0.05)  # a small step: first order


def test_covariance_by_state_adds_up_to_the_batch_covariance():
    g = torch.Generator().manual_seed(1)
    logp_old = -torch.rand(6, 5, generator=g) * 3
    logp_new = logp_old + 0.4 * torch.randn(6, 5, generator=g)
    adv = torch.randn(6, generator=g)
    mask = (torch.rand(6, 5, generator=g) < 0.8).float()
    out = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip_test("ratio"), dual_clip_c=1.5))
    parts = entropy_covariance(logp_old, adv, mask, out.clip_state(), dual=True)
    assert set(parts) == {"entropy/cov_inside", "entropy/cov_masked_low", "entropy/cov_masked_high", "entropy/cov_dual"}
    assert parts["entropy/cov_masked_low"] != 0 and parts["entropy/cov_masked_high"] != 0
    keep = mask > 0
    lp, a = logp_old[keep].double().numpy(), adv[:, None].expand_as(logp_old)[keep].double().numpy()
    assert sum(parts.values()) == pytest.approx(np.cov(lp, a, bias=True)[0, 1], rel=1e-12)


def test_the_engines_entropy_change_is_the_models_before_and_after(monkeypatch):
    """Train one step, then recompute the watched completions' entropies by hand from a copy of the model taken
    before the step and from the model after it (the batch is seeded by the step, so it is sampled again)."""
    cfg = RunConfig.make(task="add", prompts=4, group_size=4, max_new_tokens=6, mu=2, lr=1e-2, steps=1)
    trainer = make_trainer(cfg)
    before_model = copy.deepcopy(trainer.model)
    metrics = grpo_step(trainer, 0).metrics
    twin = copy.copy(trainer)
    twin.model = before_model
    batch = make_batch(twin, 0)
    rows = measured_rows(cfg, len(batch.rewards), 0, trainer.device).entropy
    seen = batch.rollout.rows(rows)
    with torch.no_grad():
        z0 = completion_logits(before_model, seen, cfg.temperature, trainer.autocast)
        z1 = completion_logits(trainer.model, seen, cfg.temperature, trainer.autocast)
    h = lambda z: torch.distributions.Categorical(logits=z.double()).entropy()  # noqa: E731
    mask = seen.completion_mask
    assert metrics["entropy/change"] == pytest.approx(float(((h(z1) - h(z0)) * mask).sum() / mask.sum()), rel=1e-5,
                                                      abs=1e-9)
    assert metrics["entropy/change"] != 0
    assert {"entropy/cov_inside", "entropy/cov_masked_low", "entropy/cov_masked_high"} <= set(metrics)


def test_random_rewards_are_seeded_and_blind_to_the_completions(monkeypatch):
    assert coin_rewards(3, 7, 64) == coin_rewards(3, 7, 64) != coin_rewards(3, 8, 64)
    assert set(coin_rewards(3, 7, 64)) == {0.0, 1.0}
    assert 0.3 < np.mean([coin_rewards(s, 0, 100) for s in range(10)]) < 0.7
    cfg = RunConfig.make(task="add", reward="random", prompts=2, group_size=4, max_new_tokens=4, steps=1)
    trainer = make_trainer(cfg)
    monkeypatch.setattr(type(trainer.task), "reward", lambda *a: pytest.fail("the task's checker was asked"))
    batch = make_batch(trainer, 5)
    assert batch.rewards.tolist() == coin_rewards(cfg.seed, 5, 8)
    other = copy.copy(trainer)
    other.model = copy.deepcopy(trainer.model)
    torch.nn.init.normal_(next(other.model.parameters()))  # another policy writes other completions
    again = make_batch(other, 5)
    assert again.texts != batch.texts and again.rewards.tolist() == batch.rewards.tolist()
    with pytest.raises(Exception, match="unknown reward"):
        RunConfig.make(reward="coin")


def test_bandit_coins_are_per_sample_seeded_and_shared_by_the_measures():
    cfg = BanditConfig.make(k=20, reward="coin", iterations=30)
    runs = run_bandits(cfg, [Objective(clip=clip_test("ratio")), Objective(clip=clip_test("kl3"))], seeds=[0, 1])
    assert np.array_equal(runs[0].history["reward"][:1], runs[1].history["reward"][:1])  # same seed, same first coins
    assert not np.array_equal(runs[0].history["reward"], runs[2].history["reward"])  # another seed, other coins
    assert 0.35 < np.mean([r.history["reward"] for r in runs]) < 0.65
    again = run_bandits(cfg, [Objective(clip=clip_test("ratio"))], seeds=[0])[0]
    assert np.array_equal(again.history["reward"], runs[0].history["reward"])


def test_the_attribution_is_computed_when_asked_and_changes_nothing_else():
    objectives = [Objective(clip=clip_test("ratio")), Objective(clip=clip_test("kl3"))]
    plain = run_bandits(BanditConfig.make(k=20, iterations=5), objectives, seeds=[0, 1])
    attributed = run_bandits(BanditConfig.make(k=20, iterations=5, attribution=True), objectives, seeds=[0, 1])
    for a, b in zip(plain, attributed):
        assert set(b.history) - set(a.history) == set(ATTRIBUTION)
        assert all(np.array_equal(a.history[k], b.history[k]) for k in a.history)
    with pytest.raises(Exception, match="attribution"):
        BanditConfig.make(attribution="perhaps")
