"""A compared cell's numbers in words, as the Claims tables, the forest plots' hovers and `divviz claims` print
them: the seeds its power needs, its verdict power, its dose, the effect it rules out, its robust tests."""

from __future__ import annotations

import math

import numpy as np

from divviz.evidence import significance


def power_text(row: dict) -> str:
    """A cell's seeds for 80% power in words: "11 [5, 60] for +0.055" (at its spread and the ends of the spread's
    95% interval); "" where the cell is sized for no effect."""
    if row["effect"] is None:
        return ""
    count = lambda n: "> 10,000" if n is None else str(n)  # noqa: E731
    low, high = row["seeds_for_power_range"]
    return (f"{count(row['seeds_for_power'])} [{count(low)}, {count(high)}] for {row['effect']:+.3f}"
            if row["n"] >= 2 else "")


def verdict_power_text(row: dict) -> str:
    """A cell's verdict power in words: "0.12 for +0.050 in a family of 4" (`verdict_power`); "" where the cell is
    sized for no effect."""
    if row.get("verdict_power") is None:
        return ""
    family = row.get("family_size")
    return f"{row['verdict_power']:.2f} for {row['effect']:+.3f}" + (f" in a family of {family}" if family else "")


FEW_TOKENS = 0.01  # a disagreement below this share of tokens: the two objectives barely act differently


def dose_text(row: dict) -> str:
    """A pair's dose over training in words (`lm_evidence.LMEvidence.dose`): "PPO ε=0.2 clips 0.85% of tokens, KL3
    δ=0.05 (wide) 0.45%; their clip states differ on 0.50%: a verdict on objectives that act differently on so few
    tokens can hardly show a difference"; "" where the cell has none."""
    dose = row.get("dose")
    if not dose:
        return ""
    clips = [f"{name} clips {100 * share:.2f}% of tokens" if i == 0 else f"{name} {100 * share:.2f}%"
             for i, (name, share) in enumerate(dose["clip"].items())]
    text = ", ".join(clips)
    differ = dose.get("disagreement")
    if differ is not None and math.isfinite(differ):
        text += f"; their clip states differ on {100 * differ:.2f}%"
        if differ < FEW_TOKENS:
            text += ": a verdict on objectives that act differently on so few tokens can hardly show a difference"
    return text


def effect_text(row: dict) -> str:
    """Whether a cell rules out its effect, with the one-sided bound that does: "rules out a gain ≥ 0.055 (one-sided
    95% bound +0.021; GBMPO's …)"; "" where it does not."""
    if not row["rules_out"]:
        return ""
    bound = significance.gain_bound(row["differences"])
    return f"rules out a gain ≥ {row['effect']:.3f} (one-sided 95% bound {bound:+.3f}; {row['effect_source']})"


def tested_text(row: dict) -> str:
    """A cell's robust tests as its line and its hover print them: ", sign-flip p 0.25 (Holm 1), median -0.021"
    ("" for a cell with no test)."""
    if row["p"] is None:
        return ""
    holm = "" if row.get("p_holm") is None else f" (Holm {row['p_holm']:.3g})"
    return f", sign-flip p {row['p']:.3g}{holm}, median {signed(row['median'])}"


def signed(x: float) -> str:
    """A number with its sign to 3 significant digits, never in exponent form: "+0.146", "-0.00184", "+0.000088";
    exactly zero (either sign) "0", which is neither side."""
    return "0" if x == 0 else np.format_float_positional(x, precision=3, fractional=False, trim="-", sign=True)
