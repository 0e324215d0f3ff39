"""Step inspector: a step's completions as text, every token coloured by what the constraint did to it, and one
token's loss explained with its own numbers."""

import math
from pathlib import Path

import pandas as pd
import streamlit as st

from divviz.app import objective_sidebar, page_state, widgets

from divviz.app.urlstate import Control
from divviz.catalogue.params import DivvizInputError, Param
from divviz.evidence import rescore
from divviz.losses import TOKEN_STATES
from divviz.runs import store
from divviz.safetext import literal
from divviz.views import explain, run_files, run_text, run_views, token_view

PAGE = "inspector"
INTRO = ("Pick a run and a step: each kept prompt with its G completions, as text, every token coloured by one of "
         "its facts (hover a token for all of them). Then pick a token to see its loss taken apart — the test's "
         "value against its threshold, the two terms of the min and which one wins, whether its gradient is "
         "masked and why, the penalty and its weight in the loss — computed by the same `policy_loss` that trained "
         "it, under the run's own objective and any clip test you add.")
CONTROLS = [  # all in the link: it opens the same token of the same step
    Control("run", "", param=Param("run", "", kind="text", doc="the run's folder name (empty: the newest run)")),
    Control("step", 0, param=Param("step", 0, 0, 10**9, kind="int", typical=(0, 10**9, 1),
                                   doc="a step whose completions the run kept (0: its last)")),
    Control("colour", "clip state", options=tuple(token_view.COLOUR_BY)),
    Control("completion", "", param=Param("completion", "", kind="text",
                                          doc="prompt.completion, each from 1, e.g. 2.3 (empty: the first)")),
    Control("token", -1, param=Param("token", -1, -1, 10**6, kind="int", typical=(-1, 10**6, 1),
                                     doc="the token's position (-1: the first one the constraint acted on)")),
    Control("m", [], family="clip")]

BY_NAME = widgets.page_top(PAGE, CONTROLS, "Step inspector", INTRO)
widgets.published_warnings()


@st.cache_data(max_entries=64, show_spinner=False)
def record_of(folder: str, step: int, mtime: float) -> dict:  # keyed by the file's time: a rewritten file rereads
    return token_view.with_entropy_covariance(store.read_completions(Path(folder), step))


def step_record(folder: Path, step: int) -> dict:
    path = folder / "completions" / f"step_{step:06d}.json"
    return record_of(str(folder), step, path.stat().st_mtime if path.exists() else 0.0)


def learns(folder: Path, step: int) -> bool:
    """Whether the loss learned from a kept step's completions (one with a nonzero advantage); a record that cannot
    be read is said when it is shown, not here."""
    try:
        return bool(token_view.learned_from(step_record(folder, step)))
    except store.CorruptRun:
        return False


def settle(name: str, options: list, fallback, where: str) -> None:
    """Before a widget whose options the data decides: a value it cannot show (a link's, or one kept from a run that
    is gone) becomes `fallback`; one that is not the control's default is said to be missing from `where`."""
    value = st.session_state.get(page_state.key(PAGE, name))
    if value not in options:
        if value != BY_NAME[name].default:
            st.warning(literal(f"{name} {value!r} is not in {where}: showing {fallback!r} instead."))
        st.session_state[page_state.key(PAGE, name)] = fallback


def forget(*names: str) -> None:
    """Back to their defaults (a widget callback: a new run starts at its last step, a new completion at its first
    token the constraint acted on)."""
    for name in names:
        st.session_state[page_state.key(PAGE, name)] = BY_NAME[name].default


with widgets.shown_errors():
    root = store.runs_dir()
    every = run_files.every_run(root)  # the runs folder's, then the published runs'
    runs = [run for run in every if store.completion_steps(run.folder)]
    listed = {run.name for run in runs}
    metrics_only = [run.name for run in every if run.config.get("backend") == "import" and run.name not in listed]
    if metrics_only:
        st.caption(literal(f"Not listed here: {len(metrics_only)} imported run{'s' if len(metrics_only) != 1 else ''} "
                           f"whose file holds metrics only, no per-token data ({', '.join(metrics_only[:3])}"
                           f"{', …' if len(metrics_only) > 3 else ''}); their curves are on the Runs page."))
    if not runs:
        st.info("No run with kept completions yet: start one in the Training lab or with `divviz train` (each "
                "step keeps its first `inspect_prompts` prompts' completions whole).")
        st.stop()
    names = {run.name: run for run in runs}
    settle("run", list(names), runs[0].name, "this runs folder's runs with kept completions")
    steps = store.completion_steps(names[st.session_state[page_state.key(PAGE, "run")]].folder)
    settle("step", steps, steps[-1], "the steps whose completions this run kept")
    with st.sidebar:
        name = st.selectbox("Run", list(names), key=page_state.key(PAGE, "run"), on_change=forget,
                            args=("step", "completion", "token"), format_func=lambda n: run_text.run_choice(names[n]))
        run = names[name]
        step = st.select_slider(run_text.kept_steps_label(steps), steps, key=page_state.key(PAGE, "step"),
                                on_change=forget, args=("token",)) if len(steps) > 1 else steps[0]
        colour_by = widgets.choice(PAGE, BY_NAME["colour"], "Colour tokens by")
        extra = objective_sidebar.measure_list(PAGE, BY_NAME["m"], "Explain the token also under these clip tests (the run's "
                                                    "penalty, β, dual-clip and aggregation kept)")
    record = step_record(run.folder, step)

    st.subheader(literal(f"{run_text.run_label(run)} · step {step}"))
    st.caption(literal(run_text.run_choice(run)))  # the run whole: the sidebar's select cuts a long one short
    choices = [f"{g + 1}.{c + 1}" for g, c in token_view.completions_of(record)]
    if not choices:
        page_state.publish_controls(PAGE, CONTROLS)
        st.warning("This step's record holds no completion (its byte cap left them all out).")
        st.stop()
    left, right = st.columns(2)

    def completion_of(choice: str) -> tuple[int, int]:  # "2.3" → (1, 2): prompt and completion, from 0
        g, c = choice.split(".")
        return int(g) - 1, int(c) - 1

    def completion_label(choice: str) -> str:
        return token_view.completion_label(record, *completion_of(choice))

    learned = [f"{g + 1}.{c + 1}" for g, c in token_view.learned_from(record)]
    if not learned:
        others = [s for s in steps if s != step and learns(run.folder, s)]
        kept = len(record["groups"])
        st.info(literal(f"Every completion kept at step {step} (its first {kept} prompt{'s' if kept != 1 else ''}) has "
                        "advantage 0 (each group's rewards are equal): the loss learns nothing from them, so no token "
                        "here is clipped or pulled (the weights may still move, by the step's other prompts and AdamW's "
                        "momentum; the Runs page has the whole step's metrics). "
                        + (f"Kept steps it learns from: {', '.join(map(str, others))}." if others else
                           "No kept step of this run has a completion it learns from.")),
                icon=":material/info:")
    settle("completion", choices, (learned or choices)[0], f"step {step}'s completions")  # the first one learned from
    g, c = completion_of(left.selectbox("Completion", choices, key=page_state.key(PAGE, "completion"), on_change=forget,
                                       args=("token",), format_func=completion_label))
    tokens = token_view.completion(record, g, c)["tokens"]
    if not tokens["id"]:
        page_state.publish_controls(PAGE, CONTROLS)
        st.warning("This completion has no token.")
        st.stop()
    not_inside = [i for i, s in enumerate(tokens["state"]) if s != 0]
    settle("token", list(range(len(tokens["id"]))), not_inside[0] if not_inside else 0, "this completion")
    i = right.selectbox("Token", range(len(tokens["id"])), key=page_state.key(PAGE, "token"),
                        format_func=lambda i: token_view.token_choice(tokens, i))
    page_state.publish_controls(PAGE, CONTROLS)  # after the last widget the link holds: run, step, completion, token
    try:
        rescored = rescore.rescore_record(record, run.config, [(t.label, t) for t in extra])
    except DivvizInputError as err:  # a record whose loss saw no token
        rescored, why = [], str(err)
    if colour_by == "re-score":
        record = token_view.with_rescore(record, [r["changed_tokens"] for r in rescored[1:]])
        st.caption(literal(f"Marked: the tokens that {', '.join(r['measure'] for r in rescored[1:])} judge otherwise "
                           "than the run's own objective (the darker, the more of them do).") if len(rescored) > 1
                   else "Add a clip test in the sidebar to mark the tokens it judges otherwise than the run's own.")
    st.html(token_view.record_html(record, colour_by, selected=(g, c, i)))
    st.markdown("**Re-score this step.** Every token the loss saw, under the run's own objective and each clip test "
                "added in the sidebar: the share each would have masked low (w < l, A < 0) and high (w > u, A > 0), "
                "the share outside its region, the share of the gradient weight that still flows, and how many tokens "
                "it judges otherwise (colour by *re-score* to see them). `divviz rescore` prints the same.")
    if rescored:
        st.caption(literal(f"Counted: the tokens the loss saw in {rescore.coverage(record, run.config)}."))
        widgets.show_table(pd.DataFrame([{k: v for k, v in r.items() if k != "changed_tokens"} for r in rescored]),
                           width="stretch", key="inspector:rescored",
                           column_config={k: st.column_config.NumberColumn(format="percent") for k in
                                          ("masked_low", "masked_high", "outside")})
        if any(math.isnan(r["gradient_flows"]) for r in rescored):
            st.caption("gradient_flows has no value (—): every advantage in this step's record is 0, so no token has "
                       "a gradient for a clip test to let through or mask.")
    else:
        st.caption(literal(why))
    if tokens["pi_new"] is None:
        st.caption(literal(token_view.pi_after_unknown(run.config)))

    st.subheader("This token's loss")
    objectives = run_views.explained_objectives(run.config, extra)
    rejected = tokens["state"][i] == len(TOKEN_STATES) - 1  # by the rollout correction: no loss to take apart
    if rejected:
        st.info(literal(run_views.rejected_note(run.config, tokens, i)), icon=":material/block:")
    for column, (label, objective) in zip(st.columns(len(objectives)) if not rejected else [], objectives):
        with column:
            st.markdown(f"**{literal(label)}**")
            try:
                e = explain.explain_stored(objective, tokens, i, label)
            except DivvizInputError as err:
                st.warning(literal(str(err)))
                continue
            st.html(token_view.explanation_html(e.lines()))
    widgets.show_chart(run_views.token_region(objectives, tokens["pi_old"][i], tokens["ratio"][i],
                                     token_view.fact(tokens, "pi_new", i)),
                  "token on the clipping regions")
