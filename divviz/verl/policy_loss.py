"""A divviz objective as a verl 0.9.1 policy loss, registered in verl's own registry (`register_policy_loss`), so that
verl trains with it by configuration:

    actor_rollout_ref.actor.policy_loss.loss_mode=divviz:kl3:delta=0.02

The loss mode is `divviz:` and the objective in the catalogue's own spelling: a clip test (`kl3:delta=0.02`,
`clip_higher:eps_low=0.2:eps_high=0.28`, `none`), optionally followed by `,surrogate=NAME[:k=v…]` (the catalogue's
surrogates: `none,surrogate=cispo`), `,penalty=NAME[:k=v…],beta=B` (a penalty toward π_old: RPG's KL losses) and
`,dual_clip_c=C` (a clip test takes verl's own `clip_ratio_c` otherwise, as its vanilla loss does).
It is checked when registered, with divviz's typed error. The token losses ℓ_t are `losses.policy_loss`'s (under verl's
rollout correction weights, when it passes them); the scalar is verl's own `agg_loss` of them with its
`loss_agg_mode` and `global_batch_info`, so data-parallel ranks aggregate exactly as verl's built-in losses do.
Penalties toward a reference policy are verl's `use_kl_loss` (its loss function is not given π_ref), and so are refused
here. Metrics: verl's `actor/pg_clipfrac`, `actor/ppo_kl`, `actor/pg_clipfrac_lower`, and divviz's
`divviz/clip_ratio/low_mean`, `divviz/clip_ratio/high_mean`, `divviz/outside_mean`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from divviz.catalogue import instances
from divviz.catalogue.params import LARGEST, DivvizInputError, Param
from divviz.losses import Objective, policy_loss

PREFIX = "divviz:"


def objective(spec: str) -> Objective:
    """The objective a loss mode's spelling names (module docstring); DivvizInputError if it is not one."""
    clip, *options = [part.strip() for part in str(spec).split(",")]
    settings = dict(option.split("=", 1) if "=" in option else (option, "") for option in options)
    unknown = set(settings) - {"surrogate", "penalty", "beta", "dual_clip_c"}
    if unknown:
        raise DivvizInputError(f"verl loss mode {spec!r}: unknown part {sorted(unknown)[0]!r} (known: surrogate=…, "
                               "penalty=…, beta=…, dual_clip_c=…)")
    number = lambda key: Param(key, 0.0, 0.0, LARGEST).check(settings[key], "verl loss mode")  # noqa: E731
    built = Objective(clip=None if clip == "none" else instances.parse(clip),
                      surrogate=instances.parse(settings["surrogate"], "surrogate") if "surrogate" in settings else None,
                      penalty=instances.parse(settings["penalty"], "penalty") if "penalty" in settings else None,
                      beta=number("beta") if "beta" in settings else 0.0,
                      dual_clip_c=number("dual_clip_c") if "dual_clip_c" in settings else None)
    if built.needs_ref:
        raise DivvizInputError(f"verl loss mode {spec!r} needs a reference policy: use verl's use_kl_loss for that")
    return built


def verl_loss(spec: str):
    """verl's policy-loss function for the objective `spec` (verl's signature and return: (loss, metrics))."""
    base = objective(spec)  # checked now, before any training
    # verl's dual-clip (its clip_ratio_c) applies to a clip test's box, as in verl's vanilla loss: not to a
    # surrogate's own loss, nor where the spelling sets dual_clip_c itself
    takes_dual = base.clip is not None and base.surrogate is None and base.dual_clip_c is None

    def compute(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                rollout_is_weights: torch.Tensor | None = None):
        from verl.trainer.ppo.core_algos import agg_loss

        chosen = replace(base, dual_clip_c=config.get("clip_ratio_c", 3.0)) if takes_dual and config is not None \
            else base
        mask = response_mask.to(log_prob.dtype)
        out = policy_loss(log_prob, old_log_prob, advantages, mask, replace(chosen, aggregation="token_sum"),
                          weight=rollout_is_weights)
        info = config.global_batch_info if config is not None else {}
        loss = agg_loss(loss_mat=out.token_loss, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **info)
        tokens = mask.sum().clamp(min=1)
        share = lambda flags: float((flags.to(mask.dtype) * mask).sum() / tokens)  # noqa: E731
        metrics = {"actor/pg_clipfrac": share(out.masked_low | out.masked_high),
                   "actor/ppo_kl": float(((old_log_prob - log_prob).detach() * mask).sum() / tokens),
                   "actor/pg_clipfrac_lower": share(out.dual_clip),
                   "divviz/clip_ratio/low_mean": share(out.masked_low),
                   "divviz/clip_ratio/high_mean": share(out.masked_high), "divviz/outside_mean": share(out.outside)}
        return loss, metrics

    return compute


def register(spec: str) -> str:
    """Register `spec`'s loss in verl's registry as `divviz:<spec>` (checked first); returns the loss mode."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    name = PREFIX + spec.strip()
    register_policy_loss(name)(verl_loss(spec.strip()))
    return name
