"""KL3 ⇔ asymmetric ratio clipping: the derivation, the Lambert-W bounds, matching, and a live check."""

import streamlit as st

from divviz.app import page_state, widgets

from divviz.views import explorer
from divviz.catalogue.divergences import CLIP_TESTS
from divviz.catalogue.params import Param
from divviz.app.urlstate import Control

PAGE = "kl3"
INTRO = ("ATR-GRPO clips a token when its k3 estimate w − 1 − log w exceeds δ. Because k3 is convex with its "
         "minimum at w = 1, that test is exactly ratio clipping on an interval [l_δ, u_δ], and the interval has "
         "a closed form through the two real branches of the Lambert W function.")
CONTROLS = [
    Control("delta", 0.05, param=CLIP_TESTS["kl3"].params[0]),
    Control("eps", 0.2, param=CLIP_TESTS["ratio"].params[0]),
    Control("eps_low", 0.2, param=CLIP_TESTS["clip_higher"].params[0]),
    Control("eps_high", 0.28, param=CLIP_TESTS["clip_higher"].params[1]),
    Control("seed", 0, param=Param("seed", 0, 0, 999, high_open=False, kind="int", typical=(0, 999, 1),
                                   doc="seed of the random batch for the numeric check")),
]

BY_NAME = widgets.page_top(PAGE, CONTROLS, "KL3 ⇔ asymmetric ratio clipping", INTRO)
with widgets.shown_errors():
    with st.sidebar:
        delta = widgets.number(PAGE, BY_NAME["delta"], "KL3 level δ")
        st.subheader("Boxes to match")
        eps = widgets.number(PAGE, BY_NAME["eps"], "PPO ε")
        eps_low = widgets.number(PAGE, BY_NAME["eps_low"], "DAPO ε_low")
        eps_high = widgets.number(PAGE, BY_NAME["eps_high"], "DAPO ε_high")
        seed = widgets.number(PAGE, BY_NAME["seed"], "batch seed")
    page_state.publish_controls(PAGE, CONTROLS)
    facts, charts = explorer.kl3_equivalence(delta, eps, eps_low, eps_high, seed)
    (lower, upper), (eps_lo, eps_hi) = facts.bounds, facts.box

    st.subheader("Derivation")
    st.latex(r"\mathrm{k3}(w) = w - 1 - \log w \le \delta,\qquad w = \pi_\theta/\pi_{\mathrm{old}}")
    st.latex(r"w - \log w = 1+\delta \iff (-w)\,e^{-w} = -e^{-1-\delta}")
    st.latex(r"\Rightarrow\; -w = W_k\!\left(-e^{-1-\delta}\right),\quad -e^{-1-\delta}\in(-1/e,\,0)")
    st.latex(r"l_\delta = -W_0\!\left(-e^{-1-\delta}\right),\qquad u_\delta = -W_{-1}\!\left(-e^{-1-\delta}\right)")
    st.latex(r"l_\delta,\,u_\delta \approx 1 \mp \sqrt{2\delta} + \tfrac{2\delta}{3} \mp \tfrac{(2\delta)^{3/2}}{36}")
    st.caption("Source: docs/theory.md §1.3 (derived for divviz; the closed form matches Wu et al. 2026, ATR-GRPO). "
               "W₀ gives the lower edge, W₋₁ the upper one.")

    st.subheader(f"At δ = {delta:g}")
    cols = st.columns(4)
    cols[0].metric("l_δ", f"{lower:.6f}", f"ε_low = {eps_lo:.4f}", delta_color="off", delta_arrow="off",
                   help=f"l_δ = {lower!r} (float64)")
    cols[1].metric("u_δ", f"{upper:.6f}", f"ε_high = {eps_hi:.4f}", delta_color="off", delta_arrow="off",
                   help=f"u_δ = {upper!r} (float64)")
    cols[2].metric("ε_high / ε_low", f"{eps_hi / eps_lo:.4f}", help="the box's asymmetry")
    cols[3].metric("series to s⁵: l ≈", f"{facts.series[0]:.5f}", f"u ≈ {facts.series[1]:.5f}", delta_color="off",
                   delta_arrow="off")
    st.caption(f"In TRL's words: `epsilon={eps_lo:.4f}`, `epsilon_high={eps_hi:.4f}` is the same test. "
               f"The wrong direction (k3 of π_old/π_θ, GRPO's penalty) would give "
               f"[{facts.inverse[0]:.4f}, {facts.inverse[1]:.4f}] instead.")

    widgets.show_chart(charts["level"], "k3 level set")
    st.subheader("Matching boxes and KL3 levels")
    widgets.show_table(explorer.matching_table(facts, eps, eps_low, eps_high), column_config={  # δ to 7 digits: a
        "KL3 δ through this edge": st.column_config.NumberColumn(format="%.7f")})  # rounded one has another box
    st.caption("A box is a KL3 level set only when both edges give the same δ. PPO's top edge is tighter than KL3 "
               "implies for its bottom edge; DAPO's is looser.")
    widgets.show_chart(charts["bounds"], "kl3 bounds vs delta")

    st.subheader("Numeric check on a random batch")
    check = facts.check
    st.write(f"{check.tokens} tokens (64 completions, mixed-sign advantages); {check.outside} fail the KL3 test, "
             f"{check.masked} of them lose their gradient. The same `policy_loss` is run twice: once with the "
             f"`kl3` test, once with `clip_higher` on [l_δ, u_δ].")
    losses, differences = st.columns(2), st.columns(2)  # two per row: 12 decimals need the width
    losses[0].metric("loss with kl3 test", f"{check.loss_kl3:.12f}")
    losses[1].metric("loss with ratio box", f"{check.loss_box:.12f}")
    differences[0].metric("max |Δ loss|", f"{check.max_abs_loss_diff:.1e}")
    differences[1].metric("max |Δ gradient|", f"{check.max_abs_grad_diff:.1e}", f"of max |grad| {check.max_abs_grad:.1e}",
                          delta_color="off", delta_arrow="off")
    if max(check.max_abs_loss_diff, check.max_abs_grad_diff) <= 1e-12:
        st.success("Identical to 1e-12 in float64: the KL3 test is asymmetric ratio clipping.", icon=":material/check:")
    else:
        st.error("The two losses differ by more than 1e-12.", icon=":material/error:")
