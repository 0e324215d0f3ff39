"""Home: what divviz is, one picture, and the way to each page."""

import streamlit as st

from divviz.app import widgets
from divviz.app.navigation import PAGES

from divviz.views import explorer

PAGE_GUIDE = PAGES[1:]  # every page but this one, in the app's one order

st.title("divviz")
st.write("See what a policy-divergence constraint does to GRPO training of a language model. Every picture in "
         "this app is computed by the same loss function that trains: PPO/GRPO ratio clipping, DAPO clip-higher, "
         "dual-clip, KL1/KL2/KL3 tests (KL3 = ATR-GRPO's asymmetric clipping), probability-space tests, GBMPO's "
         "ProbL2 and neural mirror-map penalties, and RPG's KL-regularised losses.")

st.subheader("Where to start")
st.write("The pages in the sidebar's order: from one token's clipping boundary to the exact bandit, the evidence over "
         "seeds, and real training runs read token by token.")
for start in range(0, len(PAGE_GUIDE), 3):
    for column, (number, (path, label, icon, what)) in zip(st.columns(3), enumerate(PAGE_GUIDE[start:start + 3],
                                                                                 start + 1)):
        column.page_link(path, label=f"{number}. {label}", icon=icon)
        column.caption(what)
surrogate = explorer.clipping_regions(explorer.default_tests(), pi_old=0.3, dual_clip_c=None, charts=("surrogate",))
st.plotly_chart(surrogate["surrogate"].figure, config=widgets.PLOTLY_CONFIG, key="home:surrogate")
st.caption("PPO ε = 0.2, DAPO (0.2, 0.28) and KL3 δ = 0.05 on the same tokens; the coloured strips mark where "
           "each clip removes the gradient. Open *Clipping regions* to move them.")

st.info("Every control is mirrored in the address bar: copy the link to share exactly this view.",
        icon=":material/link:")
