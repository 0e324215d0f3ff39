"""The seed papers' claims that divviz can test, as declared before running: each claim's source and provenance
(docs/theory.md's tags), the metric that stands for its words, the measures it compares, the sign it predicts and,
where a paper reports one, the size of the gain; the bandit grid its comparisons run on. Nothing here is tuned to a
result: the grid is fixed before running and every cell is reported (`claims_report.py` computes the cells and verdicts).

Bandit grid (`divviz.bandit.grpo`, exact distributions, the same seeds for every measure):
    correct actions likely (the top 3 of π_0) / rare (one, at rank K/5) / random (10%, drawn per seed)
    × K = 50 / 1000 × SGD (lr 0.5) / Adam (lr 0.05, state kept) × early (iteration 10) / late (80) readings.
Measures: PPO ε = 0.2; KL3 with δ through PPO's lower edge (0.0231), through its upper edge (0.0177), and wide
(0.05); the one-edge ablations of the wide δ, [l_δ, 1.2] and [0.8, u_δ], which tell KL3's shape from a wider box;
DAPO (0.2, 0.28); PPO with 0.1·ProbL2 and with 0.1·k3 toward π_0.

Over training on a language model (`divviz.evidence.claims_lm`, optional: it trains runs): the comparisons a claim
lists in `lm_comparisons`. One update of SmolLM2 (`claims_real`): `real_comparisons`. The report: `claims_report.py`; as text
and HTML: `claims_export.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from divviz import loss_grids
from divviz.catalogue import theory
from divviz.bandit.setting import DEFAULT_LR, BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective, policy_loss
from divviz.catalogue.params import Param
from divviz.catalogue.penalties import penalty, PENALTIES

EARLY, LATE = 10, 80
DELTA_LOW_EDGE, DELTA_HIGH_EDGE, DELTA_WIDE = (float(theory.kl3_delta_at_ratio(0.8)),
                                              float(theory.kl3_delta_at_ratio(1.2)), 0.05)
WIDE_LOW, WIDE_HIGH = theory.kl3_bounds(DELTA_WIDE)
BETA = 0.1


def _objectives() -> dict[str, Objective]:
    return {
        "PPO ε=0.2": Objective(clip=clip_test("ratio", eps=0.2)),
        f"KL3 δ={DELTA_LOW_EDGE:.4f} (PPO's lower edge)": Objective(clip=clip_test("kl3", delta=DELTA_LOW_EDGE)),
        f"KL3 δ={DELTA_HIGH_EDGE:.4f} (PPO's upper edge)": Objective(clip=clip_test("kl3", delta=DELTA_HIGH_EDGE)),
        f"KL3 δ={DELTA_WIDE:g} (wide)": Objective(clip=clip_test("kl3", delta=DELTA_WIDE)),
        f"box [{WIDE_LOW:.3f}, 1.2] (KL3 δ={DELTA_WIDE:g}'s lower edge only)":
            Objective(clip=clip_test("clip_higher", eps_low=1 - WIDE_LOW, eps_high=0.2)),
        f"box [0.8, {WIDE_HIGH:.3f}] (KL3 δ={DELTA_WIDE:g}'s upper edge only)":
            Objective(clip=clip_test("clip_higher", eps_low=0.2, eps_high=WIDE_HIGH - 1)),
        "DAPO clip-higher (0.2, 0.28)": Objective(clip=clip_test("clip_higher", eps_low=0.2, eps_high=0.28)),
        f"PPO + {BETA:g}·ProbL2": Objective(clip=clip_test("ratio"), penalty=penalty("prob_l2"), beta=BETA),
        f"PPO + {BETA:g}·k3": Objective(clip=clip_test("ratio"), penalty=penalty("k3"), beta=BETA),
        CLIP_LOW: Objective(clip=clip_test("clip_higher", eps_low=0.1, eps_high=0.2)),
    }


CLIP_LOW = "clip-low [0.9, 1.2] (a more aggressive lower clip)"
START, ZERO = "its own value at the start", "0"  # baselines that are not a measure: the run before any update, or 0


OBJECTIVES = _objectives()


def measure_of(objective: Objective) -> str | None:
    """The claims' name for `objective` ("box [0.716, 1.2] (KL3 δ=0.05's lower edge only)" for clip_higher with
    ε_low 0.2838, ε_high 0.2), None for an objective the claims do not compare."""
    return next((name for name, known in OBJECTIVES.items() if known == objective), None)


PPO, DAPO, PROBL2, K3 = "PPO ε=0.2", "DAPO clip-higher (0.2, 0.28)", f"PPO + {BETA:g}·ProbL2", f"PPO + {BETA:g}·k3"
KL3_AND_ABLATIONS = [name for name in OBJECTIVES if name.startswith(("KL3", "box"))]
KL3_HIGH_EDGE, KL3_WIDE, BOX_LOW_ONLY, BOX_HIGH_ONLY = KL3_AND_ABLATIONS[1:5]
WIDER_THAN_PPO = (KL3_WIDE, BOX_LOW_ONLY, BOX_HIGH_ONLY, DAPO)  # boxes that contain PPO's [0.8, 1.2]
# Over a training run (`claims_lm`): held-out accuracy is read at the end and as its mean over the run, the stability
# metrics once for the whole run (`engine/stability.py`); lower is more stable.
HELD_OUT = ("eval/accuracy", "eval/accuracy_greedy")
WHOLE_RUN = ("stability/collapsed", "stability/max_kl", "stability/max_clip")
# The step of collapse censored at the run's last step T (T for a run that never collapsed): its mean over seeds is
# the restricted mean time to collapse up to T (every run is followed to T), higher is more stable.
TIME_TO_COLLAPSE = "stability/time_to_collapse"
BINARY = ("stability/collapsed",)  # 0/1 per run: paired by `intervals.paired_binary`, whose interval stays in [−1, 1]
TRAINING = ((HELD_OUT[0], +1), (HELD_OUT[1], +1), *((metric, -1) for metric in WHOLE_RUN), (TIME_TO_COLLAPSE, +1))


# A claim's family holds its primary readings only: those its words name, of the objectives it names. Held-out accuracy
# sampled at the end ("better at the end"; greedy and the mean over the run, whose step 0 the pair shares, are
# secondary), the collapse flag ("more stable"; the largest update KL and clip fraction and the time to collapse
# describe how), a per-step
# metric's late window (the state the run reaches; the early window describes the way there), one update's change;
# the one-edge boxes of δ = 0.05 are ablations (KL3's shape against its width), not the claim's objective. The other
# readings are descriptive: shown with their raw verdict, neither adjusted nor counted. Fixed after the published
# cells had been read; a pre-registered experiment fixes its own before its first run.
PRIMARY_READINGS = {HELD_OUT[0]: ("end",), "stability/collapsed": ("whole run",)}
SECONDARY = (HELD_OUT[1], "stability/max_kl", "stability/max_clip", TIME_TO_COLLAPSE)
ABLATIONS = (BOX_LOW_ONLY, BOX_HIGH_ONLY)


def is_primary(candidate: str, metric: str, reading: str) -> bool:
    """Whether a cell is one of its claim's primary readings (`PRIMARY_READINGS`: the family Holm adjusts over)."""
    if candidate in ABLATIONS or metric in SECONDARY:
        return False
    return reading in PRIMARY_READINGS.get(metric, ("late", ""))


@dataclass(frozen=True)
class Effect:
    """The effect a comparison is sized for: a gain of `size` in its metric, and where the size comes from."""

    size: float
    source: str


# The margin: 5 points of held-out accuracy (6 of the 128 problems), the scale of the gain the papers report, fixed
# after the learn pair's 8 seeds had been read (before the stress pair's seeds 4–11 ran); a claim whose paper reports
# a gain in this unit is sized for that instead.
SMALLEST_EFFECT = {metric: Effect(0.05, "a 5-point margin, fixed after the learn pair had been read")
                   for metric in HELD_OUT}
PROBL2_EFFECT = Effect(0.055, "GBMPO's +5.5 points (ProbL2-GRPO over Dr. GRPO on GSM8K)")  # the one gain reported
# Readings that a wider box lowers whatever the measure's shape (KL3 δ = 0.05's box [0.716, 1.350], its one-edge
# boxes and DAPO's contain PPO's [0.8, 1.2]): labelled, and not counted as evidence of stability.
BY_CONSTRUCTION = {(name, "stability/max_clip"): "lower by construction: the candidate's box contains PPO's, so "
                                                  "fewer tokens reach its edges" for name in WIDER_THAN_PPO}


@dataclass(frozen=True)
class Comparison:
    candidate: str
    baseline: str
    metric: str
    sign: int  # the sign of candidate − baseline the claim predicts


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    source: str
    provenance: str
    operational: str  # what stands for the claim's words here
    comparisons: tuple[Comparison, ...] = ()
    identity: Callable[[], list[dict]] | None = None  # for identities: cells of largest differences
    lm_operational: str = ""  # on the built-in LM (`divviz.evidence.claims_lm`), where the claim is tested there too
    lm_comparisons: tuple[Comparison, ...] = ()
    reward: str = "task"  # "random": tested under the random-reward control (`RANDOM_GRID`, the LM's --reward random)
    real_operational: str = ""  # on SmolLM2-135M, one update per batch (`divviz.evidence.claims_real`)
    real_comparisons: tuple[Comparison, ...] = ()
    effect: Effect | None = None  # the gain the paper reports in a metric of `lm_comparisons`, if it reports one
    no_effect: str = ""  # why a claim tested over training has no `effect` (its paper reports none in this unit)


def effect_of(claim: Claim, c: Comparison) -> Effect | None:
    """The effect a comparison is sized for (its power, the gain it can rule out): the paper's where it reports one
    in the metric's unit, else the 5-point margin (`SMALLEST_EFFECT`); None for the metrics
    with neither."""
    if c.metric not in SMALLEST_EFFECT:
        return None
    return claim.effect or SMALLEST_EFFECT[c.metric]


def _kl3_identity_cells() -> list[dict]:
    cells = []
    for delta in (DELTA_HIGH_EDGE, DELTA_LOW_EDGE, DELTA_WIDE, 0.2):
        for seed in range(5):
            check = loss_grids.kl3_equivalence_check(delta, seed=seed)
            cells.append({"condition": f"δ = {delta:.4f}, random batch {seed} ({check.tokens} tokens, "
                                       f"{check.outside} outside)", "candidate": f"KL3 δ={delta:.4f}",
                          "baseline": "ratio box [l_δ, u_δ]",
                          "max_difference": max(check.max_abs_loss_diff, check.max_abs_grad_diff)})
    return cells


def _rpg_identity_cells() -> list[dict]:
    cells = []
    for name in (n.removesuffix("_rf") for n in PENALTIES if n.endswith("_rf")):  # RPG's four KL losses
        for seed in range(5):
            logp_new, logp_old, adv, mask = loss_grids.random_token_batch(seed)
            grads = []
            for form in (name, f"{name}_rf"):
                x = logp_new.clone().requires_grad_()
                out = policy_loss(x, logp_old, adv, mask,
                                  Objective(clip=clip_test("ratio"), penalty=penalty(form), beta=0.5))
                grads.append(torch.autograd.grad(out.loss, x)[0])
            cells.append({"condition": f"random batch {seed}, β = 0.5, PPO clip", "candidate": f"{name}_rf",
                          "baseline": name, "max_difference": float((grads[0] - grads[1]).abs().max())})
    return cells


CLAIMS = (
    Claim("kl3_is_clipping", "The KL3 test equals ratio clipping on [l_δ, u_δ] (loss and gradient)",
          "KL3 / ATR-GRPO paper (arXiv 2602.05494), docs/theory.md §1.3", "[3P] statement; [INF] closed form",
          "largest |difference| of the loss and of its gradient on random token batches, tolerance 1e-12",
          identity=_kl3_identity_cells),
    Claim("kl3_mass_to_confident", "KL3 reallocates probability mass toward high-confidence actions",
          "KL3 / ATR-GRPO paper, docs/theory.md §1.5", "[3P] claims only: the theorem's statement was not found",
          "initial_top_mass: the probability on the actions most likely under π_0 (top 10%), KL3 minus PPO",
          tuple(Comparison(name, PPO, "initial_top_mass", +1) for name in KL3_AND_ABLATIONS),
          lm_operational="mass_to_argmax: the share of the probability gained in an update that went to tokens that "
                         "were already the argmax; top1_mass: the sampling policy's top-1 probability at the sampled "
                         "positions (mass moved to the confident token over training); KL3 minus PPO",
          lm_comparisons=tuple(Comparison(name, PPO, metric, +1) for name in (KL3_HIGH_EDGE, KL3_WIDE)
                               for metric in ("mass_to_argmax", "top1_mass")),
          real_operational="one update: mass_to_argmax (the share of the mass gained that went to argmax tokens) and "
                           "top1_change (the top-1 mass's change over the full vocabulary at the sampled positions), "
                           "KL3 minus PPO",
          real_comparisons=tuple(Comparison(name, PPO, metric, +1) for name in (KL3_HIGH_EDGE, KL3_WIDE)
                                 for metric in ("mass_to_argmax", "top1_change"))),
    Claim("kl3_training", "KL3 makes GRPO training more stable and better at the end",
          "KL3 / ATR-GRPO paper (arXiv 2602.05494): KL3 in GRPO \"improves both training stability and final "
          "performance\"", "[3P] claims only",
          "over training only (the bandit has no held-out set): see the LM readings",
          lm_operational="held-out accuracy (128 problems no training batch draws; sampled at the run's τ and greedy) "
                         "at the end and its mean over the run, higher is better; the collapse flag, the largest "
                         "update KL (k3) and the largest clip fraction of the run, lower is more stable; KL3 and the "
                         "two one-edge boxes of δ = 0.05 (its shape against its width) minus PPO",
          lm_comparisons=tuple(Comparison(name, PPO, metric, sign)
                               for name in (KL3_HIGH_EDGE, KL3_WIDE, BOX_LOW_ONLY, BOX_HIGH_ONLY)
                               for metric, sign in TRAINING),
          no_effect="the KL3 paper reports its gains on math benchmarks of Qwen3 models, not in a unit of this task"),
    Claim("kl3_entropy", "KL3 keeps entropy higher than PPO (entropy-driven exploration)",
          "KL3 / ATR-GRPO paper, docs/theory.md §1.5", "[3P] claims only",
          "entropy of the whole policy (exact), KL3 minus PPO",
          tuple(Comparison(name, PPO, "entropy", +1) for name in KL3_AND_ABLATIONS),
          lm_operational="entropy: the mean token entropy of the sampled completions, KL3 minus PPO",
          lm_comparisons=(Comparison(KL3_HIGH_EDGE, PPO, "entropy", +1), Comparison(KL3_WIDE, PPO, "entropy", +1)),
          real_operational="one update: entropy/change, the exact change of the full distribution's entropy at the "
                           "sampled positions, KL3 minus PPO",
          real_comparisons=(Comparison(KL3_HIGH_EDGE, PPO, "entropy/change", +1),
                            Comparison(KL3_WIDE, PPO, "entropy/change", +1))),
    Claim("dapo_entropy", "Clip-higher keeps entropy higher than symmetric clipping",
          "DAPO (Yu et al. 2025), as RPG App. I.2.1 reads it; RPG §5 says the opposite (docs/theory.md §3.7)",
          "[PAPER] (RPG's text; internally inconsistent)",
          "entropy of the whole policy, DAPO (0.2, 0.28) minus PPO 0.2",
          (Comparison(DAPO, PPO, "entropy", +1),),
          lm_operational="entropy: the mean token entropy of the sampled completions, DAPO minus PPO",
          lm_comparisons=(Comparison(DAPO, PPO, "entropy", +1),),
          real_operational="one update: entropy/change, DAPO minus PPO",
          real_comparisons=(Comparison(DAPO, PPO, "entropy/change", +1),)),
    Claim("probl2_training", "A ProbL2 penalty makes GRPO end more accurate",
          "GBMPO (arXiv 2602.04380): ProbL2-GRPO +5.5 points over Dr. GRPO on GSM8K", "[PAPER] result",
          "over training only (the bandit has no held-out set): see the LM readings",
          lm_operational=f"held-out accuracy (sampled and greedy) at the end and its mean over the run, PPO + "
                         f"{BETA:g}·ProbL2 toward π_0 minus PPO (GRPO's std-scaled advantages, not Dr. GRPO's)",
          lm_comparisons=tuple(Comparison(PROBL2, PPO, metric, +1) for metric in HELD_OUT),
          effect=PROBL2_EFFECT),
    Claim("probl2_anchors", "ProbL2 anchors confident tokens and leaves rare ones free",
          "GBMPO (arXiv 2602.04380), docs/theory.md §2.3", "[CODE] penalty; [INF] its slope 2p(p − p_ref) ∝ p²",
          "initial_top_moved (Σ|π − π_0| on the top 10% of π_0): ProbL2 minus no penalty, predicted < 0; "
          "initial_rare_moved (bottom half): ProbL2 minus k3 at the same β, predicted > 0",
          (Comparison(PROBL2, PPO, "initial_top_moved", -1), Comparison(PROBL2, K3, "initial_rare_moved", +1))),
    Claim("rpg_same_gradient", "RPG's REINFORCE-style and differentiable losses have the same gradient",
          "RPG (arXiv 2505.17508) Proposition 4.1, docs/theory.md §3.4", "[PAPER]",
          "largest |difference| of the gradient of policy_loss with each KL loss in its two forms, tolerance 1e-12",
          identity=_rpg_identity_cells),
)
RANDOM_REWARD_SOURCE = "Park et al. 2025, Clip-Low Increases Entropy and Clip-High Decreases Entropy (arXiv 2509.26114)"
CLAIMS += (
    Claim("random_reward_entropy_falls", "With random rewards, PPO's symmetric clip lowers entropy",
          RANDOM_REWARD_SOURCE, "[PAPER]",
          "entropy of the whole policy minus its entropy at the start, PPO ε = 0.2, a fair coin per sample as reward",
          (Comparison(PPO, START, "entropy", -1),),
          lm_operational="entropy: the mean token entropy of the sampled completions minus the same at step 1, PPO, "
                         "a fair coin per completion as reward",
          lm_comparisons=(Comparison(PPO, START, "entropy", -1),), reward="random",
          real_operational="one update with coin rewards: entropy/change of PPO, against 0",
          real_comparisons=(Comparison(PPO, ZERO, "entropy/change", -1),)),
    Claim("random_reward_clip_low", "With random rewards, a more aggressive lower clip keeps entropy higher than the "
                                    "symmetric clip", RANDOM_REWARD_SOURCE, "[PAPER]",
          f"entropy of the whole policy, {CLIP_LOW} minus PPO ε = 0.2, coin rewards",
          (Comparison(CLIP_LOW, PPO, "entropy", +1),),
          lm_operational=f"entropy of the sampled completions, {CLIP_LOW} minus PPO, coin rewards",
          lm_comparisons=(Comparison(CLIP_LOW, PPO, "entropy", +1),), reward="random",
          real_operational=f"one update with coin rewards: entropy/change, {CLIP_LOW} minus PPO",
          real_comparisons=(Comparison(CLIP_LOW, PPO, "entropy/change", +1),)),
    Claim("random_reward_attribution", "Per update, the samples masked low would have lowered entropy and those "
                                       "masked high would have raised it", RANDOM_REWARD_SOURCE,
          "[PAPER] mechanism; [INF] first-order attribution (Cui et al. 2025, arXiv 2505.22617)",
          "entropy/would_masked_low and entropy/would_masked_high of PPO ε = 0.2 (the first-order entropy change the "
          "masked samples would have caused unmasked, bandit.entropy), mean over the reading's updates, against 0",
          (Comparison(PPO, ZERO, "entropy/would_masked_low", -1), Comparison(PPO, ZERO, "entropy/would_masked_high", +1)),
          lm_operational="entropy/cov_masked_low and entropy/cov_masked_high of PPO: the masked tokens' share of "
                         "Cov(log π_old, A), whose sign is minus that of the entropy change they would have caused "
                         "(positive: entropy down), against 0",
          lm_comparisons=(Comparison(PPO, ZERO, "entropy/cov_masked_low", +1),
                          Comparison(PPO, ZERO, "entropy/cov_masked_high", -1)), reward="random",
          real_operational="one update with coin rewards: the same covariance shares of PPO, against 0",
          real_comparisons=(Comparison(PPO, ZERO, "entropy/cov_masked_low", +1),
                            Comparison(PPO, ZERO, "entropy/cov_masked_high", -1))),
)
IDENTITY_TOLERANCE = 1e-12
SEEDS, QUICK_SEEDS = 64, 20
SEEDS_PARAM = Param("seeds", QUICK_SEEDS, 2, 256, high_open=False, kind="int", typical=(2, 64, 1),
                    doc="seeds per measure in every bandit cell (the same seeds for every measure)")

UNTESTED = (
    "Accuracy on math benchmarks (AIME, MATH500, AMC) of the papers' Qwen3 1.7B/8B models: the models, the data "
    "and the compute are not here.",
    "The KL3 paper's theorems on the logit difference and on entropy: their exact statements and assumptions were "
    "not found (docs/theory.md §1.5), so their operational readings above are divviz's.",
    "GBMPO's learned (ES-trained) mirror maps, and its reported gain over Dr. GRPO on GSM8K as such: over training "
    "divviz compares PPO + ProbL2 with PPO on a small model's arithmetic task.",
    "RPG's benchmark numbers and its claim that the REINFORCE-style forms train better: only the gradient identity "
    "is testable exactly; training quality would need their tasks.",
)


@dataclass(frozen=True)
class Condition:
    reward: str
    k: int
    optimizer: str

    def config(self, iterations: int) -> BanditConfig:
        rewards = {"likely": {"reward": "top_k", "correct_rank": 2},
                   "rare": {"reward": "one_correct", "correct_rank": self.k // 5},
                   "random": {"reward": "random_correct", "correct_percent": 10},
                   "coin": {"reward": "coin", "attribution": True}}[self.reward]  # what masked samples would do
        return BanditConfig.make(k=self.k, optimizer=self.optimizer, lr=DEFAULT_LR[self.optimizer],
                                 iterations=iterations, **rewards)

    @property
    def text(self) -> str:
        where = {"likely": "correct actions likely", "rare": "one rare correct action",
                 "random": "a random 10% correct", "coin": "random rewards (a coin per sample)"}[self.reward]
        return f"{where} · K = {self.k} · {'SGD' if self.optimizer == 'sgd' else 'Adam'}"


GRID = tuple(Condition(r, k, o) for r in ("likely", "rare", "random") for k in (50, 1000) for o in ("sgd", "adam"))
RANDOM_GRID = tuple(Condition("coin", k, o) for k in (50, 1000) for o in ("sgd", "adam"))  # the random-reward claims


BANDIT, LM, REAL = "bandit", "built-in LM", "SmolLM2-135M, one update"  # a row's setting
LM_TRAINING = "SmolLM2-135M, over training"
# A report's sections, each its own Benjamini–Hochberg family (`claims_report.adjust`): a row's setting ↦ its section
SECTIONS = {BANDIT: "bandit", "random batches": "bandit", LM: "built-in LM", LM_TRAINING: "SmolLM2-135M",
            REAL: "SmolLM2-135M"}
