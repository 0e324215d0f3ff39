"""`divviz train`: its options read into one checked `RunConfig`, and the run trained with a progress bar (divviz's
engine, or TRL's GRPOTrainer). `divviz bounds` reads its clip tests the same way (`clip_test_of`, `formula_clip_test`)."""

from __future__ import annotations

import os
import sys

from divviz.catalogue import instances
from divviz.catalogue.divergences import clip_test, get_entry
from divviz.catalogue.params import UPLOAD_MAX_BYTES, DivvizInputError, parse_assignments
from divviz.engine.config import RUN_PARAMS
from divviz.safetext import quoted


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="run GRPO on the built-in model (or --model) and write a run folder")
    p.add_argument("--clip-test", "--measure", dest="clip_test", metavar="NAME[:K=V…]",
                   help="clip test, e.g. kl3:delta=0.0231 (see `divviz catalogue`), or none (default: ratio)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="a clip-test parameter")
    p.add_argument("--formula", metavar="TEXT", help='your own clip test f(w) ≤ δ, e.g. "abs(log(w))" (instead of '
                                                     "--clip-test; with --param delta=…)")
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
    p.add_argument("--off-policy-mask-threshold", "--off-policy-mask", default=None, metavar="DELTA",
                   help="TRL's off_policy_mask_threshold: drop A < 0 completions whose mean log π_old − log π_θ "
                        "> δ (--off-policy-mask: its earlier spelling)")
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
    p.add_argument("--task", help="add, sort, reverse or countdown (default: the model's, else reverse)")
    p.add_argument("--reward", default="task",
                   help="task (its checker) or random: the random-reward control, a seeded fair coin per completion "
                        "whatever it says (Park et al. 2025)")
    p.add_argument("--prompt-format", default="auto",
                   help="auto (chat through the tokenizer's template when it has one), compact or chat")
    p.add_argument("--backend", default="divviz",
                   help="divviz (its own engine) or trl (TRL's GRPOTrainer; under `accelerate launch` on N processes)")
    p.add_argument("--model", default="builtin",
                   help="builtin, smollm2-135m (see `divviz models`), a local model folder or a hub id")
    p.add_argument("--setting", metavar="NAME",
                   help="one of the model's named settings instead of its defaults: smollm2-135m has learn (its "
                        "defaults), 'look only' and stress (see `divviz models`); options given here still win")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a model's own code (off by default)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    p.add_argument("--dtype", default="auto",
                   help="the forward passes' precision: auto (bfloat16 on a GPU, or on a CPU with AVX512-BF16 or AMX "
                        "for a real model; else float32), float32 or bfloat16; weights, log-softmax and the loss stay "
                        "float32")
    p.add_argument("--runs-dir", help="runs folder (default: $DIVVIZ_RUNS_DIR, else ./runs)")
    p.add_argument("--now", action="store_true",
                   help="start even if the runs folder already trains its limit of runs ($DIVVIZ_MAX_RUNS)")
    for param in RUN_PARAMS:
        text = f"{param.doc} ({param.range_text()}; default: the model's, else {param.default:g})"
        p.add_argument(f"--{param.name.replace('_', '-')}", help=text.replace("%", "%%"))  # argparse formats help
    p.set_defaults(run=cmd_train)


def clip_test_of(spec: str, params: list[str]):
    """A `--clip-test NAME[:k=v…]` with its `--param k=v`s, as a configured clip test."""
    test_name = spec.split(":")[0]
    if get_entry(test_name).family != "clip":
        raise DivvizInputError(f"'{test_name}' is a penalty; only clip tests have a feasible ratio interval")
    return instances.parse(":".join([spec, *params]))


def formula_clip_test(text: str, params: list[str]):
    """`--formula TEXT` with its `--param k=v`s (delta): the catalogue's `formula` clip test, f(w) ≤ δ."""
    return clip_test("formula", **{**parse_assignments(params), "f": text})


def cmd_train(args) -> int:
    from divviz.engine.config import RunConfig
    from divviz.runs.store import read_run, runs_dir, writable_runs_folder
    from divviz.runs.train import stop_on_sigterm

    for coefficient, flag in ((args.beta, "penalty"), (args.beta2, "penalty2")):
        if coefficient is not None and not getattr(args, flag):
            raise DivvizInputError(f"--{flag.replace('penalty', 'beta')} was given without a penalty (--{flag}); "
                                   "choose one or drop it")
    if args.penalty2 and args.beta2 is None:
        raise DivvizInputError("--penalty2 needs its own coefficient --beta2 (e.g. GBMPO's prob_l2kl: --penalty k3 "
                               "--beta 0.04 --penalty2 prob_l2 --beta2 0.1)")
    soft = surrogate_settings(args.surrogate)
    cfg = RunConfig.make(
        **{**named_setting(args.model, args.setting),
           **given(task=args.task, **{p.name: getattr(args, p.name) for p in RUN_PARAMS})},
        backend=args.backend, model=args.model, device=args.device, dtype=args.dtype, prompt_format=args.prompt_format,
        reward=args.reward,
        **clip_test_settings(args.clip_test, args.param, args.formula,
                           default="none" if soft["surrogate"] and get_entry(soft["surrogate"]).clip == "none"
                           else "ratio"),
        **soft, importance_sampling_level=args.importance_sampling_level, ratio_cap=args.ratio_cap,
        penalty=args.penalty, penalty_params=penalty_params(args.penalty, args.penalty_param),
        second_penalty=args.penalty2, second_penalty_params=penalty_params(args.penalty2, args.penalty2_param),
        second_beta=0.0 if args.beta2 is None else args.beta2,
        beta=0.04 if args.beta is None else args.beta, dual_clip_c=args.dual_clip, aggregation=args.aggregation,
        scale_rewards="none" if args.no_scale_rewards else args.scale_rewards, baseline=args.baseline,
        off_policy_mask_threshold=args.off_policy_mask_threshold, rollout_dtype=args.rollout_dtype,
        rollout_is=None if args.rollout_is == "none" else args.rollout_is, rollout_is_threshold=args.rollout_is_threshold,
        rollout_is_batch_normalize=args.rollout_is_batch_normalize, rollout_rs=args.rollout_rs,
        rollout_rs_threshold=args.rollout_rs_threshold, bypass_mode=args.bypass_mode,
        trust_remote_code=args.trust_remote_code)
    stop_on_sigterm()
    root = writable_runs_folder(runs_dir(args.runs_dir))  # refused before a model loads or a bar is drawn
    if not args.now and os.environ.get("RANK", "0") == "0":  # the runs folder's limit, as the app's pool keeps it
        # (under accelerate/torchrun only the first process waits; the others wait for it as they join)
        from divviz.runs.runner import wait_for_slot

        wait_for_slot(root, lambda text: print(f"divviz: {text}; --now starts anyway", file=sys.stderr))
    train = _train_with_trl if cfg.backend == "trl" else _train_with_engine
    folder = train(cfg, root)
    if folder is None:  # another process of a multi-process TRL run: the main one writes the run folder
        return 0
    run = read_run(folder)
    print(f"{run.state}: {run.message}" if run.message else run.state)
    print(folder)
    return 0 if run.state in ("done", "stopped") else 1


def named_setting(model: str, name: str | None) -> dict:
    """The run settings of `model`'s setting `name` (`models.model_settings`); {} for none (the model's defaults)."""
    from divviz.engine.models import model_settings

    if name is None:
        return {}
    named = model_settings(model)
    if name not in named:
        offered = f"it has {', '.join(map(quoted, named))}" if named else "it has none"
        raise DivvizInputError(f"model {quoted(model)} has no setting {quoted(name)}; {offered}")
    return dict(named[name])


def given(**options) -> dict:
    """The options the command line set; the others come from the model's defaults (`engine/models.py`)."""
    return {name: value for name, value in options.items() if value is not None}


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


def clip_test_settings(spec: str | None, params: list[str], formula: str | None = None,
                       default: str = "ratio") -> dict:
    """`--clip-test NAME[:k=v…]` (default `default`: ratio, or none with a surrogate that has no clip test), or
    `--formula TEXT`, and `--param k=v`s as a run config's clip and clip_params."""
    if formula is not None and spec is not None:
        raise DivvizInputError("give --clip-test or --formula, not both")
    spec = spec or default
    if spec == "none":
        return {"clip": None, "clip_params": parse_assignments(params)}
    test = formula_clip_test(formula, params) if formula is not None else clip_test_of(spec, params)
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
    from divviz.runs.train import train

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


