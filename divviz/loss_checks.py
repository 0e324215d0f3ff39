"""What the one policy loss refuses, each in one `DivvizInputError` (a `NonFiniteInput` for a NaN or inf): the
objective's own parameters (TRL's ratio cap δ, DeepSeek-V3.2's off-policy mask threshold), how an objective's parts
combine, the configured catalogue entries it is given, the normalisers that divide the loss, and `policy_loss`'s
inputs — their types, shapes and values where the mask keeps a token. `losses.Objective` checks itself on
construction and `losses.policy_loss` its inputs on every call, through these."""

from __future__ import annotations

import math

import torch

from divviz.catalogue.divergences import ClipTest
from divviz.catalogue.params import DivvizInputError, Param
from divviz.catalogue.surrogates import LEVELS, Surrogate
from divviz.safetext import quoted, unknown


RATIO_CAP = Param("ratio_cap", 2.0, 1.0, low_open=True, trl_name="delta", typical=(1.05, 10.0, 0.05),
                  doc="TRL's delta (INTELLECT-2): the unclipped term uses min(w, δ), so no token's ratio counts above "
                      "δ; for A < 0 it is dual-clip with c = δ, for A > 0 it binds only when δ < u")


def check_ratio_cap(value) -> float | None:
    return None if value is None else RATIO_CAP.check(value, "ratio_cap")


OFF_POLICY_MASK_THRESHOLD = Param("off_policy_mask_threshold", 0.5, 0.0, trl_name="off_policy_mask_threshold",
                                  typical=(0.0, 2.0, 0.01),
                                  doc="DeepSeek-V3.2's off-policy sequence mask (TRL's off_policy_mask_threshold): "
                                      "a completion with A < 0 whose mean log π_old − log π_θ exceeds δ takes no part "
                                      "in the policy term")


def check_off_policy_mask_threshold(value) -> float | None:
    return None if value is None else OFF_POLICY_MASK_THRESHOLD.check(value, "off_policy_mask_threshold")


def check_combination(clip: ClipTest | None, surrogate: Surrogate | None, level: str, dual_clip_c, ratio_cap) -> None:
    """Refuse, in one `DivvizInputError`, what does not go together: a soft surrogate with a clip test (its weight is
    the constraint), dppo/geo_mean without one, dual-clip or the ratio cap with a surrogate (they act on PPO's
    surrogate), the sequence level with a test in π_old or with a surrogate that has its own level."""
    if level not in LEVELS:
        raise DivvizInputError(unknown("importance-sampling level", level, LEVELS))
    check_measure("clip", clip, ClipTest, "clip_test")
    check_measure("surrogate", surrogate, Surrogate, "surrogate")
    if surrogate is not None:
        name = surrogate.name
        if surrogate.entry.clip == "none" and clip is not None:
            raise DivvizInputError(f"the {name} surrogate has no clip test (its gradient weight is the constraint); "
                                   f"drop the clip test {clip.name}")
        if surrogate.entry.clip == "needs" and clip is None:
            raise DivvizInputError(f"the {name} surrogate masks tokens with a clip test; choose one (e.g. kl3)")
        for what, value in (("dual-clip", dual_clip_c), ("the ratio cap δ", ratio_cap)):
            if value is not None:
                raise DivvizInputError(f"{what} acts on PPO's clipped surrogate, not on {name}; drop it")
    if level == "sequence":
        if surrogate is not None and not surrogate.entry.sequence:
            raise DivvizInputError(f"the {surrogate.name} surrogate has a level of its own; the sequence level (GSPO) "
                                   "goes with PPO's surrogate, cispo or sapo")
        if clip is not None and clip.needs_pi_old:
            raise DivvizInputError(f"the clip test {clip.name} depends on π_old, which a sequence has not; the sequence "
                                   "level (GSPO) needs a test in the ratio alone")


def check_measure(role: str, given, kind: type, maker: str) -> None:
    """`given` is None or a configured catalogue entry of `kind`; a name or anything else is one clear error."""
    if given is None or isinstance(given, kind):
        return
    if isinstance(given, str):
        raise DivvizInputError(f"{role} is the text {quoted(given)}; build it first: {maker}({quoted(given)}) "
                               f"(from divviz.catalogue.divergences)")
    raise DivvizInputError(f"{role} must be a {kind.__name__} made by {maker}(name, …); got a {type(given).__name__}")


def check_normalisers(max_completion_length, num_items_in_batch) -> None:
    """Dr. GRPO's length and DAPO's token count divide the loss: each None or a positive number (never 0)."""
    for name, value, integral in (("max_completion_length", max_completion_length, True),
                                  ("num_items_in_batch", num_items_in_batch, False)):
        if value is None:
            continue
        number = float(value) if isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool) \
            else math.nan
        if not (math.isfinite(number) and number > 0 and (number.is_integer() or not integral)):
            kind = "a positive integer" if integral else "a positive number"
            raise DivvizInputError(f"policy_loss: {name} divides the loss, so it must be {kind} or None; "
                                   f"got {quoted(value)}")


class NonFiniteInput(DivvizInputError):
    """An input of `policy_loss` is NaN or infinite where the mask keeps a token; `name` says which. Training
    rewords it for logp_new: there it means the policy diverged, not that the caller passed bad numbers."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


def check_inputs(logp_new, logp_old, adv, mask, logp_ref=None, weight=None, logp_sampling=None) -> None:
    """`policy_loss`'s inputs, or one `DivvizInputError` saying what is wrong: torch tensors; floating-point
    log-probs and advantages (a weight may also be a bool mask); logp_old, mask, logp_ref and logp_sampling shaped
    like logp_new, (B, T) with B, T ≥ 1; adv (B,), (B, 1) or (B, T); weight (B, T) or (B, 1); finite values wherever
    the mask keeps a token (else `NonFiniteInput`); logp_old ≤ 0 there."""
    given = {"logp_new": logp_new, "logp_old": logp_old, "adv": adv, "mask": mask, "logp_ref": logp_ref,
             "weight": weight, "logp_sampling": logp_sampling}
    for name, x in given.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise DivvizInputError(f"policy_loss: {name} is a {type(x).__module__}.{type(x).__name__}; it takes torch "
                                   "tensors (torch.as_tensor converts an array)")
        if x is not None and name not in ("mask", "weight") and not x.is_floating_point():
            raise DivvizInputError(f"policy_loss: {name} must hold floating-point numbers, not {x.dtype}")
    if logp_new.dim() != 2 or 0 in logp_new.shape:
        raise DivvizInputError(f"policy_loss: logp_new must be (B, T) with B, T ≥ 1 (completions × tokens); "
                               f"got shape {tuple(logp_new.shape)}")
    batch, tokens = logp_new.shape
    allowed = {"logp_old": [(batch, tokens)], "mask": [(batch, tokens)], "logp_ref": [(batch, tokens)],
               "logp_sampling": [(batch, tokens)],
               "adv": [(batch,), (batch, 1), (batch, tokens)], "weight": [(batch, tokens), (batch, 1)]}
    for name, shapes in allowed.items():
        x = given[name]
        if x is not None and tuple(x.shape) not in shapes:
            raise DivvizInputError(f"policy_loss: {name} has shape {tuple(x.shape)}; with logp_new {(batch, tokens)} "
                                   f"it must be {' or '.join(map(str, shapes))}")
    active = mask > 0
    for name in ("logp_new", "logp_old", "logp_ref", "logp_sampling", "adv", "weight"):
        x = given[name]
        if x is None:
            continue
        bad = ~torch.isfinite(x.detach().reshape(batch, -1).expand(batch, tokens)) & active
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            value = x.detach().reshape(batch, -1).expand(batch, tokens)[row, col].item()
            raise NonFiniteInput(f"policy_loss: {name} is {value} at completion {row}, token {col}, which the mask "
                                 "keeps; only masked positions may hold NaN or inf", name)
    above_one = (logp_old.detach() > 0) & active  # π_old in (0, 1]: the clip tests in π_old depend on it
    if bool(above_one.any()):
        row, col = (int(i) for i in above_one.nonzero()[0])
        raise DivvizInputError(f"policy_loss: logp_old is {logp_old[row, col].item():.6g} at completion {row}, token "
                               f"{col}: a log-probability is at most 0 (π_old in (0, 1])")
