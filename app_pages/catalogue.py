"""The catalogue: every entry divviz knows, grouped by family, each with how it differs from its nearest sibling."""

import pandas as pd
import streamlit as st

from divviz.catalogue.divergences import CATALOGUE, DUAL_CLIP
from divviz.catalogue.kinship import GROUPS
from divviz.loss_checks import RATIO_CAP
from divviz.catalogue.rollout_correction import CORRECTIONS, OPTIONS

st.title("Catalogue")
st.write("Everything the training loss can be built from, in three families. Clip tests decide per token whether "
         "the ratio w = π_θ/π_old is still inside the trust region; surrogates replace PPO's clipped surrogate "
         "(their gradient weight is the constraint); penalties add β·value to the loss. Each entry says how it differs "
         "from its nearest sibling. The same list is printed by `divviz catalogue`. A fourth tab holds verl's "
         "rollout corrections, which are options of a run rather than of the loss.")


def show(name: str, sibling: str, how: str, entry=None, usage: str = "") -> None:
    entry = entry or CATALOGUE[name]
    with st.container(border=True):
        st.markdown(f"**`{entry.name}`** — {entry.title}")
        st.latex(entry.latex)
        st.caption(entry.doc)
        st.markdown(f"*Beside `{sibling}`:* {how}.")
        if getattr(entry, "source", ""):
            st.caption(f"Source: {entry.source}")
        if usage:
            st.caption(usage)
        if entry.params:
            st.table(pd.DataFrame([{"parameter": p.name, "default": str(p.default), "valid range": p.range_text(),
                                    "TRL name": p.trl_name or "", "meaning": p.doc}
                                   for p in entry.params]).set_index("parameter"))  # a table wraps long text


tabs = dict(zip(("clip", "surrogate", "penalty", "rollout"),
                st.tabs(["Clip tests", "Surrogates", "Penalties", "Rollout corrections"])))
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
with tabs["rollout"]:
    st.subheader("When the sampler is not the policy")
    st.write("An inference engine beside the trainer samples with a copy of the policy that differs from the one the "
             "loss divides by: in another precision (vLLM in bf16 against the trainer's fp32), or some updates behind "
             "(asynchronous RL). With ρ = π_old/π_roll of each sampled token, verl weighs or rejects tokens before the "
             "loss; the weights multiply the policy term, and a rejected token leaves the loss and its normaliser. "
             "divviz simulates the sampler (Training lab → Rollout; `divviz train --rollout-dtype bfloat16 "
             "--rollout-lag K`) and logs verl's `rollout_corr/` measures of the mismatch each step.")
    for entry in CORRECTIONS.values():
        show(entry.name, entry.sibling, entry.how, entry, f"`divviz train {entry.flags}`")
    st.markdown(f"**Rejection options** (verl's): {', '.join(f'`{o}`' for o in OPTIONS)}.")
