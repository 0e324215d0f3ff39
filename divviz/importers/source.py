"""Where an imported run came from: its config.json, written by `source_config` and read back by `source_of`.

    {"backend": "import", "model": …, "task": …, "clip": "ratio" | "clip_higher", "clip_params": {…},
     "source": {"format": "unipo" | "jsonl" | "trl" | "verl", "form": how the file held it ("JSON", "JSONL",
                "folder", "metrics only", …), "file": its name, "imported": when, "model": …, "algorithm": …,
                "clip": the file's own clip fields ({"clip_eps": [0.2, 0.28]}), or null where it gives none,
                and, once written, "steps", "per_token_steps", "dropped"}}

No seed: a file gives none, and one made up would read as a fact about the run. The clip test is the file's, else
PPO's ε = 0.2 (TRL's and verl's default too), which scores tokens where the file has them; `source.clip` says which.
"""

from __future__ import annotations

import time
from pathlib import Path

from divviz.catalogue.divergences import clip_test
from divviz.catalogue.params import DivvizInputError
from divviz.importers.names import finite
from divviz.safetext import quoted, shorten

CLIP_NAMES = ("clip_eps", "cliprange", "clip_range", "epsilon", "clip_ratio")  # the first one a header gives counts
FORMAT_NAMES = {"unipo": "UNIPO", "jsonl": "divviz JSONL", "trl": "TRL", "verl": "verl"}
ASSUMED = ("ratio", {"eps": 0.2}, None)  # (clip test, parameters, the file's fields): where a file gives no clip


def clip_setting(values: dict, where: str) -> tuple[str, dict, dict | None]:
    """(clip test, its parameters, the fields it was read from) from a header's or a config's `values`: the first of
    CLIP_NAMES given, as a number ε (PPO's box [1 − ε, 1 + ε]; with TRL's `epsilon_high` beside `epsilon`, DAPO's
    clip_higher) or a list [ε_low, ε_high] (clip_higher, the box [1 − ε_low, 1 + ε_high]); `ASSUMED` where none is
    given. A value that is no clip ε is refused, naming `where` and the field."""
    name = next((k for k in CLIP_NAMES if values.get(k) is not None), None)
    if name is None:
        return ASSUMED
    given = values[name]
    fields = {name: given}
    if isinstance(given, list):
        if len(given) != 2:
            raise DivvizInputError(f"{where} '{name}' is a list of {len(given)} values; a clip is ε or "
                                   "[ε_low, ε_high]")
        low, high = given
    else:
        low, high = given, values.get("epsilon_high") if name == "epsilon" else None
        if high is not None:
            fields["epsilon_high"] = high
    for value in (low, high) if isinstance(given, list) or high is not None else (low,):
        if finite(value) is None:
            raise DivvizInputError(f"{where} '{name}' is {quoted(given, 40)}: a clip ε is a finite number")
    clip, params = ("ratio", {"eps": low}) if high is None or high == low else \
        ("clip_higher", {"eps_low": low, "eps_high": high})
    try:
        test = clip_test(clip, **params)
    except DivvizInputError as err:
        raise DivvizInputError(f"{where} '{name}' is {quoted(given, 40)}: not a clip ε ({err})") from None
    return clip, dict(test.params), fields


def source_config(fmt: str, form: str, path: Path, *, model: object = "", task: object = "", algorithm: object = "",
                  clip: tuple[str, dict, dict | None] = ASSUMED, extra: dict | None = None) -> dict:
    """An imported run's config.json (the module's docstring gives its fields); text from the file is kept as text,
    at most 200 characters."""
    text = lambda value: value[:200] if isinstance(value, str) else ""  # noqa: E731
    name, params, fields = clip
    return {"backend": "import", "model": text(model), "task": text(task), "clip": name, "clip_params": params,
            "source": {"format": fmt, "form": form, "file": path.name[:200],
                       "imported": time.strftime("%Y-%m-%d %H:%M:%S"), "model": text(model),
                       "algorithm": text(algorithm), "clip": fields, **(extra or {})}}


def source_of(config: dict) -> str:
    """Where an imported run came from, in one line for the Runs table: "UNIPO (folder) 'grpo_metrics.json' · model
    meta-llama/Llama-3.2-1B-Instruct · grpo · clip_eps=[0.2, 0.2]"; "" for a run divviz trained (its engine or its
    TRL backend). Text from the file is cut short here and must be escaped where it is shown."""
    source = config.get("source") if isinstance(config, dict) and config.get("backend") == "import" else None
    if not isinstance(source, dict):
        return ""
    fmt, form = source.get("format"), source.get("form")
    made = f"{FORMAT_NAMES.get(fmt, shorten(str(fmt), 20))}{f' ({shorten(str(form), 20)})' if form else ''}"
    fields = source.get("clip")
    clip = " ".join(f"{shorten(str(k), 20)}={shorten(str(v), 20)}" for k, v in fields.items()) \
        if isinstance(fields, dict) and fields else "clip not given (ε = 0.2 assumed)"
    parts = [f"{made} {quoted(str(source.get('file', '')), 60)}",
             f"model {shorten(str(source.get('model') or 'not given'), 60)}",
             shorten(str(source.get("algorithm") or "algorithm not given"), 30), clip]
    return " · ".join(parts)
