"""Named starting points a teacher can click: each maps a page's control names to values; measures are spelled
as `divviz.catalogue.instances` spells them."""

from divviz.bandit.setting import DEFAULT_LR
from divviz.catalogue.theory import kl3_delta_at_ratio

DELTA_LOW_EDGE = round(float(kl3_delta_at_ratio(0.8)), 7)  # KL3 through PPO ε = 0.2's lower edge: 0.0231
DELTA_HIGH_EDGE = round(float(kl3_delta_at_ratio(1.2)), 7)  # … through its upper edge: 0.0177

CLIPPING_PRESETS: dict[str, dict] = {
    "PPO ε=0.2 vs DAPO (0.2, 0.28) vs KL3 δ=0.05": {
        "m": ["ratio", "clip_higher", "kl3"]},
    "KL3 through PPO's lower edge, its upper edge, and wide (δ = 0.0231, 0.0177, 0.05)": {
        "m": ["ratio", f"kl3:delta={DELTA_LOW_EDGE}", f"kl3:delta={DELTA_HIGH_EDGE}", "kl3"]},
    "KL1 vs KL2 vs KL3 at δ = 0.05": {"m": ["kl1:delta=0.05", "kl2:delta=0.05", "kl3"]},
    "Ratio space vs probability space (rare tokens)": {"m": ["ratio", "prob_tv:delta=0.1"], "pi_old": 0.05},
}

BANDIT_PRESETS: dict[str, dict] = {
    "PPO vs DAPO vs KL3, three correct actions": {
        "m": ["ratio", "clip_higher", "kl3"], "k": 50, "reward": "top_k", "correct_rank": 2, "mu": 4,
        "optimizer": "sgd", "lr": DEFAULT_LR["sgd"]},
    "KL3 through PPO's edges, and wide": {
        "m": ["ratio", f"kl3:delta={DELTA_LOW_EDGE}", f"kl3:delta={DELTA_HIGH_EDGE}", "kl3"], "k": 50,
        "reward": "top_k", "correct_rank": 2, "mu": 4, "optimizer": "sgd", "lr": DEFAULT_LR["sgd"]},
    "A rare correct action (rank 10)": {
        "m": ["ratio", "clip_higher", "kl3"], "k": 50, "reward": "one_correct", "correct_rank": 10, "mu": 4,
        "optimizer": "sgd", "lr": DEFAULT_LR["sgd"]},
    "Ratio vs probability-space clipping, 1000 actions": {
        "m": ["ratio", "prob_tv"], "k": 1000, "reward": "top_k", "correct_rank": 49, "mu": 4, "optimizer": "sgd",
        "lr": DEFAULT_LR["sgd"]},
    "With Adam, as a trainer runs": {
        "m": ["ratio", "clip_higher", "kl3"], "k": 50, "reward": "top_k", "correct_rank": 2, "mu": 4,
        "optimizer": "adam", "lr": DEFAULT_LR["adam"]},
    "PPO vs surrogates: CISPO, SAPO, and DPPO masked by PPO's box": {
        "m": ["ratio"], "s": ["cispo:hi=1.28", "sapo", "dppo"], "k": 50, "reward": "top_k", "correct_rank": 2,
        "mu": 4, "optimizer": "sgd", "lr": DEFAULT_LR["sgd"]},
    "A sampler 2 iterations behind in bf16: no correction, TIS, IcePop, bypass": {
        "m": ["ratio"], "rollout_lag": 2, "rollout_dtype": "bfloat16",
        "rc": ["none", "TIS token", "IcePop token", "bypass"], "k": 50, "reward": "top_k", "correct_rank": 2, "mu": 4,
        "optimizer": "sgd", "lr": 0.1},  # at SGD's 0.5 the first optimiser step already jumps past u (42% of samples)
}
ON_POLICY = {"s": [], "rollout_lag": 0, "rollout_dtype": "same", "rc": ["none"]}
BANDIT_PRESETS = {name: {**ON_POLICY, **values} for name, values in BANDIT_PRESETS.items()}  # a preset names its runs
