"""Reference vectors from verl 0.9.1's own policy-loss code, saved as test data for divviz.

divviz's tests must not import verl (it pulls in ray, transformers, ...), so this script runs verl's
functions once on small seeded float64 batches and writes everything to
``tests/data/verl_policy_losses.json``: the inputs, each loss value, its autograd gradient with respect to
``log_prob``, and every metric verl returns.

What it covers (all from ``verl/trainer/ppo/core_algos.py`` unless noted):

* every loss in ``POLICY_LOSS_REGISTRY`` (called through ``get_policy_loss_fn(name)``), with verl's default
  hyper-parameters (``ActorConfig`` / ``PolicyLossConfig`` dataclass defaults) and one non-default setting,
  for every ``loss_agg_mode``, on two batches, with a boolean response mask (what
  ``verl.workers.utils.losses.ppo_loss`` passes) and, for some cases, a float64 mask and rollout IS weights;
* ``agg_loss`` for every mode (with and without ``global_batch_info``);
* ``kl_penalty`` for every mode, including the straight-through ``+`` variants;
* the rollout-correction helpers (truncated IS / IcePop weights, rejection masks, off-policy metrics) from
  ``verl/trainer/ppo/rollout_corr_helper.py``.

The formulas stored beside the vectors are written out in ``verl_formulas.py`` (next to this script).

Run it with a separate environment that has verl (never divviz's own venv)::

    python3.11 -m venv /tmp/verlenv
    /tmp/verlenv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    echo "torch==2.13.0" > /tmp/verl_constraints.txt
    /tmp/verlenv/bin/pip install -c /tmp/verl_constraints.txt verl==0.9.1
    /tmp/verlenv/bin/python scripts/verl_reference.py

The output is deterministic: running the script twice writes byte-identical JSON (clip_cov's random token
choice is made under ``torch.manual_seed(SEED)``, set before every loss call, and recorded).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

import verl
import verl.utils.torch_functional as verl_F
from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos
from verl.trainer.ppo import rollout_corr_helper as rch
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl_formulas import FORMULAS  # beside this script

EXPECTED_VERL = "0.9.1"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_policy_losses.json"
SEED = 1234  # torch.manual_seed before every policy-loss call (only clip_cov draws random numbers)
DT = torch.float64

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_MODES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
            "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]

def t(x):
    """Tensor -> nested python lists (float64 values round-trip exactly through json/repr)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bool:
            return x.to(torch.int64).tolist()
        return x.tolist()
    return x


def clean_metrics(m):
    out = {}
    for k, v in m.items():
        if isinstance(v, torch.Tensor):
            v = v.item()
        v = float(v)
        assert math.isfinite(v), (k, v)
        out[k] = v
    return out


def make_batches():
    g = torch.Generator().manual_seed(20250901)
    B, T = 6, 7
    batches = {}

    def mask(lengths):  # right-padded responses of these lengths
        return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]

    def policy(spread):  # old log-probs, and log_prob = old + spread · randn (below log 0.98 for DPPO's terms)
        old = torch.log(torch.rand(B, T, generator=g, dtype=DT) * 0.9 + 0.05)
        return old, torch.clamp(old + spread * torch.randn(B, T, generator=g, dtype=DT), max=math.log(0.98))

    # Batch "grpo": one advantage per sequence (GRPO-style), log_prob = old + 0.4 randn.
    M = mask([7, 5, 3, 6, 1, 4])
    old, lp = policy(0.4)
    adv_seq = torch.tensor([1.3, -0.7, 0.4, -1.6, 0.9, -0.2], dtype=DT)
    A = adv_seq[:, None].expand(B, T).clone()
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=DT)
    rollout = old + 0.3 * torch.randn(B, T, generator=g, dtype=DT)
    batches["grpo"] = dict(old_log_prob=old, log_prob=lp, advantages=A, response_mask=M, ref_log_prob=ref,
                           rollout_log_prob=rollout)

    # Batch "wide": per-token advantages, larger policy moves (0.8 randn), a fully masked row and a zero-advantage row.
    M = mask([7, 0, 4, 2, 7, 5])
    old, lp = policy(0.8)
    A = torch.randn(B, T, generator=g, dtype=DT) * 1.2
    A[3] = 0.0
    ref = old + 0.6 * torch.randn(B, T, generator=g, dtype=DT)
    rollout = old + 0.5 * torch.randn(B, T, generator=g, dtype=DT)
    batches["wide"] = dict(old_log_prob=old, log_prob=lp, advantages=A, response_mask=M, ref_log_prob=ref,
                           rollout_log_prob=rollout)

    # Rollout IS weights used as the optional `rollout_is_weights` argument of the losses:
    # token-level TIS with threshold 2.0 between the training old_log_prob and the rollout log-prob.
    for b in batches.values():
        w, _ = rch.compute_rollout_correction_weights(
            log_ratio=b["old_log_prob"] - b["rollout_log_prob"], response_mask=b["response_mask"],
            rollout_is="token", rollout_is_threshold=2.0)
        b["rollout_is_weights"] = w
    return batches


def actor_config(mode, agg, actor_over=None, pl_over=None):
    pl = PolicyLossConfig(loss_mode=mode, **(pl_over or {}))
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg,
                       policy_loss=pl, **(actor_over or {}))


def resolved(cfg):
    pl = cfg.policy_loss
    rc = pl.rollout_correction
    return {
        "clip_ratio": cfg.clip_ratio, "clip_ratio_low": cfg.clip_ratio_low, "clip_ratio_high": cfg.clip_ratio_high,
        "clip_ratio_c": cfg.clip_ratio_c, "tau_pos": cfg.tau_pos, "tau_neg": cfg.tau_neg,
        "loss_agg_mode": cfg.loss_agg_mode, "global_batch_info": dict(cfg.global_batch_info),
        "policy_loss": {
            "loss_mode": pl.loss_mode, "clip_cov_ratio": pl.clip_cov_ratio, "clip_cov_lb": pl.clip_cov_lb,
            "clip_cov_ub": pl.clip_cov_ub, "kl_cov_ratio": pl.kl_cov_ratio, "ppo_kl_coef": pl.ppo_kl_coef,
            "dro_beta": pl.dro_beta,
            "rollout_correction": {
                "rollout_is": rc.rollout_is, "rollout_is_threshold": rc.rollout_is_threshold,
                "rollout_is_batch_normalize": rc.rollout_is_batch_normalize, "rollout_rs": rc.rollout_rs,
                "rollout_rs_threshold": rc.rollout_rs_threshold, "bypass_mode": rc.bypass_mode,
                "loss_type": rc.loss_type,
            },
        },
    }


# (variant name, ActorConfig overrides, PolicyLossConfig overrides) per registered loss.
VARIANTS = {
    "vanilla": [("default", {}, {}),
                ("dapo_dualclip", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 1.5}, {})],
    "dppo_tv": [("default", {}, {}),
                ("tight", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 1.5}, {})],
    "dppo_kl": [("default", {}, {}),
                ("tight", {"clip_ratio_low": 0.02, "clip_ratio_high": 0.05, "clip_ratio_c": 1.5}, {})],
    "gspo": [("default", {}, {}),
             ("narrow", {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08}, {})],
    "sapo": [("default", {}, {}),
             ("tau", {"tau_pos": 2.0, "tau_neg": 4.0}, {})],
    "gpg": [("default", {}, {})],
    "clip_cov": [("default", {}, {}),
                 ("wide_band", {}, {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.05, "clip_cov_ub": 2.0})],
    "kl_cov": [("default", {}, {}),
               ("ratio", {}, {"kl_cov_ratio": 0.2, "ppo_kl_coef": 1.0})],
    "geo_mean": [("default", {}, {}),
                 ("gmpo", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}, {})],
    "dro": [("beta0.1", {}, {"dro_beta": 0.1}),
            ("beta1", {}, {"dro_beta": 1.0})],
    "cispo": [("default", {}, {}),
              ("cispo_paper", {"clip_ratio_low": 1.0, "clip_ratio_high": 0.28}, {})],
    "bypass_mode": [
        ("default", {}, {}),  # dataclass RolloutCorrectionConfig(): rollout_is='sequence', ppo_clip
        ("ppo_clip_no_is", {}, {"rollout_correction": RolloutCorrectionConfig(rollout_is=None, loss_type="ppo_clip")}),
        ("ppo_clip_token_k1_rs", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6", loss_type="ppo_clip")}),
        ("reinforce_no_is", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is=None, loss_type="reinforce")}),
        ("reinforce_token_tis", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is="token", rollout_is_threshold=1.5, loss_type="reinforce")}),
        ("reinforce_seq_tis_seq_mean_k3_rs0.1", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is="sequence", rollout_is_threshold=1.3, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.1,
            loss_type="reinforce")}),
        ("reinforce_seq_tis_seq_mean_k3_rs0.25", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is="sequence", rollout_is_threshold=1.3, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.25,
            loss_type="reinforce")}),
        ("reinforce_token_icepop", {}, {"rollout_correction": RolloutCorrectionConfig(
            rollout_is="token", rollout_is_threshold="0.5_1.5", loss_type="reinforce")}),
    ],
}


def json_overrides(a, p):
    out = dict(a)
    for k, v in p.items():
        out[k] = {kk: getattr(v, kk) for kk in ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize",
                                                 "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")} \
            if isinstance(v, RolloutCorrectionConfig) else v
    return out


def clip_cov_selection(b, mask, cfg):
    """Replicates clip_cov's token choice (same RNG draw) so the chosen tokens are recorded in the data."""
    pl = cfg.policy_loss
    old, lp, A = b["old_log_prob"], b["log_prob"], b["advantages"]
    r = torch.exp(lp - old)
    l1 = -A * r
    l2 = -A * torch.clamp(r, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    by_origin = (l2 > l1) & (mask > 0)
    cov = (A - verl_F.masked_mean(A, mask)) * (lp - verl_F.masked_mean(lp, mask))
    cov[mask == 0] = -torch.inf
    cov[by_origin] = -torch.inf
    clip_num = max(int(pl.clip_cov_ratio * mask.sum().item()), 1)
    cand = torch.nonzero((cov < pl.clip_cov_ub) & (cov > pl.clip_cov_lb) & (mask > 0))
    torch.manual_seed(SEED)
    chosen = cand[torch.randperm(len(cand))[: min(clip_num, len(cand))]] if len(cand) else cand
    return {"clip_num": clip_num, "candidates": cand.tolist(), "chosen": chosen.tolist()}


def run_policy_loss(name, b, mask, agg, a_over, p_over, with_w):
    cfg = actor_config(name, agg, a_over, p_over)
    lp = b["log_prob"].clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(name)
    w = b["rollout_is_weights"] if with_w else None
    torch.manual_seed(SEED)
    loss, metrics = fn(old_log_prob=b["old_log_prob"], log_prob=lp, advantages=b["advantages"],
                       response_mask=mask, loss_agg_mode=agg, config=cfg, rollout_is_weights=w)
    loss.backward()
    assert math.isfinite(loss.item()), (name, agg)
    assert torch.isfinite(lp.grad).all(), (name, agg)
    case = {
        "loss_mode": name, "function": fn.__name__, "config": resolved(cfg),
        "loss": loss.item(), "grad_log_prob": t(lp.grad), "metrics": clean_metrics(metrics),
    }
    if name == "clip_cov":
        sel = clip_cov_selection(b, mask, cfg)
        n_valid = mask.sum().item()
        # The replicated choice must be verl's: zero gradient there and the same clip fraction.
        assert all(lp.grad[i, j] == 0 for i, j in sel["chosen"]), (name, agg)
        assert abs(metrics["actor/pg_clipfrac"] - len(sel["chosen"]) / n_valid) < 1e-6
        case["clip_cov_selection"] = sel
    return case


def policy_loss_cases(batches):
    cases = {}
    registry = sorted(core_algos.POLICY_LOSS_REGISTRY)
    assert registry == sorted(VARIANTS), (registry, sorted(VARIANTS))
    for name in registry:
        for vname, a_over, p_over in VARIANTS[name]:
            for bname, b in batches.items():
                for agg in AGG_MODES:
                    variants = [("bool", b["response_mask"], False)]
                    if agg in ("token-mean", "seq-mean-token-mean"):
                        variants.append(("float64", b["response_mask"].to(DT), False))
                    if agg == "token-mean" and name != "bypass_mode":
                        variants.append(("bool", b["response_mask"], True))
                    for mdt, mask, with_w in variants:
                        key = f"{name}/{vname}/{bname}/{agg}/mask_{mdt}" + ("/with_is_weights" if with_w else "")
                        c = run_policy_loss(name, b, mask, agg, a_over, p_over, with_w)
                        c.update({"variant": vname, "overrides": json_overrides(a_over, p_over), "batch": bname,
                                  "loss_agg_mode": agg, "mask_dtype": mdt,
                                  "rollout_is_weights": "batch.rollout_is_weights" if with_w else None})
                        cases[key] = c
    # The deprecated non-registry compute_policy_loss must agree with "vanilla" (sanity check, not stored).
    b = batches["grpo"]
    old = core_algos.compute_policy_loss.__wrapped__ if hasattr(core_algos.compute_policy_loss, "__wrapped__") \
        else core_algos.compute_policy_loss
    ref = old(b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"], cliprange=0.2)[0].item()
    assert abs(ref - cases["vanilla/default/grpo/token-mean/mask_bool"]["loss"]) < 1e-12
    return cases


def check_dro_default_raises(batches):
    b = batches["grpo"]
    try:
        core_algos.compute_policy_loss_dro(b["old_log_prob"], b["log_prob"], b["advantages"], b["response_mask"],
                                           "token-mean", actor_config("dro", "token-mean"))
    except ValueError as e:
        return str(e)
    raise AssertionError("dro with dro_beta=None did not raise")


def agg_loss_cases(batches):
    g = torch.Generator().manual_seed(7)
    cases = {}
    for bname, b in batches.items():
        loss_mat = torch.randn(6, 7, generator=g, dtype=DT)
        M = b["response_mask"]
        n_tok = int(M.sum().item())
        n_seq = int((M.sum(-1) > 0).sum().item())
        infos = {
            "local": {},
            "dp2_global": {"dp_size": 2, "batch_num_tokens": 2 * n_tok + 3, "global_batch_size": 2 * n_seq + 1,
                           "loss_scale_factor": None},
            "scale_factor_4": {"loss_scale_factor": 4},
        }
        for mdt, mask in (("bool", M), ("float64", M.to(DT))):
            for iname, info in infos.items():
                for agg in AGG_MODES:
                    lm = loss_mat.clone().requires_grad_(True)
                    out = core_algos.agg_loss(loss_mat=lm, loss_mask=mask, loss_agg_mode=agg, **info)
                    out.backward()
                    cases[f"{bname}/{agg}/{iname}/mask_{mdt}"] = {
                        "batch": bname, "loss_agg_mode": agg, "global_batch_info": info, "mask_dtype": mdt,
                        "loss_mat": t(loss_mat), "value": out.item(), "grad_loss_mat": t(lm.grad)}
    return cases


def kl_penalty_cases(batches):
    inputs = {name: (b["log_prob"], b["ref_log_prob"]) for name, b in batches.items()}
    # Extreme log-ratios to hit k3's clamps (ref - logprob clamped to +-20, result clamped to 10).
    x = torch.tensor([[-25.0, -15.0, -3.0, -2.5, -0.5, 0.0, 0.3, 2.0],
                      [2.4, 2.6, 3.5, 5.0, 12.0, 19.5, 21.0, 30.0]], dtype=DT)
    ref_x = torch.full_like(x, -1.5)
    inputs["extreme"] = (ref_x - x, ref_x)  # logprob = ref - x, so ref - logprob = x
    cases = {}
    for mode in KL_MODES:
        for name, (lp0, ref0) in inputs.items():
            lp = lp0.clone().requires_grad_(True)
            ref = ref0.clone().requires_grad_(True)
            kl = core_algos.kl_penalty(lp, ref, kl_penalty=mode)
            kl.sum().backward()
            cases[f"{mode}/{name}"] = {
                "kl_penalty": mode, "input": name, "logprob": t(lp0), "ref_logprob": t(ref0), "value": t(kl),
                "grad_logprob": t(lp.grad), "grad_ref_logprob": t(ref.grad)}
    try:
        core_algos.kl_penalty(inputs["grpo"][0], inputs["grpo"][1], kl_penalty="full")
        raise AssertionError("'full' did not raise")
    except NotImplementedError:
        pass
    return cases


def rollout_correction_cases(batches):
    cases = {}
    weight_specs = [("token", 2.0, False), ("sequence", 2.0, False), ("token", 1.2, False),
                    ("token", "0.5_2.0", False), ("sequence", "0.8_1.5", False),
                    ("token", 2.0, True), ("sequence", 2.0, True)]
    rs_specs = [("token_k1", "0.7_1.5"), ("token_k1", 1.5), ("token_k2", 0.1), ("token_k3", 0.1),
                ("seq_sum_k1", "0.5_2.0"), ("seq_sum_k2", 0.5), ("seq_sum_k3", 0.5),
                ("seq_mean_k1", "0.8_1.25"), ("seq_mean_k2", 0.06), ("seq_mean_k3", 0.06),
                ("seq_max_k2", 0.3), ("seq_max_k3", 0.3), ("token_k1,seq_mean_k3", "0.7_1.5,0.06")]
    for bname, b in batches.items():
        M = b["response_mask"].to(DT)
        lr = b["old_log_prob"] - b["rollout_log_prob"]
        for lvl, thr, norm in weight_specs:
            w, m = rch.compute_rollout_correction_weights(log_ratio=lr, response_mask=M, rollout_is=lvl,
                                                          rollout_is_threshold=thr, rollout_is_batch_normalize=norm)
            cases[f"weights/{lvl}/{thr}/norm_{norm}/{bname}"] = {
                "function": "rollout_corr_helper.compute_rollout_correction_weights", "batch": bname,
                "log_ratio": "old_log_prob - rollout_log_prob", "rollout_is": lvl, "rollout_is_threshold": thr,
                "rollout_is_batch_normalize": norm, "weights": t(w), "metrics": clean_metrics(m)}
        for opt, thr in rs_specs:
            mask2, m = rch.compute_rollout_rejection_mask(log_ratio=lr, response_mask=M, rollout_rs=opt,
                                                          rollout_rs_threshold=thr)
            cases[f"rejection/{opt}/{thr}/{bname}"] = {
                "function": "rollout_corr_helper.compute_rollout_rejection_mask", "batch": bname,
                "log_ratio": "old_log_prob - rollout_log_prob", "rollout_rs": opt, "rollout_rs_threshold": thr,
                "mask": t(mask2), "metrics": clean_metrics(m)}
        m = rch.compute_offpolicy_metrics(old_log_prob=b["old_log_prob"], rollout_log_prob=b["rollout_log_prob"],
                                          response_mask=M)
        cases[f"offpolicy_metrics/{bname}"] = {
            "function": "rollout_corr_helper.compute_offpolicy_metrics", "batch": bname,
            "old_log_prob": "batch.old_log_prob", "rollout_log_prob": "batch.rollout_log_prob",
            "metrics": clean_metrics(m)}
    return cases


def main():
    if verl.__version__ != EXPECTED_VERL:
        sys.exit(f"needs verl {EXPECTED_VERL}, found {verl.__version__}")
    torch.use_deterministic_algorithms(True)
    batches = make_batches()
    data = {
        "meta": {
            "verl_version": verl.__version__,
            "torch_version": torch.__version__,
            "generated_by": "scripts/verl_reference.py (run with a venv that has verl==0.9.1, torch==2.13.0)",
            "dtype": "float64",
            "source_files": ["verl/trainer/ppo/core_algos.py", "verl/trainer/ppo/rollout_corr_helper.py",
                             "verl/workers/config/actor.py", "verl/workers/utils/losses.py"],
            "policy_loss_registry": {k: v.__name__ for k, v in sorted(core_algos.POLICY_LOSS_REGISTRY.items())},
            "loss_agg_modes": AGG_MODES,
            "kl_penalty_modes": KL_MODES,
            "defaults": resolved(actor_config("vanilla", "token-mean")),
            "torch_manual_seed_before_each_policy_loss_call": SEED,
            "dro_default_error": check_dro_default_raises(batches),
            "layout": {
                "batches": "name -> old_log_prob, log_prob, advantages, response_mask (0/1), ref_log_prob, "
                           "rollout_log_prob, rollout_is_weights: B x T lists",
                "policy_loss": "key 'loss_mode/variant/batch/loss_agg_mode/mask_<bool|float64>[/with_is_weights]' "
                               "-> loss, grad_log_prob (d loss / d log_prob, B x T), metrics, config (resolved), "
                               "overrides (non-defaults), function, clip_cov_selection ([b, t] lists) for clip_cov",
                "agg_loss": "key 'batch/mode/global_info/mask_dtype' -> loss_mat, value, grad_loss_mat, "
                            "global_batch_info",
                "kl_penalty": "key 'mode/input' -> logprob, ref_logprob, value (elementwise), grad_logprob and "
                              "grad_ref_logprob of value.sum()",
                "rollout_correction": "weights/..., rejection/..., offpolicy_metrics/... with log_ratio = "
                                      "old_log_prob - rollout_log_prob and a float64 mask",
            },
        },
        "formulas": FORMULAS,
        "batches": {k: {kk: t(vv) for kk, vv in v.items()} for k, v in batches.items()},
        "policy_loss": policy_loss_cases(batches),
        "agg_loss": agg_loss_cases(batches),
        "kl_penalty": kl_penalty_cases(batches),
        "rollout_correction": rollout_correction_cases(batches),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=None, separators=(",", ":"), allow_nan=False)
    OUT.write_text(text + "\n")
    print(f"wrote {OUT} ({len(text) / 1e6:.2f} MB): " + ", ".join(
        f"{k}={len(data[k])}" for k in ("policy_loss", "agg_loss", "kl_penalty", "rollout_correction")))


if __name__ == "__main__":
    main()
