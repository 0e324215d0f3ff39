"""The catalogue: every entry divviz knows, grouped by family, each with how it differs from its nearest sibling."""

import pandas as pd
import streamlit as st

from divviz.divergences import CATALOGUE, DUAL_CLIP
from divviz.kinship import GROUPS
from divviz.losses import RATIO_CAP

st.title("Catalogue")
st.write("Everything the training loss can be built from, in three families. Clip tests decide per token whether "
         "the ratio w = π_θ/π_old is still inside the trust region; surrogates replace PPO's clipped surrogate "
         "(their gradient weight is the constraint); penalties add β·value to the loss. Each entry says how it differs "
         "from its nearest sibling. The same list is printed by `divviz measures`.")


def show(name: str, sibling: str, how: str) -> None:
    entry = CATALOGUE[name]
    with st.container(border=True):
        st.markdown(f"**`{entry.name}`** — {entry.title}")
        st.latex(entry.latex)
        st.caption(entry.doc)
        st.markdown(f"*Beside `{sibling}`:* {how}.")
        if getattr(entry, "source", ""):
            st.caption(f"Source: {entry.source}")
        if entry.params:
            st.table(pd.DataFrame([{"parameter": p.name, "default": str(p.default), "valid range": p.range_text(),
                                    "TRL name": p.trl_name or "", "meaning": p.doc}
                                   for p in entry.params]).set_index("parameter"))  # a table wraps long text


tabs = dict(zip(("clip", "surrogate", "penalty"), st.tabs(["Clip tests", "Surrogates", "Penalties"])))
for group in GROUPS:
    with tabs[group.family]:
        st.subheader(group.title)
        st.write(group.blurb)
        for name, sibling, how in group.members:
            show(name, sibling, how)
with tabs["clip"]:
    st.markdown(f"**Dual-clip cap** `c` (any clip test, A < 0 only): {DUAL_CLIP.doc}; valid: {DUAL_CLIP.range_text()}.")
    st.markdown(f"**Ratio cap** `δ` (TRL's `delta`): {RATIO_CAP.doc}; valid: {RATIO_CAP.range_text()}.")
with tabs["surrogate"]:
    st.markdown("**Sequence level (GSPO)**: with `importance_sampling_level = sequence`, every token of a completion "
                "takes the completion's geometric-mean ratio s_i = exp(mean_t log w_t), and the clip test judges s_i "
                "(PPO's surrogate, cispo or sapo).")
