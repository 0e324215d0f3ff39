"""One vocabulary on the charts: each source's name for a metric divviz charts, mapped to divviz's name.

An imported metrics row keeps every finite number of the file under the source's own name, as it is (so the CSV
shows the file's columns), and adds divviz's name beside it where the table below has one (so the Runs page draws the
run on the same panels as divviz's runs). Where the source already uses divviz's name, nothing is added. A value that
is not a finite number (text, null, NaN, a list) is dropped and counted, never fatal.

Each mapping says what both names measure (docs/import.md has the table):

- verl 0.9.1 (`verl/trainer/ppo/core_algos.py`, `compute_policy_loss_vanilla`; `verl/trainer/ppo/metric_utils.py`):
  `actor/pg_clipfrac` is the share of tokens with w > 1 + ε_high and A > 0, or w < 1 − ε_low and A < 0: TRL's
  low + high, divviz's `clip_ratio/region_mean`. `actor/ppo_kl` is the token mean of −log w, w = π/π_old (log w
  clamped to ±20): the k1 estimator, divviz's `kl/k1`, not k3. `actor/pg_clipfrac_lower` is *not* mapped: it is the
  dual-clip share (A < 0 and w above verl's `clip_ratio_c`), not TRL's `clip_ratio/low_mean` (w < 1 − ε, A < 0);
  divviz charts no dual-clip share. `divviz/clip_ratio/low_mean` and `high_mean` are what divviz's own verl plugin
  (`divviz.verl.policy_loss`) logs.
- UNIPO (poloclub/unipo, `static/grpo_metrics.json`, names from OpenRLHF): `policy_clip_ratio` counts the tokens where
  the clip binds (w outside the box on the side A pushes to): `clip_ratio/region_mean`; `kl` is the KL to the
  reference model, estimated with the header's `hparams.kl_estimator` (k1, k2 or k3; GRPO's direction, π_ref/π):
  divviz's `kl_ref/<that estimator>`, and not mapped when the header names none. The schema's `clip_fraction` is left
  as it is: UNIPO does not say whether it counts A's sign (CleanRL's clipfrac counts |w − 1| > ε whatever A).
- TRL: its names are divviz's already (divviz's TRL backend writes them as they are); divviz's JSONL uses divviz's.
"""

from __future__ import annotations

import math

from divviz.safetext import quoted

DIVVIZ_NAMES: dict[str, dict[str, str]] = {
    "verl": {"actor/pg_clipfrac": "clip_ratio/region_mean", "actor/ppo_kl": "kl/k1", "actor/entropy": "entropy",
             "critic/score/mean": "reward", "response_length/mean": "completions/mean_length",
             "actor/grad_norm": "grad_norm", "divviz/clip_ratio/low_mean": "clip_ratio/low_mean",
             "divviz/clip_ratio/high_mean": "clip_ratio/high_mean"},
    "unipo": {"policy_clip_ratio": "clip_ratio/region_mean", "kl": "kl_ref/{kl_estimator}",
              "response_length": "completions/mean_length", "policy_lr": "learning_rate"},
    "trl": {},
    "jsonl": {},
}
ESTIMATORS = ("k1", "k2", "k3")


def names_for(fmt: str, hparams: dict | None = None) -> dict[str, str]:
    """The source's names → divviz's for a run in format `fmt`; a name that depends on a setting the header does not
    give (UNIPO's KL estimator) is left out."""
    estimator = (hparams or {}).get("kl_estimator")
    filled = {}
    for source, divviz in DIVVIZ_NAMES[fmt].items():
        if "{kl_estimator}" in divviz:
            if estimator not in ESTIMATORS:
                continue
            divviz = divviz.format(kl_estimator=estimator)
        filled[source] = divviz
    return filled


def metrics_row(values: object, names: dict[str, str], where: str) -> tuple[dict[str, float], list[str]]:
    """(the finite numbers of `values` under their own names plus divviz's for those `names` maps, a description of
    each value dropped because it is not a finite number). Names are kept as text (at most 80 characters), never run."""
    if not isinstance(values, dict):
        return {}, [] if values is None else [f"{where}: the metrics ({quoted(values, 30)}, not an object)"]
    row, dropped = {}, []
    for key, value in values.items():
        number = finite(value)
        if number is None:
            dropped.append(f"{where} {quoted(str(key), 40)} = {'null' if value is None else quoted(value, 30)}")
        else:
            row[str(key)[:80]] = number
    for source, divviz in names.items():
        if source in row and divviz not in row:
            row[divviz] = row[source]
    return row, dropped


def finite(value) -> float | None:
    """`value` as a float if it is a finite number (not a bool, not an integer too large for a float), else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
