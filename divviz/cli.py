"""`divviz` on the command line: the same catalogue and engine as the app, headless.

    divviz measures [--json]
    divviz bounds --measure NAME[:k=v...] [--measure …]... [--param k=v]... [--pi-old P] [--json]
    divviz bounds --formula "w - 1 - log(w)" --param delta=0.05 [--json]
    divviz train [--measure NAME[:k=v...] | --formula TEXT] [--param k=v]... [--penalty NAME --beta B] [--task T] ...
                 [--backend divviz|trl]
    accelerate launch --multi_gpu --num_processes N -m divviz train --backend trl ...
    divviz runs [--runs-dir DIR] [--json]
    divviz claims [--quick] [--seeds N] [--lm [--lm-seeds N] [--lm-steps N]] [--json] [--out report.html]

Bad input exits with code 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from divviz.catalogue import instances
from divviz.catalogue.divergences import CATALOGUE, DUAL_CLIP, clip_test, get_entry
from divviz.engine.config import RUN_PARAMS
from divviz.catalogue.params import UPLOAD_MAX_BYTES, DivvizInputError, Param, parse_assignments
from divviz.catalogue.rollout_correction import CORRECTIONS
from divviz.safetext import shorten


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage too)
        raise DivvizInputError(message)


def _param_json(p: Param) -> dict:
    return {"name": p.name, "default": p.default, "kind": p.kind, "range": p.range_text(),
            "doc": p.doc, "trl_name": p.trl_name}


def cmd_measures(args) -> int:
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


def clip_measure(spec: str, params: list[str]):
    """A `--measure NAME[:k=v…]` with its `--param k=v`s, as a configured clip test."""
    test_name = spec.split(":")[0]
    if get_entry(test_name).family != "clip":
        raise DivvizInputError(f"'{test_name}' is a penalty; only clip tests have a feasible ratio interval")
    return instances.parse(":".join([spec, *params]))


def formula_measure(text: str, params: list[str]):
    """`--formula TEXT` with its `--param k=v`s (delta): the catalogue's `formula` clip test, f(w) ≤ δ."""
    return clip_test("formula", **{**parse_assignments(params), "f": text})


def cmd_bounds(args) -> int:
    specs = args.measure or []
    count = len(specs) + (args.formula is not None)
    if not count:
        raise DivvizInputError("give a clip test: --measure NAME (see `divviz measures`), e.g. --measure kl3:delta=0.05, "
                               "or your own: --formula \"w - 1 - log(w)\" --param delta=0.05")
    if args.param and count > 1:
        raise DivvizInputError("--param belongs to a single --measure; with several, write NAME:k=v, "
                               "e.g. --measure kl3:delta=0.0177 --measure kl3:delta=0.05")
    tests = [clip_measure(spec, args.param) for spec in specs]
    if args.formula is not None:
        tests.append(formula_measure(args.formula, args.param))
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
    if args.json:  # one object for one measure, a list for several
        print_json(rows[0] if len(rows) == 1 else rows)
    return 0


def cmd_train(args) -> int:
    from divviz.engine.config import RunConfig
    from divviz.engine.store import read_run, runs_dir, writable_runs_folder
    from divviz.engine.train import stop_on_sigterm

    for coefficient, flag in ((args.beta, "penalty"), (args.beta2, "penalty2")):
        if coefficient is not None and not getattr(args, flag):
            raise DivvizInputError(f"--{flag.replace('penalty', 'beta')} was given without a penalty (--{flag}); "
                                   "choose one or drop it")
    if args.penalty2 and args.beta2 is None:
        raise DivvizInputError("--penalty2 needs its own coefficient --beta2 (e.g. GBMPO's prob_l2kl: --penalty k3 "
                               "--beta 0.04 --penalty2 prob_l2 --beta2 0.1)")
    soft = surrogate_settings(args.surrogate)
    cfg = RunConfig.make(
        task=args.task, backend=args.backend, model=args.model, device=args.device,
        **measure_settings(args.measure, args.param, args.formula,
                           default="none" if soft["surrogate"] and get_entry(soft["surrogate"]).clip == "none"
                           else "ratio"),
        **soft, importance_sampling_level=args.importance_sampling_level, ratio_cap=args.ratio_cap,
        penalty=args.penalty, penalty_params=penalty_params(args.penalty, args.penalty_param),
        second_penalty=args.penalty2, second_penalty_params=penalty_params(args.penalty2, args.penalty2_param),
        second_beta=0.0 if args.beta2 is None else args.beta2,
        beta=0.04 if args.beta is None else args.beta, dual_clip_c=args.dual_clip, aggregation=args.aggregation,
        scale_rewards="none" if args.no_scale_rewards else args.scale_rewards, baseline=args.baseline,
        off_policy_mask=args.off_policy_mask, rollout_dtype=args.rollout_dtype,
        rollout_is=None if args.rollout_is == "none" else args.rollout_is, rollout_is_threshold=args.rollout_is_threshold,
        rollout_is_batch_normalize=args.rollout_is_batch_normalize, rollout_rs=args.rollout_rs,
        rollout_rs_threshold=args.rollout_rs_threshold, bypass_mode=args.bypass_mode,
        trust_remote_code=args.trust_remote_code, **{p.name: getattr(args, p.name) for p in RUN_PARAMS})
    stop_on_sigterm()
    root = writable_runs_folder(runs_dir(args.runs_dir))  # refused before a model loads or a bar is drawn
    if not args.now and os.environ.get("RANK", "0") == "0":  # the runs folder's limit, as the app's pool keeps it
        # (under accelerate/torchrun only the first process waits; the others wait for it as they join)
        from divviz.engine.runner import wait_for_slot

        wait_for_slot(root, lambda text: print(f"divviz: {text}; --now starts anyway", file=sys.stderr))
    train = _train_with_trl if cfg.backend == "trl" else _train_with_engine
    folder = train(cfg, root)
    if folder is None:  # another process of a multi-process TRL run: the main one writes the run folder
        return 0
    run = read_run(folder)
    print(f"{run.state}: {run.message}" if run.message else run.state)
    print(folder)
    return 0 if run.state in ("done", "stopped") else 1


def print_json(value, indent: int | None = None) -> int:
    """Print `value` as strict JSON (a NaN or infinite number, which JSON cannot spell, as null); exit code 0."""
    strict = json.loads(json.dumps(value), parse_constant=lambda name: None)  # NaN, Infinity, -Infinity -> null
    print(json.dumps(strict, indent=indent, allow_nan=False))
    return 0


def penalty_params(name: str | None, items: list[str]) -> dict:
    """--penalty-param K=V pairs; K=@FILE reads a parameter that comes from a file (`Param.upload`, e.g. a mirror
    map's φ) from FILE."""
    params = parse_assignments(items)
    uploads = {p.name: p.upload for p in get_entry(name, "penalty").params if p.upload} if name else {}
    for key, value in params.items():
        if key in uploads and value.startswith("@"):
            path = value[1:]
            try:
                with open(path, "rb") as handle:
                    source = handle.read(UPLOAD_MAX_BYTES + 1)
            except OSError as err:
                raise DivvizInputError(f"cannot read {uploads[key].what} from {path!r}: "
                                       f"{err.strerror or type(err).__name__}") from None
            params[key] = uploads[key].parse(source, path)
    return params


def surrogate_settings(spec: str | None) -> dict:
    """`--surrogate NAME[:k=v…]` as a run config's surrogate and surrogate_params (none: PPO's clipped surrogate)."""
    if spec is None:
        return {"surrogate": None, "surrogate_params": {}}
    chosen = instances.parse(spec, "surrogate")
    return {"surrogate": chosen.name, "surrogate_params": chosen.params}


def measure_settings(spec: str | None, params: list[str], formula: str | None = None, default: str = "ratio") -> dict:
    """`--measure NAME[:k=v…]` (default `default`: ratio, or none with a surrogate that has no clip test), or
    `--formula TEXT`, and `--param k=v`s as a run config's clip and clip_params."""
    if formula is not None and spec is not None:
        raise DivvizInputError("give --measure or --formula, not both")
    spec = spec or default
    if spec == "none":
        return {"clip": None, "clip_params": parse_assignments(params)}
    test = formula_measure(formula, params) if formula is not None else clip_measure(spec, params)
    return {"clip": test.name, "clip_params": test.params}


def _progress_bar(cfg, device: str):
    from tqdm import tqdm

    return tqdm(total=cfg.steps, desc=f"{cfg.task} · {cfg.label} · {device}", unit="step")


def _show(bar, metrics: dict) -> None:
    from divviz.metrics import metric

    bar.set_postfix(reward=f"{metric(metrics, 'reward'):.3f}", acc=f"{metric(metrics, 'accuracy'):.3f}",
                    entropy=f"{metric(metrics, 'entropy'):.3f}", clip=f"{metric(metrics, 'clip_ratio/region_mean'):.3f}")
    bar.update(1)


def _train_with_engine(cfg, root):
    from divviz.engine.grpo import make_trainer
    from divviz.engine.train import train

    trainer = make_trainer(cfg)  # a model that will not load is bad input: exit 2 before a run folder exists
    bar = _progress_bar(cfg, trainer.device)
    folder = train(cfg, root, trainer=trainer, on_step=lambda result: _show(bar, result.metrics))
    bar.close()
    return folder


def _train_with_trl(cfg, root):
    from divviz.trl.run import process_state, train  # RunConfig.make has checked that TRL is installed

    state = process_state(cfg)
    bar = _progress_bar(cfg, f"TRL on {state.num_processes} × {state.device}") if state.is_main_process else None
    folder = train(cfg, root, on_row=lambda row: _show(bar, row) if bar else None)
    if bar:
        bar.close()
    else:
        print(f"divviz: process {state.process_index} of {state.num_processes} trained its share of {cfg.steps} steps",
              file=sys.stderr)
    return folder


def cmd_runs(args) -> int:
    from divviz.engine.store import list_runs, read_metrics, runs_dir

    runs = list_runs(runs_dir(args.runs_dir))
    rows = []
    for run in runs:
        last = (read_metrics(run.folder) or [{}])[-1]
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


def cmd_claims(args) -> int:
    from tqdm import tqdm

    from divviz.evidence import claims

    seeds = claims.QUICK_SEEDS if args.quick else claims.SEEDS
    if args.seeds is not None:
        seeds = claims.SEEDS_PARAM.check(args.seeds, "claims")
    if not args.lm and (args.lm_seeds or args.lm_steps or args.runs_dir):
        raise DivvizInputError("--lm-seeds, --lm-steps and --runs-dir are for the built-in LM's cells: add --lm")
    quiet = args.json and not sys.stderr.isatty()
    try:  # opened first, so that a path that cannot be written is refused before the work
        out = open(args.out, "w", encoding="utf-8") if args.out else None
    except OSError as err:
        raise DivvizInputError(f"cannot write {args.out}: {err.strerror}") from None
    plan = _queue_lm_cells(args) if args.lm else None  # the pool trains them while the bandit grid runs here
    bar = tqdm(total=100, desc="claims: bandit", unit="%", file=sys.stderr, disable=quiet)

    def progress(fraction: float, text: str) -> None:
        bar.set_postfix_str(text)
        bar.update(round(100 * fraction) - bar.n)

    report = claims.evaluate(seeds, progress=progress)
    bar.close()
    if plan is not None:
        report = _wait_for_lm_cells(plan, quiet).report(report)
    if out:
        with out:
            out.write(claims.to_html(report))
    if args.json:
        return print_json([{k: v for k, v in row.items() if k != "claim_key"} for row in report.rows], indent=1)
    print(claims.to_text(report))
    return 0


def _queue_lm_cells(args):
    from divviz.evidence import claims_lm
    from divviz.engine.store import runs_dir

    seeds, steps = (param.check(given or param.default, "claims") for param, given in
                    ((claims_lm.SEEDS_PARAM, args.lm_seeds), (claims_lm.STEPS_PARAM, args.lm_steps)))
    plan = claims_lm.LMPlan.read(runs_dir(args.runs_dir), seeds, steps)
    found = len(plan.runs) - len(plan.missing)
    queued = plan.queue_missing()
    print(f"divviz: built-in LM: {found} of {len(plan.runs)} runs already in {plan.root}, {len(queued)} queued",
          file=sys.stderr)
    return plan.refreshed()


def _wait_for_lm_cells(plan, quiet: bool):
    """Wait for the pool to finish the plan's runs; Ctrl-C stops those still queued or running (the finished ones
    stay, and the next `--lm` reads them)."""
    from tqdm import tqdm

    from divviz.engine.runner import stop_run

    bar = tqdm(total=100, desc="claims: built-in LM", unit="%", file=sys.stderr, disable=quiet)
    try:
        while not plan.finished:
            bar.update(round(100 * plan.progress) - bar.n)
            time.sleep(1.0)
            plan = plan.refreshed()
    except KeyboardInterrupt:
        for run in plan.runs.values():
            if run is not None and run.state in ("queued", "running"):
                stop_run(run.folder)
        raise DivvizInputError("stopped: the built-in LM runs that finished are kept in the runs folder, and the "
                               "next --lm reads them instead of training them again") from None
    bar.update(100 - bar.n)
    bar.close()
    for line in plan.failed:
        print(f"divviz: built-in LM run failed and drops out of its pairs: {line}", file=sys.stderr)
    return plan


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="divviz", description="See what a policy-divergence constraint does to GRPO.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("measures", help="list the catalogue of divergence measures")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=cmd_measures)

    p = sub.add_parser("bounds", help="feasible ratio interval [l, u] of a clip test")
    p.add_argument("--measure", action="append", metavar="NAME[:K=V…]",
                   help="clip test, e.g. kl3 or kl3:delta=0.0177 (see `divviz measures`); repeat to compare several")
    p.add_argument("--param", action="append", default=[], metavar="K=V",
                   help="a parameter of a single --measure, e.g. delta=0.05")
    p.add_argument("--formula", metavar="TEXT",
                   help='your own measure f(w) ≤ δ, e.g. "w - 1 - log(w)" or "abs(log(w))" (with --param delta=…)')
    p.add_argument("--pi-old", help="π_old of the token, for tests that depend on it (prob_tv, a formula in pi_old)")
    p.add_argument("--json", action="store_true",
                   help='print {"measure", "params", "lower", "upper"} (a list of them for several measures)')
    p.set_defaults(run=cmd_bounds)

    p = sub.add_parser("train", help="run GRPO on the built-in model (or --model) and write a run folder")
    p.add_argument("--measure", metavar="NAME[:K=V…]",
                   help="clip test, e.g. kl3:delta=0.0231 (see `divviz measures`), or none (default: ratio)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="a clip-test parameter")
    p.add_argument("--formula", metavar="TEXT", help='your own clip test f(w) ≤ δ, e.g. "abs(log(w))" (instead of '
                                                     "--measure; with --param delta=…)")
    p.add_argument("--penalty", help="penalty toward the start policy, e.g. k3, prob_l2, ufkl_rf")
    p.add_argument("--penalty-param", action="append", default=[], metavar="K=V", help="a penalty parameter")
    p.add_argument("--beta", default=None, help="penalty coefficient β (with --penalty; default 0.04)")
    p.add_argument("--penalty2", help="a second penalty with its own coefficient (GBMPO's prob_l2kl: k3 and prob_l2)")
    p.add_argument("--penalty2-param", action="append", default=[], metavar="K=V", help="a second-penalty parameter")
    p.add_argument("--beta2", default=None, help="the second penalty's coefficient (with --penalty2)")
    p.add_argument("--dual-clip", default=None, metavar="C", help="dual-clip cap c > 1 for A < 0")
    p.add_argument("--surrogate", metavar="NAME[:K=V…]",
                   help="replace PPO's clipped surrogate: cispo, sapo, vespo, gpg (no clip test), dppo, geo_mean (with one)")
    p.add_argument("--importance-sampling-level", default="token",
                   help="token, or sequence for GSPO (one ratio per completion, its geometric mean)")
    p.add_argument("--off-policy-mask", default=None, metavar="DELTA",
                   help="TRL's off_policy_mask_threshold: drop A < 0 completions whose mean log π_old − log π_θ > δ")
    p.add_argument("--ratio-cap", default=None, metavar="DELTA", help="TRL's delta > 1: the unclipped term uses min(w, δ)")
    p.add_argument("--aggregation", default="grpo",
                   help="grpo, bnpo, dr_grpo, dapo, luspo (TRL's loss_type) or token_sum (verl's)")
    p.add_argument("--scale-rewards", default="group",
                   help="TRL's scale_rewards: divide advantages by the group's reward std (group), the batch's (batch) "
                        "or neither (none, Dr. GRPO)")
    p.add_argument("--no-scale-rewards", action="store_true", help="the same as --scale-rewards none")
    p.add_argument("--baseline", default="group",
                   help="the mean subtracted from a reward: its group's (GRPO) or the whole batch's (RPG's batch mean)")
    p.add_argument("--rollout-dtype", default="same",
                   help="the sampler's precision: same (the trained policy samples), bfloat16 or float16 (a copy cast "
                        "whole, as vLLM holds it); with --rollout-lag, a simulated train/inference mismatch")
    p.add_argument("--rollout-is", default="none", help="verl's rollout importance weights π_old/π_roll: token, "
                                                        "sequence or none")
    p.add_argument("--rollout-is-threshold", default="2.0", metavar="U|L_U",
                   help="u: truncated IS (TIS, min(ρ, u)); l_u: IcePop (ρ kept in [l, u], else 0)")
    p.add_argument("--rollout-is-batch-normalize", action="store_true", help="divide the weights by their batch mean")
    p.add_argument("--rollout-rs", default=None, metavar="OPTIONS",
                   help="verl's rejection: token_k1, seq_mean_k3, … (comma-separated; all must keep a token)")
    p.add_argument("--rollout-rs-threshold", default=None, metavar="T[,T…]",
                   help="one per option or one for all: l_u (or u) for k1, an upper bound for k2/k3")
    p.add_argument("--bypass-mode", action="store_true",
                   help="verl's bypass mode: π_old is the sampler's π_roll (the loss's ratio corrects)")
    p.add_argument("--task", default="reverse", help="add, sort, reverse or countdown")
    p.add_argument("--backend", default="divviz",
                   help="divviz (its own engine) or trl (TRL's GRPOTrainer; under `accelerate launch` on N processes)")
    p.add_argument("--model", default="builtin", help="builtin, a local model folder or a hub id")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own code (off by default)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--now", action="store_true",
                   help="start even if the runs folder already trains its limit of runs ($DIVVIZ_MAX_RUNS)")
    for param in RUN_PARAMS:
        p.add_argument(f"--{param.name.replace('_', '-')}", default=param.default, help=f"{param.doc} ({param.range_text()})")
    p.set_defaults(run=cmd_train)

    p = sub.add_parser("claims", help="test the seed papers' claims on a fixed grid, with computed verdicts")
    p.add_argument("--quick", action="store_true", help="fewer seeds (20 instead of 64): well under 2 minutes on 2 cores")
    p.add_argument("--seeds", default=None, help="seeds per measure (2 to 256), instead of the default")
    p.add_argument("--json", action="store_true",
                   help="print every cell: claim, condition, metric, mean, low, high, n, verdict, …")
    p.add_argument("--out", metavar="FILE", help="also write the report as one self-contained HTML page")
    p.add_argument("--lm", action="store_true",
                   help="add the built-in LM's cells: runs queued to the runs folder's pool (about 5 minutes on 2 "
                        "cores at the defaults), and read from there the next time")
    p.add_argument("--lm-seeds", default=None, help="runs per measure on the built-in LM (2 to 64; default 8)")
    p.add_argument("--lm-steps", default=None, help="GRPO steps per built-in LM run (2 to 1000; default 60)")
    p.add_argument("--runs-dir", help="runs folder for --lm (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.set_defaults(run=cmd_claims)

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


if __name__ == "__main__":
    sys.exit(main())
