"""The Claims page's tables, from a report (`evidence/claims_report.py`): the overview of every claim and one
claim's cells, each with the columns that say something (a verdict no cell has is left out)."""

from __future__ import annotations

import pandas as pd

from divviz.evidence import claims_report
from divviz.metrics import GLOSSARY
from divviz.safetext import literal

NOT_YET = "no cell yet: tested over training on a language model, whose runs are chosen below"


def overview(result: claims_report.Report) -> pd.DataFrame:
    """Per claim and setting: its cells and the count of each verdict some cell has; a claim's text on its first
    row only, escaped (the table renders Markdown)."""
    table = pd.DataFrame(result.overview())
    table = table.loc[:, (table != 0).any(axis=0)]
    table["setting"] = table.setting.mask(table.cells == 0, NOT_YET)
    return table.assign(claim=table.claim.map(literal).mask(table.claim.duplicated(), ""),
                        setting=table.setting.map(literal))


def claim_cells(result: claims_report.Report, claim, shared: dict) -> pd.DataFrame:
    """The claim's cells, one row each, under the report's headers: the columns that vary between its cells (what
    they all share, `shared`, is said once above the table) and the verdicts some cell has."""
    cells = pd.DataFrame([row for row in result.summary() if row["claim"] == claim.text])
    kept = [c for c in cells if c not in ("claim", *shared) and cells[c].notna().any()
            and (c not in claims_report.VERDICTS or cells[c].any())]
    return cells[kept].rename(columns=claims_report.HEADERS)


def metric_meanings(rows: list[dict]) -> str:
    """What each metric of the cells `rows` is (the tables keep TRL's names), one line; "" when none is glossed."""
    meanings = {m: GLOSSARY[m] for m in dict.fromkeys(row["metric"] for row in rows) if m in GLOSSARY}
    return literal(" · ".join(f"{m}: {text}" for m, text in meanings.items()))
