"""One run configuration, checked when built; `config.json` in a run folder is exactly `RunConfig.to_dict()`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from typing import Mapping

from divviz.catalogue.aggregation import BASELINES, check_scale_rewards
from divviz.catalogue.divergences import clip_test
from divviz.engine.completions import BYTE_CAP, MAX_BYTES
from divviz.engine.models import model_defaults, model_settings
from divviz.engine.policy import DEVICES, DTYPES
from divviz.engine.prompts import PROMPT_FORMATS
from divviz.engine.tasks import TASKS
from divviz.losses import Objective
from divviz.catalogue.params import DivvizInputError, Param, check_params
from divviz.catalogue.penalties import penalty
from divviz.catalogue.rollout_correction import SAMPLER_DTYPES, RolloutCorrection
from divviz.safetext import quoted, unknown
from divviz.catalogue.surrogates import surrogate

ROLLOUT_LAG = Param("rollout_lag", 0, 0, 64, high_open=False, kind="int", typical=(0, 16, 1),
                    doc="the sampler's weights are this many updates behind the trained policy (asynchronous RL; 0: "
                        "current)")

RUN_PARAMS = (
    Param("steps", 60, 1, 100_000, high_open=False, kind="int", typical=(1, 200, 1), doc="GRPO steps"),
    Param("prompts", 16, 1, 4096, high_open=False, kind="int", typical=(1, 64, 1), doc="prompts per step"),
    Param("group_size", 8, 2, 256, high_open=False, kind="int", typical=(2, 32, 1),
          doc="G, completions per prompt (TRL num_generations)"),
    Param("mu", 2, 1, 16, high_open=False, kind="int", typical=(1, 8, 1),
          doc="μ, passes over each rollout batch (TRL num_iterations, verl ppo_epochs)"),
    Param("minibatches", 1, 1, 256, high_open=False, kind="int", typical=(1, 16, 1),
          doc="K, optimiser steps per pass: the batch's completions shuffled once and split into K equal "
              "mini-batches, all trained against the sampling policy π_old (TRL steps_per_generation; verl "
              "batch / ppo_mini_batch_size); every mini-batch after the first is off-policy (1: one step per pass)"),
    Param("lr", 2e-3, 0.0, 1.0, low_open=True, high_open=False, typical=(1e-6, 1e-2, 1e-6),
          doc="AdamW learning rate"),
    Param("temperature", 1.0, 0.0, 10.0, low_open=True, high_open=False, typical=(0.1, 2.0, 0.05),
          doc="sampling temperature; the loss uses the same tempered policy (as TRL)"),
    Param("max_new_tokens", 8, 1, 4096, high_open=False, kind="int", typical=(1, 64, 1),
          doc="longest completion (TRL max_completion_length)"),
    Param("seed", 0, 0, 2**31 - 1, high_open=False, kind="int", typical=(0, 999, 1), doc="seed of everything"),
    Param("format_reward", 0.0, 0.0, 1.0, high_open=False, typical=(0.0, 0.5, 0.05),
          doc="reward for a wrong but well-formed answer"),
    Param("max_grad_norm", 1.0, 0.0, low_open=True, typical=(0.1, 10.0, 0.1), doc="gradient clipping"),
    Param("top_entropy_quantile", 1.0, 0.0, 1.0, low_open=True, high_open=False, trl_name="top_entropy_quantile",
          typical=(0.05, 1.0, 0.05), doc="TRL's top-entropy mask: the policy term acts only on the tokens whose "
                                         "entropy is in the batch's top share ρ (1: every token)"),
    ROLLOUT_LAG,
    Param("checkpoint_every", 10, 0, 100_000, high_open=False, kind="int", typical=(0, 100, 1),
          doc="save the weights every N steps for the same-batch comparison (0: never; models ≤ 50M parameters)"),
    Param("inspect_prompts", 2, 0, 4096, high_open=False, kind="int", typical=(0, 16, 1),
          doc="prompts per step whose G completions are kept whole, every token's facts, for the step inspector "
              "(0: none)"),
    Param("inspect_bytes", BYTE_CAP, 1_024, MAX_BYTES, high_open=False, kind="int", typical=(1_024, 4_194_304, 1_024),
          doc="the most bytes of one step's kept completions (the later completions are left out)"),
    Param("eval_every", 0, 0, 100_000, high_open=False, kind="int", typical=(0, 100, 1),
          doc="evaluate on the task's held-out problems before the first step, every N steps and after the last "
              "(0: never): sampled and greedy accuracy with their 95% intervals"),
    Param("trainable_blocks", 0, 0, 1_000, high_open=False, kind="int", typical=(0, 30, 1),
          doc="train only the last N transformer blocks (and the final norm), the rest frozen: a CPU step of a real "
              "model in seconds (0: every parameter)"),
)


BACKENDS = ("divviz", "trl")  # divviz's own engine, or TRL's GRPOTrainer through divviz.trl
ROLLOUT_KEYS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                "rollout_rs_threshold")  # verl's RolloutCorrectionConfig, as a run config holds them


RENAMED_KEYS = {"off_policy_mask": "off_policy_mask_threshold"}  # a config.json's earlier spelling: its key now
EARLIER_KEYS = {new: old for old, new in RENAMED_KEYS.items()}


def current_keys(settings: Mapping) -> dict:
    """A run config's settings with earlier spellings read as today's (`RENAMED_KEYS`): published runs keep theirs."""
    return {RENAMED_KEYS.get(k, k): v for k, v in settings.items()}


def identity_keys(settings: Mapping) -> dict:
    """Settings as the hashes that name published results spell them: a renamed key under its earlier spelling
    (`RENAMED_KEYS`), so that a rename leaves every published cell and batch this code's."""
    return {EARLIER_KEYS.get(k, k): v for k, v in settings.items()}


OBJECTIVE_KEYS = ("clip", "clip_params", "surrogate", "surrogate_params", "penalty", "penalty_params", "beta",
                  "second_penalty", "second_penalty_params", "second_beta", "off_policy_mask_threshold", "dual_clip_c",
                  "ratio_cap", "importance_sampling_level", "aggregation")  # an objective in a config.json


def objective_from(settings: Mapping) -> Objective:
    """The objective named by a run config's objective keys (clip, clip_params, surrogate, surrogate_params, penalty,
    penalty_params, beta, second_penalty, second_penalty_params, second_beta, dual_clip_c, ratio_cap,
    off_policy_mask_threshold, importance_sampling_level, aggregation): a `RunConfig`, or a config.json written by the
    engine or by `divviz.trl` (an older one lacks the newer keys or spells one as it was, `current_keys`)."""
    settings = current_keys(settings)
    clip, pen, sur = settings.get("clip"), settings.get("penalty"), settings.get("surrogate")
    second = settings.get("second_penalty")
    return Objective(
        clip=clip_test(clip, **(settings.get("clip_params") or {})) if clip else None,
        penalty=penalty(pen, **(settings.get("penalty_params") or {})) if pen else None,
        beta=settings.get("beta", 0.0) if pen else 0.0, dual_clip_c=settings.get("dual_clip_c"),
        aggregation=settings.get("aggregation", "grpo"),
        surrogate=surrogate(sur, **(settings.get("surrogate_params") or {})) if sur else None,
        importance_sampling_level=settings.get("importance_sampling_level", "token"),
        ratio_cap=settings.get("ratio_cap"),
        second_penalty=penalty(second, **(settings.get("second_penalty_params") or {})) if second else None,
        second_beta=settings.get("second_beta", 0.0) if second else 0.0,
        off_policy_mask_threshold=settings.get("off_policy_mask_threshold"),
    )


def correction_from(settings: Mapping) -> RolloutCorrection:
    """The rollout correction named by a config's verl keys (`ROLLOUT_KEYS`; an older config has none: no correction)."""
    defaults = RolloutCorrection()
    return RolloutCorrection(**{k: settings.get(k, getattr(defaults, k)) for k in ROLLOUT_KEYS})


def rollout_label(settings: Mapping) -> str:
    """How a config's rollout differs from on-policy sampling: "sampler bfloat16, lag 2 · TIS token u=2 · bypass";
    "" when it does not."""
    dtype, lag = settings.get("rollout_dtype", "same"), settings.get("rollout_lag", 0)
    sampler = ", ".join(([] if dtype == "same" else [dtype]) + ([f"lag {lag}"] if lag else []))
    correction = correction_from(settings)
    parts = ([f"sampler {sampler}"] if sampler else []) + ([correction.label] if correction.active else [])
    return " · ".join(parts + (["bypass"] if settings.get("bypass_mode") else []))


def config_label(settings: Mapping) -> str:
    """A run's legend label from its config: the objective's, then how its rollout differs (`rollout_label`)."""
    return " · ".join(part for part in (objective_from(settings).label, rollout_label(settings)) if part)


def _objective_of(settings: dict) -> Objective:
    """The objective of a run's settings (`OBJECTIVE_KEYS`; no clip test given: PPO's ratio box), its parameters
    checked; parameters given without their entry are refused."""
    settings = {"clip": "ratio", **settings}
    for what, given, flag in (("clip test", "clip_params", "--clip-test"),
                              ("surrogate", "surrogate_params", "--surrogate"),
                              ("penalty", "penalty_params", "--penalty"),
                              ("second penalty", "second_penalty_params", "--penalty2")):
        if settings.get(given) and not settings.get(given.removesuffix("_params")):
            raise DivvizInputError(f"parameters {', '.join(map(quoted, settings[given]))} were given without a "
                                   f"{what} ({flag}); choose one or drop them")
    for name in ("clip", "surrogate", "penalty", "second_penalty", "importance_sampling_level", "aggregation"):
        if settings.get(name) is not None and not isinstance(settings[name], str):
            raise DivvizInputError(f"run: {name} must be a name; got {quoted(settings[name])}")
    return objective_from(settings)


def objective_settings(objective: Objective) -> dict:
    """The inverse of `objective_from`: the objective keys of a config, with checked parameters."""
    return {"clip": objective.clip.name if objective.clip else None,
            "clip_params": dict(objective.clip.params) if objective.clip else {},
            "surrogate": objective.surrogate.name if objective.surrogate else None,
            "surrogate_params": dict(objective.surrogate.params) if objective.surrogate else {},
            "penalty": objective.penalty.name if objective.penalty else None,
            "penalty_params": dict(objective.penalty.params) if objective.penalty else {},
            "beta": objective.beta, "dual_clip_c": objective.dual_clip_c, "ratio_cap": objective.ratio_cap,
            "importance_sampling_level": objective.importance_sampling_level, "aggregation": objective.aggregation,
            "second_penalty": objective.second_penalty.name if objective.second_penalty else None,
            "second_penalty_params": dict(objective.second_penalty.params) if objective.second_penalty else {},
            "second_beta": objective.second_beta, "off_policy_mask_threshold": objective.off_policy_mask_threshold}


RECORDED = ("prompting", "precision")  # what the run writes into its config.json once started: facts, not settings
KEPT_ONLY = ("checkpoint_every", "inspect_prompts", "inspect_bytes")  # what a run keeps, not how it trains
REWARD_SOURCES = ("task", "random")  # the task's checker, or a seeded coin per completion (Park et al. 2025)


def setting_of(config: Mapping) -> str:
    """The name of the setting of the config's model that it trains at ("learn", "stress"; `models.model_settings`),
    "" for none: the one whose every field but its length (`steps`) and what a run keeps (`KEPT_ONLY`) the config has
    — the most specific when several do. A run folder records its settings, not the name they came from."""
    fields = lambda setting: {k: v for k, v in setting.items() if k not in (*KEPT_ONLY, "steps")}  # noqa: E731
    matches = [(len(fields(setting)), name) for name, setting in model_settings(config.get("model", "")).items()
               if all(config.get(k) == v for k, v in fields(setting).items())]
    return max(matches)[1] if matches else ""


def check_choices(cfg: "RunConfig") -> None:
    """Each named setting is one divviz knows (else `DivvizInputError`, naming the choices)."""
    choices = {"task": TASKS, "reward": REWARD_SOURCES, "baseline": BASELINES, "backend": BACKENDS,
               "prompt format": PROMPT_FORMATS, "device": DEVICES, "dtype": DTYPES, "rollout_dtype": SAMPLER_DTYPES}
    for name, known in choices.items():
        value = getattr(cfg, name.replace(" ", "_"))
        if not isinstance(value, str) or value not in known:
            raise DivvizInputError(unknown(name, value, known))
    if not isinstance(cfg.bypass_mode, bool):
        raise DivvizInputError(f"bypass_mode must be true or false; got {quoted(cfg.bypass_mode)}")


def check_combination(cfg: "RunConfig", correction: RolloutCorrection) -> None:
    """The settings train together: mini-batches split the step's completions, and what the TRL backend and verl's
    bypass mode cannot do is asked of neither."""
    completions = cfg.prompts * cfg.group_size
    if completions % cfg.minibatches:
        raise DivvizInputError(f"{completions} completions per step (prompts × group_size) do not split into "
                               f"{cfg.minibatches} equal mini-batches; choose K dividing {completions}")
    if cfg.bypass_mode and correction.active:
        raise DivvizInputError("in bypass mode π_old is the sampler's, so the loss's own ratio corrects: verl's token "
                               "TIS is the surrogate cispo:lo=0:hi=u, IcePop the surrogate icepop; drop rollout_is "
                               "and rollout_rs")
    if cfg.backend != "trl":
        return
    if importlib.util.find_spec("trl") is None:
        raise DivvizInputError("the TRL backend needs TRL, which is not installed: pip install 'divviz[trl]'")
    if cfg.reward == "random":
        raise DivvizInputError("the random-reward control trains with the divviz backend")
    if cfg.baseline != "group":
        raise DivvizInputError("TRL's GRPOTrainer subtracts each group's mean; the batch-mean baseline trains "
                               "with the divviz backend")
    if cfg.rollout_dtype != "same" or cfg.rollout_lag or correction.active or cfg.bypass_mode:
        raise DivvizInputError("TRL's GRPOTrainer samples with the policy it trains (its vLLM correction is TRL's "
                               "vllm_importance_sampling_*, which DivvizGRPOTrainer honours); a simulated rollout "
                               "mismatch and verl's corrections train with the divviz backend")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run. Build with `RunConfig.make(...)`, which checks every field."""

    task: str = "reverse"
    reward: str = "task"  # "random": the random-reward control, a seeded fair coin per completion (`tasks.coin_rewards`)
    backend: str = "divviz"
    model: str = "builtin"
    prompt_format: str = "auto"  # `engine/prompts.py`: compact, chat (the tokenizer's template), or auto
    device: str = "auto"
    dtype: str = "auto"  # the forward passes' precision (`policy.pick_dtype`): auto, float32 or bfloat16
    objective: Objective = field(default_factory=lambda: objective_from({"clip": "ratio"}))  # config.json: its keys
    scale_rewards: str = "group"  # TRL's: "group", "batch" or "none" (True/False of older configs: group/none)
    baseline: str = "group"  # the mean subtracted from a reward: its group's, or the batch's (RPG's batch mean)
    rollout_dtype: str = "same"  # the sampler's precision (`engine/sampler.py`): same, bfloat16 or float16
    rollout_is: str | None = None  # verl's rollout correction (`rollout_correction.RolloutCorrection`)
    rollout_is_threshold: float | str = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | None = None
    bypass_mode: bool = False  # verl's: π_old is the sampler's log-probs (no forward of the trained policy for them)
    trust_remote_code: bool = False
    steps: int = 60
    prompts: int = 16
    group_size: int = 8
    mu: int = 2
    minibatches: int = 1
    lr: float = 2e-3
    temperature: float = 1.0
    max_new_tokens: int = 8
    seed: int = 0
    format_reward: float = 0.0
    max_grad_norm: float = 1.0
    top_entropy_quantile: float = 1.0
    rollout_lag: int = 0
    checkpoint_every: int = 10
    inspect_prompts: int = 2
    inspect_bytes: int = BYTE_CAP
    eval_every: int = 0
    trainable_blocks: int = 0

    @staticmethod
    def make(**values) -> "RunConfig":
        """A checked run; what is not given takes the model's defaults (`engine/models.py`), then the fields'."""
        if not isinstance(values.get("model", "builtin"), str):
            raise DivvizInputError(f"run: model must be a name or a folder; got {quoted(values['model'])}")
        values = {**model_defaults(values.get("model", "builtin")), **current_keys(values)}
        if "objective" not in values:  # a config.json's keys, or the CLI's and the pages' settings
            values["objective"] = _objective_of({k: values.pop(k) for k in OBJECTIVE_KEYS if k in values})
        elif not isinstance(values["objective"], Objective) or set(OBJECTIVE_KEYS) & set(values):
            raise DivvizInputError("run: give an Objective, or the objective's settings (clip, penalty, …), not both")
        numbers = {p.name: values.pop(p.name) for p in RUN_PARAMS if p.name in values}
        if "scale_rewards" in values:
            values["scale_rewards"] = check_scale_rewards(values["scale_rewards"])
        checked = check_params("run", RUN_PARAMS, numbers)
        known = set(RunConfig.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise DivvizInputError(f"run: unknown setting {quoted(unknown[0])}")
        cfg = RunConfig(**values, **checked)
        check_choices(cfg)
        correction = cfg.correction()
        check_combination(cfg, correction)
        return replace(cfg, **{k: getattr(correction, k) for k in ROLLOUT_KEYS})

    def correction(self) -> RolloutCorrection:
        return correction_from(self.to_dict())

    def to_dict(self) -> dict:
        """config.json's fields: the objective as its keys (`objective_settings`), in its place."""
        flat = {}
        for name in self.__dataclass_fields__:
            flat.update(objective_settings(self.objective) if name == "objective" else {name: getattr(self, name)})
        return flat

    @staticmethod
    def from_dict(data: dict) -> "RunConfig":
        """The run of a config.json; what the run recorded once it started (`RECORDED`: what it asked, `prompting`,
        and the precision it ran in) is not a setting."""
        return RunConfig.make(**{k: v for k, v in data.items() if k not in RECORDED})

    @property
    def label(self) -> str:
        return config_label(self.to_dict())
