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
import math
import os
import sys

import numpy as np

from divviz.catalogue.divergences import CATALOGUE, DUAL_CLIP
from divviz.catalogue.params import DivvizInputError, Param
from divviz.catalogue.rollout_correction import CORRECTIONS
from divviz.cli_claims import add_claims_parser
from divviz.cli_output import print_json
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


def cmd_runs(args) -> int:
    from divviz.runs.store import last_metrics, list_runs, runs_dir

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

    from divviz.evidence.rescore import rescore_step, step_coverage
    from divviz.runs import published
    from divviz.runs.store import runs_dir

    given, root = args.run_folder, runs_dir(args.runs_dir)
    if Path(given).is_dir():
        folder = published.unpacked(Path(given))
    else:  # a run's name: the runs folder's run, else the published one
        folder = next((where / given for where in (root, published.folder()) if where and (where / given).is_dir()),
                      None)
    if folder is None:
        raise DivvizInputError(f"no run {given!r}: give a run folder, or a run's name in {root} or among the "
                               "published runs")
    step = Param("step", 1, 1, 10**9, high_open=False, kind="int").check(args.step, "rescore")
    rows = rescore_step(folder, step, args.clip_test or [])
    if args.json:
        return print_json(rows, indent=1)
    print(f"run {folder.name}, step {step}: {rows[0]['tokens']} tokens the loss saw, in "
          f"{step_coverage(folder, step)}")
    print(f"{'measure':<44} {'masked low':>10} {'masked high':>11} {'outside':>8} {'grad flows':>10} {'changed':>8}")
    for r in rows:
        flows = "—" if math.isnan(r["gradient_flows"]) else f"{r['gradient_flows']:.3f}"
        print(f"{shorten(r['measure'], 44):<44} {r['masked_low']:>10.3%} {r['masked_high']:>11.3%} {r['outside']:>8.2%} "
              f"{flows:>10} {r['changed']:>8}")
        for g, c, i, piece, before, after in r["changed_tokens"][:5]:
            print(f"    prompt {g + 1}, completion {c + 1}, token {i} {shorten(repr(piece), 30)}: {before} → {after}")
    if any(math.isnan(r["gradient_flows"]) for r in rows):
        print("grad flows —: every advantage is 0 in these completions, so no token has a gradient to keep or mask")
    return 0


def cmd_import(args) -> int:
    from pathlib import Path

    from divviz.importers.formats import read
    from divviz.importers.steps import write_run
    from divviz.runs.store import read_status, runs_dir

    path = Path(args.file)
    fmt, config, steps = read(path, args.format)
    folder = write_run(steps, config, runs_dir(args.runs_dir), f"import-{path.stem}")
    print(f"imported {path.name} ({fmt}) as run {folder.name} in {folder.parent}: {read_status(folder)['message']}")
    return 0


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

    add_claims_parser(sub)

    p = sub.add_parser("import", help="make a run folder from another trainer's log: UNIPO's JSON, JSONL or folder, "
                                      "TRL's trainer_state.json, verl's file logger, divviz's JSONL")
    p.add_argument("file", help="the log: a file, or a folder (a TRL checkpoint, UNIPO's build_data.py output); its "
                                "format is told from its content")
    p.add_argument("--format", choices=("unipo", "trl", "verl", "jsonl"),
                   help="read FILE as this format instead of telling it from the content")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.set_defaults(run=cmd_import)

    p = sub.add_parser("rescore", help="a recorded step's tokens under other clip tests: what each would have masked")
    p.add_argument("run_folder", metavar="RUN", help="a run folder, or a run's name in the runs folder or among the "
                                                     "published runs")
    p.add_argument("--step", required=True, help="a step whose completions the run kept (the step inspector's)")
    p.add_argument("--clip-test", "--measure", dest="clip_test", action="append", metavar="NAME[:K=V…]",
                   help="a clip test, e.g. kl3:delta=0.02 or clip_higher (repeat to compare several); the run's own "
                        "objective always comes first")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--json", action="store_true",
                   help="print a list: measure, tokens, masked_low, masked_high, outside, gradient_flows, changed, "
                        "changed_tokens")
    p.set_defaults(run=cmd_rescore)

    p = sub.add_parser("runs", help="list the runs in the runs folder with their state")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_runs)
    return parser


READS_PUBLISHED = ("runs", "claims", "rescore")  # the commands that read published/: each says what it hides


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command in READS_PUBLISHED:
            from divviz.runs import published

            for line in published.damaged_lines():
                print(f"divviz: note: {line}", file=sys.stderr)
        return args.run(args)
    except DivvizInputError as err:
        print(f"divviz: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped reading (`divviz catalogue --json | head`): nothing went wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exiting flushes nowhere, quietly
        return 0


if __name__ == "__main__":
    sys.exit(main())
