"""Training lab: start, watch and stop short GRPO runs, one per chosen objective, on the same seed."""

import time

import streamlit as st

from divviz.app import objective_sidebar, page_state, room, run_ui, widgets

from divviz.app.urlstate import Control
from divviz.catalogue.params import DivvizInputError, Param
from divviz.engine.config import BACKENDS, REWARD_SOURCES, ROLLOUT_LAG, RUN_PARAMS, RunConfig
from divviz.engine.models import MODELS, SMOLLM2_SETTINGS, model_settings
from divviz.engine.policy import DTYPES
from divviz.engine.tasks import TASKS
from divviz.runs import runner, store
from divviz.safetext import literal
from divviz.views import run_text, run_views, token_view

PAGE = "lab"
INTRO = (f"Train the built-in model (or your own) with GRPO, one run per chosen clip test or surrogate and seed, and "
         f"watch them side by side: with several seeds per objective, each run is drawn thinly under the mean and its "
         f"95% band, so a difference between objectives can be told from a difference between seeds. Runs train in their "
         f"own processes, a few at a time on this machine: the others wait in a queue and the page stays responsive. "
         f"Stop takes a queued run off the queue at once; a training one ends within seconds (it finishes the forward "
         f"pass it is in, and is killed after {runner.STOP_GRACE_S:.0f} s if it has not), and its state then reads "
         f"*stopped*. Closing or reloading the tab does not end a run (this browser finds its runs again).")
OTHER_MODEL = "a folder or hub id"
SETTINGS = [p for p in RUN_PARAMS if p.name not in ("format_reward", "max_grad_norm", "rollout_lag")]
SEEDS = Param("seeds", 1, 1, 8, high_open=False, kind="int", typical=(1, 8, 1),
              doc="runs per objective with seeds seed, seed + 1, …; the charts show each thinly and their mean with a "
                  "95% band. They queue with everyone's runs, within this machine's limit")
CONTROLS = [
    *objective_sidebar.objective_controls(["ratio", "kl3"], beta=0.04),
    objective_sidebar.SCALE_REWARDS_CONTROL, objective_sidebar.BASELINE_CONTROL, *objective_sidebar.rollout_controls(ROLLOUT_LAG),
    Control("model", "builtin", options=(*MODELS, OTHER_MODEL)),
    Control("task", "reverse", options=tuple(TASKS)),
    Control("reward", "task", options=REWARD_SOURCES),
    Control("backend", "divviz", options=BACKENDS),
    Control("setting", "learn", options=tuple(SMOLLM2_SETTINGS)),
    Control("device", "auto", options=("auto", "cpu", "cuda")),
    Control("dtype", "auto", options=DTYPES),
    Control("seeds", SEEDS.default, param=SEEDS),
    Control("step", 0, param=Param("step", 0, 0, 100_000, kind="int", typical=(0, 100_000, 1),
                                   doc="the token scatter's step (0: the latest)")),
    *[Control(p.name, p.default, param=p) for p in SETTINGS],
]
BINDING_HINT = ("To make the constraint bind, train each batch in mini-batches (K ≥ 2: every mini-batch after the "
                "first is off-policy), raise μ or the learning rate; SmolLM2's *learn* setting does (K = 4).")

BY_NAME = widgets.page_top(PAGE, CONTROLS, "Training lab", INTRO)
root = store.runs_dir()
me = room.viewer()
st.caption(room.ownership_text(me))
st.session_state.setdefault("lab_runs", [])  # kept even when the runs folder below cannot be read
with widgets.shown_errors():  # this tab's runs, and any this browser still has queued or running (after a reload); outside
    # room mode, a tab with none shows every queued or running run: the app's one user manages them all
    st.session_state["lab_runs"] = runner.lab_runs(root, st.session_state.get("lab_runs", []), me.who,
                                                   everyone=not room.room_mode())
    runner.ensure_pool(root)  # warm: a pool that has imported torch starts a run in well under a second


def start(configs: list[RunConfig], kind: str = "") -> None:
    try:
        st.session_state["lab_runs"] = [folder.name for folder in runner.start_runs(configs, root, me, kind)]
    except DivvizInputError as err:  # e.g. a runs folder that cannot be written, or a student's share of the queue
        st.session_state["lab_error"] = str(err)


def stop() -> None:
    for name in st.session_state["lab_runs"]:
        if (root / name).is_dir():
            runner.stop_run(root / name, me)


objectives, refused, configs = [], [], []  # stay empty if a setting is refused below
with widgets.shown_errors():
    with st.sidebar:
        st.subheader("Objectives")
        objectives, refused = objective_sidebar.objective_widgets(PAGE, BY_NAME)
        seeds = widgets.number(PAGE, BY_NAME["seeds"], "Seeds per objective")  # near them: the first choice made
        st.subheader("Run")
        model = widgets.choice(PAGE, BY_NAME["model"], "Model", on_change=page_state.apply_model_settings, args=(PAGE, BY_NAME),
                          help="the tiny built-in model, SmolLM2-135M-Instruct (a real chat model; choosing it sets "
                               "its own task, learning rate, temperature and batch), or your own")
        if model == OTHER_MODEL:
            model = st.text_input("Folder or hub id", "", key="lab:model_path",
                                  help="a local folder with a causal LM, or a hub id (needs the network)")
        elif model_settings(model):
            widgets.choice(PAGE, BY_NAME["setting"], "Setting", on_change=page_state.apply_model_settings, args=(PAGE, BY_NAME),
                      help="learn: held-out accuracy rises within about 15 minutes here and the clip binds on the "
                           "off-policy mini-batches; look only: a short step where nothing clips; stress: four times "
                           "the learning rate, where an objective may collapse (docs/learning.md)")
        task = widgets.choice(PAGE, BY_NAME["task"], "Task")
        reward = widgets.choice(PAGE, BY_NAME["reward"], "Reward", labels={
            "task": "the task's checker", "random": "random: a fair coin per completion (the random-reward control)"},
            help="random rewards teach nothing, so what the entropy does then is the constraint's own doing "
                 "(Park et al. 2025, arXiv 2509.26114)")
        advantages = objective_sidebar.advantage_widgets(PAGE, BY_NAME)
        backend = widgets.choice(PAGE, BY_NAME["backend"], "Backend",
                            help="divviz: its own GRPO engine; TRL: TRL's GRPOTrainer with the same objective "
                                 "(DivvizGRPOTrainer), as you would run it at scale",
                            labels={"divviz": "divviz's engine", "trl": "TRL (DivvizGRPOTrainer)"})
        device = widgets.choice(PAGE, BY_NAME["device"], "Device")
        dtype = widgets.choice(PAGE, BY_NAME["dtype"], "Precision",
                          help="auto: bfloat16 forward passes on a GPU, or on a CPU with AVX512-BF16 or AMX for a real "
                               "model (about twice as fast), else float32; log-softmax and the loss stay float32")
        settings = {p.name: widgets.number(PAGE, BY_NAME[p.name], p.name) for p in SETTINGS}
        with st.expander("Rollout: a sampler unlike the policy, and verl's corrections"):
            st.caption("Sample with a copy of the policy in lower precision or some updates behind, as an inference "
                       "engine beside the trainer does, and compare verl's corrections of it (one run each).")
            sampler, corrections = objective_sidebar.rollout_widgets(
                PAGE, BY_NAME, "a copy of the policy cast whole, as vLLM holds it (same: the trained policy samples "
                               "itself)", "Sampler lag (updates behind)")
    page_state.publish_controls(PAGE, CONTROLS)
    configs = [RunConfig.make(task=task, reward=reward, backend=backend, model=model.strip(), device=device, dtype=dtype,
                              **advantages,
                              objective=o, **sampler, **correction,
                              **{**settings, "seed": settings["seed"] + s})
               for o in objectives for correction in corrections for s in range(seeds)]

runs = [store.read_run(root / name) for name in st.session_state["lab_runs"] if (root / name).is_dir()]
running = any(run.state in ("queued", "running") for run in runs)
if configs:
    with widgets.shown_errors():
        run_ui.expected_step_time(root, configs, on_measure=lambda cfg: start([cfg], runner.TIMING))
left, right, _ = st.columns([1, 1, 4])
left.button("Start", type="primary", icon=":material/play_arrow:", disabled=running or not configs,
            on_click=start, args=(configs,), width="stretch")
right.button("Stop", icon=":material/stop:", disabled=not running, on_click=stop, width="stretch")
for message in refused:
    st.warning(f"Not started: {literal(message)}", icon=":material/warning:")
if "lab_error" in st.session_state:
    st.error(literal(st.session_state.pop("lab_error")), icon=":material/error:")


def binding_minibatches() -> int:
    return run_views.binding_minibatches(st.session_state["lab:prompts"] * st.session_state["lab:group_size"])


def make_it_bind() -> None:
    """The notice's button: K mini-batches per pass (every one after the first off-policy), for the next Start."""
    st.session_state["lab:minibatches"] = binding_minibatches()


@st.fragment(run_every=2.0 if running else None)
def live() -> None:
    with widgets.shown_errors():
        draw_runs()


def draw_runs() -> None:
    runs = [store.read_run(root / name) for name in st.session_state["lab_runs"] if (root / name).is_dir()]
    if not runs:
        st.caption("No run queued or running: choose objectives and press Start. Finished runs are on the Runs page.")
        st.page_link("app_pages/runs.py", label="Runs", icon=":material/folder_open:")
        return
    data = []
    for run in runs:
        rows = store.read_metrics(run.folder)
        label = run_text.run_label(run)
        data.append((label, rows, run))
        label = f"{label} · seed {run.config.get('seed')}"
        st.progress(min(1.0, run.step / max(run.steps, 1)), text=run_text.progress_text(run, rows, time.time()))
        if run.state in ("failed", "interrupted"):
            st.error(literal(f"{label}: {run.message}"), icon=":material/error:")
    if any(run.state in ("queued", "running") for run in runs):
        st.caption("These runs go on training if the app is closed: the pool that trains them leaves only once its "
                   "queue is empty. Stop ends a run here, at once.")
    run_ui.one_seed_notice([label for label, _, _ in data])
    if run_ui.show_training_charts(PAGE, [(label, rows) for label, rows, _ in data],
                               [store.read_evals(run.folder) for _, _, run in data], BINDING_HINT,
                               (f"Train in {binding_minibatches()} mini-batches", make_it_bind)):
        last_step = max(len(rows) for _, rows, _ in data)
        chosen = st.session_state.get("lab:step") or last_step  # 0 (a link's default): the latest step
        st.session_state["lab:step"] = min(max(chosen, 1), max(last_step, 2))
        step = st.slider("Step for the token scatter", 1, max(last_step, 2), key="lab:step", disabled=last_step < 2)
        page_state.publish_controls(PAGE, CONTROLS)  # this fragment reruns alone: the link follows the slider
        scattered = [(label, f"{label} · seed {run.config.get('seed')}", run.config,
                      store.read_tokens(run.folder, min(step, len(rows)))) for label, rows, run in data if rows]
        widgets.show_chart(run_views.token_scatter([s for s in scattered if s[3] is not None]), "token scatter")
    if any(run.state == "queued" for run in runs):
        runner.ensure_pool(root)  # a queue is served even if its pool ended (or a start raced a pool leaving)
    if running and not any(run.state in ("queued", "running") for run in runs):
        st.rerun(scope="app")  # every run has ended: redraw the page once, buttons enabled, polling off


live()


st.subheader("Same-batch comparison")
st.write("Apply each chosen objective to the *same* rollouts from the *same* starting weights, and see how differently "
         "they move the policy: which tokens they clip, how far probabilities move, where the mass goes, and what "
         "happens to the entropy. Uses the μ and learning rate set in the sidebar; start from the model itself or "
         "from a run's saved weights (every `checkpoint_every` steps). With corrections to compare, each is applied "
         "to the same batch, drawn by the starting weights in the sampler's precision (a lag has no history here).")
with widgets.shown_errors():
    starts = {"the start model": None}
    for name in st.session_state["lab_runs"]:
        run = store.read_run(root / name)
        for k in store.checkpoint_steps(run.folder):
            starts[f"{run_text.run_label(run)} after step {k}"] = store.checkpoint_path(run.folder, k)
    left, right = st.columns(2)
    start_from = left.selectbox("Starting weights", list(starts), key="lab:compare_from")
    batch_step = right.number_input("Batch of step", 1, 100_000, 1, key="lab:compare_step",
                                    help="the prompts and sampling seed of this step of a run with these settings")
    first_seed = [cfg for cfg in configs if cfg.seed == configs[0].seed]  # one update per measure and correction
    asked = (tuple(repr(cfg) for cfg in first_seed), int(batch_step), start_from)  # what a result was made for
    if st.button("Compare on the same batch", icon=":material/compare_arrows:", disabled=not configs,
                 key="lab:compare"):
        bar = st.progress(0.0, text=f"Sampling once, then one update for each of {len(first_seed)} objectives…")
        shown = lambda done, total, text: bar.progress(done / total, text=f"{done} of {total}: {text}")  # noqa: E731
        st.session_state["lab_compare"] = (asked, run_views.same_batch(first_seed, int(batch_step) - 1,
                                                                       starts[start_from], progress=shown))
        bar.empty()
    if "lab_compare" in st.session_state:
        made_for, (table, charts, records) = st.session_state["lab_compare"]
        if made_for != asked:
            st.warning("These results are for the settings of the last comparison, not the ones now in the sidebar "
                       "(objectives, settings, batch or starting weights changed): press *Compare on the same batch* "
                       "to redo it.", icon=":material/history:")
        widgets.show_table(table, width="stretch")
        left, right = st.columns(2)
        with left:
            widgets.show_chart(charts["mass"], "same batch mass reallocation")
        with right:
            widgets.show_chart(charts["shift"], "same batch probability shift")
        st.markdown("**The same completions under each objective**: which tokens each one masks, and how far it "
                    "moved them (hover a token for its facts).")
        left, right = st.columns(2)
        colour_by = left.selectbox("Colour tokens by", list(token_view.COLOUR_BY), key="lab:compare_colour")
        first = records[0][1]
        choices = token_view.completions_of(first)
        g, c = right.selectbox("Completion", choices, key="lab:compare_completion",
                               format_func=lambda gc: token_view.completion_label(first, *gc)) \
            if choices else (None, None)
        if g is not None:
            st.caption(token_view.completion_caption(first, g, c))
            scale = max(token_view.scale_of(record, colour_by) for _, record in records)  # one scale for all
            st.html(token_view.STYLE + token_view.legend_html(colour_by, scale))
            for column, (label, record) in zip(st.columns(len(records)), records):
                tokens = token_view.completion(record, g, c)["tokens"]
                with column:
                    st.markdown(f"**{literal(label)}**")
                    st.html(token_view.completion_html(tokens, token_view.colours(tokens, colour_by, scale)))
                    st.caption(token_view.state_counts(tokens))
