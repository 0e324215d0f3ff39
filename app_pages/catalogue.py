"""The catalogue: every measure divviz knows, its formula, its parameters and their valid ranges."""

import pandas as pd
import streamlit as st

from divviz.divergences import CLIP_TESTS, DUAL_CLIP, PENALTIES

st.title("Catalogue")
st.write("Every divergence measure in divviz, as the training loss uses it. Clip tests decide per token "
         "whether the ratio w = π_θ/π_old is still inside the trust region; penalties add β·value to the loss. "
         "The same list is printed by `divviz measures`.")


def show(entries):
    for entry in entries.values():
        with st.container(border=True):
            st.markdown(f"**`{entry.name}`** — {entry.title}")
            st.latex(entry.latex)
            st.caption(entry.doc)
            if entry.params:
                st.table(pd.DataFrame([{"parameter": p.name, "default": str(p.default), "valid range": p.range_text(),
                                        "TRL name": p.trl_name or "", "meaning": p.doc}
                                       for p in entry.params]).set_index("parameter"))  # a table wraps long text


clip_tab, penalty_tab = st.tabs(["Clip tests", "Penalties"])
with clip_tab:
    show(CLIP_TESTS)
    st.markdown(f"**Dual-clip cap** `c` (any clip test, A < 0 only): {DUAL_CLIP.doc}; valid: {DUAL_CLIP.range_text()}.")
with penalty_tab:
    show(PENALTIES)
