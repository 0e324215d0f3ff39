"""Named starting points a teacher can click: each maps a page's control names to values."""

from divviz.theory import kl3_delta_at_ratio

CLIPPING_PRESETS: dict[str, dict] = {
    "PPO ε=0.2 vs DAPO (0.2, 0.28) vs KL3 δ=0.05": {
        "m": ["ratio", "clip_higher", "kl3"], "ratio.eps": 0.2, "clip_higher.eps_low": 0.2,
        "clip_higher.eps_high": 0.28, "kl3.delta": 0.05},
    "KL3 with PPO's lower edge (δ = k3(0.8) = 0.0231)": {
        "m": ["ratio", "kl3"], "ratio.eps": 0.2, "kl3.delta": round(float(kl3_delta_at_ratio(0.8)), 7)},
    "KL1 vs KL2 vs KL3 at δ = 0.05": {
        "m": ["kl1", "kl2", "kl3"], "kl1.delta": 0.05, "kl2.delta": 0.05, "kl3.delta": 0.05},
    "Ratio space vs probability space (rare tokens)": {
        "m": ["ratio", "prob_tv"], "ratio.eps": 0.2, "prob_tv.delta": 0.1, "pi_old": 0.05},
}

BANDIT_PRESETS: dict[str, dict] = {
    "PPO vs DAPO vs KL3, three correct actions": {
        "m": ["ratio", "clip_higher", "kl3"], "k": 50, "reward": "top_k", "correct_rank": 2, "mu": 4, "lr": 2.0},
    "A rare correct action (rank 10)": {
        "m": ["ratio", "clip_higher", "kl3"], "k": 50, "reward": "one_correct", "correct_rank": 10, "mu": 4,
        "lr": 2.0},
    "Ratio vs probability-space clipping, 1000 actions": {
        "m": ["ratio", "prob_tv"], "k": 1000, "reward": "top_k", "correct_rank": 49, "mu": 4, "lr": 5.0},
}
