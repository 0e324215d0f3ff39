"""Mass reallocation: an exact softmax bandit trained with GRPO under each clip test, side by side."""

import streamlit as st

from divviz import ui, views
from divviz.bandit import BANDIT_PARAMS, INIT_SHAPES, REWARDS
from divviz.divergences import AGGREGATIONS, BETA, DUAL_CLIP, PENALTIES
from divviz.params import Param
from divviz.presets import BANDIT_PRESETS
from divviz.urlstate import Control, measure_param_controls

PAGE = "bandit"
CONTROLS = [
    Control("m", ["ratio", "clip_higher", "kl3"], family="clip"),
    Control("pen", "none", options=("none", *PENALTIES)),
    Control("beta", 0.05, param=BETA),
    Control("dual", False, param=Param("dual", False, kind="bool", doc="cap the loss of A < 0 tokens at −c·A")),
    Control("c", 3.0, param=DUAL_CLIP),
    Control("agg", "grpo", options=AGGREGATIONS),
    Control("init", "zipf", options=INIT_SHAPES),
    Control("reward", "top_k", options=REWARDS),
    *[Control(p.name, p.default, param=p) for p in BANDIT_PARAMS],
    *measure_param_controls(("penalty",)),
]
BY_NAME = {c.name: c for c in CONTROLS}
REWARD_LABELS = {"one_correct": "one correct action (at a rank)", "top_k": "the top k actions are correct",
                 "graded": "graded: 1 − rank/(K−1)", "random": "random rewards in [0, 1]"}


st.title("Mass reallocation")
st.write("A softmax policy over K actions, trained by GRPO with each clip test from the same start and seed. "
         "Everything is exact here: the whole distribution, its entropy, and where the probability mass goes — "
         "toward actions that were already likely, or toward rare ones. Each step is the gradient of the training "
         "loss, `policy_loss`, written in closed form (equal to autograd's to 1e-12, tested); tick *autograd* to "
         "take it through torch autograd as training does, about ten times slower.")

ui.bind_controls(PAGE, CONTROLS)
ui.preset_buttons(PAGE, BANDIT_PRESETS)
with ui.shown_errors():
    with st.sidebar:
        st.subheader("Objectives")
        tests, pen, beta, c, aggregation = ui.objective_widgets(PAGE, BY_NAME)
        st.subheader("Bandit")
        cfg = {"init": ui.choice(PAGE, BY_NAME["init"], "Initial distribution π_0"),
               "reward": ui.choice(PAGE, BY_NAME["reward"], "Reward", labels=REWARD_LABELS)}
        for p in BANDIT_PARAMS:
            cfg[p.name] = ui.number(PAGE, BY_NAME[p.name], p.name)
    ui.publish_controls(PAGE, CONTROLS)

    specs = [(t.name, t.params) for t in tests] or [None]
    with st.spinner("Training the bandit…"):
        runs = views.bandit_runs(cfg, specs, (pen.name, pen.params) if pen else None, beta, c, aggregation)
    charts = views.mass_reallocation(runs)

    cols = st.columns(len(runs))
    for col, run in zip(cols, runs):
        final = {k: v[-1] for k, v in run.history.items()}
        col.metric(run.label, f"E[r] = {final['expected_reward']:.3f}",
                   f"entropy {run.initial_entropy:.2f} → {final['entropy']:.2f}", delta_color="off",
                   delta_arrow="off")
    ui.show_chart(charts["distribution"], "distribution before and after")
    ui.show_chart(charts["mass"], "mass reallocation by initial probability")
    ui.show_chart(charts["history"], "reward entropy and mass over iterations")
    ui.show_chart(charts["clipping"], "clip fractions and kl over iterations")
