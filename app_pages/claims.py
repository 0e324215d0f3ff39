"""Claims: the seed papers' claims that divviz can test, on a fixed grid, each cell with a computed verdict."""

import json

import pandas as pd
import streamlit as st

from divviz import claims
from divviz.safetext import literal


@st.cache_data(show_spinner=False, max_entries=4)
def report(seeds: int) -> claims.Report:
    bar = st.progress(0.0, text="Testing the claims…")
    result = claims.evaluate(seeds, progress=lambda fraction, text: bar.progress(fraction, text=literal(text)))
    bar.empty()
    return result


st.title("Claims")
st.write("What the three seed papers claim and divviz can test, tested on a grid of conditions declared before "
         "running: where the correct actions sit (likely, rare, random), small and large K, SGD and Adam, an early and "
         "a late reading. Each cell compares two measures seed by seed on the same seeds: the mean difference, its "
         "95% interval, n, and a verdict computed from the interval — *holds*, *reversed*, or *not resolved* (the "
         "interval contains 0); identities are *exact* when the largest difference is below 1e-12. Nothing here is "
         "typed by hand: `divviz claims` prints the same report.")
low, high, _ = claims.SEEDS_PARAM.slider_range()
seeds = st.slider("Seeds per measure", int(low), int(high), claims.QUICK_SEEDS, key="claims:seeds",
                  help=claims.SEEDS_PARAM.doc)
result = report(seeds)
summary = pd.DataFrame(result.summary())
cells = pd.DataFrame(result.rows).drop(columns=["claim_key"])

for claim in result.claims:
    st.subheader(literal(claim.text))
    st.caption(literal(f"{claim.source} · {claim.provenance} · measured as: {claim.operational}"))
    mine = summary[summary.claim == claim.text].drop(columns=["claim"])
    st.dataframe(mine.loc[:, (mine != 0).any(axis=0)], hide_index=True, width="stretch")
    with st.expander("Every cell of this claim"):
        st.dataframe(cells[cells.claim == claim.text].drop(columns=["claim", "source", "provenance"]),
                     hide_index=True, width="stretch")

st.subheader("Not testable here")
for text in result.untested:
    st.markdown(f"- {literal(text)}")
row = st.container(horizontal=True)
row.download_button("Report (HTML)", lambda: claims.to_html(result), file_name="divviz_claims.html", mime="text/html",
                    icon=":material/download:", on_click="ignore", key="claims:html")
row.download_button("Every cell (JSON)", lambda: json.dumps(result.rows, indent=1), file_name="divviz_claims.json",
                    mime="application/json", icon=":material/table:", on_click="ignore", key="claims:json")
