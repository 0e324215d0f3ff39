"""divviz against verl 0.9.1's own code, through reference vectors (tests/data/verl_policy_losses.json, written by
scripts/verl_reference.py with verl installed; importing verl here would need ray): the vanilla PPO policy loss
with its dual-clip, its aggregation modes and its k1/k2/k3 penalty estimators, loss and gradient in float64."""

import json
import math
from pathlib import Path

import pytest
import torch

from divviz.catalogue.aggregation import aggregate
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective, policy_loss
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import penalty
from divviz.catalogue.rollout_correction import (SAFETY_BOUND, RolloutCorrection, offpolicy_metrics, rejection_mask,
                                                 rejection_statistic, rollout_weights, rs_options)
from divviz.catalogue.surrogates import surrogate

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "verl_policy_losses.json").read_text())
F64 = torch.float64
ULPS = 1e-15  # a float64 value computed here against one verl wrote on another CPU: exp/log may round a few ulps apart
# verl's loss_agg_mode → divviz's aggregation (TRL's loss_type), where divviz has it; seq-mean-token-sum-norm
# divides by the padded length T, Dr. GRPO's max_completion_length
AGGREGATIONS = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo",
                "token-sum": "token_sum", "seq-mean-token-sum": "luspo"}
PER_SEQUENCE = ("seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum")


def tolerance(key: str) -> dict:
    """Rounding, except where verl's seq-mean-token-mean adds 1e-8 to each row's token count, which it keeps with a
    float mask (with the bool mask that verl's ppo_loss passes, the count is an integer and the 1e-8 vanishes in
    float32): there each row's mean differs by ~1e-8 of itself (sapo always aggregates so; geo_mean divides by the
    row length + 1e-8 likewise, and divviz by the row length)."""
    if ("seq-mean-token-mean" in key or key.startswith("sapo/")) and "mask_float64" in key:
        return {"rel": 0.0, "abs": 1e-8}
    if key.startswith("geo_mean/") and "mask_float64" in key:  # its row length + 1e-8 (see above)
        return {"rel": 1e-6, "abs": 1e-12}
    return {"rel": 1e-12, "abs": 1e-15}


def tensors(case: dict, *names) -> list[torch.Tensor]:
    return [torch.tensor(case[name], dtype=F64) for name in names]


VANILLA = [key for key, case in DATA["policy_loss"].items() if case["loss_mode"] == "vanilla"
           and case["loss_agg_mode"] in AGGREGATIONS
           and not (case["batch"] == "wide" and case["loss_agg_mode"] in PER_SEQUENCE)]  # see below


@pytest.mark.parametrize("key", VANILLA)
def test_verls_vanilla_policy_loss_is_divvizs_box_with_dual_clip(key):
    """verl's `compute_policy_loss_vanilla` (box [1 − clip_ratio_low, 1 + clip_ratio_high], dual-clip cap
    clip_ratio_c, always on) equals policy_loss with clip_higher and dual_clip_c: the loss, its gradient in log π,
    pg_clipfrac (divviz's clip_ratio/region) and pg_clipfrac_lower (divviz's dual-clip share), with and without
    verl's rollout importance weights (policy_loss's `weight`). The 'wide' batch
    has an empty row, which verl's per-sequence modes do not count and divviz's grpo/dr_grpo/luspo do, so it is
    tested with the token modes only."""
    case = DATA["policy_loss"][key]
    batch = DATA["batches"][case["batch"]]
    logp_old, logp_new, adv, mask = tensors(batch, "old_log_prob", "log_prob", "advantages", "response_mask")
    config = case["config"]
    logp_new.requires_grad_()
    weight = tensors(batch, "rollout_is_weights")[0] if case["rollout_is_weights"] is not None else None
    box = clip_test("clip_higher", eps_low=config["clip_ratio_low"], eps_high=config["clip_ratio_high"])
    objective = Objective(clip=box, dual_clip_c=config["clip_ratio_c"], aggregation=AGGREGATIONS[case["loss_agg_mode"]])
    out = policy_loss(logp_new, logp_old, adv, mask, objective, max_completion_length=mask.shape[1], weight=weight)
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    close = tolerance(key)
    assert out.loss.item() == pytest.approx(case["loss"], **close)
    torch.testing.assert_close(grad, torch.tensor(case["grad_log_prob"], dtype=F64), rtol=close["rel"] * 100,
                               atol=close["abs"])
    share = lambda x: float((x.double() * mask).sum() / mask.sum())  # noqa: E731
    assert share(out.masked_region) == pytest.approx(case["metrics"]["actor/pg_clipfrac"], rel=1e-6)
    assert share(out.dual_clip) == pytest.approx(case["metrics"]["actor/pg_clipfrac_lower"], rel=1e-6, abs=1e-9)
    assert 0 < case["metrics"]["actor/pg_clipfrac"] < 1


BYPASS = {"reinforce_token_tis": lambda rc: Objective(surrogate=surrogate("cispo", lo=0.0, hi=rc["rollout_is_threshold"])),
          "reinforce_token_icepop": lambda rc: Objective(surrogate=surrogate(
              "icepop", **dict(zip(("lo", "hi"), map(float, rc["rollout_is_threshold"].split("_")))))),
          "reinforce_no_is": lambda rc: Objective(surrogate=surrogate("gpg")),
          "ppo_clip_no_is": lambda rc: Objective(clip=clip_test("ratio"), dual_clip_c=3.0),
          "default": lambda rc: Objective(clip=clip_test("ratio"), dual_clip_c=3.0)}
BYPASS_CASES = [key for key, case in DATA["policy_loss"].items() if case["loss_mode"] == "bypass_mode"
                and case["variant"] in BYPASS and case["loss_agg_mode"] in AGGREGATIONS
                and not (case["batch"] == "wide" and case["loss_agg_mode"] in PER_SEQUENCE)]


@pytest.mark.parametrize("key", BYPASS_CASES)
def test_verls_bypass_mode_rollout_corrections_are_divviz_surrogates(key):
    """verl's bypass mode (π_old is the rollout policy, its IS weights taken from the ratio itself): REINFORCE with
    token TIS min(w, u) is cispo with lo = 0, with token IcePop w·[l ≤ w ≤ u] the icepop surrogate, without IS gpg;
    PPO's clip with the sequence IS weights (there for its metrics only) is verl's vanilla loss."""
    case = DATA["policy_loss"][key]
    batch = DATA["batches"][case["batch"]]
    logp_old, logp_new, adv, mask = tensors(batch, "old_log_prob", "log_prob", "advantages", "response_mask")
    logp_new.requires_grad_()
    objective = BYPASS[case["variant"]](case["config"]["policy_loss"]["rollout_correction"])
    objective = Objective(**{**{f: getattr(objective, f) for f in ("clip", "surrogate", "dual_clip_c")},
                             "aggregation": AGGREGATIONS[case["loss_agg_mode"]]})
    out = objective(logp_new, logp_old, adv, mask, max_completion_length=mask.shape[1])
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    close = tolerance(key)
    assert out.loss.item() == pytest.approx(case["loss"], **close)
    torch.testing.assert_close(grad, torch.tensor(case["grad_log_prob"], dtype=F64), rtol=max(close["rel"] * 100, 1e-10),
                               atol=close["abs"])


@pytest.mark.parametrize("key", [k for k in DATA["agg_loss"] if k.split("/")[1] in AGGREGATIONS and "local" in k
                                 and k.startswith("grpo/")])
def test_verls_aggregation_modes_are_divvizs(key):
    case = DATA["agg_loss"][key]
    loss_mat, = tensors(case, "loss_mat")
    mask, = tensors(DATA["batches"][case["batch"]], "response_mask")
    loss_mat.requires_grad_()
    value = aggregate(loss_mat, mask, AGGREGATIONS[case["loss_agg_mode"]], mask.shape[1])
    (grad,) = torch.autograd.grad(value, loss_mat)
    close = tolerance(key)
    assert value.item() == pytest.approx(case["value"], **close)
    torch.testing.assert_close(grad, torch.tensor(case["grad_loss_mat"], dtype=F64), rtol=close["rel"],
                               atol=close["abs"])


@pytest.mark.parametrize("verl_mode, ours", [("k1", "k1"), ("kl", "k1"), ("k2", "k2"), ("mse", "k2"),
                                             ("low_var_kl", "k3"), ("k3", "k3"), ("abs", "abs"), ("k1+", "k1+"),
                                             ("kl+", "k1+"), ("k2+", "k2+"), ("mse+", "k2+"), ("k3+", "k3+"),
                                             ("low_var_kl+", "k3+"), ("abs+", "abs+")])
@pytest.mark.parametrize("batch", ["grpo", "wide"])
def test_verls_kl_penalties_are_divvizs_reference_penalties(verl_mode, ours, batch):
    """`kl_penalty(log_prob, ref_log_prob, mode)` equals divviz's penalty of the same estimator in GRPO's direction
    (r = π_ref/π_θ), value and gradient in log π_θ (away from verl's ±10 clamp of k3, which these inputs do not
    reach), and so does the penalty's closed-form slope (the bandit's). A mode ending in "+" is the estimator with
    straight_through: its value, k2's gradient."""
    case = DATA["kl_penalty"][f"{verl_mode}/{batch}"]
    logp, ref = tensors(case, "logprob", "ref_logprob")
    logp.requires_grad_()
    measure = penalty(ours.rstrip("+"), straight_through=ours.endswith("+"))
    value = measure.loss_term(logp, logp.detach(), ref)
    (grad,) = torch.autograd.grad(value.sum(), logp)
    torch.testing.assert_close(value.detach(), torch.tensor(case["value"], dtype=F64), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.as_tensor(measure.slope(*(x.detach().numpy() for x in (logp, logp, ref)))), grad,
                               rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, torch.tensor(case["grad_logprob"], dtype=F64), rtol=1e-12, atol=1e-14)


def verl_objective(case: dict) -> Objective:
    """The divviz objective of one of verl's surrogate losses, from the case's config. verl's eps are ratio-box edges
    for cispo and gspo, probability or binary-KL thresholds for dppo_tv/kl, and log-ratio edges for geo_mean; sapo and
    geo_mean ignore loss_agg_mode (per-sequence mean, and mean over all completions)."""
    config, mode = case["config"], case["loss_mode"]
    low, high = config["clip_ratio_low"], config["clip_ratio_high"]
    aggregation = AGGREGATIONS[case["loss_agg_mode"]]
    if mode == "cispo":
        return Objective(surrogate=surrogate("cispo", lo=1 - low, hi=1 + high), aggregation=aggregation)
    if mode == "sapo":
        return Objective(surrogate=surrogate("sapo", tau_pos=config["tau_pos"], tau_neg=config["tau_neg"]))
    if mode == "gpg":
        return Objective(surrogate=surrogate("gpg"), aggregation=aggregation)
    if mode == "gspo":
        return Objective(clip=clip_test("clip_higher", eps_low=low, eps_high=high), importance_sampling_level="sequence",
                         aggregation=aggregation)
    if mode == "geo_mean":
        box = clip_test("clip_higher", eps_low=-math.expm1(-low), eps_high=math.expm1(high))
        return Objective(clip=box, surrogate=surrogate("geo_mean"))
    options = config["policy_loss"]
    if mode == "dro":
        return Objective(surrogate=surrogate("dro", beta=options["dro_beta"]), aggregation=aggregation)
    if mode == "kl_cov":
        return Objective(surrogate=surrogate("kl_cov", ratio=options["kl_cov_ratio"], coef=options["ppo_kl_coef"]),
                         aggregation=aggregation)
    if mode == "clip_cov":
        band = surrogate("clip_cov", ratio=options["clip_cov_ratio"], lb=options["clip_cov_lb"], ub=options["clip_cov_ub"])
        return Objective(clip=clip_test("clip_higher", eps_low=low, eps_high=high), surrogate=band,
                         aggregation=aggregation)
    return Objective(clip=clip_test(mode, delta_low=low, delta_high=high), surrogate=surrogate("dppo", c=config["clip_ratio_c"]),
                     aggregation=aggregation)


SURROGATE_CASES = [key for key, case in DATA["policy_loss"].items()
                   if case["loss_mode"] in ("cispo", "sapo", "gpg", "gspo", "geo_mean", "dppo_tv", "dppo_kl", "dro",
                                            "kl_cov", "clip_cov")
                   and not (case["batch"] == "wide" and case["loss_mode"] != "geo_mean"
                            and (case["loss_agg_mode"] in PER_SEQUENCE or case["loss_mode"] == "sapo"))]


@pytest.mark.parametrize("key", SURROGATE_CASES)
def test_verls_surrogate_losses_are_divvizs(key):
    """verl's cispo, sapo, gpg, gspo, geo_mean (GMPO), dppo_tv, dppo_kl, dro, kl_cov and clip_cov losses equal
    policy_loss with the matching surrogate, level and clip test (`verl_objective`), under every aggregation, with and
    without verl's rollout importance weights (policy_loss's `weight`; geo_mean's is their geometric mean): loss and gradient in
    log π; where verl logs clip fractions, the tokens they count (dppo: the tokens the test masks; geo_mean: outside
    the box by the sign of A; cispo: the weight off its box; clip_cov: the tokens it drew, with torch's global
    generator seeded as verl's script seeded it)."""
    case = DATA["policy_loss"][key]
    batch = DATA["batches"][case["batch"]]
    logp_old, logp_new, adv, mask = tensors(batch, "old_log_prob", "log_prob", "advantages", "response_mask")
    weight = None
    if case["rollout_is_weights"] is not None:
        (weight,) = tensors(batch, "rollout_is_weights")
    logp_new.requires_grad_()
    torch.manual_seed(DATA["meta"]["torch_manual_seed_before_each_policy_loss_call"])
    out = verl_objective(case)(logp_new, logp_old, adv, mask, max_completion_length=mask.shape[1], weight=weight)
    (grad,) = torch.autograd.grad(out.loss, logp_new)
    close = tolerance(key)
    assert out.loss.item() == pytest.approx(case["loss"], **close)
    torch.testing.assert_close(grad, torch.tensor(case["grad_log_prob"], dtype=F64), rtol=max(close["rel"] * 100, 1e-10),
                               atol=close["abs"])
    share = lambda x: float((x.double() * mask).sum() / mask.sum())  # noqa: E731
    metrics, mode = case["metrics"], case["loss_mode"]
    if mode.startswith("dppo"):
        assert share(out.grad_masked) == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)
    if mode == "geo_mean":
        assert share(out.outside & (adv > 0)) == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)
        assert share(out.outside & (adv < 0)) == pytest.approx(metrics["actor/pg_clipfrac_lower"], rel=1e-6, abs=1e-9)
    if mode == "clip_cov":  # the same draw again, from the same seed
        torch.manual_seed(DATA["meta"]["torch_manual_seed_before_each_policy_loss_call"])
        arrays = [x.detach().numpy() for x in (logp_new, logp_old, adv, mask, ~out.grad_masked)]
        drawn = torch.as_tensor(verl_objective(case).surrogate.selected(*arrays))
        assert sorted(drawn.nonzero().tolist()) == sorted(case["clip_cov_selection"]["chosen"])
        assert share(drawn) == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6)
    if mode == "cispo":
        lo, hi = 1 - case["config"]["clip_ratio_low"], 1 + case["config"]["clip_ratio_high"]
        off = (out.ratio < lo) | (out.ratio > hi)
        assert share(off) == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("key", list(DATA["rollout_correction"]))
def test_verls_rollout_correction_weights_masks_and_metrics(key):
    """verl's `compute_rollout_correction_weights` (TIS and IcePop, per token or completion, with and without batch
    normalisation), `compute_rollout_rejection_mask` (k1/k2/k3 per token, summed, averaged or maxed over the
    completion, several at once) and `compute_offpolicy_metrics` equal `divviz.catalogue.rollout_correction`'s: the masks
    exactly, the weights to a few ulps (exp on another CPU), or to 1e-8 where verl's masked mean adds 1e-8 to its count; every metric divviz reports, under
    verl's name, to 1e-7 (the same 1e-8)."""
    case = DATA["rollout_correction"][key]
    batch = DATA["batches"][case["batch"]]
    old, rollout, mask = tensors(batch, "old_log_prob", "rollout_log_prob", "response_mask")
    if key.startswith("weights"):
        got, metrics = rollout_weights(old - rollout, mask, case["rollout_is"], case["rollout_is_threshold"],
                                       case["rollout_is_batch_normalize"])
        want = torch.tensor(case["weights"], dtype=F64)
    elif key.startswith("rejection"):
        got, metrics = rejection_mask(old - rollout, mask, case["rollout_rs"], case["rollout_rs_threshold"])
        want = torch.tensor(case["mask"], dtype=F64)
    else:
        got = want = None
        metrics = offpolicy_metrics(old, rollout, mask)
    if want is not None:
        # Masks and clip decisions exactly; weights are exp() of float64 log-ratios, which two CPUs' libm may round
        # one ulp apart (1.1e-16 seen on AMD EPYC against vectors written elsewhere): a few ulps, 1e-15 relative.
        torch.testing.assert_close(got, want, rtol=(1e-8 if "norm_True" in key else ULPS) if key.startswith("weights")
                                   else 0, atol=0)
        bare = (rollout_weights(old - rollout, mask, case["rollout_is"], case["rollout_is_threshold"],
                                case["rollout_is_batch_normalize"], with_metrics=False) if key.startswith("weights")
                else rejection_mask(old - rollout, mask, case["rollout_rs"], case["rollout_rs_threshold"],
                                    with_metrics=False))
        assert torch.equal(bare[0], got) and bare[1] == {}  # the bandit's call: the same numbers, no statistics
    assert metrics and set(metrics) <= set(case["metrics"])
    for name, value in metrics.items():
        assert value == pytest.approx(case["metrics"][name], rel=1e-7, abs=1e-9), name


def test_the_correction_applies_all_of_it_under_verls_prefix():
    """`RolloutCorrection.apply` is the weights, the mask and verl's metrics of the three functions together, under
    "rollout_corr/", as verl's `compute_rollout_correction_and_rejection_mask` returns them."""
    batch = DATA["batches"]["grpo"]
    old, rollout, mask = tensors(batch, "old_log_prob", "rollout_log_prob", "response_mask")
    correction = RolloutCorrection("sequence", "0.8_1.5", rollout_rs="token_k1, seq_mean_k3",
                                   rollout_rs_threshold="0.7_1.5,0.06")
    out = correction.apply(old, rollout, mask)
    weights = DATA["rollout_correction"]["weights/sequence/0.8_1.5/norm_False/grpo"]
    rejection = DATA["rollout_correction"]["rejection/token_k1,seq_mean_k3/0.7_1.5,0.06/grpo"]
    torch.testing.assert_close(out.weight, torch.tensor(weights["weights"], dtype=F64), rtol=ULPS, atol=0)
    torch.testing.assert_close(out.mask, torch.tensor(rejection["mask"], dtype=F64), rtol=0, atol=0)  # 0s and 1s
    expected = {**DATA["rollout_correction"]["offpolicy_metrics/grpo"]["metrics"], **weights["metrics"],
                **rejection["metrics"]}
    assert set(out.metrics) <= {f"rollout_corr/{k}" for k in expected}
    assert {"rollout_corr/k3_kl", "rollout_corr/rollout_is_eff_sample_size", "rollout_corr/rollout_rs_masked_fraction",
            "rollout_corr/chi2_seq"} <= set(out.metrics)
    assert correction.label == "IcePop sequence [0.8, 1.5] RS token_k1,seq_mean_k3 0.7_1.5,0.06"


def test_the_rejection_cases_reject_something():
    """Most of verl's rejection cases drop some tokens and keep others, so the equalities above can fail."""
    dropping = [k for k, c in DATA["rollout_correction"].items() if k.startswith("rejection")
                and 0 < sum(map(sum, c["mask"])) < sum(map(sum, DATA["batches"][c["batch"]]["response_mask"]))]
    assert len(dropping) >= 12


REJECTION_MARGIN = 1e-9  # relative: float64 rounding on another CPU moves a statistic by ~1e-15 of itself


@pytest.mark.parametrize("key", [k for k in DATA["rollout_correction"] if k.startswith("rejection")])
def test_no_rejection_statistic_sits_on_its_threshold(key):
    """The exact masks above hold on any CPU only if no token's statistic (k1, k2 or k3 of ρ, per token or reduced
    over its completion) lies within rounding of the threshold it is compared with: each is at least
    `REJECTION_MARGIN` (relative) away from it, so a one-ulp difference in exp or log cannot flip a decision."""
    case = DATA["rollout_correction"][key]
    old, rollout, mask = tensors(DATA["batches"][case["batch"]], "old_log_prob", "rollout_log_prob", "response_mask")
    log_ratio, active = (old - rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND), mask > 0
    for name, low, high in rs_options(case["rollout_rs"], case["rollout_rs_threshold"]):
        compared = rejection_statistic(log_ratio, mask, name).expand_as(mask)[active]
        edges = [math.log(low), math.log(high)] if name.endswith("k1") else [high]
        for edge in edges:
            assert ((compared - edge).abs() > REJECTION_MARGIN * max(abs(edge), 1e-12)).all(), (name, edge)


@pytest.mark.parametrize("call, says", [
    (lambda lr, m: rollout_weights(lr, m, "chunk"), "unknown rollout-correction level 'chunk'"),
    (lambda lr, m: rollout_weights(lr, m, threshold="2_1"), "need u > 0 .TIS. or 0 < l < u"),
    (lambda lr, m: rollout_weights(lr, m, threshold="nan"), "need u > 0"),
    (lambda lr, m: rollout_weights(lr, m, threshold=-1.0), "need u > 0"),
    (lambda lr, m: rollout_weights(lr, m, threshold="1_2_3"), "write u .TIS., or l_u .IcePop."),
    (lambda lr, m: rollout_weights(lr, m, threshold="__import__('os')"), "write u .TIS., or l_u .IcePop."),
    (lambda lr, m: rejection_mask(lr, m, "token_k4", "0.1"), "unknown rejection option 'token_k4'"),
    (lambda lr, m: rejection_mask(lr, m, "seq_max_k1", "2"), "unknown rejection option 'seq_max_k1'"),
    (lambda lr, m: rejection_mask(lr, m, "token_k1,seq_mean_k3,token_k2", "0.7_1.5,0.06"), "one threshold each"),
    (lambda lr, m: rejection_mask(lr, m, "token_k2", "0.1_0.2"), "need a number u > 0"),
    (lambda lr, m: rejection_mask(lr, m, "token_k1", "0.5"), "need l_u with 0 < l ≤ u"),
    (lambda lr, m: rejection_mask(lr, m, "token_k1", None), "one threshold each or one for all"),
    (lambda lr, m: RolloutCorrection("tokens"), "unknown rollout_is 'tokens'"),
    (lambda lr, m: RolloutCorrection(rollout_rs_threshold="0.1"), "without rollout_rs"),
])
def test_bad_rollout_correction_settings_are_refused(call, says):
    with pytest.raises(DivvizInputError, match=says):
        call(torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=F64))
