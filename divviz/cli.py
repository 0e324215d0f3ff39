"""`divviz` on the command line: the same catalogue and engine as the app, headless.

    divviz catalogue [--json]
    divviz models [--json]
    divviz bounds --clip-test NAME[:k=v...] [--clip-test …]... [--param k=v]... [--pi-old P] [--json]
    divviz bounds --formula "w - 1 - log(w)" --param delta=0.05 [--json]
    divviz train [--clip-test NAME[:k=v...] | --formula TEXT] [--param k=v]... [--penalty NAME --beta B] [--task T] ...
                 [--backend divviz|trl]
    accelerate launch --multi_gpu --num_processes N -m divviz train --backend trl ...
    divviz runs [--runs-dir DIR] [--json]
    divviz rescore RUN --step N [--clip-test NAME[:k=v...]]... [--json]
    divviz import FILE|FOLDER [--format unipo|trl|verl|jsonl] [--runs-dir DIR]
    divviz claims [--quick] [--seeds N] [--lm [--lm-model M] [--lm-setting S] [--lm-seeds N] [--lm-steps N]
                  [--lm-pilot-extra N] [--no-wait | --no-train] [--ray [ADDRESS]]] [--real [--batches N]] [--json]
                  [--out report.html]

Bad input exits with code 2 and one line on stderr, never a traceback. `--measure` and `divviz measures`, the
earlier names of `--clip-test` and `divviz catalogue`, are still read.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from divviz.catalogue.divergences import CATALOGUE, DUAL_CLIP
from divviz.catalogue.params import DivvizInputError, Param
from divviz.catalogue.rollout_correction import CORRECTIONS
from divviz.cli_train import add_train_parser, clip_test_of, formula_clip_test
from divviz.safetext import shorten


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage too)
        raise DivvizInputError(message)


def _param_json(p: Param) -> dict:
    return {"name": p.name, "default": p.default, "kind": p.kind, "range": p.range_text(),
            "doc": p.doc, "trl_name": p.trl_name}


def cmd_catalogue(args) -> int:
    rows = [
        {"name": e.name, "family": e.family, "title": e.title, "latex": e.latex, "doc": e.doc,
         "params": [_param_json(p) for p in e.params]}
        for e in CATALOGUE.values()
    ]
    rows.append({"name": "dual_clip", "family": "cap", "title": "dual-clip cap for A < 0",
                 "latex": r"\ell_t \le -c\,A_t \;(A_t<0)", "doc": DUAL_CLIP.doc,
                 "params": [_param_json(DUAL_CLIP)]})
    rows += [{"name": e.name.replace(" ", "_"), "family": "rollout", "title": e.title, "latex": e.latex, "doc": e.doc,
              "flags": e.flags, "params": [_param_json(p) for p in e.params]} for e in CORRECTIONS.values()]
    if args.json:
        print_json(rows, indent=2)
        return 0
    for row in rows:
        shown = {"bool": lambda v: int(v), "text": repr}
        params = ", ".join(f"{p['name']}={shown.get(p['kind'], lambda v: format(v, 'g'))(p['default'])}"
                           for p in row["params"])
        print(f"{row['name']:<12} {row['family']:<10} {row['title']}" + (f"  [{params}]" if params else "")
              + (f"  (divviz train {row['flags']})" if "flags" in row else ""))
    return 0


def cmd_models(args) -> int:
    """The built-in models (`engine/models.py`): what each is, where it comes from, and the settings it brings."""
    from divviz.engine.models import MODELS

    if args.json:
        return print_json(list(MODELS.values()), indent=2)
    for row in MODELS.values():
        print(f"{row['name']:<14} {row['parameters']:>12,} parameters  {row['layers']:>2} layers  vocabulary "
              f"{row['vocabulary']:,}  {'chat template' if row['chat_template'] else 'compact prompts'}")
        print(f"{'':<14} {row['model']}; from {row['source']}; licence {row['licence']}")
        if row["defaults"]:
            print(f"{'':<14} defaults: " + ", ".join(f"{k}={v}" for k, v in row["defaults"].items()))
        for name, setting in row.get("settings", {}).items():  # `divviz train --setting NAME`
            changed = {k: v for k, v in setting.items() if row["defaults"].get(k) != v}
            print(f"{'':<14} --setting {name!r}: " + (", ".join(f"{k}={v}" for k, v in changed.items())
                                                       or "the defaults"))
    return 0


def cmd_bounds(args) -> int:
    specs = args.clip_test or []
    count = len(specs) + (args.formula is not None)
    if not count:
        raise DivvizInputError("give a clip test: --clip-test NAME (see `divviz catalogue`), e.g. --clip-test "
                               "kl3:delta=0.05, or your own: --formula \"w - 1 - log(w)\" --param delta=0.05")
    if args.param and count > 1:
        raise DivvizInputError("--param belongs to a single --clip-test; with several, write NAME:k=v, "
                               "e.g. --clip-test kl3:delta=0.0177 --clip-test kl3:delta=0.05")
    tests = [clip_test_of(spec, args.param) for spec in specs]
    if args.formula is not None:
        tests.append(formula_clip_test(args.formula, args.param))
    pi_old = None
    if args.pi_old is not None:
        pi_old = Param("pi_old", 0.5, 0.0, 1.0, low_open=True, high_open=False).check(args.pi_old, "bounds")
    rows = []
    for test in tests:
        if test.needs_pi_old and pi_old is None:
            raise DivvizInputError(f"{test.name}: its interval depends on π_old; pass --pi-old P with P in (0, 1]")
        lower, upper = (float(b) for b in test.bounds(None if pi_old is None else np.asarray(pi_old)))
        rows.append({"measure": test.name, "params": test.params, "lower": lower,
                     "upper": None if math.isinf(upper) else upper})
        if not args.json:
            where = f" at π_old = {pi_old:g}" if pi_old is not None else ""
            print(f"{test.name} {test.params}{where}: {lower:.10g} <= w <= {upper:.10g}")
    if args.json:  # one object for one clip test, a list for several
        print_json(rows[0] if len(rows) == 1 else rows)
    return 0


def print_json(value, indent: int | None = None) -> int:
    """Print `value` as strict JSON (a NaN or infinite number, which JSON cannot spell, as null); exit code 0."""
    strict = json.loads(json.dumps(value), parse_constant=lambda name: None)  # NaN, Infinity, -Infinity -> null
    print(json.dumps(strict, indent=indent, allow_nan=False))
    return 0


def cmd_runs(args) -> int:
    from divviz.engine.store import last_metrics, list_runs, runs_dir

    runs = list_runs(runs_dir(args.runs_dir))
    rows = []
    for run in runs:
        last = last_metrics(run.folder)  # the end of metrics.jsonl only: a 50,000-step run costs what a short one does
        rows.append({"name": run.name, "state": run.state, "step": run.step, "steps": run.steps,
                     "task": run.config.get("task"), "clip": run.config.get("clip"),
                     "penalty": run.config.get("penalty"), "message": run.message,
                     "reward": last.get("reward"), "accuracy": last.get("accuracy"), "folder": str(run.folder)})
    if args.json:
        print_json(rows, indent=2)
        return 0
    if not rows:
        print(f"no runs in {runs_dir(args.runs_dir)}")
    for r in rows:
        acc = "" if r["accuracy"] is None else f"acc {r['accuracy']:.3f}"
        why = f"  {shorten(r['message'], 100)}" if r["state"] in ("failed", "corrupt", "interrupted") else ""
        print(f"{r['name']:<60} {r['state']:<11} {r['step']:>4}/{r['steps']:<4} {acc}{why}")
    return 0


def cmd_rescore(args) -> int:
    from pathlib import Path

    from divviz.engine.store import runs_dir
    from divviz.evidence.rescore import rescore_step, step_coverage

    given = args.run_folder
    folder = Path(given) if Path(given).is_dir() else runs_dir(args.runs_dir) / given
    if not folder.is_dir():
        raise DivvizInputError(f"no run {given!r}: give a run folder, or a run's name in {runs_dir(args.runs_dir)}")
    step = Param("step", 1, 1, 10**9, high_open=False, kind="int").check(args.step, "rescore")
    rows = rescore_step(folder, step, args.clip_test or [])
    if args.json:
        return print_json(rows, indent=1)
    print(f"run {folder.name}, step {step}: {rows[0]['tokens']} tokens the loss saw, in "
          f"{step_coverage(folder, step)}")
    print(f"{'measure':<44} {'masked low':>10} {'masked high':>11} {'outside':>8} {'grad kept':>9} {'changed':>8}")
    for r in rows:
        kept = "—" if math.isnan(r["gradient_kept"]) else f"{r['gradient_kept']:.3f}"
        print(f"{shorten(r['measure'], 44):<44} {r['masked_low']:>10.3%} {r['masked_high']:>11.3%} {r['outside']:>8.2%} "
              f"{kept:>9} {r['changed']:>8}")
        for g, c, i, piece, before, after in r["changed_tokens"][:5]:
            print(f"    prompt {g + 1}, completion {c + 1}, token {i} {shorten(repr(piece), 30)}: {before} → {after}")
    if any(math.isnan(r["gradient_kept"]) for r in rows):
        print("grad kept —: every advantage is 0 in these completions, so no token has a gradient to keep or mask")
    return 0


def cmd_import(args) -> int:
    from pathlib import Path

    from divviz.engine.store import read_status, runs_dir
    from divviz.importers.formats import read
    from divviz.importers.steps import write_run

    path = Path(args.file)
    fmt, config, steps = read(path, args.format)
    folder = write_run(steps, config, runs_dir(args.runs_dir), f"import-{path.stem}")
    print(f"imported {path.name} ({fmt}) as run {folder.name} in {folder.parent}: {read_status(folder)['message']}")
    return 0


def cmd_claims(args) -> int:
    from tqdm import tqdm

    from divviz.evidence import claims, claims_export, claims_report, lm_evidence

    seeds = claims.QUICK_SEEDS if args.quick else claims.SEEDS
    if args.seeds is not None:
        seeds = claims.SEEDS_PARAM.check(args.seeds, "claims")
    if not args.lm and (args.lm_seeds or args.lm_steps or args.lm_pilot_extra or args.runs_dir
                        or args.lm_model != "builtin" or args.lm_setting or args.no_wait or args.no_train
                        or args.no_published or args.ray):
        raise DivvizInputError("--lm-seeds, --lm-steps, --lm-pilot-extra, --lm-model, --lm-setting, --no-wait, "
                               "--no-train, --no-published, --ray and --runs-dir are for the LM's cells: add --lm")
    if args.ray:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise DivvizInputError("--ray needs Ray, which is not installed: pip install 'divviz[ray]' 'torch==2.13.0'")
        os.environ["DIVVIZ_RAY"] = args.ray  # the runs folder's pool is Ray's (`runner.pool_command`)
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

    report = claims_report.build(seeds, progress=progress)
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
        return print_json([{k: v for k, v in row.items() if k != "claim_key"} for row in report.rows], indent=1)
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
    from divviz.engine.store import runs_dir
    from divviz.evidence import claims_lm

    if args.lm_model not in MODELS:
        raise DivvizInputError(f"--lm-model takes a built-in model ({', '.join(MODELS)}); got {args.lm_model!r}")
    settings = evaluated_settings(args.lm_model)  # a setting without held-out evaluations tests nothing here
    if args.lm_setting and args.lm_setting not in settings:
        raise DivvizInputError(f"--lm-setting: {args.lm_model} has "
                               + (f"the settings with held-out evaluations {', '.join(settings)}" if settings
                                  else "no settings")
                               + f"; got {args.lm_setting!r}")
    setting = args.lm_setting or next(iter(settings), "")
    declared, declared_extra = claims_lm.declared_seeds(args.lm_model, setting)
    seeds = claims_lm.SEEDS_PARAM.check(args.lm_seeds or declared, "claims")
    steps = claims_lm.STEPS_PARAM.check(args.lm_steps or claims_lm.default_steps(args.lm_model, setting), "claims")
    pilot = declared + declared_extra if declared_extra else 0  # the declared pilot pair's seeds, if it has more
    extra = claims_lm.PILOT_EXTRA_PARAM.check(args.lm_pilot_extra if args.lm_pilot_extra is not None
                                              else max(0, pilot - seeds), "claims")
    plan = claims_lm.LMPlan.read(runs_dir(args.runs_dir), seeds, steps, args.lm_model, setting, seeds + extra,
                                 with_published=not args.no_published)
    found = len(plan.runs) - len(plan.missing)
    queued = [] if args.no_train else plan.queue_missing()
    print(f"divviz: {plan.name}: {found} of {len(plan.runs)} runs found, {len(queued)} queued"
          + (f"; {plan.provenance}" if plan.provenance else f" (runs folder {plan.root})"), file=sys.stderr)
    return plan.refreshed()


def _wait_for_lm_cells(plan, quiet: bool):
    """Wait for the pool to finish the plan's runs; Ctrl-C stops those still queued or running (the finished ones
    stay, and the next `--lm` reads them)."""
    from tqdm import tqdm

    from divviz.engine.runner import stop_run

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="divviz", description="See what a policy-divergence constraint does to GRPO.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("catalogue", aliases=["measures"],
                       help="list the catalogue: clip tests with their intervals, penalties and surrogates")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_catalogue)

    p = sub.add_parser("models", help="list the built-in models (divviz train --model NAME)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_models)

    p = sub.add_parser("bounds", help="feasible ratio interval [l, u] of a clip test")
    p.add_argument("--clip-test", "--measure", dest="clip_test", action="append", metavar="NAME[:K=V…]",
                   help="clip test, e.g. kl3 or kl3:delta=0.0177 (see `divviz catalogue`); repeat to compare several")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a parameter of a single --clip-test, e.g. delta=0.05")
    p.add_argument("--formula", metavar="TEXT",
                   help='your own clip test f(w) ≤ δ, e.g. "w - 1 - log(w)" or "abs(log(w))" (with --param delta=…)')
    p.add_argument("--pi-old", help="π_old of the token, for tests that depend on it (prob_tv, a formula in pi_old)")
    p.add_argument("--json", action="store_true",
                   help='print {"measure", "params", "lower", "upper"} (a list of them for several clip tests)')
    p.set_defaults(run=cmd_bounds)

    add_train_parser(sub)

    p = sub.add_parser("claims", help="test the seed papers' claims on a fixed grid, with computed verdicts")
    p.add_argument("--quick", action="store_true", help="fewer seeds (20 instead of 64): well under 2 minutes on 2 cores")
    p.add_argument("--seeds", default=None, help="seeds per objective (2 to 256), instead of the default")
    p.add_argument("--json", action="store_true",
                   help="print every cell: claim, condition, metric, mean, low, high, n, verdict, …")
    p.add_argument("--out", metavar="FILE", help="also write the report as one self-contained HTML page")
    p.add_argument("--lm", action="store_true",
                   help="add the built-in LM's cells: runs queued to the runs folder's pool (about 5 minutes on 2 "
                        "cores at the defaults), and read from there the next time")
    p.add_argument("--lm-seeds", default=None, help="runs per objective on the LM (2 to 64; default 8, or the declared "
                                                    "grid's 4 for smollm2-135m)")
    p.add_argument("--lm-steps", default=None,
                   help="GRPO steps per LM run (2 to 1000; default 60, or the SmolLM2 setting's 30)")
    p.add_argument("--lm-pilot-extra", default=None,
                   help="seeds the pilot pair, PPO ε = 0.2 and KL3 δ = 0.05, trains beyond --lm-seeds (0 to 56; "
                        "default 0, or the declared grid's: 4 at learn, 8 at stress): the headline's comparison at "
                        "more seeds than the other objectives'")
    p.add_argument("--lm-model", default="builtin",
                   help="the model of the LM cells: builtin (default) or smollm2-135m (its own task, held-out set and "
                        "settings; about 13 minutes per run on 2 cores, so a grid takes hours: it resumes)")
    p.add_argument("--lm-setting", default=None,
                   help="a setting of --lm-model: for smollm2-135m learn (default) or stress (lr 2e-4)")
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

    p = sub.add_parser("import", help="make a run folder from another trainer's log: UNIPO's JSON, JSONL or folder, "
                                      "TRL's trainer_state.json, verl's file logger, divviz's JSONL")
    p.add_argument("file", help="the log: a file, or a folder (a TRL checkpoint, UNIPO's build_data.py output); its "
                                "format is told from its content")
    p.add_argument("--format", choices=("unipo", "trl", "verl", "jsonl"),
                   help="read FILE as this format instead of telling it from the content")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.set_defaults(run=cmd_import)

    p = sub.add_parser("rescore", help="a recorded step's tokens under other clip tests: what each would have masked")
    p.add_argument("run_folder", metavar="RUN", help="a run folder, or a run's name in the runs folder")
    p.add_argument("--step", required=True, help="a step whose completions the run kept (the step inspector's)")
    p.add_argument("--clip-test", "--measure", dest="clip_test", action="append", metavar="NAME[:K=V…]",
                   help="a clip test, e.g. kl3:delta=0.02 or clip_higher (repeat to compare several); the run's own "
                        "objective always comes first")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--json", action="store_true",
                   help="print a list: measure, tokens, masked_low, masked_high, outside, gradient_kept, changed, "
                        "changed_tokens")
    p.set_defaults(run=cmd_rescore)

    p = sub.add_parser("runs", help="list the runs in the runs folder with their state")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_runs)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except DivvizInputError as err:
        print(f"divviz: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped reading (`divviz catalogue --json | head`): nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exiting flushes nowhere, quietly
        return 0


if __name__ == "__main__":
    sys.exit(main())
