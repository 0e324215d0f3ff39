"""How TRL 1.16's `GRPOConfig` names a divviz `Objective`, both ways: `trl_args_for` checks a config against an
objective (TRL's options left at their defaults defer to it; set ones must agree) and `trl_objective` reads the
objective a plain `GRPOTrainer` optimises."""

from __future__ import annotations

import copy

from trl import GRPOConfig

from divviz.catalogue.aggregation import TRL_AGGREGATIONS
from divviz.catalogue.divergences import clip_test
from divviz.losses import Objective
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import penalty
from divviz.catalogue.surrogates import SURROGATES, surrogate


def _default(name: str):
    return GRPOConfig.__dataclass_fields__[name].default


def _same_box(objective: Objective, epsilon: float, epsilon_high: float | None) -> bool:
    """True if the objective's clip test is TRL's own box [1 − epsilon, 1 + (epsilon_high or epsilon)]."""
    clip, high = objective.clip, epsilon if epsilon_high is None else epsilon_high
    if clip is None:
        return False
    if clip.name == "ratio":
        return clip.params["eps"] == epsilon == high
    return clip.name == "clip_higher" and (clip.params["eps_low"], clip.params["eps_high"]) == (epsilon, high)


def trl_args_for(objective: Objective, args: GRPOConfig) -> GRPOConfig:
    """A copy of `args` that agrees with `objective`, or a `DivvizInputError` naming the conflicting setting.

    A TRL option left at its default defers to the objective; one set to another value must agree with it.
    TRL's `beta` is set to the objective's β when its penalty needs the reference model, so that TRL loads that
    model and computes its log-probs (`ref_per_token_logps`); the penalty itself is the objective's. With two
    penalties, TRL's `beta` is that of the first one that reads π_ref."""
    check_loss_type(objective, args.loss_type)
    for option, ours, name in (("delta", objective.ratio_cap, "ratio cap"),
                               ("importance_sampling_level", objective.importance_sampling_level, "level"),
                               ("off_policy_mask_threshold", objective.off_policy_mask_threshold, "off-policy mask")):
        theirs = getattr(args, option)
        if theirs != _default(option) and theirs != ours:
            raise DivvizInputError(f"GRPOConfig({option}={theirs!r}) contradicts the objective's {name} {ours!r}; "
                                   f"set both to the same, or drop {option}")
    if objective.surrogate is not None:
        check_surrogate_options(objective.surrogate, args)
    changed = {name: getattr(args, name) for name in ("epsilon", "epsilon_high")
               if getattr(args, name) != _default(name)}
    if objective.surrogate is None and changed and not _same_box(objective, args.epsilon, args.epsilon_high):
        names = ", ".join(f"{k}={v}" for k, v in changed.items())
        raise DivvizInputError(
            f"GRPOConfig({names}) sets TRL's clip range, which the objective's clip test "
            f"'{objective.clip.label if objective.clip else 'none'}' replaces; drop {' and '.join(changed)}")
    penalty = objective.penalty
    ref_betas = [beta for p, beta in objective.penalties if p.entry.needs_ref]
    needs_ref, beta = bool(ref_betas), (ref_betas or [0.0])[0]
    if args.beta != 0 and not (needs_ref and args.beta == beta):
        raise DivvizInputError(
            f"GRPOConfig(beta={args.beta}) adds TRL's k3 penalty, which the objective replaces; drop beta and put the "
            f"penalty in the objective, e.g. Objective(penalty=penalty('k3', importance_weight=True), beta={args.beta}) "
            "for TRL's own (use_bias_correction_kl=True)")
    if (penalty is not None and penalty.name == "k3" and penalty.params["importance_weight"]
            and args.use_bias_correction_kl is False):
        raise DivvizInputError(
            "GRPOConfig(use_bias_correction_kl=False) contradicts the objective's importance-weighted k3 penalty; "
            "drop one of them")
    if args.entropy_coef != 0 or args.use_adaptive_entropy:
        raise DivvizInputError("GRPOConfig's entropy bonus (entropy_coef, use_adaptive_entropy) is not part of a divviz "
                               "objective; drop it")
    args = copy.copy(args)
    args.beta = beta if needs_ref else 0.0
    args.delta, args.importance_sampling_level = objective.ratio_cap, objective.importance_sampling_level
    args.off_policy_mask_threshold = objective.off_policy_mask_threshold  # TRL computes it, from vLLM's log-probs
    return args


# TRL's own surrogate losses: divviz surrogate -> (TRL loss_type, the aggregation TRL gives it); their GRPOConfig options
# are the surrogate parameters' `trl_name`s
TRL_SURROGATES = {"cispo": ("cispo", "dapo"), "sapo": ("sapo", "grpo"), "vespo": ("vespo", "dapo")}


def trl_options(name: str) -> dict[str, str]:
    """The GRPOConfig option of each parameter of a TRL surrogate that TRL can set, by parameter."""
    return {p.name: p.trl_name for p in SURROGATES[name].params if p.trl_name}


def trl_loss_type(objective: Objective) -> str:
    """The GRPOConfig loss_type that goes with `objective`: its TRL surrogate's, else its aggregation."""
    if objective.surrogate is not None and objective.surrogate.name in TRL_SURROGATES:
        return TRL_SURROGATES[objective.surrogate.name][0]
    return objective.aggregation


def check_loss_type(objective: Objective, loss_type: str) -> None:
    """GRPOConfig's loss_type names both TRL's surrogate and its aggregation; it must name the objective's."""
    if objective.aggregation not in TRL_AGGREGATIONS:
        raise DivvizInputError(f"the aggregation '{objective.aggregation}' is verl's; TRL has no loss_type for it: "
                               f"choose one of {', '.join(TRL_AGGREGATIONS)}")
    name = objective.surrogate.name if objective.surrogate is not None else None
    if name in TRL_SURROGATES:
        want, aggregation = TRL_SURROGATES[name]
        if objective.aggregation != aggregation:
            raise DivvizInputError(f"TRL's {name} aggregates as {aggregation}; set the objective's aggregation to "
                                   f"'{aggregation}'")
    else:
        want = objective.aggregation
    if loss_type != want:
        raise DivvizInputError(f"GRPOConfig(loss_type='{loss_type}') contradicts the objective "
                               f"({objective.label}, aggregation '{objective.aggregation}'), whose loss_type is "
                               f"'{want}'; set loss_type='{want}'")


def check_surrogate_options(surrogate, args: GRPOConfig) -> None:
    """TRL's options of a TRL surrogate left at their defaults defer to the objective; set ones must agree."""
    if surrogate.name not in TRL_SURROGATES:
        return
    for param, option in trl_options(surrogate.name).items():
        theirs = getattr(args, option)
        if theirs != _default(option) and theirs != surrogate.params[param]:
            raise DivvizInputError(f"GRPOConfig({option}={theirs}) contradicts the objective's {surrogate.name} "
                                   f"{param}={surrogate.params[param]:g}; drop {option}")


def trl_objective(args) -> Objective | None:
    """The objective a plain `GRPOTrainer` optimises, in the catalogue's words: TRL's box [1 − epsilon,
    1 + epsilon_high] is `clip_higher` (none for its own surrogates cispo, sapo and vespo, which are catalogue
    surrogates), its `beta` k3 penalty is `k3` (importance-weighted when `use_bias_correction_kl`), `delta` the ratio
    cap, `importance_sampling_level` the level, `off_policy_mask_threshold` the off-policy mask. None where a
    setting is outside the catalogue's ranges."""
    try:
        high = args.epsilon if args.epsilon_high is None else args.epsilon_high
        k3 = penalty("k3", importance_weight=bool(args.use_bias_correction_kl)) if args.beta else None
        level = dict(penalty=k3, beta=args.beta, importance_sampling_level=args.importance_sampling_level,
                     off_policy_mask_threshold=args.off_policy_mask_threshold)
        for name, (loss_type, aggregation) in TRL_SURROGATES.items():
            if args.loss_type == loss_type:
                params = {param: getattr(args, option) for param, option in trl_options(name).items()
                          if getattr(args, option) is not None}
                return Objective(surrogate=surrogate(name, **params), aggregation=aggregation, **level)
        if args.loss_type not in TRL_AGGREGATIONS:
            return None
        return Objective(clip=clip_test("clip_higher", eps_low=args.epsilon, eps_high=high), ratio_cap=args.delta,
                         aggregation=args.loss_type, **level)
    except DivvizInputError:  # e.g. an epsilon outside the catalogue's range
        return None
