"""UNIPO's run logs (poloclub/unipo) as a divviz run, in each form UNIPO reads or writes (`docs/canonical_schema.json`,
`scripts/build_data.py`):

- JSON: one document, a `header` (task, model_name, algorithm, hparams …), an optional `blueprint` whose `prompts`
  stand in for those of an entry that has none, and `entries`, one per model update (mini-batch updates included),
  each with `step`, `metrics` and a few `prompts`, each prompt with its `responses`: reward, advantage, and `tokens`
  with `ids`, `strings`, `log_probs` (or `prob`: log_probs = log prob, as build_data.py converts it),
  `old_log_probs`, optional `ref_log_probs` and per-token `advantages` (else the response's advantage on every
  token). With no prompts anywhere (UNIPO's published `static/grpo_metrics.json`), the run is its metrics alone.
- JSONL: a first line `{"type": "header", …the header's fields}`, then one `{"type": "step", …an entry}` a line,
  streamed (no blueprint).
- a folder as build_data.py writes it: `<algo>_metrics.json` (the header and every entry's step and metrics) beside
  `<algo>/step-N.json` (`{"step": N, "prompts": […]}`, for the entries that had prompts). Name the folder that holds
  both, or `<algo>/` itself.

Entry k in file order becomes divviz step k (from 1), with UNIPO's own `step` kept as `unipo/step`; UNIPO's steps
must increase. The ratio is exp(log_probs − old_log_probs); the run's clip test is the header's `hparams.clip_eps`
(a number ε, or UNIPO's [ε_low, ε_high]: DAPO's clip_higher) or another of `source.CLIP_NAMES`; the metrics are named
as `names.DIVVIZ_NAMES["unipo"]` says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers.files import json_lines, read_document
from divviz.importers.names import finite, metrics_row, names_for
from divviz.importers.source import clip_setting, source_config
from divviz.importers.steps import Group, Step, check_order, checked_completion
from divviz.safetext import quoted

NAMES = {"pieces": "strings", "logp_old": "old_log_probs", "logp": "log_probs", "adv": "advantages",
         "logp_ref": "ref_log_probs"}  # divviz's names for a completion's lists → the schema's, for messages
STEP_FILE = re.compile(r"step-(\d+)\.json")


def read(path: Path, document: object) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps) of a UNIPO JSON document, or DivvizInputError naming the first fault."""
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise DivvizInputError(f"{path.name}: not UNIPO's schema (no 'entries' list)")
    entries = document["entries"]
    blueprint = document.get("blueprint")
    shared = blueprint.get("prompts") if isinstance(blueprint, dict) else None
    prompted = shared is not None or any(isinstance(e, dict) and e.get("prompts") for e in entries)
    form = "JSON with a blueprint" if shared is not None else "JSON" if prompted else "JSON, metrics only"
    config, names = _config(document.get("header"), path, form)
    return config, _steps(((f"entry {e + 1}", entry) for e, entry in enumerate(entries)), names, shared)


def read_jsonl(path: Path) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps as they are read) of a UNIPO JSONL file."""
    with open(path, "rb") as handle:
        number, first = next(json_lines(handle, path.name), (1, None))
    if not isinstance(first, dict) or first.get("type") != "header":
        raise DivvizInputError(f"{path.name}: line {number} is not UNIPO's header line ({{\"type\": \"header\", …}})")
    config, names = _config({k: v for k, v in first.items() if k != "type"}, path, "JSONL")

    def entries():
        with open(path, "rb") as handle:
            lines = json_lines(handle, path.name)
            next(lines)
            for number, value in lines:
                if not isinstance(value, dict) or value.get("type") != "step":
                    raise DivvizInputError(f"line {number} is not a step line ({{\"type\": \"step\", …}})")
                yield f"line {number}", value

    return config, _steps(entries(), names)


def read_folder(path: Path) -> tuple[dict, Iterator[Step]]:
    """(the run's config, its steps) of a folder as UNIPO's build_data.py writes it: every entry's metrics, and the
    tokens of those whose step file exists."""
    metrics_file = _metrics_file(path)
    key = metrics_file.name[:-len("_metrics.json")]
    document = read_document(metrics_file)
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise DivvizInputError(f"{metrics_file.name}: not UNIPO's schema (no 'entries' list)")
    entries = document["entries"]
    steps = [entry.get("step") if isinstance(entry, dict) else None for entry in entries]
    for e, step in enumerate(steps):
        if not _count(step):
            raise DivvizInputError(f"{metrics_file.name} entry {e + 1}: 'step' is {quoted(step, 30)}, not a count "
                                   "(a folder's step files are found by it)")
    folder = metrics_file.parent / key
    files = {int(m[1]): p for p in (folder.iterdir() if folder.is_dir() else []) if (m := STEP_FILE.fullmatch(p.name))}
    orphans = sorted(set(files) - set(steps))
    if orphans:
        raise DivvizInputError(f"{key}/{files[orphans[0]].name} belongs to no entry of {metrics_file.name}")
    config, names = _config(document.get("header"), metrics_file, "folder")

    def entries_with_prompts():
        for e, (entry, step) in enumerate(zip(entries, steps)):
            if step not in files:
                yield f"{metrics_file.name} entry {e + 1}", entry
                continue
            record = read_document(files[step])
            if not isinstance(record, dict) or not isinstance(record.get("prompts"), list):
                raise DivvizInputError(f"{key}/{files[step].name}: no 'prompts' list")
            where = f"{metrics_file.name} entry {e + 1} ({key}/{files[step].name})"
            yield where, {**entry, "prompts": record["prompts"]}

    return config, _steps(entries_with_prompts(), names)


def _metrics_file(path: Path) -> Path:
    """The `<algo>_metrics.json` of a UNIPO folder: the one in `path`, or the one beside `path` = `<algo>/`."""
    found = sorted(path.glob("*_metrics.json"))
    if len(found) == 1:
        return found[0]
    beside = path.parent / f"{path.name}_metrics.json"
    if not found and beside.is_file():
        return beside
    if found:
        runs = ", ".join(p.name[:-len("_metrics.json")] for p in found)
        raise DivvizInputError(f"{path.name} holds {len(found)} UNIPO runs ({runs}): name one run's step folder "
                               f"(e.g. {path.name}/{found[0].name[:-len('_metrics.json')]}), or its metrics file")
    raise DivvizInputError(f"{path.name} holds no <algo>_metrics.json and none is beside it: not a UNIPO folder")


def _config(header: object, path: Path, form: str) -> tuple[dict, dict[str, str]]:
    """The run's config from UNIPO's header, and the metric names for its rows (`names.names_for`)."""
    header = header if isinstance(header, dict) else {}
    hparams = header.get("hparams") if isinstance(header.get("hparams"), dict) else {}
    config = source_config("unipo", form, path, model=header.get("model_name"), task=header.get("task"),
                           algorithm=header.get("algorithm"), clip=clip_setting(hparams, "header hparams"),
                           extra={"header": {k: header[k] for k in ("dataset", "reward_strategy")
                                             if isinstance(header.get(k), str)}})
    return config, names_for("unipo", hparams)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _steps(entries, names: dict[str, str], shared: list | None = None) -> Iterator[Step]:
    """A Step per (where, entry), numbered from 1: its metrics, and its prompts' tokens (the entry's, else the
    blueprint's `shared` prompts; none: a metrics-only step)."""
    last = None
    for number, (where, entry) in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise DivvizInputError(f"{where}: not an object")
        own = entry.get("step")
        if own is not None:
            if not _count(own):
                raise DivvizInputError(f"{where}: 'step' is {quoted(own, 30)}, not a count")
            check_order(own, last, where)
            last = own
        metrics, dropped = metrics_row(entry.get("metrics"), names, f"step {number}")
        if own is not None:
            metrics["unipo/step"] = float(own)
        prompts = entry.get("prompts") if entry.get("prompts") is not None else shared
        yield Step(_groups(prompts, where) if prompts else None, metrics, number, dropped)


def _groups(prompts: object, where: str) -> list[Group]:
    if not isinstance(prompts, list):
        raise DivvizInputError(f"{where}: 'prompts' is not a list")
    groups = []
    for p, prompt in enumerate(prompts):
        if not isinstance(prompt, dict) or not isinstance(prompt.get("prompt"), str) \
                or not isinstance(prompt.get("responses"), list):
            raise DivvizInputError(f"{where}, prompt {p + 1}: needs 'prompt' text and a 'responses' list")
        group = Group(prompt["prompt"])
        for r, response in enumerate(prompt["responses"]):
            group.completions.append(_completion(response, f"{where}, prompt {p + 1}, response {r + 1}"))
        groups.append(group)
    return groups


def _completion(response: object, here: str):
    tokens = response.get("tokens") if isinstance(response, dict) else None
    if not isinstance(tokens, dict):
        raise DivvizInputError(f"{here}: no 'tokens'")
    logp, names = tokens.get("log_probs"), NAMES
    if logp is None and "prob" in tokens:
        logp, names = _log_probs(tokens["prob"], here), {**NAMES, "logp": "prob"}
    for name, value in (("ids", tokens.get("ids")), ("strings", tokens.get("strings")), ("log_probs", logp),
                        ("old_log_probs", tokens.get("old_log_probs"))):
        if value is None:
            raise DivvizInputError(f"{here}: 'tokens' lacks '{name}'{' (or prob)' if name == 'log_probs' else ''}")
    if not isinstance(tokens["ids"], list):
        raise DivvizInputError(f"{here}: 'ids' is not a list")
    advantage, per_token = response.get("advantage"), tokens.get("advantages")
    if per_token is None:
        if finite(advantage) is None:
            raise DivvizInputError(f"{here}: no 'advantages' and no 'advantage' ({quoted(advantage, 20)})")
        per_token = [float(advantage)] * len(tokens["ids"])
    return checked_completion(
        {"text": response.get("response_text"), "reward": response.get("reward", 0.0), "ids": tokens["ids"],
         "pieces": tokens["strings"], "logp_old": tokens["old_log_probs"], "logp": logp, "adv": per_token,
         "logp_ref": tokens.get("ref_log_probs")}, here, names)


def _log_probs(prob: object, here: str) -> list[float]:
    """log prob per token, each prob in (0, 1]."""
    if not isinstance(prob, list):
        raise DivvizInputError(f"{here}: 'prob' is not a list")
    for t, p in enumerate(prob):
        if finite(p) is None or not 0 < p <= 1:
            raise DivvizInputError(f"{here}: 'prob' at token {t} is {quoted(p, 30)}, not a probability in (0, 1]")
    return [math.log(p) for p in prob]
