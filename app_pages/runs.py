"""Runs: every run in the runs folder — from the app or from `divviz train` — with its state; overlay,
inspect, export, delete."""

import pandas as pd
import streamlit as st

from divviz import ui, views
from divviz.engine import store

st.title("Runs")
root = store.runs_dir()
st.write(f"Every run folder in `{root}` (set `DIVVIZ_RUNS_DIR` or `--runs-dir` to use another), including runs "
         "started with `divviz train` in a terminal. Running ones update live.")


@st.fragment(run_every=2.0)
def overview() -> None:
    with ui.shown_errors():
        draw_overview()


def draw_overview() -> None:
    runs = store.list_runs(root)
    if not runs:
        st.info("No runs yet. Start one in the Training lab, or run `divviz train` in a terminal.")
        return
    metrics = {run.name: store.read_metrics(run.folder) for run in runs}
    table = []
    for run in runs:
        last = (metrics[run.name] or [{}])[-1]
        table.append({"run": run.name, "state": run.state, "step": f"{run.step}/{run.steps}",
                      "task": run.config.get("task", ""), "objective": views.run_label(run),
                      "reward": last.get("reward"), "accuracy": last.get("accuracy"),
                      "entropy": last.get("entropy"), "message": run.message})
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")
    names = [run.name for run in runs]
    chosen = st.multiselect("Runs to overlay", names, default=names[:2], key="runs:chosen")
    picked = [run for run in runs if run.name in chosen]
    data = [(views.run_label(run, unique=True), metrics[run.name]) for run in picked]
    if any(rows for _, rows in data):
        export = pd.concat([pd.DataFrame(metrics[run.name]).assign(run=run.name) for run in picked])
        st.download_button("Metrics of these runs (CSV)", export.to_csv(index=False), file_name="divviz_metrics.csv",
                           mime="text/csv", icon=":material/table:", key="runs:csv", on_click="ignore")
    ui.show_training_charts("runs", data)
    for run in picked:
        with st.expander(f"{run.name}: config and status"):
            st.json({"config": run.config, "status": run.status})


overview()

st.subheader("Delete a run")
runs = store.list_runs(root)
with ui.shown_errors():
    name = st.selectbox("Run", [r.name for r in runs], index=None, key="runs:delete", placeholder="choose a run")
    if name:
        run = store.read_run(root / name)
        if run.state == "running":
            st.warning("This run is still running: stop it first (Training lab, or Ctrl-C in its terminal).")
        elif st.checkbox(f"Yes, delete {name} and all its files", key="runs:confirm"):
            if st.button("Delete", type="primary", icon=":material/delete:", key="runs:delete_button"):
                store.delete_run(root / name)
                st.success(f"Deleted {name}.")
