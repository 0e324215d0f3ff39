"""Home: what divviz is, one picture, and the way to each page."""

import streamlit as st

from divviz import ui, views

st.title("divviz")
st.write("See what a policy-divergence constraint does to GRPO training of a language model. Every picture in "
         "this app is computed by the same loss function that trains: PPO/GRPO ratio clipping, DAPO clip-higher, "
         "dual-clip, KL1/KL2/KL3 tests (KL3 = ATR-GRPO's asymmetric clipping), probability-space tests, GBMPO's "
         "ProbL2 and neural mirror-map penalties, and RPG's KL-regularised losses.")

left, right = st.columns([3, 2])
with left:
    charts = views.clipping_regions(views.default_tests(), pi_old=0.3, dual_clip_c=None)
    st.plotly_chart(charts["surrogate"].figure, config=ui.PLOTLY_CONFIG, key="home:surrogate")
    st.caption("PPO ε = 0.2, DAPO (0.2, 0.28) and KL3 δ = 0.05 on the same tokens; the coloured strips mark where "
               "each clip removes the gradient. Open *Clipping regions* to move them.")
with right:
    st.subheader("Explore")
    st.page_link("app_pages/clipping_regions.py", label="Clipping regions", icon=":material/straighten:")
    st.caption("Feasible intervals, the (π_old, π_new) plane, surrogate and gradient, logit room.")
    st.page_link("app_pages/kl3_equivalence.py", label="KL3 ⇔ asymmetric clipping", icon=":material/function:")
    st.caption("The Lambert-W bounds, matching PPO/DAPO boxes, and a live numeric check.")
    st.page_link("app_pages/mass_reallocation.py", label="Mass reallocation", icon=":material/bar_chart:")
    st.caption("An exact softmax bandit under GRPO: entropy, top-1 mass, where the mass goes.")
    st.page_link("app_pages/training_lab.py", label="Training lab", icon=":material/model_training:")
    st.caption("GRPO runs on a built-in model (or yours), one per measure, live; same-batch comparison.")
    st.page_link("app_pages/runs.py", label="Runs", icon=":material/folder_open:")
    st.caption("Every saved run, also those started with `divviz train`: overlay, export, delete.")
    st.page_link("app_pages/catalogue.py", label="Catalogue", icon=":material/menu_book:")
    st.caption("Every measure, its formula, parameters and valid ranges.")
    st.info("Every control is mirrored in the address bar: copy the link to share exactly this view.",
            icon=":material/link:")
