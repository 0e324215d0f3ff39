"""Mass reallocation: an exact softmax bandit trained with GRPO under each clip test, side by side."""

import streamlit as st

from divviz.app import objective_sidebar, page_state, widgets

from divviz.views import explorer
from divviz.bandit.setting import BANDIT_PARAMS, DEFAULT_LR, INIT_SHAPES, OPTIMIZERS, REWARDS
from divviz.catalogue.params import Param
from divviz.views.presets import BANDIT_PRESETS
from divviz.safetext import literal
from divviz.app.urlstate import Control

PAGE = "bandit"
INTRO = ("A softmax policy over K actions, trained by GRPO with each clip test or surrogate from the same start, with "
         "several seeds each. Everything is exact here: the whole distribution, its entropy, and where the probability "
         "mass goes — toward actions that were already likely, or toward rare ones. Curves are the mean over the seeds "
         "with a 95% band; the paired differences below say whether an effect holds, and in how many seeds it "
         "reverses. Each step is the gradient of the training loss, `policy_loss`, in closed form (equal to autograd's "
         "to 1e-12, tested); tick *autograd* to take it through torch autograd as training does.")
OVER_ITERATIONS = ("Reward, entropy and mass", "Clip fractions and KL", "Why the entropy moves",
                   "Sampler and corrections")  # the tabs of the curves over iterations; one drawn
SEEDS = Param("seeds", 8, 1, 64, high_open=False, kind="int", typical=(1, 64, 1),
              doc="runs per objective, seeds seed, seed + 1, …: curves show their mean with a 95% band")
CONTROLS = [
    *objective_sidebar.objective_controls(["ratio", "clip_higher", "kl3"], beta=0.05),
    Control("init", "zipf", options=INIT_SHAPES),
    objective_sidebar.SCALE_REWARDS_CONTROL, objective_sidebar.BASELINE_CONTROL,
    Control("reward", "top_k", options=REWARDS),
    Control("optimizer", "sgd", options=OPTIMIZERS),
    Control("seeds", SEEDS.default, param=SEEDS),
    Control("base", 0, param=Param("base", 0, 0, 63, high_open=False, kind="int", typical=(0, 63, 1))),
    Control("diff_at", 80, param=Param("diff_at", 80, 1, 10_000, kind="int", typical=(1, 1000, 1),
                                       doc="the iteration the paired differences are read at")),
    Control("diff_metric", explorer.BANDIT_METRICS[0], options=tuple(explorer.BANDIT_METRICS)),
    *[Control(p.name, p.default, param=p) for p in BANDIT_PARAMS if p.name != "rollout_lag"],
    *objective_sidebar.rollout_controls(next(p for p in BANDIT_PARAMS if p.name == "rollout_lag")),
    Control("tab", OVER_ITERATIONS[0], options=OVER_ITERATIONS),
]
REWARD_LABELS = {"one_correct": "one correct action (at a rank)",
                 "top_k": "the most likely actions are correct (ranks 0 … correct_rank)",
                 "graded": "graded: 1 − rank/(K−1)", "random": "random rewards in [0, 1]",
                 "random_correct": "a random share of the actions are correct (correct_percent %)",
                 "coin": "random-reward control: a fair coin per sample, whatever the action"}
PARAM_LABELS = {"k": "K, the number of actions",
                "correct_rank": lambda reward: ("correct_rank: ranks 0 … this one are correct" if reward == "top_k"
                                                else "correct_rank: the rank of the correct action"),
                "correct_percent": "correct_percent: the share of actions that are correct (%)",
                "attribution": "Attribute the entropy's change to each clip state (slower)"}
APPLIES = {"correct_rank": lambda cfg: cfg["reward"] in ("top_k", "one_correct"),  # a setting the others ignore is
           "correct_percent": lambda cfg: cfg["reward"] == "random_correct",  # not shown (its value is kept)
           "sharpness": lambda cfg: cfg["init"] != "uniform"}
OPTIMIZER_LABELS = {"sgd": "SGD (the loss's own step)", "adam": "Adam, its state kept across iterations"}
PAST_HIGH_WARNING = 0.05  # share of A > 0 samples above u after one optimiser step, over the first iterations


def optimizer_changed() -> None:
    """A new optimiser starts from its own default learning rate (SGD's 0.5 would throw Adam far past any clip)."""
    st.session_state[page_state.key(PAGE, "lr")] = DEFAULT_LR[st.session_state[page_state.key(PAGE, "optimizer")]]


BY_NAME = widgets.page_top(PAGE, CONTROLS, "Mass reallocation", INTRO, BANDIT_PRESETS)
with widgets.shown_errors():
    with st.sidebar:
        st.subheader("Objectives")
        objectives, refused = objective_sidebar.objective_widgets(PAGE, BY_NAME, bandit=True)
        st.caption("A bandit's completion is one token: the sequence level (GSPO) is the token level here, and "
                   "vespo's φ takes the token's ratio.")
        st.subheader("Bandit")
        seeds = widgets.number(PAGE, BY_NAME["seeds"], "Seeds per objective")
        cfg = {"init": widgets.choice(PAGE, BY_NAME["init"], "Initial distribution π_0"),
               "reward": widgets.choice(PAGE, BY_NAME["reward"], "Reward", labels=REWARD_LABELS),
               **objective_sidebar.advantage_widgets(PAGE, BY_NAME),
               "optimizer": st.selectbox("Optimiser", OPTIMIZERS, key=page_state.key(PAGE, "optimizer"),
                                         format_func=OPTIMIZER_LABELS.get, on_change=optimizer_changed)}
        for p in BANDIT_PARAMS:
            if p.name == "rollout_lag":
                continue
            if p.name in APPLIES and not APPLIES[p.name](cfg):
                cfg[p.name] = st.session_state.get(page_state.key(PAGE, p.name), p.default)
                continue
            label = PARAM_LABELS.get(p.name, p.name)
            cfg[p.name] = widgets.number(PAGE, BY_NAME[p.name], label(cfg["reward"]) if callable(label) else label)
        with st.expander("Rollout: a sampler unlike the policy, and verl's corrections"):
            st.caption("Draw the samples from the policy of some iterations ago, its logits rounded to a lower "
                       "precision, as an inference engine beside a trainer does; π_old stays the current policy. "
                       "Compare verl's corrections of it (one run each).")
            sampler, variants = objective_sidebar.rollout_widgets(PAGE, BY_NAME, "the sampler's logits rounded to this precision "
                                                                  "(same: exact)", "Sampler lag (iterations behind)")
            cfg.update(sampler)
    page_state.publish_controls(PAGE, CONTROLS)

    for message in refused:
        st.warning(f"Not trained: {literal(message)}", icon=":material/warning:")
    if not objectives:
        st.stop()
    progress, bar = widgets.working("Training the bandit: iteration")
    try:
        groups = explorer.bandit_runs(cfg, objectives, seeds, variants, progress)
    finally:  # trained, or refused (too much work, a divergence): the bar goes either way
        bar.empty()
    charts = explorer.mass_reallocation(groups)

    per_row = min(len(groups), 4)  # more in one row would cut the numbers short
    cols = [col for _ in range(0, len(groups), per_row) for col in st.columns(per_row)]
    for col, (label, value, delta) in zip(cols, explorer.group_cards(groups)):
        col.metric(label, value, delta, delta_color="off", delta_arrow="off")
    past_high, early = explorer.first_step_past_high(groups, cfg["iterations"])
    if past_high > PAST_HIGH_WARNING:
        st.warning(f"At this learning rate, {past_high:.0%} of the positive-advantage samples are already above u "
                   f"after the first optimiser step (mean of the first {early} iterations, worst objective): one step "
                   "jumps past the box before the clip can act, so differences between boxes here mostly measure how far "
                   "each lets that step overshoot. Lower lr to compare the constraints themselves.",
                   icon=":material/warning:")
    widgets.show_chart(charts["distribution"], "distribution before and after")
    widgets.show_chart(charts["mass"], "mass reallocation by initial probability")
    st.subheader("Over the iterations")
    shown, tab = widgets.lazy_tabs(PAGE, BY_NAME["tab"], {"Sampler and corrections": "rollout" in charts})
    with tab:
        if shown == OVER_ITERATIONS[0]:
            widgets.show_chart(charts["history"], "reward entropy and mass over iterations")
        elif shown == OVER_ITERATIONS[1]:
            widgets.show_chart(charts["clipping"], "clip fractions and kl over iterations")
        elif shown == OVER_ITERATIONS[2]:
            st.write("Each update changes the entropy by ΔH ≈ −Cov_π(log π, Δz) to first order (Cui et al. 2025, "
                     "arXiv 2505.22617). A plain gradient step is a sum over the samples, so the change splits into "
                     "what each sample caused, summed here by clip state, and what the masked samples would have "
                     "caused had the constraint let them through (Park et al. 2025, arXiv 2509.26114: masking low "
                     "raises entropy, masking high lowers it). Exact with SGD; with Adam, the shares are those of the "
                     "loss gradient's own step. Choose the *coin* reward for their random-reward control.")
            widgets.show_chart(charts["entropy"], "entropy change observed and predicted")
            if "attribution" in charts:
                widgets.show_chart(charts["attribution"], "entropy change by clip state")
            else:
                st.caption("Tick *Attribute the entropy's change to each clip state* in the sidebar for who moves it "
                           "(about a third more time per change).")
        else:
            widgets.show_chart(charts["rollout"], "sampler mismatch and corrections over iterations")

    st.subheader("Paired differences")
    labels = [runs[0].label for runs in groups]
    if len(groups) < 2:
        st.info("Add a second objective to compare it with the first, seed by seed.")
    else:
        left, middle, right = st.columns(3)
        base_key = page_state.key(PAGE, "base")
        st.session_state[base_key] = min(st.session_state[base_key], len(groups) - 1)
        baseline = left.selectbox("Baseline objective", range(len(groups)), key=base_key,
                                  format_func=lambda i: labels[i])
        iterations = len(groups[0][0].history["entropy"])
        at_key = page_state.key(PAGE, "diff_at")
        st.session_state[at_key] = min(st.session_state.get(at_key, iterations), iterations)
        at = middle.slider("At iteration", 1, max(iterations, 2), key=at_key, disabled=iterations < 2)
        metric = right.selectbox("Metric over the iterations", explorer.BANDIT_METRICS,
                                 key=page_state.key(PAGE, "diff_metric"))
        st.write(f"Each objective minus {literal(labels[baseline])} on the same seeds, at iteration {min(at, iterations)}: "
                 "the mean difference, its 95% interval (Student t), n, and in how many seeds one run alone would have "
                 "shown the opposite order.")
        widgets.show_table(explorer.paired_differences(groups, baseline, iteration=min(at, iterations) - 1),
                           width="stretch")
        widgets.show_chart(explorer.paired_difference_chart(groups, baseline, metric), "paired difference")
