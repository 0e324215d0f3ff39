"""Step inspector: a step's completions as text, every token coloured by what the constraint did to it, and one
token's loss explained with its own numbers."""

from pathlib import Path

import pandas as pd
import streamlit as st

from divviz.app import ui

from divviz.evidence import rescore
from divviz.views import explain, run_views, token_view
from divviz.engine import store
from divviz.losses import TOKEN_STATES
from divviz.catalogue.params import DivvizInputError
from divviz.safetext import literal
from divviz.app.urlstate import Control

PAGE = "inspector"
CONTROLS = [Control("colour", "clip state", options=tuple(token_view.COLOUR_BY)), Control("m", [], family="clip")]
BY_NAME = {c.name: c for c in CONTROLS}

st.title("Step inspector")
st.write("Pick a run and a step: each kept prompt with its G completions, as text, every token coloured by one of "
         "its facts (hover a token for all of them). Then pick a token to see its loss taken apart — the test's "
         "value against its threshold, the two terms of the min and which one wins, whether its gradient is "
         "masked and why, the penalty and its weight in the loss — computed by the same `policy_loss` that trained "
         "it, under the run's own measure and any other you add.")

ui.bind_controls(PAGE, CONTROLS)


@st.cache_data(max_entries=64, show_spinner=False)
def record_of(folder: str, step: int, mtime: float) -> dict:  # keyed by the file's time: a rewritten file rereads
    return token_view.with_entropy_covariance(store.read_completions(Path(folder), step))


def token_label(tokens: dict, i: int) -> str:
    return f"{i}: {tokens['raw'][i]!r} · {TOKEN_STATES[tokens['state'][i]]}"


with ui.shown_errors():
    root = store.runs_dir()
    runs = [run for run in store.list_runs(root) if store.completion_steps(run.folder)]
    if not runs:
        st.info("No run with kept completions yet: start one in the Training lab or with `divviz train` (each "
                "step keeps its first `inspect_prompts` prompts' completions whole).")
        st.stop()
    names = {run.name: run for run in runs}
    with st.sidebar:
        name = st.selectbox("Run", list(names), key="inspector:run", format_func=lambda n: run_views.run_choice(names[n]))
        run = names[name]
        steps = store.completion_steps(run.folder)
        step = st.select_slider("Step", steps, value=steps[-1], key=f"inspector:step:{name}") if len(steps) > 1 \
            else steps[0]
        colour_by = ui.choice(PAGE, BY_NAME["colour"], "Colour tokens by")
        extra = ui.measure_list(PAGE, BY_NAME["m"], "Explain the token also under these clip tests (the run's "
                                                    "penalty, β, dual-clip and aggregation kept)")
    ui.publish_controls(PAGE, CONTROLS)
    path = run.folder / "completions" / f"step_{step:06d}.json"
    record = record_of(str(run.folder), step, path.stat().st_mtime if path.exists() else 0.0)

    st.subheader(literal(f"{run_views.run_label(run)} · step {step}"))
    choices = [(g, c) for g, group in enumerate(record["groups"]) for c in range(len(group["completions"]))]
    if not choices:
        st.warning("This step's record holds no completion (its byte cap left them all out).")
        st.stop()
    left, right = st.columns(2)
    g, c = left.selectbox("Completion", choices, key="inspector:completion",
                          format_func=lambda gc: f"prompt {gc[0] + 1} · completion {gc[1] + 1} · reward "
                                                 f"{record['groups'][gc[0]]['completions'][gc[1]]['reward']:.3g}")
    tokens = record["groups"][g]["completions"][c]["tokens"]
    if not tokens["id"]:
        st.warning("This completion has no token.")
        st.stop()
    not_inside = [i for i, s in enumerate(tokens["state"]) if s != 0]
    i = right.selectbox("Token", range(len(tokens["id"])), index=not_inside[0] if not_inside else 0,
                        key=f"inspector:token:{name}:{step}:{g}:{c}", format_func=lambda i: token_label(tokens, i))
    try:
        rescored = rescore.rescore_record(record, run.config, [(t.label, t) for t in extra])
    except DivvizInputError as err:  # a record whose loss saw no token
        rescored, why = [], str(err)
    if colour_by == "re-score":
        record = token_view.with_rescore(record, rescored[1]["changed_tokens"] if len(rescored) > 1 else [])
    st.html(token_view.record_html(record, colour_by, selected=(g, c, i)))
    st.markdown("**Re-score this step.** Every token the loss saw, under the run's own measure and each clip test "
                "added in the sidebar: the share each would have masked low (w < l, A < 0) and high (w > u, A > 0), "
                "the share outside its region, the gradient weight it keeps, and how many tokens it judges otherwise "
                "(colour by *re-score* to see them). `divviz rescore` prints the same.")
    if rescored:
        st.dataframe(pd.DataFrame([{k: v for k, v in r.items() if k != "changed_tokens"} for r in rescored]),
                     hide_index=True, width="stretch", key="inspector:rescored",
                     column_config={k: st.column_config.NumberColumn(format="percent") for k in
                                    ("masked_low", "masked_high", "outside")})
    else:
        st.caption(literal(why))
    if tokens["pi_new"] is None:
        st.caption("π after the update is not known for this run: its trainer (TRL) makes no forward pass after the "
                   "update, so Δπ is blank and the token has no point after the update.")

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
    ui.show_chart(run_views.token_region(objectives, tokens["pi_old"][i], tokens["ratio"][i],
                                     token_view.fact(tokens, "pi_new", i)),
                  "token on the clipping regions")
