"""The workshop walkthrough: each step's link to its exact view, what to do, what to notice, and the numbers it
quotes, computed by the same functions the pages call, formatted as the pages show them.

One source for three things: the Tour page (`app_pages/tour.py`), README's "Workshop walkthrough" (between its two
`walkthrough` markers; `python scripts/walkthrough.py` writes it, tests/pages/test_walkthrough.py checks that README holds
it), and the walkthrough test, which opens each number's page at its link and finds the number where `Number.where`
says it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Callable
from urllib.parse import quote

from divviz.bandit.setting import BanditConfig
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective
from divviz.views import explorer
from divviz.views.figures import fmt


@dataclass(frozen=True)
class Number:
    """A number a step quotes: its text, and where a page shows it: ("metric", label) for a metric's value,
    ("chart", "") for text inside one of the page's charts, ("table", "measure|metric|column") for a cell of the
    page's first table (read back and rounded as quoted), on the page `page` opened with `query`."""

    text: str
    page: str
    query: dict
    where: tuple[str, str]


@dataclass(frozen=True)
class Step:
    title: str
    page: str  # the app page's path, e.g. "kl3_equivalence"
    query: dict  # the link's parameters: the exact view
    do: str
    notice: str  # with {name} fields, filled from `numbers`
    numbers: Callable[[], dict[str, Number]] = field(default=lambda: {})

    def link(self) -> str:
        """The step's view, relative to the app's address."""
        return f"/{self.page}" + ("?" + "&".join(f"{k}={quote(str(v), safe=',:')}" for k, v in self.query.items())
                                  if self.query else "")

    def text(self) -> str:
        return self.notice.format(**{name: number.text for name, number in self.numbers().items()})


CLIPPING = {"m": "ratio,clip_higher,kl3"}


@cache
def _clipping_numbers() -> dict[str, Number]:
    """Each default test's interval, as the intervals chart of Clipping regions labels it."""
    def interval(name: str) -> Number:
        lower, upper = clip_test(name).bounds()
        return Number(f"[{fmt(lower)}, {fmt(upper)}]", "clipping_regions", CLIPPING, ("chart", ""))

    return {name: interval(name) for name in ("ratio", "clip_higher", "kl3")}


@cache
def _kl3_numbers(delta: float) -> dict[str, Number]:
    facts, _ = explorer.kl3_equivalence(delta, 0.2, 0.2, 0.28, 0)
    query = {"delta": f"{delta:g}"}
    return {"l": Number(f"{facts.bounds[0]:.6f}", "kl3_equivalence", query, ("metric", "l_δ")),
            "u": Number(f"{facts.bounds[1]:.6f}", "kl3_equivalence", query, ("metric", "u_δ")),
            "dloss": Number(f"{facts.check.max_abs_loss_diff:.1e}", "kl3_equivalence", query,
                            ("metric", "max |Δ loss|"))}


TOUR_CLIP_TESTS = ("ratio", "clip_higher", "kl3")
SEEDS = 8


@cache
def _bandit_numbers(iteration: int) -> dict[str, Number]:
    """The Mass reallocation page at its defaults (PPO, DAPO, KL3; 8 seeds), paired differences in entropy at
    `iteration` (1-based), each measure minus PPO."""
    groups = explorer.bandit_runs(BanditConfig().to_dict(), [Objective(clip=clip_test(n)) for n in TOUR_CLIP_TESTS],
                                  SEEDS)
    table = explorer.paired_differences(groups, 0, iteration=iteration - 1)
    query = {"diff_at": str(iteration)} if iteration != BanditConfig().iterations else {}
    out = {}
    for name, runs in zip(TOUR_CLIP_TESTS[1:], groups[1:]):
        row = table[(table["measure"] == runs[0].label) & (table["metric"] == "entropy")].iloc[0]
        for column, key, sign in (("difference", "d", "+"), ("95% low", "lo", ""), ("95% high", "hi", "")):
            out[f"{name}_{key}"] = Number(f"{row[column]:{sign}.3f}", "mass_reallocation", query,
                                          ("table", f"{runs[0].label}|entropy|{column}"))
        out[f"{name}_rev"] = Number(row["seeds against the mean"], "mass_reallocation", query,
                                    ("table", f"{runs[0].label}|entropy|seeds against the mean"))
    return out


STEPS = (
    Step("Clipping regions", "clipping_regions", CLIPPING,
         "Compare PPO ε = 0.2, DAPO (0.2, 0.28) and KL3 δ = 0.05 (the preset *PPO ε=0.2 vs DAPO vs KL3 δ=0.05*). Ask "
         "which test lets a good token's probability rise most; move δ and watch the strips in the gradient panel. "
         "Then the preset *Ratio space vs probability space*: π_old = 0.05, and compare the cones.",
         "The intervals: PPO {ratio}, DAPO {clip_higher}, KL3 {kl3}: KL3's box holds both others, its upper edge the "
         "highest and its lower edge the lowest.", _clipping_numbers),
    Step("KL3 ⇔ asymmetric clipping", "kl3_equivalence", {"delta": "0.0231"},
         "Read the derivation, then set δ to 0.0231, the KL3 level through PPO's lower edge 0.8 (the slider moves "
         "in steps of 0.0001).",
         "l_δ = {l}, but the top edge is u_δ = {u}, not 1.2: KL3 is PPO's box only below. The numeric check at the "
         "bottom runs `policy_loss` with both and finds max |Δ loss| = {dloss}.", lambda: _kl3_numbers(0.0231)),
    Step("Mass reallocation", "mass_reallocation", {"diff_at": "10", "diff_metric": "entropy"},
         "The default: the three most likely of 50 actions are correct, 8 seeds per objective, SGD at lr 0.5; each "
         "curve is the mean over the seeds with its 95% band. In *Paired differences* the link sets *At iteration* "
         "to 10 and the paired differences' chart to the entropy.",
         "Each objective minus PPO in entropy, seed by seed: DAPO {clip_higher_d} [{clip_higher_lo}, "
         "{clip_higher_hi}], {clip_higher_rev} seeds against the mean; KL3 δ = 0.05 {kl3_d} [{kl3_lo}, "
         "{kl3_hi}], {kl3_rev} against it: their wider upper edges let the correct actions rise faster, and "
         "entropy falls sooner.",
         lambda: _bandit_numbers(10)),
    Step("Mass reallocation, at the end", "mass_reallocation", {"diff_metric": "entropy"},
         "Move *At iteration* to 80 (or open this link).",
         "At iteration 80: DAPO minus PPO {clip_higher_d} [{clip_higher_lo}, {clip_higher_hi}], {clip_higher_rev} "
         "seeds against the mean; KL3 minus PPO {kl3_d} [{kl3_lo}, {kl3_hi}], {kl3_rev} against it. Where an "
         "interval holds 0 the verdict is *not resolved*: one seed on the projector would be a coin toss. The "
         "**Claims** page puts the papers' statements through the same test on a grid.", lambda: _bandit_numbers(80)),
    Step("Training lab", "training_lab", {"m": "ratio,kl3:delta=0.0177", "seeds": "3", "steps": "200"},
         "Press Start: two objectives, three seeds each, 200 steps (the default 60-step run takes 17–18 s here, so "
         "there is time to watch). "
         "Watch entropy and the clip fractions; move *Step for the token scatter*; press Stop. Then *Compare on "
         "the same batch* with μ = 4 to see the objectives diverge on identical rollouts.",
         "KL3 δ = 0.0177 is the level through PPO's upper edge: its interval is [{l}, {u}], tighter than PPO's "
         "below 1.", lambda: _kl3_numbers(0.0177)),
    Step("Step inspector", "step_inspector", {},
         "Open one of step 5's KL3 runs, colour by *clip state*, pick a blue (masked low) token, and add *ratio* under "
         "*Explain the token also under*.",
         "A token with A < 0 and w between 0.8 and {l} is masked low by KL3 δ = 0.0177 (w < l) but inside PPO's "
         "[0.8, 1.2]: the explainer shows KL3's clipped term winning the min and PPO's not.",
         lambda: {"l": _kl3_numbers(0.0177)["l"]}),
    Step("Runs", "runs", {},
         "Overlay the lab's runs (the list names each by objective, task and seed), group them by objective, download "
         "the metrics CSV; meanwhile run `divviz train --clip-test kl3` in a terminal and watch it appear.",
         "Grouped, each objective is a mean with its band: the seeds' range with fewer than 4 seeds, a 95% interval "
         "cut to the quantity's range with more."),
    Step("When the sampler is not the policy", "training_lab",
         {"m": "ratio", "rollout_dtype": "bfloat16", "rollout_lag": "2", "rc": "none,TIS token,bypass", "seeds": "3"},
         "The link keeps only *ratio*, sets the sampler to bfloat16 and 2 updates behind, and compares no correction, "
         "TIS per token and bypass with 3 seeds each: press Start. Then colour a corrected run's tokens by *ρ* or "
         "*rollout gap* in the Step inspector, and see the Mass reallocation preset *A sampler 2 iterations behind "
         "in bf16* and *Clipping regions* → *Rollout corrections*.",
         "The rollout panel shows the sampler's distance from the policy (k3 KL); the table \"What the rollout "
         "corrections do\" (docs/rollout_corrections.md) has the measured effect over 8 seeds."),
)


APP = "http://localhost:8501"  # `./run app`'s address


def markdown() -> str:
    """README's walkthrough: every step, its link, what to do and what to notice, with the numbers computed now."""
    return "".join(f"{n}. **{step.title}** ([open]({APP}{step.link()})): {step.do} {step.text()}\n"
                   for n, step in enumerate(STEPS, 1))
