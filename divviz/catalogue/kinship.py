"""How the catalogue's entries relate: each one's group, and how it differs from its nearest sibling.

The Catalogue page and `divviz catalogue` read this map; tests/catalogue/test_catalogue.py checks that it names every entry
once and that every sibling is an entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    title: str
    family: str  # "clip", "penalty" or "surrogate"
    blurb: str
    members: tuple[tuple[str, str, str], ...]  # (entry, nearest sibling, how the entry differs from it)


GROUPS = (
    Group("Ratio boxes", "clip", "A fixed interval of w = π_θ/π_old, whatever the token's probability.", (
        ("ratio", "clip_higher", "one ε for both sides"),
        ("clip_higher", "ratio", "its own room above 1 (ε_high > ε_low lets unlikely tokens rise: DAPO)"),
    )),
    Group("KL tests of w", "clip", "Schulman's estimators of KL(π_old‖π_θ) on the token, at most δ.", (
        ("kl3", "clip_higher", "the same box with ε_low = 1 − l_δ, ε_high = u_δ − 1 (Lambert W), set by one δ"),
        ("kl2", "kl3", "symmetric in log w, [e^−√(2δ), e^√(2δ)]: a little tighter above 1 at the same δ"),
        ("kl1", "kl3", "−log w can be negative, so only the lower bound e^−δ is left (u = ∞)"),
    )),
    Group("Probability-space tests", "clip", "The change of the token's probability, not its ratio: the interval "
          "of w depends on π_old, wide for rare tokens and narrow for likely ones.", (
        ("prob_tv", "dppo_tv", "one δ for a fall and a rise"),
        ("dppo_tv", "prob_tv", "its own room for a fall (δ_low) and a rise (δ_high): verl's DPPO-Binary-TV"),
        ("dppo_kl", "dppo_tv", "the change measured by the token's yes/no (Bernoulli) KL: a likely token gets "
                               "little room to rise and a rare one much"),
    )),
    Group("Your own", "clip", "A divergence you type, tested as f(w) ≤ δ.", (
        ("formula", "kl3", "any f in w (and π_old) that passes the checks; w − 1 − log w is kl3 exactly"),
    )),
    Group("KL to the reference (GRPO's direction)", "penalty", "Estimators of KL(π_θ‖π_ref) on r = π_ref/π_θ, added "
          "as β·value.", (
        ("k3", "k1", "never negative and low-variance (GRPO's, TRL's beta); the kl3 test's estimator on the flipped "
                     "ratio"),
        ("k1", "k3", "unbiased but can be negative; its slope in log π is constant"),
        ("k2", "k3", "½(log r)², symmetric in log r: half of GBMPO's log-L2"),
        ("abs", "k1", "|log r|: k1 made non-negative, the same slope size ±1 (verl's abs)"),
    )),
    Group("GBMPO's Bregman penalties", "penalty", "Bregman divergences D_h(π_θ‖π_ref) on the sampled token.", (
        ("prob_l2", "mirror", "h = ‖p‖² fixed: the slope 2p(p − p_ref) leaves rare tokens almost free"),
        ("mirror", "prob_l2", "h from a seeded non-negative neural map ψ = ∇h instead of ‖p‖²"),
        ("mirror_phi", "mirror", "the map's 380 numbers given (e.g. an ES run's best φ) instead of drawn from a seed"),
    )),
    Group("RPG's regularisers to π_old", "penalty", "RPG's KL family (Zhang et al. 2026) toward the sampling policy, "
          "each in a differentiable and a REINFORCE-style form with the same gradient.", (
        ("fkl", "ufkl", "−log w alone: its value can be negative"),
        ("ufkl", "fkl", "adds w − 1, the unnormalised form: k3 of w, the kl3 test's measure as a penalty"),
        ("rkl", "urkl", "w log w, the reverse direction KL(π_θ‖π_old)"),
        ("urkl", "rkl", "subtracts w, the unnormalised form"),
        ("fkl_rf", "fkl", "value −sg(g(w))·log π: the same gradient (RPG Prop. 4.1), another loss value"),
        ("ufkl_rf", "ufkl", "value −sg(g(w))·log π: the same gradient, another loss value"),
        ("rkl_rf", "rkl", "value −sg(g(w))·log π: the same gradient, another loss value"),
        ("urkl_rf", "urkl", "value −sg(g(w))·log π: the same gradient, another loss value"),
    )),
    Group("Soft surrogates (no clip test)", "surrogate", "They replace PPO's clipped surrogate; the gradient weight γ "
          "(∂ℓ/∂log π = −A·γ) is the constraint.", (
        ("cispo", "gpg", "the weight is w clipped to [lo, hi] instead of 1; unlike PPO no token loses its gradient"),
        ("sapo", "cispo", "a smooth gate: γ = 4σ(1−σ)·w fades away from w = 1 instead of flattening at a cap"),
        ("gpg", "cispo", "γ = 1: plain REINFORCE, no ratio (cispo with lo = hi = 1)"),
        ("icepop", "cispo", "the weight is w inside [lo, hi] and 0 outside instead of flat at the edges: verl's IcePop "
                            "in bypass mode (its TIS, min(w, hi), is cispo with lo = 0)"),
        ("dro", "gpg", "REINFORCE plus β/2·(log w)²: its slope β log w pulls a token back toward π_old, harder the "
                       "further it went"),
    )),
    Group("Batch-selecting surrogates", "surrogate", "Which tokens they treat otherwise depends on the whole batch: "
          "those whose advantage and log-prob covary (Cui et al. 2025).", (
        ("kl_cov", "gpg", "the ratio w instead of 1, and a |log w| penalty on the top-k covariance tokens only"),
        ("clip_cov", "dppo", "PPO's clipped surrogate, except k random tokens in a covariance band lose their "
                             "gradient"),
    )),
    Group("Surrogates with a clip test", "surrogate", "They keep the objective's clip test for masking.", (
        ("dppo", "cispo", "tokens the test masks get no gradient (as PPO); unmasked ones the weight min(w, c)"),
    )),
    Group("RPG's Algorithm 2 (KL inside the clipped advantage)", "surrogate", "RPG's REINFORCE-style loss with its "
          "clip: the KL term β·g joins the advantage the clip test and c judge, so a held token loses it too.", (
        ("rpg_ufkl", "ufkl_rf", "the same β(w − 1) pull, but only on tokens the clip keeps, and read at the clipped w̄"),
        ("rpg_urkl", "rpg_ufkl", "g = −w̄ log w̄: the reverse direction's pull"),
        ("rpg_fkl", "rpg_ufkl", "g = 1: a constant push up every unmasked token's log-prob, its value unbounded"),
        ("rpg_rkl", "rpg_urkl", "g = −w̄(log w̄ + 1): URKL's pull minus a constant"),
    )),
    Group("Sequence-level surrogates", "surrogate", "A completion's tokens share one ratio (PPO's own sequence level is "
          "GSPO: the objective's importance-sampling level).", (
        ("vespo", "cispo", "the weight φ(W) of the whole completion's ratio W, 1 at W = 1, fading on both sides"),
        ("geo_mean", "vespo", "the geometric mean of the token ratios, each clipped to [l, u] first; one loss per "
                              "completion (GMPO)"),
    )),
)

SIBLINGS = {name: (sibling, how) for group in GROUPS for name, sibling, how in group.members}
