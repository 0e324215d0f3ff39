"""`divviz claims`: the seed papers' claims on their fixed grid, each cell with a computed verdict — the bandit's
here, the language models' from their runs (trained by the runs folder's pool, or on a Ray cluster with `--ray`, or
read from the published runs), SmolLM2 one update at a time with `--real`."""

from __future__ import annotations

import os
import sys
import time

from divviz.catalogue.params import DivvizInputError
from divviz.cli_output import print_json


def add_claims_parser(sub) -> None:
    from divviz.evidence.claims_lm import DEVICE_KINDS

    p = sub.add_parser("claims", help="test the seed papers' claims on a fixed grid, with computed verdicts")
    p.add_argument("--quick", action="store_true",
                   help="20 seeds computed here instead of the 64 whose cells are published (about 15 s on 2 cores)")
    p.add_argument("--seeds", default=None,
                   help="seeds per measure (2 to 256) instead of the default 64, whose bandit cells are published "
                        "and read; any other count is computed here")
    p.add_argument("--recompute", action="store_true",
                   help="compute the bandit grid here even at the 64 seeds whose cells are published (about 50 s)")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON: its scope (where each part's cells come from) and every cell: "
                        "claim, condition, metric, mean, low, high, n, verdict, the per-seed values, …")
    p.add_argument("--out", metavar="FILE", help="also write the report as one self-contained HTML page")
    p.add_argument("--lm", action="store_true",
                   help="add the built-in LM's cells: runs queued to the runs folder's pool (about 5 minutes on 2 "
                        "cores at the defaults), and read from there the next time")
    p.add_argument("--lm-seeds", default=None, help="runs per objective on the LM (0 to 64, 0: the pilot pair alone; "
                                                    "default 8, or the declared grid's 4 for smollm2-135m)")
    p.add_argument("--lm-steps", default=None,
                   help="GRPO steps per LM run (2 to 1000; default 60, or the SmolLM2 setting's 30)")
    p.add_argument("--lm-pilot-extra", default=None,
                   help="seeds the pilot pair, PPO ε = 0.2 and KL3 δ = 0.05, trains beyond --lm-seeds (0 to 56; "
                        "default 0, or the declared grid's: 4 at learn, 8 at stress): the headline's comparison at "
                        "more seeds than the other objectives'")
    p.add_argument("--lm-model", default="builtin",
                   help="the model of the LM cells: builtin (default) or smollm2-135m (its own task, held-out set and "
                        "settings; 13 minutes for a run alone on 2 cores, 15–35 with two side by side, so a "
                        "grid takes hours: it resumes)")
    p.add_argument("--lm-setting", default=None,
                   help="a setting of --lm-model: for smollm2-135m learn or stress (lr 2e-4; the default, as on the "
                        "Claims page)")
    p.add_argument("--lm-device", default=None, choices=tuple(DEVICE_KINDS),
                   help="the kind of device whose runs hold the LM cells (default: this machine's, where runs train): "
                        "cuda with --no-train reads the grid published from a GPU (the stress pair, an H200) on a CPU")
    p.add_argument("--no-wait", action="store_true",
                   help="with --lm: report the cells of the runs finished so far, leave the rest training in the pool")
    p.add_argument("--no-train", action="store_true",
                   help="with --lm: report the runs already in the runs folder and queue nothing (e.g. a grid trained "
                        "on another machine and copied here)")
    p.add_argument("--runs-dir", help="runs folder for --lm (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="with --lm: train the missing runs on a Ray cluster (ray://HOST:PORT, auto, or none given: one "
                        "of this machine's own) instead of this machine's pool; they land in the runs folder as the "
                        "pool's do (docs/scale.md; pip install 'divviz[ray]')")
    p.add_argument("--no-published", action="store_true",
                   help="with --lm: read only the runs folder, not the published runs (published/, which hold "
                        "SmolLM2's grids: a cell the runs folder has not finished is read from there by default)")
    p.add_argument("--real", action="store_true",
                   help="add SmolLM2-135M's cells: one update per rollout batch under each objective, from the same "
                        "weights (about 55 s a batch on 2 cores), cached: a second call trains nothing")
    p.add_argument("--batches", default=None, help="rollout batches for --real (2 to 256; default 16)")
    p.set_defaults(run=cmd_claims)


def cmd_claims(args) -> int:
    if not args.lm and (args.lm_seeds or args.lm_steps or args.lm_pilot_extra or args.runs_dir
                        or args.lm_model != "builtin" or args.lm_setting or args.lm_device or args.no_wait
                        or args.no_train or args.no_published or args.ray):
        raise DivvizInputError("--lm-seeds, --lm-steps, --lm-pilot-extra, --lm-model, --lm-setting, --lm-device, "
                               "--no-wait, --no-train, --no-published, --ray and --runs-dir are for the LM's cells: "
                               "add --lm")
    if args.ray:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise DivvizInputError("--ray needs Ray, which is not installed: pip install 'divviz[ray]' 'torch==2.13.0'")
    before = os.environ.get("DIVVIZ_RAY")
    if args.ray:
        os.environ["DIVVIZ_RAY"] = args.ray  # the pool the runs folder gets is Ray's (`runner.pool_command`)
    try:
        return _claims_report(args)
    finally:  # as it was: main() also runs inside other programs (a notebook, the tests)
        if before is None:
            os.environ.pop("DIVVIZ_RAY", None)
        else:
            os.environ["DIVVIZ_RAY"] = before


def _claims_report(args) -> int:
    from tqdm import tqdm

    from divviz.evidence import claims, claims_export, claims_report, lm_evidence

    seeds = claims.QUICK_SEEDS if args.quick else claims.SEEDS
    if args.seeds is not None:
        seeds = claims.SEEDS_PARAM.check(args.seeds, "claims")
    if args.batches is not None and not args.real:
        raise DivvizInputError("--batches is for the real model's cells: add --real")
    quiet = args.json and not sys.stderr.isatty()
    try:  # opened first, so that a path that cannot be written is refused before the work
        out = open(args.out, "w", encoding="utf-8") if args.out else None
    except OSError as err:
        raise DivvizInputError(f"cannot write {args.out}: {err.strerror}") from None
    plan = _lm_cells(args) if args.lm else None  # the pool trains the missing ones while the bandit grid runs here
    bar = tqdm(total=100, desc="claims: bandit", unit="%", file=sys.stderr, disable=quiet)

    def progress(fraction: float, text: str) -> None:
        bar.set_postfix_str(text)
        bar.update(round(100 * fraction) - bar.n)

    report = claims_report.build(seeds, progress=progress, recompute=args.recompute)
    bar.close()
    if plan is not None:
        if args.no_wait or args.no_train:
            plan = plan.refreshed()
            print(f"divviz: {plan.name}: {plan.done} of {len(plan.runs)} runs finished; the report has their cells"
                  + (", and nothing was queued (--no-train)" if args.no_train else
                     ", and the pool goes on training the rest (run this again later)"), file=sys.stderr)
        plan = plan if args.no_wait or args.no_train else _wait_for_lm_cells(plan, quiet)
        report = lm_evidence.LMEvidence(plan).report(report)
    if args.real:
        report = _real_cells(args, quiet).report(report)
    if out:
        with out:
            out.write(claims_export.to_html(report))
    if args.json:
        return print_json(claims_export.report_json(report), indent=1)
    print(claims_export.to_text(report))
    return 0


def _real_cells(args, quiet: bool):
    """The real model's batches, computed where not cached (a bar per batch); Ctrl-C keeps the batches done."""
    from tqdm import tqdm

    from divviz.evidence import claims_real

    plan = claims_real.RealPlan(claims_real.BATCHES_PARAM.check(args.batches or claims_real.BATCHES_PARAM.default,
                                                                "claims"))
    missing = len(plan.missing)
    print(f"divviz: SmolLM2-135M: {len(plan.jobs) - missing} of {len(plan.jobs)} batches already in "
          f"{claims_real.cache_folder()}, {missing} to compute", file=sys.stderr)
    bar = tqdm(total=missing, desc="claims: SmolLM2, one update", unit="batch", file=sys.stderr, disable=quiet)

    def progress(done: int, total: int, text: str) -> None:
        bar.set_postfix_str(text)
        bar.update(done - bar.n)

    try:
        plan.compute(progress)
    except KeyboardInterrupt:
        raise DivvizInputError(f"stopped: {len(plan.jobs) - len(plan.missing)} of {len(plan.jobs)} batches are kept in "
                               f"{claims_real.cache_folder()}, and the next --real computes only the rest") from None
    bar.close()
    return plan


def _lm_cells(args):
    """The LM cells' plan, read from the runs folder, its missing runs queued (none with --no-train)."""
    from divviz.engine.models import MODELS, evaluated_settings
    from divviz.engine.policy import pick_device
    from divviz.evidence import claims_lm
    from divviz.runs.store import runs_dir

    if args.lm_model not in MODELS:
        raise DivvizInputError(f"--lm-model takes a built-in model ({', '.join(MODELS)}); got {args.lm_model!r}")
    settings = evaluated_settings(args.lm_model)  # a setting without held-out evaluations tests nothing here
    if args.lm_setting and args.lm_setting not in settings:
        raise DivvizInputError(f"--lm-setting: {args.lm_model} has "
                               + (f"the settings with held-out evaluations {', '.join(settings)}" if settings
                                  else "no settings")
                               + f"; got {args.lm_setting!r}")
    setting = args.lm_setting or claims_lm.opening_setting(settings)
    here = pick_device().type
    device = args.lm_device or here
    if device != here and not (args.no_train or args.ray):  # a Ray cluster's workers may have the device asked for
        raise DivvizInputError(f"--lm-device {device}: runs queued here would train on {here}; add --no-train to read "
                               f"the runs trained on {device} (the published ones among them)")
    declared, declared_extra = claims_lm.declared_seeds(args.lm_model, setting, device)
    seeds = claims_lm.SEEDS_PARAM.check(declared if args.lm_seeds is None else args.lm_seeds, "claims")
    steps = claims_lm.STEPS_PARAM.check(args.lm_steps or claims_lm.default_steps(args.lm_model, setting), "claims")
    pilot = declared + declared_extra if declared_extra else 0  # the declared pilot pair's seeds, if it has more
    extra = claims_lm.PILOT_EXTRA_PARAM.check(args.lm_pilot_extra if args.lm_pilot_extra is not None
                                              else max(0, pilot - seeds), "claims")
    plan = claims_lm.LMPlan.read(runs_dir(args.runs_dir), seeds, steps, args.lm_model, setting, seeds + extra,
                                 with_published=not args.no_published, device=device)
    found = len(plan.runs) - len(plan.missing)
    queued = [] if args.no_train else plan.queue_missing()
    print(f"divviz: {plan.name}: {found} of {len(plan.runs)} runs found, {len(queued)} queued"
          + (f"; {plan.provenance}" if plan.provenance else f" (runs folder {plan.root})"), file=sys.stderr)
    return plan.refreshed()


def _wait_for_lm_cells(plan, quiet: bool):
    """Wait for the pool to finish the plan's runs; Ctrl-C stops those still queued or running (the finished ones
    stay, and the next `--lm` reads them)."""
    from tqdm import tqdm

    from divviz.runs.runner import stop_run

    bar = tqdm(total=100, desc=f"claims: {plan.name}", unit="%", file=sys.stderr, disable=quiet,
               bar_format="{l_bar}{bar}| {n_fmt}% [{elapsed}{postfix}]")
    try:
        while not plan.finished:
            left, ahead = plan.time_left(), len(plan.ahead)
            bar.set_postfix_str(f"{plan.done} of {len(plan.runs)} runs, "
                                + ("time left unknown" if left is None else f"about {left / 60:.0f} min left")
                                + (f" ({ahead} other queued runs included)" if ahead else ""))
            bar.update(round(100 * plan.progress) - bar.n)
            time.sleep(1.0)
            plan = plan.refreshed()
    except KeyboardInterrupt:
        for run in plan.runs.values():
            if run is not None and run.state in ("queued", "running"):
                stop_run(run.folder)
        raise DivvizInputError(f"stopped: {plan.name}'s runs that finished are kept in the runs folder, and the next "
                               "--lm reads them instead of training them again") from None
    bar.update(100 - bar.n)
    bar.close()
    for line in plan.failed:
        print(f"divviz: {plan.name}: a run failed and drops out of its pairs: {line}", file=sys.stderr)
    return plan
