"""How a task's problems reach the model: the compact prompt as it is ("17+8="), or asked in words through the
tokenizer's chat template, as a chat model expects.

`prompt_format` "auto" is "chat" for a tokenizer that has a chat template and "compact" for one that has none (the
built-in character model keeps its compact prompts). In the chat form the user message is the task's `question`,
the template adds what the model's own template adds (SmolLM2's: its default system message) and the assistant's
turn opening (`add_generation_prompt`), and the reward reads the reply through the task's extractor. A run records
what it asked (`prompting`): the format, the extractor and the template text.
"""

from __future__ import annotations

from divviz.catalogue.params import DivvizInputError
from divviz.engine.tasks import Task
from divviz.safetext import unknown

PROMPT_FORMATS = ("auto", "compact", "chat")


def resolve_format(requested: str, tokenizer) -> str:
    """"compact" or "chat" for `requested` with this tokenizer; "chat" without a template is refused."""
    if requested not in PROMPT_FORMATS:
        raise DivvizInputError(unknown("prompt format", requested, PROMPT_FORMATS))
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested == "chat" and not has_template:
        raise DivvizInputError("prompt format 'chat' needs a tokenizer with a chat template; this one has none "
                               "(use compact)")
    return ("chat" if has_template else "compact") if requested == "auto" else requested


def shown_prompts(task: Task, prompts: list[str], fmt: str) -> list[str]:
    """What each prompt asks, as a person reads it: the compact prompt, or the question in words."""
    return [task.question(p) for p in prompts] if fmt == "chat" else list(prompts)


def prompt_ids(tokenizer, task: Task, prompts: list[str], fmt: str) -> list[list[int]]:
    """The token ids the model sees for each compact prompt (`asked_ids` of its `shown_prompts`)."""
    return asked_ids(tokenizer, shown_prompts(task, prompts, fmt), fmt)


def asked_ids(tokenizer, asked: list[str], fmt: str) -> list[list[int]]:
    """The token ids of prompts as asked (`shown_prompts`): the tokenizer's encoding (with its BOS) in the compact
    form, or the chat template applied to the question (specials come from the template, none are added twice)."""
    if fmt == "compact":
        return tokenizer(asked)["input_ids"]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in asked]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def prompting(tokenizer, task: Task, fmt: str) -> dict:
    """What a run asked, for its config: the format, the extractor (documented in `engine/tasks.py`) and the chat
    template used (None in the compact form)."""
    chat = fmt == "chat"
    return {"format": fmt, "extractor": task.extract.__name__.lstrip("_") if chat else "whole completion",
            "chat_template": tokenizer.chat_template if chat else None,
            "example": shown_prompts(task, [task.batch(seed=0, n=1)[0][0]], fmt)[0]}
