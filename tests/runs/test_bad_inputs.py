"""Classes of bad input, each tried: a parameter at the edge of its declared range (the
ranges themselves are swept in test_param_ranges.py), library entry points given the wrong kind of thing, a runs
folder that cannot be used (every page, and the CLI before it prints any progress), and what a link message says
the page then does."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from divviz import cli
from divviz.app.urlstate import Control, read_query
from divviz.bandit.grpo import run_bandits
from divviz.bandit.setting import BanditConfig
from divviz.catalogue import theory
from divviz.catalogue.aggregation import group_advantages
from divviz.catalogue.divergences import CLIP_TESTS, clip_test
from divviz.catalogue.penalties import penalty
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.surrogates import surrogate
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_trainer
from divviz.loss_grids import random_token_batch
from divviz.losses import Objective, policy_loss

APP = str(Path(__file__).resolve().parents[2] / "router.py")
PAGES = ["home", "clipping_regions", "kl3_equivalence", "mass_reallocation", "claims", "training_lab", "runs",
         "step_inspector", "catalogue"]


@pytest.mark.parametrize("delta", [1e-300, 1e-40, 1e-20, 1e-12, 1e-6])
def test_a_tiny_kl3_level_has_finite_bounds_and_valid_json(delta, capsys):
    """δ just above 0 is inside kl3's range (0, 50]: its interval is finite, 1 − √(2δ) ≤ l ≤ 1 ≤ u (to rounding),
    and `divviz bounds --json` prints JSON that a strict parser reads."""
    lower, upper = theory.kl3_bounds(delta)
    assert 0 < lower <= 1 <= upper < 2 and upper - 1 == pytest.approx(math.sqrt(2 * delta), rel=1e-3, abs=1e-16)
    assert cli.main(["bounds", "--measure", f"kl3:delta={delta!r}", "--json"]) == 0
    row = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"JSON holds {name}"))
    assert row["lower"] == lower and row["upper"] == upper


def test_a_run_with_a_tiny_kl3_level_trains():
    """Every token is outside [l, u] = [1, 1] to rounding, so nothing moves the policy, and nothing is NaN."""
    cfg = RunConfig.make(clip="kl3", clip_params={"delta": 1e-300}, prompts=2, group_size=4, max_new_tokens=4,
                         steps=1, inspect_prompts=1)
    metrics = grpo_step(make_trainer(cfg), 0).metrics
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float)), metrics


BANDIT_REFUSED = [
    ({"k": 1}, "bandit: parameter 'k' must be an integer in [2, 1000]; got 1"),
    ({"lr": float("nan")}, "parameter 'lr' must be a finite number in (0, 100]"),
    ({"k": 10, "correct_rank": 10}, "'correct_rank' must be below k = 10"),
    ({"init": "gaussian"}, "unknown initial shape 'gaussian'; choose zipf, uniform or random"),
    ({"reward": "bonus"}, "unknown reward 'bonus'"),
    ({"momentum": 0.9}, "bandit: unknown parameter 'momentum'"),
    ({"optimizer": "rmsprop"}, "bandit: unknown optimizer 'rmsprop'; choose sgd or adam"),
    ({"correct_percent": 0}, "parameter 'correct_percent' must be an integer in [1, 100]"),
]
RUN_REFUSED = [
    ({"steps": 0}, "run: parameter 'steps' must be an integer in [1, 100000]; got 0"),
    ({"lr": "nan"}, "parameter 'lr' must be a finite number in (0, 1]"),
    ({"task": "chess"}, "unknown task 'chess'"),
    ({"clip": "kl3", "clip_params": {"delta": -1}}, "kl3: parameter 'delta'"),
    ({"penalty": "k9"}, "unknown penalty 'k9'"),
    ({"aggregation": "sum"}, "unknown aggregation 'sum'"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"dual_clip_c": 0.5}, "parameter 'c' must be a finite number in (1, 1e+06]"),
    ({"objective": "kl3"}, "run: give an Objective, or the objective's settings (clip, penalty, …), not both"),
    ({"clip": 3}, "run: clip must be a name; got 3"),
    ({"penalty_params": {"seed": 1}}, "parameters 'seed' were given without a penalty (--penalty)"),
]


@pytest.mark.parametrize("make, values, message", [*((BanditConfig.make, v, m) for v, m in BANDIT_REFUSED),
                                                   *((RunConfig.make, v, m) for v, m in RUN_REFUSED)],
                         ids=[m[:40] for _, m in BANDIT_REFUSED + RUN_REFUSED])
def test_a_bad_bandit_or_run_setting_is_refused_with_the_typed_error(make, values, message):
    with pytest.raises(DivvizInputError) as err:
        make(**values)
    assert message in str(err.value)


def tokens():
    logp_new, logp_old, adv, mask = random_token_batch(1, completions=3, length=4)
    return logp_new, logp_old, adv, mask


WRONG_KINDS = [
    (lambda: Objective(clip="kl3"), "clip is the text 'kl3'; build it first: clip_test('kl3')"),
    (lambda: Objective(clip=clip_test("ratio"), penalty="k3"), "penalty is the text 'k3'"),
    (lambda: Objective(surrogate=0.5), "surrogate must be a Surrogate"),
    (lambda: policy_loss(*tokens(), Objective(clip=penalty("k3"))), "clip must be a ClipTest"),
    (lambda: policy_loss(*tokens(), clip_test("kl3")), "objective must be an Objective(clip=…, …); got a ClipTest"),
    (lambda: policy_loss(*tokens()[:3], 1.0), "mask is a builtins.float; it takes torch tensors"),
    (lambda: policy_loss(tokens()[0], tokens()[1] + 1, *tokens()[2:]), "logp_old is"),
    (lambda: policy_loss(*tokens(), Objective(aggregation="dapo"),
                         num_items_in_batch=0), "num_items_in_batch divides the loss"),
    (lambda: policy_loss(*tokens(), Objective(aggregation="dr_grpo"),
                         max_completion_length=0), "max_completion_length divides"),
    (lambda: policy_loss(*tokens(), Objective(aggregation="dr_grpo"), max_completion_length=2.5), "a positive integer"),
    (lambda: clip_test(clip_test("kl3")), "a clip test is named by its catalogue name, e.g. 'kl3'; got a ClipTest"),
    (lambda: penalty(penalty("k3")), "a penalty is named by its catalogue name"),
    (lambda: surrogate(3), "a surrogate is named by its catalogue name"),
    (lambda: clip_test("prob_tv").bounds(1.5), "pi_old is a probability in (0, 1]; got 1.5"),
    (lambda: clip_test("prob_tv").bounds(0.0), "pi_old is a probability in (0, 1]; got 0.0"),
    (lambda: clip_test("prob_tv").bounds(float("nan")), "pi_old is a probability in (0, 1]"),
    (lambda: clip_test("prob_tv").bounds("half"), "pi_old must be a number or an array"),
    (lambda: theory.kl3_bounds(-1.0), "kl3_bounds needs finite δ ≥ 0"),
    (lambda: theory.kl3_bounds(float("nan")), "kl3_bounds needs finite δ ≥ 0"),
    (lambda: theory.kl3_bounds("wide"), "kl3_bounds takes δ ≥ 0"),
    (lambda: theory.kl3_delta_at_ratio(-0.5), "takes a ratio w > 0"),
    (lambda: group_advantages(1.0), "group_advantages takes rewards as a torch tensor or numpy array"),
    (lambda: group_advantages([[1.0, 0.0]]), "group_advantages takes rewards"),
    (lambda: BanditConfig(k="fifty"), "bandit: parameter 'k' must be an integer"),
    (lambda: BanditConfig(k=3, correct_rank=5), "'correct_rank' must be below k = 3"),
    (lambda: run_bandits("kl3", [Objective(clip=clip_test("kl3"))]), "run_bandits takes a BanditConfig"),
    (lambda: run_bandits(BanditConfig(), ["kl3"]), "run_bandits takes a list of Objective"),
]


@pytest.mark.parametrize("call,says", WRONG_KINDS, ids=[s[:40] for _, s in WRONG_KINDS])
def test_library_entry_points_given_the_wrong_kind_raise_one_typed_line(call, says):
    with pytest.raises(DivvizInputError) as err:
        call()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_list_of_probabilities_is_an_array_to_bounds():
    lower, upper = clip_test("prob_tv", delta=0.1).bounds([0.05, 0.5, 1.0])
    assert np.allclose(lower, [0, 0.8, 0.9]) and np.allclose(upper, [3, 1.2, 1.1])
    assert all(clip_test(name).bounds(0.3) is not None for name in CLIP_TESTS if name != "formula")


@pytest.fixture
def unusable_runs_folders(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # as root can read any folder, a link to itself is the folder that cannot be read
    return {"a file": (a_file, "is a file, not a folder"),
            "a looping link": (loop, "is not a folder that can be used (Too many levels of symbolic links)")}


@pytest.mark.parametrize("page", PAGES)
def test_every_page_survives_a_runs_folder_that_cannot_be_used(page, unusable_runs_folders, monkeypatch):
    for root, _ in unusable_runs_folders.values():
        monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(root))
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.switch_page(f"app_pages/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert all("Traceback" not in e.value and "Something went wrong" not in e.value for e in at.error)


def test_the_cli_refuses_an_unusable_runs_folder_before_any_progress(unusable_runs_folders):
    exe = str(Path(sys.executable).with_name("divviz"))
    for root, says in unusable_runs_folders.values():
        proc = subprocess.run([exe, "train", "--steps", "1", "--runs-dir", str(root)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr  # no model loaded, no bar drawn


def test_a_link_message_says_what_the_page_then_does():
    controls = [Control("m", ["ratio"], family="clip"), Control("task", "add", options=("add", "sort"))]
    _, problems = read_query(controls, {"m": "kl3,kl3", "task": "<b>multiply</b>"})
    repeated, refused = sorted(problems, key=lambda p: "task" in p)
    assert repeated.endswith("each is shown once") and "default" not in repeated
    assert refused.endswith("Using the default instead: add")  # the default, named
    _, (refused,) = read_query(controls, {"task": "multiply"}, lambda values: {"task": "sort"})
    assert refused.endswith("Using the default instead: sort")  # the page's default (e.g. a model setting's)
