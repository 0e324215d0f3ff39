"""verl 0.9.1's policy losses, aggregation, KL penalties and rollout corrections, written out as formulas.

The text that `verl_reference.py` stores beside the reference vectors (its "formulas" section), read from
``verl/trainer/ppo/core_algos.py`` and ``rollout_corr_helper.py``: what each case computes, without verl.
"""

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
