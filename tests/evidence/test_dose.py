"""The dose beside an over-training verdict, against numpy on the published runs' own files, and the plain sentence
that carries it."""

import json

import numpy as np
import pytest

from divviz.catalogue import theory
from divviz.evidence import claims, claims_export


def states(ratio, adv, low, high):
    """A clip box's token states by hand: 1 masked low (w < low, A < 0), 2 masked high (w > high, A > 0), else 0."""
    return np.where((ratio < low) & (adv < 0), 1, np.where((ratio > high) & (adv > 0), 2, 0))


@pytest.fixture(scope="module")
def learn():
    from divviz.runs import published

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIVVIZ_PUBLISHED", str(published.ROOT))
        yield claims_export.published_evidence("smollm2-135m", "learn")


def test_the_headline_dose_is_what_the_runs_files_say(learn):
    plan, _, report = learn
    row = claims_export.headline_cell(report)
    boxes = {claims.PPO: (0.8, 1.2), claims.KL3_WIDE: theory.kl3_bounds(claims.DELTA_WIDE)}
    clip, differ = {m: [] for m in boxes}, []
    for seed in row["seeds"]:
        shares = []
        for measure, other in ((claims.KL3_WIDE, claims.PPO), (claims.PPO, claims.KL3_WIDE)):
            folder = plan.runs[(measure, "task", seed)].folder
            metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            clip[measure].append(np.mean([m["clip_ratio/region_mean"] for m in metrics]))
            per_step = []
            for path in sorted((folder / "tokens").glob("step_*.npz")):
                with np.load(path) as t:
                    ratio, adv, own = t["ratio"], t["adv"], t["state"]
                per_step.append(np.mean(states(ratio, adv, *boxes[other]) != own % 4))
            shares.append(np.mean(per_step))
        differ.append(np.mean(shares))
    assert row["dose"]["clip"] == pytest.approx({m: np.mean(v) for m, v in clip.items()}, rel=1e-12)
    assert row["dose"]["disagreement"] == pytest.approx(np.mean(differ), rel=1e-12)
    assert 0.002 < row["dose"]["disagreement"] < 0.01  # about half a percent of tokens


def test_the_plain_sentence_and_the_cli_line_carry_the_dose_the_verdict_and_its_power(learn):
    _, _, report = learn
    row = claims_export.headline_cell(report)
    sentence = claims_export.plain_sentence(report)
    assert sentence.startswith("At learn, ")
    for number in (f"{100 * row['dose']['disagreement']:.2f}%", f"{row['mean']:+.3f}", f"{row['low']:+.3f}",
                   f"over {row['n']} seeds", f"was {row['verdict_power']:.2f}", row["verdict_adjusted"]):
        assert number in sentence
    assert ("no gain of 5 points or more (rejected at one-sided α = 0.05" in sentence) == row["rules_out"]
    line = claims_export.cell_text(row)
    assert "can hardly show a difference" in line and "verdict power" in line
    assert sentence in claims_export.to_text(report)
    assert json.loads(json.dumps(claims_export.report_json(report)))["cells"][report.rows.index(row)]["dose"] == \
        row["dose"]


def test_the_disagreement_counts_the_tokens_rescore_lists(learn):
    from divviz.evidence import rescore

    plan, _, _ = learn
    folder = plan.runs[(claims.PPO, "task", 0)].folder
    tokens = rescore.sampled_tokens(folder, 1)
    other = claims.OBJECTIVES[claims.KL3_WIDE]
    listed = rescore.rescore(tokens, other, "kl3")
    assert rescore.disagreement(tokens, other) == listed["changed"] / listed["tokens"] > 0
