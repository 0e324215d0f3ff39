"""Clipping regions: where each clip test lets a token's ratio go, and what that does to the gradient."""

import streamlit as st

from divviz.app import objective_sidebar, page_state, widgets

from divviz.views import explorer
from divviz.catalogue.divergences import DUAL_CLIP
from divviz.catalogue.params import Param
from divviz.views.presets import CLIPPING_PRESETS
from divviz.catalogue.penalties import PENALTIES
from divviz.app.urlstate import Control, measure_param_controls

PAGE = "regions"
INTRO = ("Pick clip tests and move their parameters: each chart below is the training loss itself, evaluated "
         "on a grid. A token is clipped when its ratio w = π_θ/π_old leaves the test's interval on the side "
         "its advantage pushes it; then it gets no gradient.")
TAB_CHARTS = {"Gradient weight": ("weight",), "Penalties": ("penalty",), "Rollout corrections": ("correction",),
              "Probability space": ("region", "logit")}  # below the surrogate; only the open tab's are built
TABS = tuple(TAB_CHARTS)
CONTROLS = [
    Control("m", ["ratio", "clip_higher", "kl3"], family="clip"),
    Control("s", ["cispo:hi=1.28", "sapo"], family="surrogate"),
    Control("pi_old", 0.3, param=Param("pi_old", 0.3, 0.0, 1.0, low_open=True, high_open=False,
                                       typical=(0.01, 1.0, 0.01), doc="the probability π_old gave the token; "
                                       "only probability-space tests (prob_tv) depend on it")),
    Control("dual", False, param=Param("dual", False, kind="bool", doc="cap the loss of A < 0 tokens at −c·A")),
    Control("c", 3.0, param=DUAL_CLIP),
    Control("p", ["k3", "prob_l2"], options=tuple(PENALTIES), multi=True),
    *measure_param_controls(("penalty",)),
    *objective_sidebar.correction_controls([]),
    Control("tab", TABS[0], options=TABS),
]

BY_NAME = widgets.page_top(PAGE, CONTROLS, "Clipping regions", INTRO, CLIPPING_PRESETS)
with widgets.shown_errors():
    with st.sidebar:
        st.subheader("Clip tests")
        tests = objective_sidebar.measure_list(PAGE, BY_NAME["m"], "Tests to compare: any clip test of the catalogue, the same one "
                                                    "as often as you like with other parameters")
        st.subheader("Surrogates")
        surrogates = objective_sidebar.measure_list(PAGE, BY_NAME["s"], "Replacements of PPO's clipped surrogate, drawn in the "
                                                         "gradient-weight chart (those that mask with a clip test "
                                                         "take the first)")
        pi_old = widgets.number(PAGE, BY_NAME["pi_old"], "π_old of the token (for the surrogate and prob_tv)")
        dual = widgets.number(PAGE, BY_NAME["dual"], "Dual-clip for A < 0")
        c = widgets.number(PAGE, BY_NAME["c"], "dual-clip c") if dual else None
        st.subheader("Penalties")
        names = widgets.choice(PAGE, BY_NAME["p"], "Penalties to draw (toward π_ref; RPG's toward π_old)")
        penalties = [objective_sidebar.penalty_widgets(PAGE, name, BY_NAME) for name in names]
        st.subheader("Rollout corrections")
        corrections = objective_sidebar.correction_widgets(PAGE, BY_NAME)
    page_state.publish_controls(PAGE, CONTROLS)
    if not tests:
        st.info("Pick at least one clip test in the sidebar.")
        st.stop()
    charts = explorer.clipping_regions(tests, pi_old, c, surrogates, penalties, corrections,
                                       charts=("intervals", "sweeps", "surrogate"))

    widgets.show_chart(charts["intervals"], "intervals")
    widgets.show_chart(charts["sweeps"], "interval sweeps")
    st.subheader("Surrogate and gradient")
    st.write("Top: the objective −ℓ(w) the optimiser climbs. Bottom: its slope; where it is zero (the coloured "
             "strip of each test), the token is clipped. With A > 0 the clip binds above u, with A < 0 below l.")
    widgets.show_chart(charts["surrogate"], "surrogate and gradient")
    applies = {"Penalties": bool(penalties), "Rollout corrections": bool(corrections)}
    shown, tab = widgets.lazy_tabs(PAGE, BY_NAME["tab"], applies)
    charts = explorer.clipping_regions(tests, pi_old, c, surrogates, penalties, corrections, charts=TAB_CHARTS[shown])
    with tab:
        if shown == "Gradient weight":
            st.write("Every loss here has the gradient ∂ℓ/∂log π = −A·γ(w). Under PPO's surrogate γ is w inside the "
                     "region and 0 where the test masks (a hard region); a soft surrogate has no region, and γ is its "
                     "constraint: cispo flattens it past its cap, sapo fades it smoothly, vespo weighs a whole "
                     "completion by its ratio.")
            widgets.show_chart(charts["weight"], "gradient weight")
        elif shown == "Penalties":
            st.write("A penalty is not a region: it adds β·slope to every token's ∂ℓ/∂log π_θ, clipped or not. "
                     "Against r = π_θ/π_ref at π_ref = the π_old set above: k3's slope 1 − 1/r is the same for every "
                     "π_ref, while ProbL2's and a mirror map's are in probability space and vanish for rare tokens.")
            widgets.show_chart(charts["penalty"], "penalties")
        elif shown == "Rollout corrections":
            st.write("When the sampler is not the policy, verl's corrections act before the loss, on "
                     "ρ = π_old/π_roll of each sampled token (the policy the loss divides by, over the sampler that "
                     "drew the token): TIS caps the weight at u, IcePop drops the token outside [l, u], rejection "
                     "takes it out of the loss where its k1/k2/k3 passes the bound. One token is drawn here, so the "
                     "sequence level is the token level.")
            if any(v.get("bypass_mode") for v in corrections):
                st.caption("Bypass mode is not drawn: it has no multiplier, since its π_old is π_roll and the loss's "
                           "own ratio w = π_θ/π_roll corrects (the charts above).")
            widgets.show_chart(charts["correction"], "rollout corrections")
        else:
            left, right = st.columns(2)
            with left:
                st.write("A ratio box is a cone in probability space; a probability-space test is a band of constant "
                         "width, so it leaves rare tokens far more room.")
                widgets.show_chart(charts["region"], "feasible region")
            with right:
                st.write("For a softmax head where only the sampled token's logit moves: how far it may move before "
                         "the clip binds. Likely tokens can never reach u once π_old ≥ 1/u.")
                widgets.show_chart(charts["logit"], "logit room")
