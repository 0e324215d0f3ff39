"""divviz's JSONL import format: one step per line, so that any trainer exports in a few lines and any size streams.

    {"header": {"model": "…", "task": "…", "clip_eps": 0.2}}          optional first line
    {"prompts": [{"prompt": "…", "completions": [{
        "text": "…", "reward": 1.0,
        "ids": [..], "pieces": [..],                                     the tokens, as the tokenizer decodes each
        "logp_old": [..], "logp": [..],                                  log π_old and log π at the update, per token
        "adv": [..]  (or "advantage": 0.5 for every token),
        "logp_ref": [..], "logp_roll": [..]}]}],                         optional: π_ref, the sampler's π_roll
     "metrics": {"entropy": 1.2, …}}                                    optional: the trainer's own numbers

The header's `clip_eps` is ε or [ε_low, ε_high] (`source.clip_setting`). Each line becomes one divviz step, numbered
from 1 in file order. A line is read at a time (at most `files.MAX_LINE_BYTES`); `export_record` writes an engine
run's recorded step in this format (tests round-trip it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers.files import first_line, json_lines
from divviz.importers.names import metrics_row
from divviz.importers.source import clip_setting, source_config
from divviz.importers.steps import Group, Step, checked_completion


def read(path: Path) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps as they are read), or DivvizInputError naming the first fault (the steps are
    checked as they are read: `steps.write_run` removes what it wrote when one is refused)."""
    first, _ = first_line(path)
    header = first.get("header") if isinstance(first, dict) and isinstance(first.get("header"), dict) else None
    config = source_config("jsonl", "JSONL", path, model=(header or {}).get("model"), task=(header or {}).get("task"),
                           clip=clip_setting(header or {}, "header"))

    def steps() -> Iterator[Step]:
        with open(path, "rb") as handle:
            lines = json_lines(handle, path.name)
            if header is not None:
                next(lines)
            for number, (line, value) in enumerate(lines, start=1):
                yield _step(value, line, number)

    return config, steps()


def _step(value: object, line: int, number: int) -> Step:
    """Line `line`'s step, the run's step `number`."""
    where = f"line {line}"
    if not isinstance(value, dict) or not isinstance(value.get("prompts"), list):
        raise DivvizInputError(f"{where}: a step needs a 'prompts' list")
    groups = []
    for p, prompt in enumerate(value["prompts"]):
        if not isinstance(prompt, dict) or not isinstance(prompt.get("prompt"), str) \
                or not isinstance(prompt.get("completions"), list):
            raise DivvizInputError(f"{where}, prompt {p + 1}: needs 'prompt' text and a 'completions' list")
        group = Group(prompt["prompt"])
        for c, completion in enumerate(prompt["completions"]):
            here = f"{where}, prompt {p + 1}, completion {c + 1}"
            if not isinstance(completion, dict):
                raise DivvizInputError(f"{here}: not an object")
            for name in ("ids", "pieces", "logp_old", "logp"):
                if not isinstance(completion.get(name), list):
                    raise DivvizInputError(f"{here}: lacks '{name}' (a list)")
            adv = completion.get("adv")
            if adv is None:
                one = completion.get("advantage")
                if not isinstance(one, (int, float)) or isinstance(one, bool):
                    raise DivvizInputError(f"{here}: lacks 'adv' (per token) or 'advantage'")
                adv = [float(one)] * len(completion["ids"])
            group.completions.append(checked_completion({**completion, "adv": adv}, here))
        groups.append(group)
    metrics, dropped = metrics_row(value.get("metrics"), {}, f"step {number}")
    return Step(groups, metrics, number, dropped)


def export_record(record: dict, metrics: dict | None = None) -> dict:
    """An engine step record (`engine.completions`) as one line of this format: log π_old from π_old, log π at the
    update from π_old·w (the ratio at its last optimiser step). Tokens the loss did not see cannot be exported (no
    ratio): such a record is refused."""
    prompts = []
    for group in record["groups"]:
        completions = []
        for c in group["completions"]:
            t = c["tokens"]
            if t.get("ratio") is None or any(w is None for w in t["ratio"]):
                raise DivvizInputError("a token of this record has no ratio (the loss did not see it)")
            logp_old = [math.log(p) for p in t["pi_old"]]
            completions.append({"text": c["text"], "reward": c["reward"], "ids": t["id"], "pieces": t["piece"],
                                "logp_old": logp_old, "logp": [lp + math.log(w) for lp, w in zip(logp_old, t["ratio"])],
                                "adv": t["adv"]})
        prompts.append({"prompt": group["prompt"], "completions": completions})
    return {"prompts": prompts, **({"metrics": metrics} if metrics else {})}
