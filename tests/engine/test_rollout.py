"""A sampler that is not the trained policy (`engine/sampler.py`: lower precision, some updates behind) and verl's
rollout corrections in the engine: the sampler holds what it should, a corrected step replays by hand through
`policy_loss`, the step inspector keeps π_roll, ρ and the rejected tokens, and every setting is checked."""

import json
import math

import pytest
import torch

from divviz import cli
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.rollout_correction import RolloutCorrection
from divviz.engine.config import RunConfig, config_label
from divviz.engine.grpo import grpo_step, make_batch, make_trainer
from divviz.engine.rollout import completion_logps
from divviz.engine.sampler import RolloutPolicy
from divviz.runs import store
from divviz.runs.train import train

SMALL = dict(prompts=4, group_size=4, max_new_tokens=6, inspect_prompts=4)


def test_the_sampler_holds_the_weights_of_lag_updates_ago():
    """After each update the sampler takes the weights handed over `lag` updates before (the start weights until
    then; with no lag, the new ones), exactly in the model's own precision and as their bfloat16 cast in bfloat16."""
    tr = make_trainer(RunConfig.make())
    for dtype, cast, lag in (("same", torch.float32, 2), ("bfloat16", torch.bfloat16, 2), ("bfloat16", torch.bfloat16, 0)):
        model = tr.model
        start = {k: v.clone() for k, v in model.state_dict().items()}
        sampler, seen = RolloutPolicy(model, dtype, lag=lag), [start]
        for update in range(4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * (update + 1))
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
            sampler.after_update(model)
            held = sampler.model.state_dict()
            expected = seen[max(update + 1 - lag, 0)]
            assert all(held[k].dtype == cast and torch.equal(held[k], expected[k].to(cast)) for k in held), update
        model.load_state_dict(start)


def test_a_bfloat16_sampler_samples_from_its_own_log_probs():
    """The rollout's log-probs are the bfloat16 copy's (the same completions scored by it again agree to bf16
    rounding) and differ from the float32 policy's: a real mismatch, of the size vLLM's bf16 gives (|Δ log π| ≪ 1)."""
    tr = make_trainer(RunConfig.make(rollout_dtype="bfloat16", **SMALL))
    assert tr.sampler is not None and next(tr.sampler.model.parameters()).dtype == torch.bfloat16
    batch = make_batch(tr, 0)
    mask = batch.rollout.completion_mask > 0
    with torch.no_grad():
        by_sampler = completion_logps(tr.sampler.model, batch.rollout, 1.0, tr.sampling()[1])
        by_policy = completion_logps(tr.model, batch.rollout, 1.0, tr.autocast)
    gap = (batch.rollout.logp - by_policy)[mask].abs()
    assert (batch.rollout.logp - by_sampler)[mask].abs().mean() < gap.mean() / 3
    assert 1e-4 < gap.mean() < 0.1


def test_on_policy_runs_make_no_sampler_and_measure_no_mismatch():
    """Without a mismatch the trained model samples itself; a correction there finds π_roll = π_old up to the KV
    cache's rounding: weights 1 and nothing rejected."""
    assert make_trainer(RunConfig.make(**SMALL)).sampler is None
    plain = grpo_step(make_trainer(RunConfig.make(**SMALL)), 0).metrics
    assert not any(k.startswith("rollout_corr/") for k in plain)
    corrected = grpo_step(make_trainer(RunConfig.make(rollout_is="token", rollout_rs="token_k3",
                                                      rollout_rs_threshold="1e-6", **SMALL)), 0).metrics
    assert abs(corrected["rollout_corr/k3_kl"]) < 1e-9 and corrected["rollout_corr/rollout_rs_masked_fraction"] == 0
    assert corrected["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-5)
    # The loss is the same up to those weights: each token's term −w·r·A moves by |w − 1|·|A|, and the aggregation
    # averages them, so |Δloss| ≤ max|w − 1| · max|A| with |A| < 2 in a group of 4 scaled by its std. A relative
    # tolerance would not do: the KV cache's float32 rounding differs between CPUs, and the loss can be near 0.
    off_one = max(corrected["rollout_corr/rollout_is_max"] - 1, 1 - corrected["rollout_corr/rollout_is_min"])
    assert off_one < 1e-4
    assert corrected["loss"] == pytest.approx(plain["loss"], rel=0, abs=2 * off_one + 1e-7)


CORRECTED = dict(rollout_lag=1, rollout_is="token", rollout_is_threshold=1.2, rollout_rs="token_k1",
                 rollout_rs_threshold="0.8_1.25", lr=0.01, mu=1, **SMALL)


def test_a_corrected_step_replays_by_hand():
    """Step 2 of a run whose sampler is one update behind, with token TIS (u = 1.2) and token_k1 rejection: its loss
    is policy_loss with verl's weights and mask of π_old against the sampler's log-probs, and its record keeps π_roll,
    ρ (the weight) and state 5 exactly on the rejected tokens."""
    cfg = RunConfig.make(**CORRECTED)
    tr = make_trainer(cfg)
    grpo_step(tr, 0)
    result = grpo_step(tr, 1)
    replay = make_trainer(cfg)
    grpo_step(replay, 0)
    batch = make_batch(replay, 1)
    mask = batch.rollout.completion_mask
    with torch.no_grad():
        logp_old = completion_logps(replay.model, batch.rollout, cfg.temperature, replay.autocast)
    corrected = RolloutCorrection("token", 1.2, rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25").apply(
        logp_old, batch.rollout.logp, mask)
    out = replay.objective(logp_old.clone().requires_grad_(), logp_old, batch.adv, corrected.mask,
                           weight=corrected.weight, max_completion_length=cfg.max_new_tokens)
    m = result.metrics
    assert m["loss"] == pytest.approx(float(out.loss), rel=1e-5)
    assert 0 < m["rollout_corr/rollout_rs_masked_fraction"] < 1 and m["rollout_corr/k3_kl"] > 1e-3
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] > 0  # TIS truncated some weights
    for key, value in corrected.metrics.items():
        assert m[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
    completions = [c for g in result.inspected["groups"] for c in g["completions"]]
    assert len(completions) == 16
    for row, completion in enumerate(completions):
        t, n = completion["tokens"], int(mask[row].sum())
        rejected = (corrected.mask[row, :n] == 0).tolist()
        assert [s == 5 for s in t["state"]] == rejected
        assert t["pi_roll"] == pytest.approx(batch.rollout.logp[row, :n].exp().tolist(), rel=1e-6)
        assert [r for r, gone in zip(t["rho"], rejected) if not gone] == pytest.approx(
            [w for w, gone in zip(corrected.weight[row, :n].tolist(), rejected) if not gone], rel=1e-6, abs=1e-9)
        assert all((r is None) == gone for key in ("ratio", "rho", "loss") for r, gone in zip(t[key], rejected))
        assert all(w == 0 for w, gone in zip(t["weight"], rejected) if gone)


def test_bypass_mode_takes_pi_old_from_the_sampler():
    """verl's bypass mode: the loss's π_old is π_roll (the record's π_old is its π_roll), and the metrics measure the
    sampler against the policy it lags."""
    result = grpo_step(make_trainer(RunConfig.make(rollout_dtype="bfloat16", bypass_mode=True, **SMALL)), 0)
    for g in result.inspected["groups"]:
        for c in g["completions"]:
            assert c["tokens"]["pi_old"] == pytest.approx(c["tokens"]["pi_roll"], rel=1e-6)
    assert result.metrics["rollout_corr/k3_kl"] > 0


@pytest.mark.parametrize("settings, says", [
    (dict(rollout_dtype="int8"), "unknown rollout_dtype 'int8'"),
    (dict(rollout_dtype=["bfloat16"]), "unknown rollout_dtype"),
    (dict(bypass_mode="yes"), "bypass_mode must be true or false"),
    (dict(rollout_is="token", rollout_is_threshold=[2.0]), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_batch_normalize="1"), "rollout_is_batch_normalize must be true or false"),
    (dict(rollout_lag=-1), "rollout_lag"),
    (dict(rollout_lag=math.nan), "rollout_lag"),
    (dict(rollout_is="chunk"), "unknown rollout_is 'chunk'"),
    (dict(rollout_is="token", rollout_is_threshold="2_1"), "0 < l < u"),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="<script>"), "rejection threshold"),
    (dict(rollout_rs="seq_mean_k4", rollout_rs_threshold="0.1"), "unknown rejection option"),
    (dict(rollout_is="token", bypass_mode=True), "in bypass mode"),
    (dict(backend="trl", rollout_lag=2), "train with the divviz backend"),
    (dict(backend="trl", rollout_rs="token_k2", rollout_rs_threshold="0.1"), "train with the divviz backend"),
])
def test_bad_rollout_settings_are_refused_in_one_line(settings, says):
    pytest.importorskip("trl") if settings.get("backend") == "trl" else None
    with pytest.raises(DivvizInputError, match=says) as err:
        RunConfig.make(**settings)
    assert "\n" not in str(err.value)


def test_labels_say_how_the_rollout_differs_and_older_configs_still_open(tmp_path):
    cfg = RunConfig.make(rollout_dtype="bfloat16", rollout_lag=2, rollout_is="sequence",
                         rollout_is_threshold="0.5_2", rollout_rs="token_k1, token_k1", rollout_rs_threshold=1.5)
    assert cfg.label == "ratio ε=0.2 · sampler bfloat16, lag 2 · IcePop sequence [0.5, 2] RS token_k1 1.5"
    assert cfg.rollout_rs == "token_k1" and cfg.rollout_is_threshold == "0.5_2"
    assert RunConfig.make(rollout_is="token", rollout_is_threshold="0.123456789_2.5").rollout_is_threshold == \
        "0.123456789_2.5"  # kept exactly, not to a label's digits
    assert RunConfig.make(bypass_mode=True, rollout_lag=1).label == "ratio ε=0.2 · sampler lag 1 · bypass"
    older = {k: v for k, v in RunConfig.make().to_dict().items() if not k.startswith(("rollout", "bypass"))}
    assert RunConfig.from_dict(older) == RunConfig.make() and config_label(older) == "ratio ε=0.2"


def test_the_cli_trains_a_mismatched_corrected_run(tmp_path, capsys):
    """`divviz train` with the rollout flags writes them to config.json and verl's metrics to every step."""
    code = cli.main(["train", "--steps", "2", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "6",
                     "--rollout-dtype", "bfloat16", "--rollout-lag", "1", "--rollout-is", "sequence",
                     "--rollout-is-threshold", "0.5_2", "--rollout-rs", "seq_mean_k3", "--rollout-rs-threshold",
                     "0.05", "--runs-dir", str(tmp_path), "--now"])
    assert code == 0
    (run,) = store.list_runs(tmp_path)
    config = json.loads((run.folder / "config.json").read_text())
    assert (config["rollout_dtype"], config["rollout_lag"], config["rollout_is"]) == ("bfloat16", 1, "sequence")
    rows = store.read_metrics(run.folder)
    assert all(math.isfinite(r["rollout_corr/chi2_seq"]) and "rollout_corr/rollout_rs_masked_fraction" in r
               for r in rows)
    assert cli.main(["train", "--rollout-is", "token", "--bypass-mode", "--runs-dir", str(tmp_path)]) == 2
    assert "in bypass mode" in capsys.readouterr().err


def test_a_lagging_run_trains_to_the_end(tmp_path):
    folder = train(RunConfig.make(steps=4, rollout_lag=2, rollout_is="token", **SMALL), tmp_path)
    rows = store.read_metrics(folder)
    assert store.read_run(folder).state == "done" and len(rows) == 4
    assert rows[0]["rollout_corr/k3_kl"] < 1e-9 < rows[3]["rollout_corr/k3_kl"]  # step 1 samples with the start weights
