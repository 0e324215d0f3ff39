"""Home: what divviz is, one picture, and the way to each page."""

import streamlit as st

from divviz.app import ui

from divviz.views import explorer

PAGE_GUIDE = (  # (page script, title, icon, one line), in the workshop walkthrough's order
    ("app_pages/tour.py", "Tour", ":material/school:",
     "Start here: the walkthrough, each step's link, what to do and the numbers to expect."),
    ("app_pages/clipping_regions.py", "Clipping regions", ":material/straighten:",
     "Feasible intervals, the (π_old, π_new) plane, surrogate and gradient, logit room."),
    ("app_pages/kl3_equivalence.py", "KL3 ⇔ asymmetric clipping", ":material/function:",
     "The Lambert-W bounds, matching PPO/DAPO boxes, and a live numeric check."),
    ("app_pages/mass_reallocation.py", "Mass reallocation", ":material/bar_chart:",
     "An exact softmax bandit under GRPO: entropy, top-1 mass, where the mass goes, over seeds."),
    ("app_pages/claims.py", "Claims", ":material/fact_check:",
     "The papers' statements put to a paired test, with intervals and computed verdicts."),
    ("app_pages/training_lab.py", "Training lab", ":material/model_training:",
     "GRPO runs on the built-in model, SmolLM2-135M or yours, one per measure, live; same-batch comparison."),
    ("app_pages/step_inspector.py", "Step inspector", ":material/text_select_start:",
     "One step's completions token by token: what the constraint did to each, and why."),
    ("app_pages/runs.py", "Runs", ":material/folder_open:",
     "Every saved run, also those started with `divviz train`: overlay, export, delete."),
    ("app_pages/catalogue.py", "Catalogue", ":material/menu_book:",
     "Every measure, its formula, parameters and valid ranges."),
)

st.title("divviz")
st.write("See what a policy-divergence constraint does to GRPO training of a language model. Every picture in "
         "this app is computed by the same loss function that trains: PPO/GRPO ratio clipping, DAPO clip-higher, "
         "dual-clip, KL1/KL2/KL3 tests (KL3 = ATR-GRPO's asymmetric clipping), probability-space tests, GBMPO's "
         "ProbL2 and neural mirror-map penalties, and RPG's KL-regularised losses.")

st.subheader("Where to start")
st.write("The pages in the order of the workshop walkthrough (README): from one token's clipping boundary to the exact "
         "bandit, the evidence over seeds, and real training runs read token by token.")
for start in range(0, len(PAGE_GUIDE), 3):
    for column, (number, (path, label, icon, what)) in zip(st.columns(3), enumerate(PAGE_GUIDE[start:start + 3],
                                                                                 start + 1)):
        column.page_link(path, label=f"{number}. {label}", icon=icon)
        column.caption(what)
surrogate = explorer.clipping_regions(explorer.default_tests(), pi_old=0.3, dual_clip_c=None, charts=("surrogate",))
st.plotly_chart(surrogate["surrogate"].figure, config=ui.PLOTLY_CONFIG, key="home:surrogate")
st.caption("PPO ε = 0.2, DAPO (0.2, 0.28) and KL3 δ = 0.05 on the same tokens; the coloured strips mark where "
           "each clip removes the gradient. Open *Clipping regions* to move them.")

st.info("Every control is mirrored in the address bar: copy the link to share exactly this view.",
        icon=":material/link:")
