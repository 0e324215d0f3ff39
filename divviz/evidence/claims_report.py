"""The claims report: every cell of every claim, its verdict, and the report's multiplicity.

A compared cell (`comparison_row`; a report's cells are tested together, `comparison_rows`) is candidate − baseline
over the same seeds: the paired mean with its 95% interval (`intervals`), the sign-flip p of the mean, the median
with its sign test, and the verdict they give together (`significance.verdict`); an identity's cell is its largest
|difference| against a tolerance. The cells of a report are then adjusted for their number (`adjust`): Holm within a
family (a claim's primary readings at one setting), Benjamini–Hochberg within the report's section
(`claims.SECTIONS`); each cell keeps its raw verdict beside the adjusted one, and the counts of a report's summary
and overview are of the adjusted ones; a cell outside its claim's primary readings (`claims.is_primary`) is
descriptive, in no family.

The bandit grid (`evaluate`) makes the first cells; `claims_lm` and `claims_real` add theirs (`Report` is replaced
with more rows, and adjusted again).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from divviz.evidence import bandit_published, intervals, significance
from divviz.evidence.bandit_cells import bandit_cells
from divviz.evidence.cell_words import dose_text, effect_text, power_text, verdict_power_text
from divviz.evidence.kept import Kept
from divviz.evidence.verdict_power import verdict_power
from divviz.evidence.claims import (BANDIT, BINARY, BY_CONSTRUCTION, CLAIMS, GRID, IDENTITY_TOLERANCE, QUICK_SEEDS,
                                    RANDOM_GRID, SECTIONS, SEEDS, UNTESTED, Claim, Comparison, effect_of, is_primary)
from divviz.runs import tail


COMPUTED_HERE = "computed here"  # a report's bandit cells, when they were not read from the published grid


def summary_key(row: dict) -> tuple[str, str, str, str, str]:
    """The summary entry a cell (or the entry itself) counts in: its claim, setting, compared pair and metric."""
    return row["claim"], row["setting"], row["candidate"], row["baseline"], row["metric"]


@dataclass
class Report:
    rows: list[dict]
    seeds: int
    bandit: str = COMPUTED_HERE  # where the bandit's cells come from: else `bandit_published.source`
    lm: str = ""  # what the language model's cells are ("" when the report has none): `claims_lm.LMPlan.text`
    real: str = ""  # what the real model's cells are ("" when none): `claims_real.RealPlan.text`
    lm_details: tuple[str, ...] = ()  # lines on the LM runs beyond the cells: collapses per measure, the pilot
    untested: tuple[str, ...] = UNTESTED
    claims: tuple[Claim, ...] = field(default=CLAIMS)

    def __post_init__(self):
        self.rows = adjust(self.rows)

    def summary(self) -> list[dict]:
        """Per claim, setting, compared pair and metric: how many cells have each verdict after adjustment for
        multiplicity (`VERDICTS`), how many held or reversed before it ("raw holds or reversed") and how many
        primary cells rule out the gain they are sized for (`RULES_OUT`); for an
        identity, also the largest |difference| over its cells (None for the other claims)."""
        out: dict[tuple, dict] = {}
        for row in self.rows:
            entry = out.setdefault(summary_key(row),
                                   {"claim": row["claim"], "setting": row["setting"], "candidate": row["candidate"],
                                    "baseline": row["baseline"], "metric": row["metric"], "cells": 0,
                                    **{v: 0 for v in VERDICTS}, RAW: 0, RULES_OUT: 0, "largest": None})
            entry["cells"] += 1
            entry[row["verdict_adjusted"]] += 1
            entry[RAW] += row["verdict"] in (intervals.HOLDS, intervals.REVERSED)
            entry[RULES_OUT] += bool(row.get("rules_out")) and row["verdict_adjusted"] != DESCRIPTIVE
            if intervals.is_identity(row["verdict"]):
                entry["largest"] = max(entry["largest"] or 0.0, abs(row["mean"]))
        return list(out.values())

    def overview(self) -> list[dict]:
        """Per claim, in the catalogue's order, and per setting it is tested in (the bandit, a language model over
        training, one update, …): how many cells, and how many of them hold, reverse, are not resolved, exact or
        not, or have no data yet, and how many primary cells rule out the gain they are sized for (`summary` added
        up over its rows) — a setting's verdicts never added to another's.
        A claim with no cell yet is one row, its setting ""."""
        out, summary = {}, self.summary()
        for claim in self.claims:
            rows = [s for s in summary if s["claim"] == claim.text] or [{"claim": claim.text, "setting": ""}]
            for s in rows:
                entry = out.setdefault((claim.text, s["setting"]), {"claim": claim.text, "setting": s["setting"],
                                                                    "cells": 0, **dict.fromkeys(VERDICTS, 0), RAW: 0,
                                                                    RULES_OUT: 0})
                for count in ("cells", *VERDICTS, RAW, RULES_OUT):
                    entry[count] += s.get(count, 0)
        return list(out.values())

    @property
    def scope(self) -> str:
        """One line: how many cells, and on what."""
        return (f"{len(self.rows)} cells: the bandit grid with {self.seeds} seeds per measure, every measure on the "
                f"same seeds, {self.bandit}"
                + (f"; {self.lm}" if self.lm else "; the built-in LM not included")
                + (f"; {self.real}" if self.real else ""))


CELL_KEYS = ("claim", "setting", "condition", "metric", "candidate", "baseline", "predicted_sign", "verdict",
             "verdict_adjusted", "mean", "low", "high", "n", "seeds_against_mean", "p", "p_holm", "q_bh", "median",
             "p_median", "seeds_for_power", "verdict_power", "rules_out", "by_construction",
             "dose")  # a cell's columns, in the order shown
HEADERS = {**{k: k for k in CELL_KEYS}, "predicted_sign": "predicted", "verdict": "verdict (raw)",
           "verdict_adjusted": "verdict (Holm)", "low": "95% low", "high": "95% high",
           "seeds_against_mean": "seeds against the mean", "p": "sign-flip p", "p_holm": "p (Holm, claim × setting)",
           "q_bh": "q (BH, section)", "median": "median", "p_median": "sign-test p",
           "seeds_for_power": "seeds for 80% power (t-test alone)",
           "verdict_power": "verdict power (whole rule, Holm)",
           "dose": "dose (clip fractions; tokens whose clip state differs)", "rules_out": "rules out the effect",
           "by_construction": "by construction", "cells": "cells", "reading": "reading",
           "largest": "largest |difference|"}  # their headers


def cell_table(rows: list[dict], shared: dict) -> list[dict]:
    """A claim's cells as its table shows them, headed in words: who and what (candidate, metric), the outcome
    (the verdicts, mean, interval, n, tests) before the long condition, without the columns every cell shares
    (`shared`, said once above it) or that say nothing for these cells (an identity's interval, predicted sign, n
    and tests; its mean is the largest |difference|)."""
    identity = all(intervals.is_identity(row["verdict"]) for row in rows)
    said_by_mean = ("predicted_sign", "verdict_adjusted", "low", "high", "n", "seeds_against_mean", "p", "p_holm",
                    "q_bh", "median", "p_median", "seeds_for_power", "verdict_power", "rules_out", "by_construction",
                    "reading")
    first = ("candidate", "metric", "reading", "verdict_adjusted", "verdict", "mean", "low", "high", "n",
             "seeds_against_mean")  # the reading (end, over the run, late) beside its metric: it tells two rows apart
    keys = [k for k in dict.fromkeys((*first, *CELL_KEYS[1:]))
            if k not in shared and not (identity and k in said_by_mean)]
    headers = {**HEADERS, **({"mean": HEADERS["largest"]} if identity else {})}
    texts = {"seeds_for_power": power_text, "verdict_power": verdict_power_text, "rules_out": effect_text,
             "dose": dose_text}
    return [{headers[k]: texts[k](row) if k in texts else row[k] for k in keys} for row in rows]


def shared_text(shared: dict) -> str:
    """`in_common`'s values in words, e.g. "setting bandit · baseline PPO ε=0.2 · predicted: candidate − baseline
    > 0"."""
    words = {"predicted_sign": lambda v: f"predicted: candidate − baseline {'>' if v == '+' else '<'} 0",
             "baseline": lambda v: "compared against 0" if v == "0" else f"baseline {v}"}
    return " · ".join(words.get(k, lambda v: f"{HEADERS[k]} {v}")(v) for k, v in shared.items())


def in_common(rows: list[dict], keys) -> dict:
    """The `keys` whose value is the same in every one of `rows` (and not empty), with that value: what a table of
    these rows can say once above it instead of in every row."""
    return {k: rows[0][k] for k in keys
            if rows and rows[0][k] not in ("", None) and all(r[k] == rows[0][k] for r in rows)}


BY_CONSTRUCTION_VERDICT = "by construction"  # a reading that holds because the candidate's box is wider
DESCRIPTIVE = "descriptive"  # a reading outside its claim's family (`claims.is_primary`): its raw verdict only
VERDICTS = (intervals.HOLDS, intervals.REVERSED, intervals.NOT_RESOLVED, significance.DISAGREE, intervals.IDENTICAL,
            BY_CONSTRUCTION_VERDICT, DESCRIPTIVE, intervals.EXACT, intervals.NOT_EXACT, intervals.NO_DATA)
VERDICT_RULE = ("each cell: candidate − baseline seed by seed, its mean with the 95% interval (Student-t; Newcombe's "
                "for a 0/1 reading such as the collapse flag), n, the seeds that go the other way, the sign-flip "
                "permutation p of the mean (exact up to 16 seeds: at n seeds it cannot go below 2/2^n, 0.125 at 4; "
                "beyond, random flips, more where a verdict could change with the draw) and the median with its sign "
                "test. Holds / reversed: the interval excludes 0 on that side and p < 0.05; mean and median disagree: "
                "they have opposite signs and one is resolved on its own (t interval or sign test); identical: every "
                "seed's difference is exactly 0; else not resolved. The adjusted verdict (the counts) uses p adjusted "
                "by Holm within a claim's primary readings at one setting (those its words name: held-out accuracy "
                "sampled at the end, the collapse flag, a per-step metric's late window, one update's change; of "
                "its own objectives, not the one-edge ablation boxes — chosen after the published cells were read); "
                "the other readings are descriptive (their raw verdict shown, not adjusted or counted; the mean over "
                "the run includes step 0, which the pair shares, so a gain there reads smaller); q is "
                "Benjamini–Hochberg's over the primary readings of the report's section (bandit, built-in LM, "
                "SmolLM2); a reading lower by construction (a wider box clips less) "
                "counts as such, not as stability. Identities: exact below 1e-12; no data: no seed has both runs yet")
RAW = "raw holds or reversed"  # a summary's count of cells that held or reversed before adjustment
RULES_OUT = "rules out the margin"  # a summary's count of primary cells ruling out the gain they are sized for


def adjust(rows: list[dict]) -> list[dict]:
    """The rows with their multiplicity added (copies; the rows given are not changed): `p_holm`, the sign-flip p
    adjusted by Holm within the cell's family (a claim's primary readings at one setting, `claims.is_primary`),
    `q_bh`, adjusted by Benjamini–Hochberg over the primary cells of the cell's section of the report
    (`claims.SECTIONS`: the bandit's tiny p's never shrink a language model's q's), and `verdict_adjusted`, the
    verdict with `p_holm` in place of p — a reading lower by construction (`BY_CONSTRUCTION`) that holds is counted as
    such instead, and a descriptive cell (not primary) reads DESCRIPTIVE with neither p_holm nor q_bh.

    A p read from random flips (beyond 16 seeds) is read again with more flips (`significance.MORE_FLIPS`) wherever
    a verdict, raw or adjusted, could differ with the draw: where the verdicts with every Monte Carlo p at the low
    end of its bounds (`significance.p_bounds`) differ from those with every one at the high end (Holm's adjusted
    p's only grow with each p, so the two ends bound every draw). Each cell keeps its flips (`p_flips`, None: exact)
    and its p's bounds (`p_bounds`)."""
    out = [dict(row, p_flips=row["p_flips"] if "p_flips" in row else  # a row adjusted before keeps its reading
                significance.flips_of(row.get("n", 0)) if row.get("p") is not None else None) for row in rows]
    tested = [row for row in out if row.get("p") is not None]
    for flips in significance.MORE_FLIPS:
        refine = _draw_dependent(tested)
        if not refine:
            break
        for row, p in zip(refine, significance.sign_flip_ps([row["differences"] for row in refine], flips=flips)):
            row.update(p=p, p_flips=flips)
    for row in out:
        row.update(p_holm=None, q_bh=None, verdict_adjusted=row["verdict"], p_bounds=None)
    for row, reading in zip(tested, _readings(tested, [row["p"] for row in tested])):
        row["verdict"], row["verdict_adjusted"], row["p_holm"], row["q_bh"] = reading
        row["p_bounds"] = [float(b) for b in significance.p_bounds(row["p"], row["p_flips"])]
    sizes = Counter(row["family"] for row in tested if row.get("primary", True))
    for row in tested:  # the whole rule's power where a primary cell is sized for an effect (`verdict_power`)
        if row.get("primary", True) and row.get("effect") is not None and row["n"] >= 2:
            power = verdict_power(row["n"], row["effect"], float(np.std(row["differences"], ddof=1)),
                                  sizes[row["family"]])
            row["verdict_power"], row["family_size"] = _finite(power), sizes[row["family"]]
    return out


def _readings(tested: list[dict], ps: list[float]) -> list[tuple[str, str, float, float]]:
    """Each tested row's (raw verdict, adjusted verdict, Holm p, BH q) if its sign-flip p were `ps[i]`: Holm within
    its family and BH within its section, both over the primary rows; a descriptive row's (raw, DESCRIPTIVE, None,
    None)."""
    primary = [i for i, row in enumerate(tested) if row.get("primary", True)]
    holm, bh = [None] * len(tested), [None] * len(tested)
    for adjusted, group_of, method in ((holm, lambda row: row["family"], significance.holm),
                                       (bh, lambda row: SECTIONS.get(row["setting"], row["setting"]),
                                        significance.benjamini_hochberg)):
        for i, value in zip(primary, _adjusted([tested[i] for i in primary], [ps[i] for i in primary], group_of,
                                               method)):
            adjusted[i] = value
    out = []
    for row, p, p_holm, q in zip(tested, ps, holm, bh):
        raw = _raw_verdict(row, p)
        if not row.get("primary", True):
            out.append((raw, DESCRIPTIVE, None, None))
            continue
        adjusted = significance.adjusted_verdict(raw, p_holm)
        if row.get("by_construction") and raw == intervals.HOLDS:
            adjusted = BY_CONSTRUCTION_VERDICT
        out.append((raw, adjusted, p_holm, q))
    return out


def _adjusted(rows: list[dict], ps: list[float], group_of: Callable[[dict], str], method) -> list[float]:
    """`ps` adjusted by `method` (Holm's, BH's) within each group of rows `group_of` names, in the rows' order."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(group_of(row), []).append(i)
    out = [math.nan] * len(rows)
    for members in groups.values():
        for i, value in zip(members, method([ps[i] for i in members])):
            out[i] = float(value)
    return out


def _raw_verdict(row: dict, p: float) -> str:
    """A compared cell's verdict with sign-flip p `p` (`significance.verdict`, from the row's own numbers)."""
    if row.get("n") == 0 or "differences" not in row:
        return row["verdict"]  # no data, or a row given with its verdict alone
    return significance.verdict(row["low"], row["high"], p, row["mean"], row["median"],
                                1 if row["predicted_sign"] == "+" else -1,
                                np.nan if row["p_median"] is None else row["p_median"])


def draw_dependent(rows: list[dict]) -> list[dict]:
    """The adjusted rows whose verdict, raw or after Holm, a draw of their Monte Carlo p's could still change
    (empty when `adjust` settled every one: a p read at the most flips it draws that still straddles is listed)."""
    tested = [row for row in rows if row.get("p") is not None]
    bounds = [significance.p_bounds(row["p"], row["p_flips"]) for row in tested]
    low, high = (_readings(tested, [b[end] for b in bounds]) for end in (0, 1))
    return [row for i, row in enumerate(tested) if low[i][:2] != high[i][:2]]


def _draw_dependent(tested: list[dict]) -> list[dict]:
    """The Monte Carlo rows to read again (unless already read at the most flips): each row whose verdicts differ
    between every Monte Carlo p at its low bound and every one at its high bound, and the rows of its family before
    it in Holm's order whose own step, (m − j + 1) × its p's high bound, reaches α (those could carry it over)."""
    refine = {}
    for row in draw_dependent(tested):
        family = sorted((r for r in tested if r["family"] == row["family"]
                         and r.get("primary", True) == row.get("primary", True)),
                        key=lambda r: r["p"])
        steps = {id(r): (len(family) - j) * significance.p_bounds(r["p"], r["p_flips"])[1]
                 for j, r in enumerate(family)}
        refine.update({id(r): r for r in family if r["p_flips"] and r["p_flips"] < significance.MORE_FLIPS[-1]
                       and (r is row or (r["p"] <= row["p"] and steps[id(r)] >= significance.ALPHA))})
    return list(refine.values())


COMPUTED = Kept(most=8)  # (seeds, the grid's key, the published grid file's identity) ↦ the report


def build(seeds: int = 20, grid=GRID + RANDOM_GRID, progress: Callable[[float, str], None] | None = None,
          recompute: bool = False) -> Report:
    """Every claim on every cell: identities on random batches, the bandit claims on the grid with `seeds` seeds
    (a claim of the random-reward control on the grid's coin conditions, the others on the rest). The bandit's
    cells are read from the published grid where it is this one (`bandit_published`), unless `recompute`. Built
    once for as long as the published grid's file stays as it is (`kept.Kept`: the server's warm-up builds the
    Claims page's), `progress` hearing of a build only."""
    if recompute:
        return _build(seeds, grid, progress, recompute=True)
    key = (seeds, bandit_published.key(seeds, grid), tail.file_identity(bandit_published.path()))
    return COMPUTED.get(key, lambda: _build(seeds, grid, progress))


def _build(seeds: int, grid, progress, recompute: bool = False) -> Report:
    rows = []
    for claim in CLAIMS:
        if claim.identity is not None:
            for cell in claim.identity():
                rows.append(_row(claim, "random batches", cell["condition"], "max |difference|", cell["candidate"],
                                 cell["baseline"], "", cell["max_difference"], cell["max_difference"],
                                 cell["max_difference"], 1, 0,
                                 intervals.identity_verdict(cell["max_difference"], IDENTITY_TOLERANCE)))
    found = None if recompute else bandit_published.read(seeds, grid)
    if found and progress:
        progress(0.0, f"bandit: the cells of published/{bandit_published.FILE}, tested")
    by_key = {claim.key: claim for claim in CLAIMS}
    cells = found["cells"] if found else bandit_cells(seeds, grid, progress)
    compared = []
    for cell in cells:
        claim = by_key[cell["claim"]]
        c = next(c for c in claim.comparisons
                 if (c.candidate, c.baseline, c.metric) == (cell["candidate"], cell["baseline"], cell["metric"]))
        compared.append(dict(claim=claim, setting=BANDIT, condition=cell["condition"], c=c,
                             candidate=cell["candidate_values"], baseline=cell["baseline_values"], seeds=range(seeds),
                             reading=cell["reading"]))
    rows += comparison_rows(compared)
    if found and progress:
        progress(1.0, "done")
    return Report(rows, seeds, bandit=bandit_published.source(found)) if found else Report(rows, seeds)


def opening_seeds() -> int:
    """The seeds the Claims page opens at: the published grid's (its bandit runs read, not run), else
    `claims.QUICK_SEEDS` (run here in about 15 s on 2 cores)."""
    return SEEDS if bandit_published.read(SEEDS, GRID + RANDOM_GRID) else QUICK_SEEDS


def comparison_rows(cells: list[dict]) -> list[dict]:
    """`comparison_row` for each of `cells` (its arguments by name), their sign-flip tests run together
    (`significance.sign_flip_ps`: one scipy call per seed count, each p the one it would have alone)."""
    ps = significance.sign_flip_ps([np.subtract(np.asarray(cell["candidate"], dtype=np.float64),
                                                np.asarray(cell["baseline"], dtype=np.float64)) for cell in cells])
    return [comparison_row(**cell, p=p) for cell, p in zip(cells, ps)]


def comparison_row(claim: Claim, setting: str, condition: str, c: Comparison, candidate, baseline, seeds,
                   where: str = "", reading: str = "", *, p: float) -> dict:
    """One cell of a compared claim from its seeds' values (candidate and baseline, seed `seeds[i]` in both) and the
    sign-flip p of the paired difference's mean (`comparison_rows` tests a report's cells together): the paired
    difference candidate − baseline with its interval (Newcombe's for a 0/1 reading), that p, the median with its
    sign test, the seeds each way, and the verdict they give together
    (`significance.verdict`); where the comparison is sized for an effect (`effect_of`), the seeds 80% power needs
    and whether the gain is ruled out. `where` names the setting's part of the cell's family (a claim's readings at
    one setting: the multiplicity Holm adjusts for, `adjust`); `reading` which of the metric's readings the values
    are ("end", "late", …), as the condition also says in words."""
    a, b = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    difference = a - b
    if a.size == 0:
        d = intervals.Paired(np.nan, np.nan, np.nan, 0, 0)
    else:
        d = (intervals.paired_binary if c.metric in BINARY else intervals.paired)(a, b)
    median, p_median, up, down = significance.sign_test(difference)
    verdict = (intervals.NO_DATA if d.n == 0 else
               significance.verdict(d.low, d.high, p, d.mean, median, c.sign, p_median))
    row = _row(claim, setting, condition, c.metric, c.candidate, c.baseline, "+" if c.sign > 0 else "−", d.mean,
               d.low, d.high, d.n, d.against_mean, verdict)
    effect = effect_of(claim, c)
    needed = significance.seeds_needed(difference, effect.size) if effect else (None, None, None)
    row.update(p=_finite(p), median=_finite(median), p_median=_finite(p_median), seeds_up=up, seeds_down=down,
               family=" · ".join(filter(None, (claim.key, setting, where))), reading=reading,
               primary=is_primary(c.candidate, c.metric, reading),
               by_construction=BY_CONSTRUCTION.get((c.candidate, c.metric), ""),
               effect=effect.size if effect else None, effect_source=effect.source if effect else "",
               seeds_for_power=needed[0], seeds_for_power_range=[needed[1], needed[2]] if effect else None,
               rules_out=(effect is not None and d.n >= 2 and c.sign > 0
                          and significance.rules_out_gain(difference, effect.size)),
               seeds=[int(s) for s in seeds], candidate_values=a.tolist(), baseline_values=b.tolist(),
               differences=difference.tolist())
    return row


def _finite(x: float | None) -> float | None:
    """A number as JSON can hold it: None for NaN or infinity (JSON has neither)."""
    return None if x is None or not math.isfinite(x) else float(x)


def _row(claim: Claim, setting: str, condition: str, metric: str, candidate: str, baseline: str, predicted: str,
         mean: float, low: float, high: float, n: int, against_mean: int, verdict: str) -> dict:
    return {"claim": claim.text, "claim_key": claim.key, "source": claim.source, "provenance": claim.provenance,
            "setting": setting, "condition": condition, "metric": metric, "candidate": candidate,
            "baseline": baseline, "predicted_sign": predicted, "mean": _finite(mean), "low": _finite(low),
            "high": _finite(high), "n": n, "seeds_against_mean": against_mean, "verdict": verdict,
            "primary": True,
            **dict.fromkeys(("p", "median", "p_median", "seeds_up", "seeds_down", "family", "reading",
                             "by_construction", "effect", "effect_source", "seeds_for_power", "seeds_for_power_range",
                             "verdict_power", "family_size", "dose",
                             "rules_out", "seeds", "candidate_values", "baseline_values", "differences"))}  # a compared cell's (below)
