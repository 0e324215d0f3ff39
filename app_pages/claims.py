"""Claims: the seed papers' claims that divviz can test, on a fixed grid, each cell with a computed verdict."""

import json

import pandas as pd
import streamlit as st

from divviz.app import page_state, room, widgets

from divviz.app.urlstate import Control
from divviz.catalogue.params import DivvizInputError
from divviz.engine import stability
from divviz.engine.models import MODELS, evaluated_settings
from divviz.engine.policy import pick_device
from divviz.evidence import (claims, claims_export, claims_lm, claims_real, claims_report, dose_search, forest,
                             lm_evidence)
from divviz.evidence.claims_lm import DEVICE_KINDS
from divviz.runs import published, store
from divviz.safetext import literal
from divviz.views import claims_tables, dose_plots, run_plots, run_text


def report(seeds: int) -> claims_report.Report:
    """The claims report at `seeds` seeds, built once per published grid file (`claims_report.build`), with a bar
    while it is built."""
    bar = st.empty()
    try:
        return claims_report.build(seeds, progress=lambda fraction, text: bar.progress(fraction, text=literal(text)))
    finally:
        bar.empty()


def queue_lm_runs(plan: claims_lm.LMPlan, owner: str) -> None:
    try:
        plan.queue_missing(owner)
    except DivvizInputError as err:  # e.g. a runs folder that cannot be written
        st.session_state["claims_error"] = str(err)


PAGE = "claims"
SMOLLM2 = claims_lm.OPENING_MODEL
OPENING = claims_lm.opening_setting(evaluated_settings(SMOLLM2))  # as `divviz claims --lm` does
HERE = pick_device().type  # where the runs queued from this page train
CONTROLS = [Control("seeds", claims_report.opening_seeds(), param=claims.SEEDS_PARAM),
            Control("lm_model", SMOLLM2, options=tuple(MODELS)),
            Control("lm_setting", OPENING, options=(*dict.fromkeys(s for m in MODELS for s in evaluated_settings(m)),
                                                    "the lab's defaults")),
            Control("lm_device", HERE, options=tuple(DEVICE_KINDS)),
            Control("lm_seeds", claims_lm.declared_seeds(SMOLLM2, OPENING, HERE)[0], param=claims_lm.SEEDS_PARAM),
            Control("lm_pilot_extra", claims_lm.declared_seeds(SMOLLM2, OPENING, HERE)[1],
                    param=claims_lm.PILOT_EXTRA_PARAM),
            Control("lm_steps", claims_lm.STEPS_PARAM.default, param=claims_lm.STEPS_PARAM),
            Control("claim", claims.CLAIMS[0].key, options=tuple(c.key for c in claims.CLAIMS))]


def declared_design() -> None:
    """A Model, Setting or Device change: the seeds of the grid declared there (SmolLM2's published grids), else
    the built-in LM's default."""
    seeds, extra = claims_lm.declared_seeds(st.session_state["claims:lm_model"],
                                            st.session_state.get("claims:lm_setting", ""),
                                            st.session_state.get("claims:lm_device", HERE))
    st.session_state[page_state.key(PAGE, "lm_seeds")], st.session_state[page_state.key(PAGE, "lm_pilot_extra")] = seeds, extra


CELL_COLUMNS = {claims_report.HEADERS["verdict"]: st.column_config.TextColumn(width=100),  # "not resolved" in full
                claims_report.HEADERS["verdict_adjusted"]: st.column_config.TextColumn(width=100),
                claims_report.HEADERS["largest"]: st.column_config.NumberColumn(format="%.1e"),  # 1.0e-18, not 0.000…01
                claims_report.HEADERS["rules_out"]: st.column_config.TextColumn(width="large")}  # its bound in full

st.title("Claims")
widgets.published_warnings()
st.write("What the three seed papers claim and divviz can test, tested on a grid of conditions declared before "
         "running: on an exact bandit (where the correct actions sit, small and large K, SGD and Adam, an early and a "
         "late reading) and over training on a language model — on a fresh clone, SmolLM2-135M's published runs. "
         "Each cell compares two objectives seed by seed on the same seeds. A verdict needs two tests to agree: the "
         "95% t interval of the mean difference excludes 0, and the sign-flip permutation test of the mean (no "
         "normality assumed) gives p < 0.05 — *holds* on the predicted side, *reversed* on the other, else *not "
         "resolved*. At n seeds that p cannot go below 2/2ⁿ: at 4 seeds (0.125) nothing can hold. Where the mean and "
         "the median difference point opposite ways and one of them is resolved on its own (the t interval or the "
         "sign test) the cell says *mean and median disagree*; *identical*: every "
         "seed's difference is exactly 0; identities are *exact* below 1e-12; *no data*: no seed has both runs yet. "
         "Each cell is then adjusted for how many were tested: Holm within a claim's primary readings at one "
         "setting — those its words name (accuracy sampled at the end, the collapse flag, a late window, one "
         "update), of its own objectives; the rest are *descriptive*, shown raw and not counted. The counts and "
         "colours use this adjusted verdict, the raw one beside it; Benjamini–Hochberg's q is computed over the primary "
         "readings of each section (the bandit, the built-in LM, SmolLM2). Beyond 16 seeds the sign-flip p is "
         "drawn from random flips, more of them wherever a verdict could change with the draw. Over training, "
         "accuracy cells also give the seeds 80% power needs and whether the effect the "
         "papers report is ruled out (both tests, one-sided, at that margin: not below 5 seeds). Nothing here is "
         "typed by hand: `divviz claims` prints the same report. The verdicts come first; the "
         "[language-model sections](#on-a-language-model-over-training) under them choose "
         "the model, its setting and seeds.")
first_visit = not page_state.visited(PAGE)
page_state.bind_controls(PAGE, CONTROLS)
if first_visit and not {"lm_seeds", "lm_pilot_extra"} & set(st.query_params.to_dict()):
    declared_design()  # a link naming a setting, not its seeds: that setting's declared grid
low, high, _ = claims.SEEDS_PARAM.slider_range()
seeds = st.slider("Seeds per measure (bandit grid)", int(low), int(high), key="claims:seeds",
                  help=claims.SEEDS_PARAM.doc)
result = report(seeds)
st.caption(literal(f"The bandit's cells at {seeds} seeds: {result.bandit}" +
                   (". Any other seed count is computed here." if result.bandit != claims_report.COMPUTED_HERE
                    else " (once per server).")))
verdicts = st.container()  # shown first; the model sections below add their cells before it is filled

st.subheader("On a language model, over training")
st.write("Several of the claims are also tested by training a language model — the built-in one, or SmolLM2-135M at "
         "its *learn* setting (it learns in a run of 30 steps and its clip binds) or its *stress* setting (four "
         "times the learning rate, where an objective may collapse): PPO, KL3 at two δ, the two one-edge boxes of "
         "δ = 0.05, DAPO, PPO + ProbL2, and a tighter lower clip with random rewards, several seeds each, on the same "
         "seeds (the same prompts at every step). Final performance is the held-out accuracy; stability the collapse "
         "flag, the largest update KL and clip fraction. The built-in LM's runs, SmolLM2's at both settings on a CPU "
         "and its stress pair on a GPU (*Trained on*: a grid of its own) are published with divviz (`published/`): a "
         "fresh clone reads them, and says so below. Runs you train queue "
         "with everyone's in the runs folder (they show on the Runs page), a finished run is kept, and a stopped one "
         "resumes from its last resume state: the next time, this page reads them instead of training them again. "
         "Cells show as soon as both runs of a pair are done; n says how many seeds each has.")
lm_plan = None
with widgets.shown_errors():
    model_column, setting_column, device_column, left, pilot_column, right = st.columns(6)
    lm_model = model_column.selectbox("Model", list(MODELS), key="claims:lm_model", on_change=declared_design,
                                      help="the built-in LM (reverse, 60 steps: about 5 minutes for every cell on 2 "
                                           "cores) or SmolLM2-135M-Instruct (its own task, held-out set and settings: "
                                           "13 minutes for a run alone on 2 cores, 15–35 with two side by side, so a "
                                           "grid takes hours)")
    settings = list(evaluated_settings(lm_model))  # the settings the claims can be tested at
    lm_setting = setting_column.selectbox("Setting", settings or ["the lab's defaults"], key="claims:lm_setting",
                                          disabled=not settings, on_change=declared_design,
                                          help="SmolLM2's settings (`divviz models`); the built-in LM trains at the "
                                               "lab's defaults. Choosing one sets the seeds of the grid declared there.")
    lm_setting = lm_setting if settings else ""
    lm_device = device_column.selectbox("Trained on", list(DEVICE_KINDS), format_func=DEVICE_KINDS.get,
                                        key="claims:lm_device", on_change=declared_design,
                                        help="the kind of device whose runs hold the cells: a GPU's bf16 rounds "
                                             "otherwise than a CPU's, so their runs are two grids, never one. Runs "
                                             f"you train here train on {DEVICE_KINDS[HERE]}; the other kind's are "
                                             "read from published/ (SmolLM2's stress pair on an H200).")
    lm_seeds = left.slider("Seeds per LM objective", *map(int, claims_lm.SEEDS_PARAM.slider_range()[:2]),
                           key="claims:lm_seeds", help=claims_lm.SEEDS_PARAM.doc)
    lm_pilot_extra = pilot_column.number_input("Pilot pair's extra seeds", int(claims_lm.PILOT_EXTRA_PARAM.low),
                                               int(claims_lm.PILOT_EXTRA_PARAM.high), key="claims:lm_pilot_extra",
                                               help=claims_lm.PILOT_EXTRA_PARAM.doc)
    if settings:  # the setting brings its steps: shown, not chosen
        right.number_input("Steps per run", value=claims_lm.default_steps(lm_model, lm_setting), disabled=True,
                           key=f"claims:lm_steps_of:{lm_model}:{lm_setting}", help="the setting's own")
        lm_steps = None
    else:
        lm_steps = right.number_input("Steps per run", int(claims_lm.STEPS_PARAM.low),
                                      int(claims_lm.STEPS_PARAM.high), key="claims:lm_steps",
                                      help=claims_lm.STEPS_PARAM.doc)
    page_state.publish_controls(PAGE, CONTROLS)
    lm_plan = claims_lm.LMPlan.read(store.runs_dir(), lm_seeds, lm_steps, lm_model, lm_setting,
                                    lm_seeds + lm_pilot_extra, device=lm_device)
evidence = lm_evidence.LMEvidence(lm_plan) if lm_plan is not None else None  # read once for the cells and curves
if lm_plan is not None and lm_model != claims_lm.BUILTIN and (lm_setting, lm_device) not in claims_lm.DECLARED:
    st.caption(literal(f"No grid is declared for {lm_model} at {lm_setting} on {DEVICE_KINDS[lm_device]}, and none "
                       "is published: the seeds above are the defaults."))
if lm_plan is not None and lm_plan.done:
    result = evidence.report(result)
    if sentence := claims_export.plain_sentence(result):
        st.markdown(f"**{literal(sentence)}**")
if lm_plan is not None and lm_plan.provenance:
    st.info(literal(f"Published runs: {lm_plan.provenance}. They are read, never trained again; a run of your own "
                    "of a cell takes its place."), icon=":material/inventory_2:")
if lm_plan is not None and lm_plan.finished:
    st.success(literal(f"Included: {lm_plan.text}."), icon=":material/check:")
elif lm_plan is not None:
    me = room.viewer()  # in room mode, queueing a grid of runs is the teacher's call: it fills everyone's queue
    st.button(f"Train the {len(lm_plan.missing)} missing runs" if lm_plan.missing else "All runs are queued",
              icon=":material/play_arrow:", disabled=not lm_plan.missing or not me.teacher or lm_device != HERE,
              key="claims:lm_start", on_click=queue_lm_runs, args=(lm_plan, me.who),
              help=(f"Runs queued here train on {DEVICE_KINDS[HERE]}: choose it under Trained on to train these "
                    "cells."
                    if lm_device != HERE else None if me.teacher else
                    "In a workshop room only the teacher starts these runs (they would fill the room's queue); the "
                    "results show here once they are trained."))
    if lm_device != HERE:
        st.caption(literal(f"Runs queued here train on {DEVICE_KINDS[HERE]}, so they cannot fill these cells: the "
                           f"runs read here are those trained on {DEVICE_KINDS[lm_device]}."))
    if "claims_error" in st.session_state:
        st.error(literal(st.session_state.pop("claims_error")), icon=":material/error:")

    @st.fragment(run_every=2.0 if lm_plan.pending else None)
    def lm_progress() -> None:
        with widgets.shown_errors():
            fresh = st.session_state.pop("claims:plan_fresh", False)  # this run read the folder a moment ago
            plan = lm_plan if fresh else lm_plan.refreshed()
            left_s = plan.time_left()
            ahead = len(plan.ahead)
            if plan.pending:  # something trains or waits in the queue
                eta = ("" if left_s is None else f", about {run_text.duration(left_s)} left at the pace so far"
                       + (f", {ahead} other queued run{'s' if ahead != 1 else ''} included" if ahead else ""))
            else:  # nothing is training: what Train would cost, not a countdown
                eta = (f"; the other {len(plan.missing)} are not queued" + (
                    "" if left_s is None else f" (about {run_text.duration(left_s)} to train them here, at the pace "
                                              "of the runs so far)"))
            st.progress(plan.progress, text=literal(f"{plan.done} of {len(plan.runs)} runs finished{eta} "
                                                    f"({plan.text})"))
            if plan.done != lm_plan.done:
                st.rerun(scope="app")

    st.session_state["claims:plan_fresh"] = True  # a fragment rerun (every 2 s) reads the runs folder again
    lm_progress()
    if lm_plan.done:
        st.info(literal(f"Included so far: the cells of the {lm_plan.done} finished runs (each cell's n says how many "
                        "seeds it has)."), icon=":material/hourglass_top:")
for line in lm_plan.failed if lm_plan is not None else ():
    st.warning(literal(f"A run failed and drops out of its pairs: {line}"), icon=":material/warning:")
if lm_plan is not None and lm_plan.done:
    with widgets.shown_errors():
        st.caption("Learning curves: per objective, the mean over its finished seeds, with the band of their range "
                   "below 4 seeds, else the 95% interval; on the reward and the entropy (read at every step), a ✕ "
                   "on an objective's line marks a step where one of its seeds collapsed (the table below). The "
                   "task-reward runs only: the random-reward control's runs are read in their claims' cells.")
        collapses = evidence.collapses()
        widgets.show_chart(run_plots.learning_curves_chart(
            {metric: evidence.curves(metric) for metric in lm_evidence.CURVES}, f"Learning curves on {lm_plan.name}",
            {row["measure"]: row["steps"] for row in collapses}),
            f"learning curves {lm_plan.model} {lm_plan.setting}", key="claims:learning_curves")
        st.caption(f"Stability per objective (the task-reward runs): a run collapsed at {stability.RULE} "
                   "(`engine/stability.py`), or when it stopped on a non-finite value; the share with its Wilson 95% "
                   "interval; and the reward curve's spread over seeds, the standard deviation of each run's mean "
                   "reward with its 95% interval.")
        widgets.show_table(lm_evidence.collapse_table(collapses), width="stretch")
        pilot = evidence.pilot()
        if pilot is not None:
            st.caption(literal(lm_evidence.pilot_text(pilot)))

st.subheader("Where the constraint binds: the dose searches")
RULE = dose_search.RULE
st.write("PPO ε = 0.2 and KL3 δ = 0.05 act differently only on the tokens whose ratio falls between their two boxes: "
         "each verdict above says on what share of tokens its two objectives' clip states differed, and where that "
         "share is small no difference can show. Before an experiment is declared, a dose search trains the pair at "
         f"seed 0 on SmolLM2-135M's learn batch for {dose_search.STEPS} steps (the Model and Setting above do not "
         "apply here) at each point of a declared grid — μ, K, the learning rate and, in the second search, the "
         "sampling temperature — and reads each point by a rule fixed before its first run: **1** PPO clips at least "
         f"{RULE['ppo_clip']:.0%} of tokens over the run; **2** the two objectives' clip states differ on at least "
         f"{RULE['disagreement']:.0%} (the *disagreement*: each run's sampled tokens re-scored under the other's "
         "test, the pair's mean); **3** PPO's held-out accuracy ends above its start; **4** PPO collapses or its "
         f"entropy's last {RULE['entropy_window']} steps average below {RULE['entropy_fraction']:g} × its first "
         "step's. The experiment's setting is the cheapest point meeting all four; failing 4, the point meeting 1–3 "
         "with the largest disagreement (the stability claim then not testable); none meeting 1–3, no binding regime "
         "at this cost. Every reading below is computed again here from the runs' per-step data (`python "
         "scripts/dose_search.py --table` prints the same), and the Runs page lists the published runs.")
manifests = published.manifests()
choices = {}  # each search's choice as read here; a search not shown leaves the experiment's setting unsaid
for label, search in dose_search.SEARCHES.items():
    with widgets.shown_errors():
        try:
            found = dose_search.published_summary(search, published.root())
        except DivvizInputError as err:
            st.warning(literal(f"The {label} dose search is not shown: {err}"), icon=":material/report:")
            continue
        if found is None:
            choices[label] = None
            st.caption(literal(f"The {label} dose search: none of its {len(search.points)} points "
                               f"({', '.join(search.points)}) published yet. The experiment it may choose is "
                               f"pre-registered in {dose_search.PREREGISTRATION}."))
            continue
        found, where = dose_plots.read_again(found, search), dose_search.published_runs(search, manifests)
        choices[label] = dose_search.choose(found["points"], len(search.points))
        st.markdown(f"**The {label} search** — {literal(dose_plots.search_sentence(found, search, where))}")
        st.caption(literal(dose_plots.early_and_late_sentence(found)))
        widgets.show_table(dose_plots.dose_table(found, where), width="stretch")
        st.caption("rule 1 2 3 4: each condition above met (✓) or not (✗) at the point; PPO s/step is PPO's run's "
                   "median step time, the cost the rule compares is the pair's. A published grid holds one CPU's "
                   "runs with one set of versions: a point trained in another grid than most, or a pair across two, "
                   "starts from another step 0 (its held-out start and first entropy differ from the others').")
        widgets.show_chart(dose_plots.dose_chart(found, f"The {label} dose search over the run"),
                           f"{label} dose search")
if len(choices) == len(dose_search.SEARCHES):
    st.markdown(f"**The experiment's setting** ({dose_search.PREREGISTRATION}): "
                f"{literal(dose_search.experiment_setting(choices))}.")

st.subheader("On a real model, one update at a time")
st.write("SmolLM2-135M-Instruct cannot be trained for many steps on a CPU while you wait, but one update can: for "
         "each of N rollout batches, every objective takes its update from the same weights on the same completions, "
         "and what it did to the full distribution at each sampled position is read exactly — the entropy, the top-1 "
         "mass, the mass gained by argmax tokens, the covariance shares by clip state — then paired over the "
         "batches. The 16 batches divviz's own report reads are published with the repository; a batch computed "
         "here is cached and read first (`divviz claims --real` fills the same cache).")
with widgets.shown_errors():
    real_batches = st.slider("Batches", *map(int, claims_real.BATCHES_PARAM.slider_range()[:2]),
                             value=claims_real.BATCHES_PARAM.default, key="claims:real_batches",
                             help=claims_real.BATCHES_PARAM.doc)
    real_plan = claims_real.RealPlan(real_batches)
    if not real_plan.missing:
        result = real_plan.report(result)
        st.success(literal(f"Included: {real_plan.text}."), icon=":material/check:")
    else:
        done = len(real_plan.jobs) - len(real_plan.missing)
        st.caption(f"{done} of {len(real_plan.jobs)} batch results are here (published or cached); computing the "
                   f"rest takes about {len(real_plan.missing) * 30 // 60 + 1} min on 2 cores, in this page.")
        teacher = room.viewer().teacher  # in room mode, a quarter of an hour of the machine is the teacher's call
        if st.button(f"Compute the {len(real_plan.missing)} missing batches", icon=":material/play_arrow:",
                     key="claims:real_start", disabled=not teacher,
                     help=None if teacher else "In a workshop room only the teacher starts this."):
            bar = st.progress(0.0, text="SmolLM2, one update per batch…")
            real_plan.compute(lambda k, total, text: bar.progress(k / max(total, 1), text=literal(text)))
            st.rerun()

with verdicts:
    st.subheader("Every claim at a glance")
    st.caption("Per claim and per setting it is tested in (over training: the Model, Setting and Trained on chosen "
               "below, under the verdicts; one setting's verdicts are never added to another's): its cells, how many "
               "of them each verdict has after Holm's adjustment within the claim's primary readings at that "
               "setting (*descriptive*: the other readings; *raw holds or reversed*: before adjustment; *rules out "
               "the margin*: primary cells that rule out a gain of the margin they are sized for). Pick a claim in "
               "the select under the table for its cells by setting and compared objective, its forest plots and "
               "every cell — one claim at a time, so "
               "that a control change redraws one claim's plots, not every claim's. The counts are of "
               "cells, not of independent tests: a claim's cells share their runs (an early and a late reading, the "
               "greedy and the sampled accuracy, two δ of KL3 against one PPO), so several cells holding is not as "
               "many confirmations. A claim's source carries docs/theory.md's tag: [PAPER] read in the paper's own text, "
               "[3P] read only in a third-party summary, [INF] divviz's own derivation or reading.")
    st.table(claims_tables.overview(result), hide_index=True)  # static: every claim and setting in full
    texts = {c.key: c.text for c in result.claims}
    chosen = st.selectbox("Claim", list(texts), format_func=texts.get, key="claims:claim",
                          help="the claim whose tables and forest plots show below; it travels in the link")
    claim = next(c for c in result.claims if c.key == chosen)
    st.subheader(literal(claim.text))
    on_lm = f" · on a language model: {claim.lm_operational}" if result.lm and claim.lm_operational else ""
    st.caption(literal(f"{claim.source} · {claim.provenance} · measured as: {claim.operational}{on_lm}"))
    its_rows = [row for row in result.rows if row["claim_key"] == claim.key]
    if not its_rows:
        st.info("No cell of this claim yet" + (": it is tested over training on a language model, and its cells "
                                               "show once that model's runs are done (below)."
                                               if claim.lm_comparisons else "."), icon=":material/hourglass_top:")
    else:
        shared = claims_report.in_common(its_rows, ("setting", "candidate", "baseline", "metric", "predicted_sign"))
        if shared:
            st.caption(literal(f"In every cell of this claim: {claims_report.shared_text(shared)}"))
        meanings = claims_tables.metric_meanings(its_rows)
        if meanings:  # the metrics keep TRL's names in the tables; here is what each one is
            st.caption(meanings)
        widgets.show_table(claims_tables.claim_cells(result, claim, shared), width="stretch",
                           column_config=CELL_COLUMNS)  # up to 20 rows:
        # st.table renders each cell as Markdown, 0.1–0.2 s more per change in chromium (docs/benchmarks.md run 12)
        for _, metric, compared in forest.panels(result, [claim]):
            drawn, tall = forest.panel(claim, metric, compared)
            with st.container(height=min(440, tall + 24)):
                st.markdown(drawn, unsafe_allow_html=True)  # its text is escaped inside
        with st.expander("Every cell of this claim"):
            shown = pd.DataFrame(claims_report.cell_table(its_rows, shared))
            widgets.show_table(shown, width="stretch", column_config=CELL_COLUMNS)
    row = st.container(horizontal=True)
    row.download_button("Report (HTML)", lambda: claims_export.to_html(result), file_name="divviz_claims.html",
                        mime="text/html", icon=":material/download:", on_click="ignore", key="claims:html")
    row.download_button("Every cell (JSON)", lambda: json.dumps(claims_export.report_json(result), indent=1),
                        file_name="divviz_claims.json", mime="application/json", icon=":material/table:",
                        on_click="ignore", key="claims:json")

st.subheader("Not testable here")
for text in result.untested:
    st.markdown(f"- {literal(text)}")
