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

EXPECTED_VERL = "0.9.1"
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_policy_losses.json"
SEED = 1234  # torch.manual_seed before every policy-loss call (only clip_cov draws random numbers)
DT = torch.float64

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_MODES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
            "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]

FORMULAS = {
    "_notation": (
        "old = old_log_prob, lp = log_prob (the only tensor with grad), A = advantages, M = response_mask, "
        "w = rollout_is_weights (optional, detached, multiplies the per-token loss L_t just before agg_loss "
        "for every loss except geo_mean). Every loss ends with agg_loss(L, M, loss_agg_mode, "
        "**config.global_batch_info) unless said otherwise. masked_mean(x, M) = sum(where(M, x, 0) * M) / "
        "(M.sum() + 1e-8); with a bool mask M.sum() is int64 and `+ 1e-8` rounds away in float32, so the "
        "eps vanishes; with a float64 mask it stays. sg = stop-gradient (detach). Metrics are python floats "
        "via .item(). Defaults are ActorConfig/PolicyLossConfig dataclass defaults (== actor.yaml): "
        "clip_ratio=clip_ratio_low=clip_ratio_high=0.2, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05, "
        "clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002, ppo_kl_coef=0.1, "
        "dro_beta=None, loss_agg_mode='token-mean'. eps_lo = clip_ratio_low if not None else clip_ratio; "
        "eps_hi likewise."
    ),
    "agg_loss": (
        "core_algos.agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, "
        "global_batch_size=None, loss_scale_factor=None). token-mean: masked_sum(L, M) / batch_num_tokens * "
        "dp_size, batch_num_tokens defaults to M.sum() (no eps). token-sum: masked_sum(L, M) * dp_size. "
        "seq-mean-token-sum: s_i = sum_t L*M; seq_mask_i = (sum_t M > 0); global_batch_size defaults to "
        "seq_mask.sum() (fully-masked rows excluded); loss = masked_sum(s, seq_mask) / global_batch_size * "
        "dp_size. seq-mean-token-sum-norm: same, then / loss_scale_factor (default M.shape[-1] = T, the "
        "padded length). seq-mean-token-mean: s_i = sum_t L*M / (sum_t M + 1e-8) (eps lost in float32 for a "
        "bool mask), then as seq-mean-token-sum. dp_size > 1 without the global counts raises ValueError. "
        "masked_sum(x, M) = (where(M.bool(), x, 0) * M).sum()."
    ),
    "vanilla": (
        "compute_policy_loss_vanilla. d = clamp(lp - old, -20, 20); r = exp(d); ppo_kl = masked_mean(-d, M). "
        "L1 = -A r; L2 = -A clamp(r, 1 - eps_lo, 1 + eps_hi); C1 = max(L1, L2); "
        "pg_clipfrac = masked_mean(L2 > L1); L3 = -A c (c = clip_ratio_c, asserted > 1); "
        "C2 = min(L3, C1); pg_clipfrac_lower = masked_mean((C1 > L3) & (A < 0)); "
        "L = where(A < 0, C2, C1) [* w]. Metrics: actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower."
    ),
    "dppo_tv": (
        "compute_policy_loss_dppo_tv (DPPO-Binary-TV). d = clamp(lp - old, -20, 20); r = exp(d); "
        "ppo_kl = masked_mean(-d, M); c = config.get('clip_ratio_c', 20.0) -> ActorConfig always has it, so "
        "c = 3.0 by default; tr = sg(clamp(r, max=c)); p = exp(lp), p_old = exp(old); "
        "valid = sg(where(A > 0, (p - p_old) <= eps_hi, (p - p_old) >= -eps_lo)) (A == 0 takes the negative "
        "branch); L = -A * tr * lp * valid [* w] (gradient -A*tr*valid per token: REINFORCE-style, the ratio "
        "only as a detached weight). pg_clipfrac = masked_mean(1 - valid); pg_clipfrac_lower = "
        "masked_mean((r > c) * valid). Here clip_ratio* are TV thresholds, not ratio bounds."
    ),
    "dppo_kl": (
        "compute_policy_loss_dppo_kl (DPPO-Binary-KL). As dppo_tv, but with "
        "bkl = p_old (old - lp) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)); "
        "valid = sg(where(A > 0, (bkl <= eps_hi) | (p <= p_old), (bkl <= eps_lo) | (p >= p_old))); "
        "L = -A * sg(clamp(r, max=c)) * lp * valid [* w]; same three metrics as dppo_tv. Needs lp < 0 "
        "(p < 1) or the log is NaN."
    ),
    "gspo": (
        "compute_policy_loss_gspo (function default loss_agg_mode 'seq-mean-token-mean', but the actor passes "
        "config.loss_agg_mode). d = lp - old (no clamp); n_i = clamp(sum_t M, min=1); "
        "s_i = sum_t d*M / n_i; log_s = clamp(lp - sg(lp) + sg(s_i), max=10); sr = exp(log_s) (value = "
        "exp(s_i) on every token of row i, gradient per token = sr * dlp); L1 = -A sr; "
        "L2 = -A clamp(sr, 1 - eps_lo, 1 + eps_hi); L = max(L1, L2) [* w] (no dual clip). "
        "pg_clipfrac = masked_mean(L2 > L1); ppo_kl = masked_mean(-d, M); pg_clipfrac_lower = 0.0."
    ),
    "sapo": (
        "compute_policy_loss_sapo. d = clamp(lp - old, -20, 20); r = exp(d); tau = where(A > 0, tau_pos, "
        "tau_neg); gate = sigmoid(tau (r - 1)) * 4 / tau; L = -gate * A [* w]. ALWAYS aggregated with "
        "'seq-mean-token-mean' (loss_agg_mode argument ignored). pg_clipfrac = 0.0, pg_clipfrac_lower = 0.0, "
        "ppo_kl = masked_mean(-d, M)."
    ),
    "gpg": (
        "compute_policy_loss_gpg. L = -lp * A [* w]; agg_loss with loss_agg_mode. No metrics (returns {}). "
        "old_log_prob is unused."
    ),
    "clip_cov": (
        "compute_policy_loss_clip_cov. d = lp - old (no clamp); r = exp(d); ppo_kl = masked_mean(-d, M); "
        "L1 = -A r; L2 = -A clamp(r, 1 - eps_lo, 1 + eps_hi); clip_by_origin = (L2 > L1) & (M > 0); "
        "cov = (A - masked_mean(A, M)) * (lp - masked_mean(sg(lp), M)); cov = -inf where M == 0 or "
        "clip_by_origin; clip_num = max(int(clip_cov_ratio * M.sum()), 1); candidates = nonzero((cov < ub) & "
        "(cov > lb) & (M > 0)) (row-major order); if any: chosen = candidates[torch.randperm(len)[:min("
        "clip_num, len)]] -- RANDOM, uses torch's global CPU generator; corr = 1 except 0 at chosen; "
        "L = max(L1, L2) * corr [* w] (no dual clip). pg_clipfrac = masked_mean(corr == 0); ppo_kl. "
        "(No pg_clipfrac_lower.) Each case records the candidates and the chosen tokens."
    ),
    "kl_cov": (
        "compute_policy_loss_kl_cov. d = lp - old (no clamp); r = exp(d); ppo_kl metric = masked_mean(|d|, M) "
        "(absolute!). L1 = -A r; Lkl = -A r + ppo_kl_coef |d|; over valid tokens (M > 0, row-major "
        "flattening) cov = (A - mean A)(sg(lp) - mean sg(lp)) (plain means over valid tokens, no eps); "
        "k = max(1, int(n_valid * kl_cov_ratio)); the top-k cov tokens (torch.topk, largest) get Lkl, the "
        "others L1; L [* w]; deterministic (no RNG). Metric: actor/ppo_kl only."
    ),
    "geo_mean": (
        "compute_policy_loss_geo_mean (GMPO). d = lp - old (no clamp); ppo_kl = masked_mean(-d, M); "
        "sgn = sign(A); dc = clamp(d, -eps_lo, eps_hi); dm = sgn * min(sgn d, sgn dc); n_i = sum_t M; "
        "ratio_i = exp(sum_t dm*M / (n_i + 1e-8)); adv_i = sum_t A*M / (n_i + 1e-8); L_i = -adv_i ratio_i; "
        "with w: L_i *= exp(sum_t log(w + 1e-10)*M / (n_i + 1e-8)). pg_loss = torch.mean(L) over ALL B rows "
        "(fully-masked rows count, with L_i = 0); loss_agg_mode is IGNORED. clipped = d != dc; pg_clipfrac = "
        "masked_mean(clipped & (A > 0)); pg_clipfrac_lower = masked_mean(clipped & (A < 0)). Note eps_lo/hi "
        "bound the LOG ratio here."
    ),
    "dro": (
        "compute_policy_loss_dro. beta = policy_loss.dro_beta (default None -> ValueError; must be > 0); "
        "d = lp - old; L = -(lp A - 0.5 beta d^2) [* w]; metric actor/ppo_kl = masked_mean(-d, M)."
    ),
    "cispo": (
        "compute_policy_loss_cispo. d = clamp(lp - old, -20, 20); r = exp(d); ppo_kl = masked_mean(-d, M); "
        "cr = clamp(r, 1 - eps_lo, 1 + eps_hi); L = -sg(cr) * A * lp [* w]; pg_clipfrac = masked_mean(r != "
        "cr); pg_clipfrac_lower = 0.0."
    ),
    "bypass_mode": (
        "compute_policy_loss_bypass_mode: old_log_prob is the rollout log-prob. rc = "
        "config.policy_loss.rollout_correction (RolloutCorrectionConfig; dataclass default rollout_is="
        "'sequence', threshold 2.0, loss_type 'ppo_clip'; the yaml default has rollout_is null). Under "
        "no_grad: weights, mask', metrics = rollout_corr_helper.compute_rollout_correction_and_rejection_mask("
        "old_log_prob=lp, rollout_log_prob=old, response_mask=M, rollout_is, rollout_is_threshold, "
        "rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold). loss_type 'ppo_clip': "
        "compute_policy_loss_vanilla(old, lp, A, mask', mode, config, w=None) (IS weights only for metrics). "
        "loss_type 'reinforce': compute_policy_loss_reinforce: L = -A lp [* w]; agg_loss(L, mask', mode); "
        "metric actor/ppo_kl = masked_mean(old - lp, mask'). All 'rollout_corr/...' metrics are merged in."
    ),
    "kl_penalty": (
        "core_algos.kl_penalty(logprob, ref_logprob, kl_penalty=mode), elementwise, x = logprob - ref: "
        "'kl'/'k1': x; 'abs': |x|; 'mse'/'k2': 0.5 x^2; 'low_var_kl'/'k3': k = clamp(ref - logprob, -20, 20); "
        "clamp(exp(k) - k - 1, -10, 10); 'full' raises NotImplementedError. Mode ending in '+' (any base, "
        "including 'k2+'): value of the base mode, gradient of 0.5 x^2 (straight-through: b - sg(b) + "
        "sg(forward)). The actor's kl loss is agg_loss(kl_penalty(lp, ref, kl_loss_type), M, loss_agg_mode) "
        "* kl_loss_coef (defaults low_var_kl, 0.001), added to the policy loss; the in-reward penalty "
        "(ray_trainer.apply_kl_penalty) uses kl_penalty(old_log_prob, ref, algorithm.kl_penalty='kl') * M."
    ),
    "rollout_correction": (
        "rollout_corr_helper.compute_rollout_correction_weights(log_ratio = lp_train - lp_rollout, M, "
        "rollout_is in {'token','sequence'}, threshold, batch_normalize): token: raw = exp(clamp(lr, -20, 20)); "
        "sequence: raw = exp(clamp(sum_t lr*M, -20, 20)) broadcast over the row; raw *= M; float threshold "
        "u -> TIS: w = clamp(raw, max=u); string 'l_u' -> IcePop: w = raw where l <= raw <= u else 0; "
        "detached; batch_normalize divides by masked_mean(w, M) (token) or by the mean over non-empty rows "
        "of the per-row masked_mean (sequence) (torch.distributed all-reduce if initialized). "
        "compute_rollout_rejection_mask(log_ratio, M, rollout_rs, rollout_rs_threshold): lr clamped to "
        "+-20; k1 = -lr, k2 = 0.5 lr^2, k3 = exp(lr) - 1 - lr; token_kX per token, seq_sum_kX = masked_sum "
        "over the row, seq_mean_kX = masked_mean over the row (eps 1e-8), seq_max_kX = max over valid tokens; "
        "k1 options keep lower_log <= stat <= upper_log with thresholds 'l_u' (single u means l = 1/u), "
        "logs taken of l and u; k2/k3 keep stat <= u; comma-separated options are ANDed; mask' = M * keep."
    ),
}


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
