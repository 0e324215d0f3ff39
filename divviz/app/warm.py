"""The server warms itself at start: a thread imports what the pages read (torch, scipy, pandas, Plotly, divviz's
evidence and views) and computes the Claims page's opening cells, collapses and curves into divviz's own
caches (`evidence/kept.py`, the run store's), so that the first page a browser opens pays for neither
(docs/benchmarks.md).

It runs once per server process and never holds the server up: the server answers at once, and a page opened while
the thread works waits only for what the thread has not done yet (Python imports a module once). A failure is one
line on the server's log; the pages then compute as before.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import asynccontextmanager

DONE = threading.Event()  # set once the warm-up has ended, done or failed


def warm() -> None:
    """Import the pages' modules and compute the Claims page's opening evidence (`claims_lm.opening_plan`)."""
    start = time.perf_counter()
    try:
        import divviz.app.widgets  # noqa: F401  (what every page imports, with torch through the catalogue)
        import divviz.views.claims_tables  # noqa: F401
        import divviz.views.run_plots  # noqa: F401
        from divviz.engine.policy import pick_device
        from divviz.evidence import claims_lm, claims_real, claims_report, lm_evidence
        from divviz.runs import store

        report = claims_report.build(claims_report.opening_seeds())
        evidence = lm_evidence.LMEvidence(claims_lm.opening_plan(store.runs_dir(), pick_device().type))
        report = evidence.report(report)  # its cells, with the pilot's spread for their power
        evidence.collapses()
        for metric in lm_evidence.CURVES:
            evidence.curves(metric)
        real = claims_real.RealPlan(claims_real.BATCHES_PARAM.default)
        if not real.missing:
            real.report(report)
        print(f"divviz: warmed in {time.perf_counter() - start:.1f} s (the pages' imports and the Claims page's "
              "opening cells)", file=sys.stderr, flush=True)
    except Exception as error:  # noqa: BLE001 - a warm-up that fails leaves the pages to compute as before
        print(f"divviz: the warm-up stopped ({type(error).__name__}: {error}); pages compute on their first load",
              file=sys.stderr, flush=True)
    finally:
        DONE.set()


@asynccontextmanager
async def lifespan(app):
    """`st.App`'s start and end: the warm-up starts in a daemon thread, and the server answers at once."""
    threading.Thread(target=warm, name="divviz-warm", daemon=True).start()
    yield
