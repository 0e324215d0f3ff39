"""Runs: every run in the runs folder — from the app or from `divviz train` — with its state; overlay,
inspect, export, delete."""

import pandas as pd
import streamlit as st

from divviz.app import room, run_ui, widgets

from divviz.runs import runner, store
from divviz.safetext import literal
from divviz.views import run_files, run_text, runs_table

st.title("Runs")
widgets.published_warnings()
root = store.runs_dir()
me = room.viewer()
st.write(f"Every run folder in {literal(str(root))} (set `DIVVIZ_RUNS_DIR` or `--runs-dir` to use another), "
         "including runs started with `divviz train` in a terminal, then the published runs: the claims grids "
         "divviz's own evidence was trained on (read-only, their owner says *published* and their grid; a run of "
         "yours of the same cell is listed as yours). Running ones update live. " + room.ownership_text(me))


@st.fragment(run_every=2.0)
def overview() -> None:
    """The table of runs, every 2 s: each run's status and last row only, a page of them at a time."""
    with widgets.shown_errors():
        runs = run_files.every_run(root)
        if not runs:
            st.info("No runs yet. Start one in the Training lab, or run `divviz train` in a terminal.")
        else:
            query = st.text_input("Filter runs", key="runs:filter", placeholder="part of an objective, task, model, state, "
                                  "seed, folder name or source (imported, UNIPO, TRL, verl)",
                                  help="filters this table; the runs overlaid below stay as chosen there (type in "
                                       "that box to find a run)")
            matching = runs_table.matching(runs, query)
            pages = max(1, -(-len(matching) // runs_table.PAGE_SIZE))
            if st.session_state.get("runs:page", 1) > pages:  # a narrower filter: its last page
                st.session_state["runs:page"] = pages
            page = st.number_input(f"Page (of {pages})", 1, pages, 1, key="runs:page") if pages > 1 else 1
            shown = matching[(page - 1) * runs_table.PAGE_SIZE:page * runs_table.PAGE_SIZE]
            st.caption(f"{len(matching)} of {len(runs)} runs" + (f", {len(shown)} on this page" if pages > 1 else ""))
            widgets.show_table(pd.DataFrame(runs_table.overview_rows(shown, me)), width="stretch", column_config={
                "objective": st.column_config.TextColumn(width=250),  # whole: its parameters tell the runs apart
                "claims measure": st.column_config.TextColumn(width=330)})
        if st.session_state.get("runs:seen", ()) != runs_table.seen(runs):
            st.rerun()  # a run came, went, started or ended: the page's list and live charts follow


def charts(names: list[str], group: bool) -> None:
    """The chosen runs' curves (read incrementally: only what was appended since); a fragment that refreshes every
    2 s while one of them trains, and rests otherwise."""
    with widgets.shown_errors():
        every = {run.name: run.folder for run in run_files.every_run(root)}
        picked = [store.read_run(every[name]) for name in names if name in every]
        data = [(f"{run_text.task_label(run.config)} · {run_text.run_label(run)}" if group else
                 run_text.run_label(run, unique=True), store.read_metrics(run.folder)) for run in picked]
        if any(rows for _, rows in data):
            st.download_button("Metrics of these runs (CSV)", lambda: run_files.metrics_csv(picked),
                               icon=":material/table:", file_name="divviz_metrics.csv", mime="text/csv",
                               key="runs:csv", on_click="ignore", help="every step of every chosen run, made when "
                                                                       "you click")
        run_ui.show_training_charts("runs", data, [store.read_evals(run.folder) for run in picked],
                                "Training with mini-batches (K ≥ 2), a larger μ or learning rate makes it bind.")
        for run in picked:
            with st.expander(f"{literal(run.name)}: config and status"):
                st.json({"config": run.config, "status": run.status})


with widgets.shown_errors():
    runs = run_files.every_run(root)
    st.session_state["runs:seen"] = runs_table.seen(runs)  # before the table: it compares against this
    overview()
    if runs:
        names = {run.name: run for run in runs}
        left, right = st.columns([4, 1])
        with_data = [name for name in names if names[name].step > 0]  # a run that never trained a step draws no line
        chosen = left.multiselect("Runs to overlay", list(names), default=with_data[:2], key="runs:chosen",
                                  format_func=lambda name: run_text.run_choice(names[name]),
                                  help="type part of an objective, a task or a seed to filter; runs with no step yet "
                                       "draw nothing")
        group = right.toggle("Group by objective", key="runs:group",
                             help="runs of the same objective and task (e.g. several seeds) drawn thinly, under their "
                                  "mean and its 95% band")
        live = any(names[name].state in runs_table.ACTIVE for name in chosen)
        st.fragment(charts, run_every=2.0 if live else None)(chosen, group)

st.subheader("Stop or delete a run")
with widgets.shown_errors():
    runs = [run for run in store.list_runs(root) if me.can_manage(run.status)]
    st.caption(("The teacher's browser manages every run." if room.room_mode() else
                "This app is served to this machine only, so you manage every run.") if me.teacher else
               "Runs this browser started. (The teacher opens the app once with ?teacher=KEY to manage all.)")
    name = st.selectbox("Run", [r.name for r in runs], index=None, key="runs:delete", placeholder="choose a run")
    if name:
        run = store.read_run(root / name)
        if run.state in ("queued", "running"):
            if st.button("Stop", icon=":material/stop:", key="runs:stop_button"):
                st.info(f"{literal(name)}: {runner.stop_run(root / name, me)}.")
        elif st.checkbox(f"Yes, delete {literal(name)} and all its files", key="runs:confirm"):
            if st.button("Delete", type="primary", icon=":material/delete:", key="runs:delete_button"):
                runner.delete_run(root / name, me)
                st.success(f"Deleted {literal(name)}.")
