"""Publish the bandit grid at 64 seeds and write what it and the published runs say into docs/claims.md and README.md:
`python scripts/evidence_tables.py` (about 50 s: the bandit grid computed again, then published as
published/claims-bandit-64.json.gz, `bandit_published`).

docs/claims.md holds, between its markers, the bandit grid's summary (`claims_export.bandit_markdown`), the built-in
LM's published grid and one block per SmolLM2 setting (`claims_export.published_markdown`: where the runs come from,
the headline cells, the collapses, the pilot), and two tables of claims across settings
(`claims_export.settings_markdown`: the random-reward control on the bandit, the built-in LM and SmolLM2's published
one-update batches; the KL3 paper's per-update claims on those batches); README's two claims rows and its row on why
entropy moves quote the same (`bandit_sentence`, `headline_sentence`, `entropy_row`).
The sign-flip p's of every cell these reports test are drawn again (the published ones are not read) and published
as published/sign-flip-p.json (`significance.publish`), which the Claims page and `divviz claims` then read instead
of drawing 10⁴ flips per cell on a fresh clone's first load.
tests/evidence/test_evidence_tables.py regenerates them and fails on any difference: publish runs, then run this.
"""

import subprocess
import time
from dataclasses import replace
from pathlib import Path

from divviz.evidence import (bandit_cells, bandit_published, claims, claims_export, claims_lm, claims_real, claims_report,
                             significance)

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
START, END = "<!-- over training: made by scripts/evidence_tables.py -->\n", "<!-- over training end -->\n"
BANDIT_START, BANDIT_END = "<!-- bandit: made by scripts/evidence_tables.py -->\n", "<!-- bandit end -->\n"
BUILTIN_START, BUILTIN_END = "<!-- built-in LM: made by scripts/evidence_tables.py -->\n", "<!-- built-in LM end -->\n"
RANDOM_START = "<!-- random rewards: made by scripts/evidence_tables.py -->\n"
RANDOM_END = "<!-- random rewards end -->\n"
UPDATE_START, UPDATE_END = "<!-- one update: made by scripts/evidence_tables.py -->\n", "<!-- one update end -->\n"
RANDOM_CLAIMS = ("random_reward_entropy_falls", "random_reward_clip_low", "random_reward_attribution")
UPDATE_CLAIMS = ("kl3_mass_to_confident", "kl3_entropy", "dapo_entropy")  # the KL3 paper's, per update
ROW = "| claims over training (SmolLM2-135M, published runs) |"
BANDIT_ROW = "| claims on the bandit |"
ENTROPY_ROW = "| why entropy moves |"


def publish_bandit() -> None:
    """Compute the bandit grid at `claims.SEEDS` seeds here and publish its cells."""
    start = time.perf_counter()
    cells = bandit_cells.bandit_cells(claims.SEEDS, claims.GRID + claims.RANDOM_GRID)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    bandit_published.write(cells, claims.SEEDS, claims.GRID + claims.RANDOM_GRID, time.perf_counter() - start, commit)


def bandit_report() -> claims_report.Report:
    """The bandit grid at `claims.SEEDS` seeds as published (computed when what is published is not this grid)."""
    return claims_report.build(claims.SEEDS)


def bandit_row(report: claims_report.Report) -> str:
    return (f"{BANDIT_ROW} \"KL3 keeps entropy higher than PPO\", {claims_export.bandit_sentence(report)} "
            f"(each cell's per-seed values published as [published/{bandit_published.FILE}]"
            f"(published/{bandit_published.FILE}); the Claims page opens on them) "
            "| [docs/claims.md](docs/claims.md) |\n")


def mechanism_report(bandit: claims_report.Report, builtin: claims_report.Report) -> claims_report.Report:
    """The bandit's cells, the built-in LM's published runs and SmolLM2's published one-update batches together."""
    return replace(bandit, rows=bandit.rows + builtin.rows + claims_real.RealPlan().rows())


def across_settings(report: claims_report.Report) -> tuple[str, str]:
    """The two tables of claims across settings (`mechanism_report`): the random-reward control's (the bandit, the
    built-in LM's published runs, SmolLM2's published one-update batches) and the KL3 paper's per-update claims on
    those batches."""
    return (claims_export.settings_markdown(report, RANDOM_CLAIMS, (claims.BANDIT, claims.LM, claims.REAL)),
            claims_export.settings_markdown(report, UPDATE_CLAIMS, (claims.REAL,)))


def entropy_row(report: claims_report.Report) -> str:
    """README's row on why entropy moves (`mechanism_report`): SmolLM2's published one-update batches under random
    rewards, the masked samples' shares of the covariance and the entropy change itself."""
    def cell(metric: str) -> str:
        r = next(r for r in report.rows if r["setting"] == claims.REAL and r["candidate"] == claims.PPO
                 and r["metric"] == metric)
        return (f"{claims_export.signed(r['mean'])} [{claims_export.signed(r['low'])}, "
                f"{claims_export.signed(r['high'])}] ({r['verdict_adjusted']})")

    batches = next(r["n"] for r in report.rows if r["setting"] == claims.REAL)
    return (f"{ENTROPY_ROW} random rewards, one update of SmolLM2-135M under PPO: the masked-low samples' share of "
            f"Cov(log π_old, A) {cell('entropy/cov_masked_low')}, the masked-high {cell('entropy/cov_masked_high')}, "
            f"{batches} published batches; the entropy change itself {cell('entropy/change')} "
            "| [docs/claims.md](docs/claims.md#why-entropy-moves-measured) |\n")


def published() -> dict:
    """Each declared grid's published runs, read once, by (setting, kind of device): (plan, evidence, report)."""
    return {(setting, device): claims_export.published_evidence(MODEL, setting, device)
            for setting, device in claims_lm.DECLARED}


def block(grids: dict) -> str:
    where = {"cpu": "2-core CPUs", "cuda": "one GPU"}
    return "".join(f"#### {setting} ({where[device]})\n\n{claims_export.published_markdown(*grid)}\n"
                   for (setting, device), grid in grids.items())


def readme_row(grids: dict) -> str:
    sentences = "; ".join(claims_export.headline_sentence(plan, report) for plan, _, report in grids.values())
    return (f"{ROW} KL3 δ = 0.05 − PPO, held-out accuracy at step 30: {sentences} "
            "| [docs/claims.md](docs/claims.md#over-training-on-smollm2-135m) |\n")


def between(text: str, start: str, end: str, new: str) -> str:
    before, rest = text.split(start)
    return before + start + new + end + rest.split(end)[1]


def main() -> None:
    significance.published_file().unlink(missing_ok=True)  # every p drawn again, then published
    publish_bandit()
    bandit = bandit_report()
    claims_md = ROOT / "docs" / "claims.md"
    text = between(claims_md.read_text(), BANDIT_START, BANDIT_END, claims_export.bandit_markdown(bandit))
    builtin = claims_export.published_evidence(claims_lm.BUILTIN, "")
    text = between(text, BUILTIN_START, BUILTIN_END, claims_export.published_markdown(*builtin))
    mechanism = mechanism_report(bandit, builtin[2])
    random_rewards, one_update = across_settings(mechanism)
    text = between(between(text, RANDOM_START, RANDOM_END, random_rewards), UPDATE_START, UPDATE_END, one_update)
    grids = published()
    claims_md.write_text(between(text, START, END, block(grids)))
    readme = ROOT / "README.md"
    rows = {ROW: readme_row(grids), BANDIT_ROW: bandit_row(bandit),
            ENTROPY_ROW: entropy_row(mechanism)}
    lines = readme.read_text().splitlines(keepends=True)
    readme.write_text("".join(next((new for start, new in rows.items() if line.startswith(start)), line)
                              for line in lines))
    significance.publish()


if __name__ == "__main__":
    main()
