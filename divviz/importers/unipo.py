"""UNIPO's canonical schema (poloclub/unipo, docs/canonical_schema.json) as a divviz run.

The file is one JSON document: a `header` (task, model_name, algorithm, hparams …) and `entries`, one per model update
(mini-batch updates included), each with `metrics` and a few `prompts`, each prompt with its `responses`: reward,
advantage, and `tokens` with `ids`, `strings`, `log_probs`, `old_log_probs`, optional `ref_log_probs` and per-token
`advantages` (else the response's advantage on every token). Each entry becomes one divviz step, numbered from 1 in
file order; the ratio is exp(log_probs − old_log_probs); the run's clip test is PPO's with the header's `clip_eps`
(or `cliprange`, `clip_range`, `epsilon`) when it gives one.

A JSON document is parsed whole, so a file above `MAX_BYTES` is refused before it is read.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from divviz.catalogue.params import DivvizInputError
from divviz.importers.steps import Group, Step, checked_completion, numeric_metrics, source_config
from divviz.safetext import quoted

MAX_BYTES = 256 * 2**20  # a UNIPO file is read whole: 256 MB at most (JSONL imports stream instead)
NAMES = {"pieces": "strings", "logp_old": "old_log_probs", "logp": "log_probs", "adv": "advantages",
         "logp_ref": "ref_log_probs"}  # divviz's names for a completion's lists → the schema's, for messages
CLIP_NAMES = ("clip_eps", "cliprange", "clip_range", "epsilon", "clip_ratio")


def read(path: Path) -> tuple[dict, list[Step]]:
    """(the run's config, its steps), or DivvizInputError naming the first fault."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise DivvizInputError(f"{path.name} is {size / 2**20:.0f} MB; a UNIPO file is read whole, at most "
                               f"{MAX_BYTES // 2**20} MB (the divviz JSONL format streams any size)")
    try:
        document = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise DivvizInputError(f"{path.name} is not JSON ({str(err)[:80]})") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise DivvizInputError(f"{path.name}: not UNIPO's schema (no 'entries' list)")
    header = document.get("header") if isinstance(document.get("header"), dict) else {}
    hparams = header.get("hparams") if isinstance(header.get("hparams"), dict) else {}
    eps = next((hparams[k] for k in CLIP_NAMES if _positive(hparams.get(k))), None)
    config = source_config("unipo", path, header.get("model_name", ""), header.get("task", ""), eps,
                           {"header": {k: header[k] for k in ("task", "dataset", "algorithm", "model_name",
                                                              "reward_strategy") if isinstance(header.get(k), str)}})
    return config, [_step(entry, e) for e, entry in enumerate(document["entries"])]


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 < x < 10


def _step(entry: object, e: int) -> Step:
    where = f"entry {e + 1}"
    if not isinstance(entry, dict) or not isinstance(entry.get("prompts"), list):
        raise DivvizInputError(f"{where}: no 'prompts' list")
    groups = []
    for p, prompt in enumerate(entry["prompts"]):
        if not isinstance(prompt, dict) or not isinstance(prompt.get("prompt"), str) \
                or not isinstance(prompt.get("responses"), list):
            raise DivvizInputError(f"{where}, prompt {p + 1}: needs 'prompt' text and a 'responses' list")
        group = Group(prompt["prompt"])
        for r, response in enumerate(prompt["responses"]):
            here = f"{where}, prompt {p + 1}, response {r + 1}"
            tokens = response.get("tokens") if isinstance(response, dict) else None
            if not isinstance(tokens, dict):
                raise DivvizInputError(f"{here}: no 'tokens'")
            for name in ("ids", "strings", "log_probs", "old_log_probs"):
                if name not in tokens:
                    raise DivvizInputError(f"{here}: 'tokens' lacks '{name}'")
            advantage = response.get("advantage")
            per_token = tokens.get("advantages")
            if per_token is None:
                if not isinstance(advantage, (int, float)) or isinstance(advantage, bool):
                    raise DivvizInputError(f"{here}: no 'advantages' and no 'advantage' ({quoted(advantage, 20)})")
                per_token = [float(advantage)] * len(tokens["ids"]) if isinstance(tokens["ids"], list) else None
            if not isinstance(tokens["ids"], list):
                raise DivvizInputError(f"{here}: 'ids' is not a list")
            group.completions.append(checked_completion(
                {"text": response.get("response_text"), "reward": response.get("reward", 0.0),
                 "ids": tokens["ids"], "pieces": tokens["strings"], "logp_old": tokens["old_log_probs"],
                 "logp": tokens["log_probs"], "adv": per_token, "logp_ref": tokens.get("ref_log_probs")}, here, NAMES))
        groups.append(group)
    return Step(groups, numeric_metrics(entry.get("metrics")))
