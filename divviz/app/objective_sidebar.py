"""The sidebar's catalogue widgets: the objectives to compare (clip tests, surrogates, penalties, and how they
combine), the advantages, and the rollout: a sampler unlike the policy and verl's corrections of it."""

from __future__ import annotations

import streamlit as st

from divviz.app.page_state import key, renew_list_widgets
from divviz.app.urlstate import Control, measure_param_controls
from divviz.app.widgets import choice, number, slider_for
from divviz.catalogue import instances
from divviz.catalogue.aggregation import AGGREGATIONS, BASELINES, SCALE_REWARDS
from divviz.catalogue.divergences import BETA, DUAL_CLIP, FAMILIES
from divviz.catalogue.params import DivvizInputError, Param
from divviz.catalogue.penalties import penalty, PENALTIES
from divviz.catalogue.rollout_correction import (ICEPOP_HIGH, ICEPOP_LOW, OPTIONS as RS_OPTIONS, RS_BOUND, RS_RATIO_HIGH,
                                       RS_RATIO_LOW, SAMPLER_DTYPES, TIS_CAP)
from divviz.catalogue.surrogates import LEVELS
from divviz.loss_checks import OFF_POLICY_MASK_THRESHOLD, RATIO_CAP
from divviz.losses import Objective
from divviz.safetext import literal
from divviz.views import explorer


def _edit_measures(page: str, name: str, action: str, index: int | None = None) -> None:
    """Add (from the "Add a clip test" box), duplicate or remove one entry of the list (a widget callback)."""
    specs = list(st.session_state[key(page, name)])
    if action == "add":
        added = st.session_state.pop(key(page, f"{name}_add"), None)
        if added:
            specs.append(added)
    elif action == "duplicate":
        specs.insert(index + 1, specs[index])
    else:
        del specs[index]
    st.session_state[key(page, name)] = specs
    renew_list_widgets(page, name)


def measure_list(page: str, control: Control, title: str) -> list:
    """The page's list of clip tests or surrogates (a `Control` of family "clip" or "surrogate"), each with its
    parameters: one expander per entry with its sliders, Duplicate and Remove, then a box to add another. The same
    entry may appear several times. The list lives in the session as spelled entries (`instances.spell`); the returned
    ones carry the sliders' values."""
    name = control.name
    specs = st.session_state[key(page, name)]
    version = st.session_state.get(key(page, f"{name}_version"), 0)
    chosen = [instances.parse(spec, control.family) for spec in specs]
    widget = [{p.name: f"{page}:{name}{version}.{i}.{p.name}" for p in m.entry.params} for i, m in enumerate(chosen)]
    for measure, keys in zip(chosen, widget):  # a slider's value, else the list's
        for p in measure.entry.params:
            st.session_state.setdefault(keys[p.name], measure.params[p.name])
    current, refused = [], {}
    for i, (measure, keys) in enumerate(zip(chosen, widget)):
        try:
            current.append(instances.configure(measure.name, {p: st.session_state[k] for p, k in keys.items()},
                                               control.family))
        except DivvizInputError as err:  # a typed formula that is refused: keep the list's last good one
            current.append(measure)
            refused[i] = err
    labels = instances.unique_labels([m.label for m in current])
    st.caption(title)
    for i, (measure, keys, label) in enumerate(zip(current, widget, labels)):
        with st.expander(label, expanded=len(current) <= 3 or i in refused):
            for p in measure.entry.params:
                slider_for(p, keys[p.name], p.name)
            if i in refused:
                st.error(f"{literal(str(refused[i]))} — still shown: {literal(measure.label)}", icon=":material/error:")
            st.caption(measure.entry.doc)
            row = st.container(horizontal=True)
            row.button("Duplicate", key=f"{page}:{name}{version}.{i}:dup", icon=":material/content_copy:",
                       on_click=_edit_measures, args=(page, name, "duplicate", i))
            row.button("Remove", key=f"{page}:{name}{version}.{i}:del", icon=":material/close:",
                       on_click=_edit_measures, args=(page, name, "remove", i))
    noun = "surrogate" if control.family == "surrogate" else "clip test"
    st.selectbox(f"Add a {noun}", list(FAMILIES[control.family]),
                 index=None, key=key(page, f"{name}_add"), placeholder=f"add a {noun}…", on_change=_edit_measures,
                 args=(page, name, "add"), help="the same entry may be added again with other parameters")
    st.session_state[key(page, name)] = [instances.spell(m) for m in current]
    return current


def penalty_widgets(page: str, name: str, controls: dict[str, Control]):
    """Sliders for the chosen penalty's parameters (in an expander), then the configured penalty."""
    entry = PENALTIES[name]
    with st.expander(f"{name}: {entry.title}", expanded=True):
        values = {p.name: number(page, controls[f"{name}.{p.name}"], p.name) for p in entry.params}
        st.caption(entry.doc)
    return penalty(name, **values)


def objective_controls(tests: list[str], beta: float) -> list[Control]:
    """The controls of `objective_widgets`, with the page's default clip tests and β."""
    return [Control("m", tests, family="clip"), Control("s", [], family="surrogate"),
            Control("pen", "none", options=("none", *PENALTIES)), Control("beta", beta, param=BETA),
            Control("pen2", "none", options=("none", *PENALTIES)), Control("beta2", 0.1, param=BETA),
            Control("dual", False, param=Param("dual", False, kind="bool", doc="cap the loss of A < 0 tokens at −c·A")),
            Control("c", 3.0, param=DUAL_CLIP),
            Control("cap_on", False, param=Param("cap_on", False, kind="bool", doc=RATIO_CAP.doc)),
            Control("cap", RATIO_CAP.default, param=RATIO_CAP),
            Control("opsm_on", False, param=Param("opsm_on", False, kind="bool", doc=OFF_POLICY_MASK_THRESHOLD.doc)),
            Control("opsm", OFF_POLICY_MASK_THRESHOLD.default, param=OFF_POLICY_MASK_THRESHOLD),
            Control("level", "token", options=LEVELS), Control("agg", "grpo", options=AGGREGATIONS),
            *measure_param_controls(("penalty",))]


def correction_controls(default: list[str]) -> list[Control]:
    """The controls of `correction_widgets`: the corrections to compare (`default` at first) and their parameters."""
    return [Control("rc", default, options=tuple(explorer.ROLLOUT_VARIANTS), multi=True),
            *[Control(p.name, p.default, param=p) for p in (TIS_CAP, ICEPOP_LOW, ICEPOP_HIGH, RS_RATIO_LOW,
                                                            RS_RATIO_HIGH, RS_BOUND)],
            Control("rs_option", "token_k1", options=RS_OPTIONS),
            Control("rc_norm", False, param=Param("rc_norm", False, kind="bool",
                                                  doc="verl's rollout_is_batch_normalize: weights divided by their "
                                                      "batch mean"))]


def rollout_controls(lag: Param) -> list[Control]:
    """The controls of `rollout_widgets`, with the page's parameter for the sampler's lag."""
    return [Control("rollout_dtype", "same", options=tuple(SAMPLER_DTYPES)),
            Control("rollout_lag", lag.default, param=lag), *correction_controls(["none"])]


def correction_widgets(page: str, controls: dict[str, Control]) -> list[dict]:
    """verl's rollout corrections to compare, with the parameters of those chosen: one dict of run-config keys each
    (`explorer.rollout_variant`)."""
    names = choice(page, controls["rc"], "Corrections to compare (one run each)",
                   help="; ".join(f"{k}: {v}" for k, v in explorer.ROLLOUT_VARIANTS.items()))
    values = {"tis_u": TIS_CAP.default, "icepop": (ICEPOP_LOW.default, ICEPOP_HIGH.default),  # for those not shown
              "rs_option": controls["rs_option"].default, "rs_ratio": (RS_RATIO_LOW.default, RS_RATIO_HIGH.default),
              "rs_bound": RS_BOUND.default, "normalize": False}
    if any(n.startswith("TIS") for n in names):
        values["tis_u"] = number(page, controls["tis_u"], "TIS cap u")
    if any(n.startswith("IcePop") for n in names):
        values["icepop"] = (number(page, controls["icepop_l"], "IcePop l"),
                            number(page, controls["icepop_u"], "IcePop u"))
    if any(n.startswith(("TIS", "IcePop")) for n in names):
        values["normalize"] = number(page, controls["rc_norm"], "Normalise the weights to mean 1 (verl)")
    if "rejection" in names:
        values["rs_option"] = choice(page, controls["rs_option"], "Rejection statistic")
        if values["rs_option"].endswith("k1"):
            values["rs_ratio"] = (number(page, controls["rs_l"], "kept for ratio bounds from l"),
                                  number(page, controls["rs_u"], "to u"))
        else:
            values["rs_bound"] = number(page, controls["rs_bound"], f"in the loss while {values['rs_option']} ≤")
    return [explorer.rollout_variant(name, **values) for name in names]


def rollout_widgets(page: str, controls: dict[str, Control], precision_help: str,
                    lag_label: str) -> tuple[dict, list[dict]]:
    """The rollout block of the Training lab and the bandit: the sampler's precision and lag (one for all runs), and
    the rollout corrections to compare (one run each; none chosen is one run without). Returns the shared config keys
    and one dict of run-config keys per correction."""
    shared = {"rollout_dtype": choice(page, controls["rollout_dtype"], "Sampler precision", help=precision_help),
              "rollout_lag": number(page, controls["rollout_lag"], lag_label)}
    return shared, correction_widgets(page, controls) or [{}]


SCALE_REWARDS_CONTROL = Control("scale_rewards", "group", options=SCALE_REWARDS,
                                aliases=(("0", "none"), ("1", "group")))  # a link may carry the toggle's 0/1


BASELINE_CONTROL = Control("baseline", "group", options=BASELINES)


def advantage_widgets(page: str, controls: dict[str, Control]) -> dict[str, str]:
    """The advantage's baseline and scale: {"baseline": …, "scale_rewards": …}."""
    return {"baseline": choice(page, controls["baseline"], "Advantages: the reward minus the mean of",
                               labels={"group": "its group (GRPO)", "batch": "the whole batch (RPG's batch mean)"}),
            "scale_rewards": choice(page, controls["scale_rewards"], "… divided by the reward std of",
                                    labels={"group": "its group (GRPO)",
                                            "batch": "the whole batch (TRL's scale_rewards='batch')",
                                            "none": "nothing (Dr. GRPO, RPG)"})}


def objective_widgets(page: str, controls: dict[str, Control], bandit: bool = False) -> tuple[list[Objective], list[str]]:
    """The sidebar block shared by the bandit and the lab: clip tests and surrogates (one run each), a penalty with
    its β and a second one with its own, dual-clip, TRL's ratio cap and off-policy mask, the importance-sampling
    level and the aggregation. Returns `explorer.compared_objectives`: (objectives, a message for each entry these
    settings refuse)."""
    tests = measure_list(page, controls["m"], "Clip tests under PPO's surrogate (one run each)")
    surrogates = measure_list(page, controls["s"], "Surrogates (one run each; those that mask with a clip test take "
                                                   "the first)")
    pen_name = choice(page, controls["pen"], "Penalty toward the start policy")
    pen = penalty_widgets(page, pen_name, controls) if pen_name != "none" else None
    shared = {"penalty": pen, "beta": number(page, controls["beta"], "β") if pen else 0.0}
    second = choice(page, controls["pen2"], "A second penalty, with its own coefficient",
                    help="GBMPO's prob_l2kl: k3 with β and prob_l2 with λ")
    if second != "none" and second == pen_name:
        st.warning("The second penalty is the first one again: choose another, or raise β.", icon=":material/warning:")
    elif second != "none":
        shared["second_penalty"] = penalty_widgets(page, second, controls)
        shared["second_beta"] = number(page, controls["beta2"], "β₂ (its coefficient)")
    if number(page, controls["dual"], "Dual-clip"):
        shared["dual_clip_c"] = number(page, controls["c"], "dual-clip c")
    if number(page, controls["cap_on"], "Ratio cap δ (TRL's delta)"):
        shared["ratio_cap"] = number(page, controls["cap"], "δ")
    if number(page, controls["opsm_on"], "Off-policy sequence mask (TRL's)"):
        shared["off_policy_mask_threshold"] = number(page, controls["opsm"], "mask threshold δ")
    shared["importance_sampling_level"] = choice(page, controls["level"], "Importance sampling (TRL's level)",
                                                 labels={"token": "token (GRPO)", "sequence": "sequence (GSPO)"})
    shared["aggregation"] = choice(page, controls["agg"], "Aggregation (TRL loss_type)")
    return explorer.compared_objectives(tests, surrogates, bandit, **shared)
