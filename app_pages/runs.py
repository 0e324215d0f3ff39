"""Runs: every run in the runs folder — from the app or from `divviz train` — with its state; overlay,
inspect, export, delete."""

import pandas as pd
import streamlit as st

from divviz.app import ui

from divviz.views import run_views
from divviz.engine import runner, store
from divviz.safetext import literal

st.title("Runs")
root = store.runs_dir()
st.write(f"Every run folder in {literal(str(root))} (set `DIVVIZ_RUNS_DIR` or `--runs-dir` to use another), "
         "including runs started with `divviz train` in a terminal. Running ones update live. Everyone sees every "
         "run; only the browser that started a run (or the teacher) can stop or delete it.")
me = ui.viewer()


@st.fragment(run_every=2.0)
def overview() -> None:
    with ui.shown_errors():
        draw_overview()


def draw_overview() -> None:
    runs = store.list_runs(root)
    if not runs:
        st.info("No runs yet. Start one in the Training lab, or run `divviz train` in a terminal.")
        return
    table = []
    for run in runs:
        last = store.last_metrics(run.folder)  # the table needs each run's latest row, not its history
        table.append({"run": run.name, "state": run.state, "step": f"{run.step}/{run.steps}",
                      "owner": run_views.owner_label(run.status, me), "model": run.config.get("model", ""),
                      "task": run.config.get("task", ""), "objective": run_views.run_label(run),
                      "seed": run.config.get("seed"), "reward": last.get("reward", float("nan")),
                      "accuracy": last.get("accuracy", float("nan")), "entropy": last.get("entropy", float("nan")),
                      "message": run.message or ""})
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    names = {run.name: run for run in runs}
    left, right = st.columns([4, 1])
    with_data = [name for name in names if names[name].step > 0]  # a run that never trained a step draws no line
    chosen = left.multiselect("Runs to overlay", list(names), default=with_data[:2], key="runs:chosen",
                              format_func=lambda name: run_views.run_choice(names[name]),
                              help="type part of a measure, a task or a seed to filter; runs with no step yet draw "
                                   "nothing")
    group = right.toggle("Group by measure", key="runs:group",
                         help="runs of the same measure and task (e.g. several seeds) drawn thinly, under their mean "
                              "and its 95% band")
    picked = [run for run in runs if run.name in chosen]
    metrics = {run.name: store.read_metrics(run.folder) for run in picked}  # read once, then only what was appended
    data = [(f"{run.config.get('task', '')} · {run_views.run_label(run)}" if group else run_views.run_label(run, unique=True),
             metrics[run.name]) for run in picked]
    if any(rows for _, rows in data):
        st.download_button("Metrics of these runs (CSV)", lambda: run_views.metrics_csv(picked), icon=":material/table:",
                           file_name="divviz_metrics.csv", mime="text/csv", key="runs:csv", on_click="ignore",
                           help="every step of every chosen run, made when you click")
    ui.show_training_charts("runs", data)
    for run in picked:
        with st.expander(f"{literal(run.name)}: config and status"):
            st.json({"config": run.config, "status": run.status})


overview()

st.subheader("Stop or delete a run")
with ui.shown_errors():
    runs = [run for run in store.list_runs(root) if me.can_manage(run.status)]
    st.caption(("The teacher's browser manages every run." if ui.room_mode() else
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
