"""Hostile input as a workshop produces it: links whose values hold Markdown or repeat a measure, run folders that
hold junk, a runs folder that is a file, options without their measure, and bad tensors for the loss. Each gets a
clear message, no traceback, and nothing else is lost."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from divviz import cli
from divviz.catalogue.divergences import clip_test
from divviz.engine import store
from divviz.losses import Objective, policy_loss
from divviz.catalogue.params import DivvizInputError
from divviz.safetext import WORD_JOINER, literal, shorten
from divviz.app.urlstate import Control, read_query

APP = str(Path(__file__).resolve().parents[2] / "app.py")
HOSTILE = ("[click](http://127.0.0.1:9/x) ![img](http://127.0.0.1:9/i.png) <script>alert(1)</script> **b** "
           ":red[r] :smile: $x^2$ www.example.com a@b.c `c` # h")


def unescape(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown).replace(WORD_JOINER, "").replace("  \n", "\n")


def test_literal_escapes_every_markdown_trigger_and_keeps_the_text():
    shown = literal(HOSTILE)
    assert unescape(shown) == HOSTILE
    assert not re.search(r"(?<!\\)[\[\]()<>*`$:#!]", shown)  # no Markdown/HTML character left unescaped
    assert "http\\:" + WORD_JOINER in shown and "www" + WORD_JOINER in shown and "@" + WORD_JOINER in shown
    assert shorten("x" * 10_000, 80) == "x" * 80 + "… (10000 characters)"


def test_a_link_repeating_a_measure_is_merged_and_said():
    values, problems = read_query([Control("m", ["ratio"], options=("ratio", "kl3"), multi=True)],
                                  {"m": "ratio,kl3,ratio"})
    assert values["m"] == ["ratio", "kl3"] and problems == ["link: 'm' names a value more than once; each is shown once"]


def test_a_long_bad_link_value_is_cut_in_its_message():
    _, (problem,) = read_query([Control("m", ["ratio"], options=("ratio",), multi=True)], {"m": "z" * 10_000})
    assert len(problem) < 200 and "(10002 characters)" in problem


@pytest.mark.parametrize("page, query", [
    ("app_pages/clipping_regions.py", {"m": "ratio,ratio,kl3"}),
    ("app_pages/clipping_regions.py", {"m": HOSTILE, "kl3.delta": HOSTILE}),
    ("app_pages/mass_reallocation.py", {"m": "kl3,kl3"}),
    ("app_pages/training_lab.py", {"m": "kl3,kl3", "task": HOSTILE * 50}),
])
def test_pages_survive_hostile_links_and_show_their_values_as_text(page, query, tmp_path, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    at.switch_page(page).run()
    assert not at.exception, at.exception
    assert at.warning, "the bad or repeated value is reported"
    for warning in at.warning:
        assert len(warning.value) < 600  # cut, not echoed whole
        assert "](" not in warning.value.replace("\\](", "")  # no live link or image syntax
        assert "<script>" not in warning.value


def corrupt_runs(root: Path) -> dict[str, str]:
    """One good run and one of each kind of corrupt folder; returns name → expected state."""
    def folder(name, status=None, raw=None, config=None):
        path = root / name
        path.mkdir(parents=True)
        if raw is not None:
            (path / "status.json").write_bytes(raw)
        if status is not None:
            (path / "status.json").write_text(json.dumps(status))
        (path / "config.json").write_text(config if config is not None else json.dumps({"clip": "kl3"}))
        return path

    good = folder("20260101-000000-good", {"state": "done", "step": 2, "steps": 2, "message": "2 steps"})
    (good / "metrics.jsonl").write_text('{"step": 1, "reward": "high", "entropy": 0.5}\n{"step": 2, "reward": 1}\n')
    folder("20260101-000001-junk", raw=os.urandom(300))
    folder("20260101-000002-list", [1, 2, 3])
    folder("20260101-000003-text", {"state": "done", "step": "three", "steps": 3})
    folder("20260101-000004-state", {"state": "<b>owned</b>", "step": 1, "steps": 1})
    folder("20260101-000005-config", {"state": "done", "step": 1, "steps": 1}, config="[not json")
    (root / "20260101-000006-tokens" / "tokens").mkdir(parents=True)
    (root / "20260101-000006-tokens" / "status.json").write_text(json.dumps({"state": "done", "step": 1, "steps": 1}))
    (root / "20260101-000006-tokens" / "config.json").write_text(json.dumps({"clip": "ratio"}))
    (root / "20260101-000006-tokens" / "tokens" / "step_000001.npz").write_bytes(b"PK\x03\x04junk")
    return {"good": "done", "junk": "corrupt", "list": "corrupt", "text": "corrupt", "state": "corrupt",
            "config": "corrupt", "tokens": "done"}


def test_a_corrupt_run_is_listed_with_its_reason_and_hides_no_other(tmp_path):
    want = corrupt_runs(tmp_path)
    runs = {run.name.split("-")[-1]: run for run in store.list_runs(tmp_path)}
    assert {name: run.state for name, run in runs.items()} == want
    assert "not JSON" in runs["junk"].message and "holds a list" in runs["list"].message
    assert "'step' is 'three'" in runs["text"].message and "unknown state" in runs["state"].message
    assert store.read_metrics(runs["good"].folder) == [{"step": 1, "entropy": 0.5}, {"step": 2, "reward": 1}]
    assert store.read_tokens(runs["tokens"].folder, 1) is None


def test_divviz_runs_and_the_runs_page_list_corrupt_runs(tmp_path, capsys, monkeypatch):
    want = corrupt_runs(tmp_path)
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == 0
    listed = {row["name"].split("-")[-1]: row["state"] for row in json.loads(capsys.readouterr().out)}
    assert listed == want
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == 0
    assert re.search(r"-list +corrupt +0/0 +status.json holds a list, not an object", capsys.readouterr().out)
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert sorted(table["state"]) == sorted(want.values())


@pytest.mark.parametrize("argv, says", [
    (["train", "--measure", "none", "--param", "delta=0.1"], "without a clip test"),
    (["train", "--penalty-param", "importance_weight=1"], "without a penalty"),
    (["train", "--beta", "0.1"], "--beta was given without a penalty"),
    (["train", "--device", "mps"], "no Apple GPU"),
    (["train", "--measure", "x" * 5000], "characters)"),
    (["bounds", "--measure", "kl3", "--param", "delta=" + "9" * 5000], "characters)"),
])
def test_bad_cli_options_exit_2_with_one_line(argv, says, capsys, tmp_path):
    assert cli.main([*argv, "--runs-dir", str(tmp_path)] if argv[0] == "train" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and len(err) < 400


def test_a_runs_folder_that_is_a_file_or_unwritable_exits_2(tmp_path, capsys):
    not_a_folder = tmp_path / "runs"
    not_a_folder.write_text("")
    for command in (["train", "--steps", "1"], ["runs"]):
        assert cli.main([*command, "--runs-dir", str(not_a_folder)]) == 2
        assert "is a file, not a folder" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert cli.main(["train", "--steps", "1", "--runs-dir", str(locked)]) == 2


def loss_inputs(batch=3, tokens=4):
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(batch, tokens, generator=g) - 0.1
    logp_new = (logp_old + 0.3 * torch.randn(batch, tokens, generator=g)).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)[:batch, :tokens]
    return logp_new, logp_old, torch.randn(batch, generator=g), mask


def test_nan_and_inf_on_padding_do_not_poison_the_loss():
    logp_new, logp_old, adv, mask = loss_inputs()
    clean = policy_loss(logp_new, logp_old, adv, mask, Objective(clip=clip_test("kl3"), aggregation="bnpo"))
    poisoned_new = logp_new.detach().clone().masked_fill(mask == 0, float("nan")).requires_grad_()
    poisoned_old = logp_old.masked_fill(mask == 0, float("-inf"))
    out = policy_loss(poisoned_new, poisoned_old, adv, mask, Objective(clip=clip_test("kl3"), aggregation="bnpo"))
    assert out.loss.item() == clean.loss.item()
    out.loss.backward()
    assert torch.isfinite(poisoned_new.grad).all() and (poisoned_new.grad[mask == 0] == 0).all()


@pytest.mark.parametrize("change, says", [
    (lambda a: {**a, "logp_old": a["logp_old"][:, :2]}, "logp_old has shape (3, 2)"),
    (lambda a: {**a, "adv": torch.zeros(5)}, "adv has shape (5,)"),
    (lambda a: {**a, "mask": a["mask"][:2]}, "mask has shape (2, 4)"),
    (lambda a: {**a, "logp_new": torch.zeros(0, 4), "logp_old": torch.zeros(0, 4), "adv": torch.zeros(0),
                "mask": torch.zeros(0, 4)}, "B, T ≥ 1"),
    (lambda a: {**a, "logp_new": a["logp_new"].detach().numpy()}, "it takes torch tensors"),
    (lambda a: {**a, "adv": torch.ones(3, dtype=torch.long)}, "floating-point"),
    (lambda a: {**a, "logp_new": a["logp_new"].detach().clone().index_put_((torch.tensor(1), torch.tensor(1)),
                                                                         torch.tensor(float("nan")))},
     "logp_new is nan at completion 1, token 1"),
])
def test_bad_loss_inputs_get_one_clear_message(change, says):
    logp_new, logp_old, adv, mask = loss_inputs()
    args = change({"logp_new": logp_new, "logp_old": logp_old, "adv": adv, "mask": mask})
    with pytest.raises(DivvizInputError, match=re.escape(says)):
        policy_loss(args["logp_new"], args["logp_old"], args["adv"], args["mask"], Objective(clip=clip_test("ratio")))


def test_numpy_inputs_are_refused_not_miscomputed():
    logp_new, logp_old, adv, mask = loss_inputs()
    with pytest.raises(DivvizInputError):
        policy_loss(logp_new, np.asarray(logp_old), adv, mask)
