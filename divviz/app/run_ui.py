"""The widgets of the run pages (Training lab, Runs) that the shared widgets (`widgets.py`, `objective_sidebar.py`) do not cover: what a run will cost
before Start, and the charts of runs with the notices that go with them."""

from __future__ import annotations

import math
from dataclasses import replace

import streamlit as st

from divviz.app.page_state import key
from divviz.app.widgets import show_chart
from divviz.engine import stability
from divviz.runs import runner
from divviz.runs.train import eval_steps
from divviz.safetext import literal
from divviz.views import run_text, run_views


def expected_step_time(root, configs: list, on_measure) -> None:
    """Before Start: what a step of these runs will cost on this machine, from a run of the same model already
    timed here (`runner.step_time_estimate`); without one, a button that measures it with a one-step run."""
    cfg = configs[0]
    estimate = runner.step_time_estimate(root, cfg)
    if estimate is None:
        left, right = st.columns([3, 1])
        left.caption(literal(f"No step of {cfg.model} has been timed on this machine yet, so the time per step is "
                             "not known: a two-step timing run measures it — its second step, since the first also "
                             "warms the process up (it stays in the runs folder, listed as a timing run, so that "
                             "later estimates find it)."))
        right.button("Measure one step", icon=":material/timer:", key="measure_step",
                     on_click=on_measure, args=(replace(cfg, steps=2, eval_every=0),))  # no evaluation
        return
    runs = len(configs)
    at_once = min(runs, runner.max_runs())
    seconds = estimate.at(at_once)
    evaluations = len(eval_steps(cfg))
    evaluation = runner.eval_time_estimate(root, cfg) if evaluations else None
    total = math.ceil(runs / at_once) * (seconds * cfg.steps + evaluations * (evaluation or 0.0))
    held_out = ""
    if evaluations:
        held_out = (f", {evaluations} held-out evaluations each included (about {run_text.seconds_text(evaluation)} "
                    "each here)" if evaluation is not None else
                    f", plus {evaluations} held-out evaluations each (not yet timed here)")
    st.caption(literal(
        f"Expected: about {run_text.seconds_text(seconds)} per step ({estimate.basis}, "
        f"{run_text.timed_beside(estimate.side_by_side)}); "
        + (f"these {runs} runs train {at_once} at a time" if runs > 1 else "this run trains")
        + f": about {run_text.duration(total)} in all for {cfg.steps} steps{' each' if runs > 1 else ''}{held_out}. "
        "Take it as within a factor of 2: anything else this machine does, another browser's runs included, slows "
        "every step."))


def one_seed_notice(labels: list[str]) -> None:
    """Where runs compare objectives on one seed each (`run_views.one_seed_each`), say what that cannot tell, and
    where the comparison over seeds is."""
    if run_views.one_seed_each(labels):
        st.info("One seed per objective: a gap between these curves is as much the seed's as the objective's (two "
                "seeds of one objective can differ as much). The Claims page compares the objectives over seeds, with "
                "intervals — on SmolLM2, from the published runs of its learn and stress settings.",
                icon=":material/casino:")
        st.page_link("app_pages/claims.py", label="Claims: the same comparison over seeds", icon=":material/fact_check:")


def show_training_charts(page: str, runs: list[tuple[str, list[dict]]], evals: list[list[dict]] | None = None,
                         binding_hint: str = "", make_it_bind=None) -> bool:
    """The metric curves of runs [(label, metrics rows)] with a smoothing slider: first, when nothing has clipped,
    a notice that every measure makes the same update (with `binding_hint`, how to make it bind), and each run's
    collapse; the held-out accuracy (`evals`, each run's evaluation rows); the curves; the clip fraction and KL by
    mini-batch; their mass reallocation by π_old (Training lab and Runs page alike). Returns whether there was
    anything to draw. `make_it_bind`: (button label, callback) that changes the page's settings so the clip binds."""
    runs, evals = run_views.in_colour_order(runs, evals)
    if run_views.nothing_clipped(runs):
        st.info(f"No token was clipped in the last {run_views.BINDING_WINDOW} steps of any of these runs, so at these "
                "settings every clip test makes exactly the same update as no clip at all: their curves can differ "
                f"only by chance. {binding_hint}", icon=":material/info:")
        if make_it_bind is not None:
            st.button(make_it_bind[0], on_click=make_it_bind[1], icon=":material/tune:", key=key(page, "make_it_bind"))
    for label, rows in runs:
        step = run_views.collapse_step(rows) if rows else None
        if step is not None:
            st.warning(literal(f"{label} collapsed at step {step}: {stability.RULE} (engine/stability.py)."),
                       icon=":material/trending_down:")
    held_out = run_views.held_out_chart([(label, rows, e) for (label, rows), e in zip(runs, evals or [[]] * len(runs))])
    if held_out is not None:
        show_chart(held_out, f"{page} held-out accuracy")
    smooth = st.slider("Smoothing: trailing mean over steps", 1, 20, 1, key=key(page, "smooth"))
    charts = run_views.training_charts(runs, smooth)
    for name, chart in charts.items():
        show_chart(chart, f"{page} {name}")
    by_minibatch = run_views.minibatch_profile(runs)
    if by_minibatch is not None:
        show_chart(by_minibatch, f"{page} by mini-batch")
    if charts:
        show_chart(run_views.mass_shift(runs), f"{page} mass reallocation")
    return bool(charts)
