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
from divviz.app.urlstate import Control, read_query
from divviz.catalogue.divergences import clip_test
from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.losses import Objective, policy_loss
from divviz.runs import processes, store
from divviz.safetext import WORD_JOINER, literal, shorten

APP = str(Path(__file__).resolve().parents[2] / "router.py")
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


@pytest.mark.parametrize("names", [
    lambda pid: {"pid": pid},  # a status from another tool, or forged: no identity
    lambda pid: {"pid": pid, "process": "another-boot:12345"},  # a folder copied from another machine
    lambda pid: {"pid": pid, "process": processes.process_identity(pid).rsplit(":", 1)[0] + ":1"},  # a reused pid
])
def test_stop_signals_no_process_that_is_not_the_runs_own(tmp_path, names):
    """A runs folder whose status.json says running under a live pid that is not the process that trained it (copied
    from another machine, left after a reboot, written by hand): the run reads interrupted, saying why, and Stop
    sends that process nothing."""
    import signal
    import subprocess
    import sys

    from divviz.runs import runner

    bystander = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                                 stdout=subprocess.PIPE)
    try:
        assert bystander.stdout.readline().strip() == b"ready"
        store.write_status(tmp_path, {"state": "running", **names(bystander.pid), "step": 3, "steps": 10})
        status = store.read_status(tmp_path)
        assert status["state"] == "interrupted" and "no signal is sent to it" in status["message"]
        assert runner.stop_run(tmp_path, wait_s=0.1) == "interrupted"
        assert not runner.is_running(tmp_path)
        assert bystander.poll() is None  # alive: no SIGTERM, and no SIGKILL after the grace
        store.write_status(tmp_path, {"state": "running", **processes.running(bystander.pid), "step": 3, "steps": 10})
        assert store.read_status(tmp_path)["state"] == "running"  # the run's own process is one Stop may signal
        assert runner.stop_run(tmp_path, wait_s=5) == "stopping" and bystander.wait(timeout=10) == -signal.SIGTERM
    finally:
        bystander.kill()


def test_a_fifo_or_a_link_to_dev_zero_as_a_run_file_is_not_read(tmp_path):
    """A runs folder from elsewhere whose run files are a FIFO (a read would wait for a writer forever), a link to
    /dev/zero (a read would never end) or a zip that inflates to gigabytes: `divviz runs` lists every run at once,
    and the run beside them is read as it is."""
    import subprocess
    import sys
    import zipfile

    fine = tmp_path / "fine"
    fine.mkdir()
    store.write_status(fine, {"state": "done", "step": 1, "steps": 1})
    (fine / "config.json").write_text(json.dumps(RunConfig.make(steps=1).to_dict()))
    (fine / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    for name, plant in (("fifo", lambda p: os.mkfifo(p)), ("zero", lambda p: p.symlink_to("/dev/zero"))):
        run = tmp_path / name
        run.mkdir()
        for file in ("status.json", "config.json", "metrics.jsonl"):
            plant(run / file)
    bomb = tmp_path / "fine" / "tokens"
    bomb.mkdir()
    with zipfile.ZipFile(bomb / "step_000001.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
        header["shape"] = (2**23,)  # 64 MiB of float64 zeros a column, 256 MiB in all, 0.3 MB deflated
        for column in store.TOKEN_COLUMNS:
            with archive.open(f"{column}.npy", "w") as member:
                np.lib.format.write_array_header_1_0(member, header)
                for _ in range(8):
                    member.write(bytes(2**23))
    listed = subprocess.run([sys.executable, "-m", "divviz", "runs", "--runs-dir", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    runs = {run["name"]: run for run in json.loads(listed.stdout)}
    assert set(runs) == {"fine", "fifo", "zero"} and runs["fine"]["state"] == "done"
    assert runs["fifo"]["state"] == runs["zero"]["state"] == "corrupt"
    assert store.read_metrics(fine)[0]["loss"] == 0.5 and store.read_tokens(fine, 1) is None


def test_a_formula_in_a_run_never_runs_in_a_spreadsheet_and_infinity_is_written_as_null(tmp_path):
    """A metric named `=HYPERLINK(…)` and a task spelled as a formula go into the Runs page's CSV with a leading
    apostrophe (numbers, negative ones too, as they are); a non-finite metric (an imported log-prob of −1e308 makes
    a KL −inf) is written as JSON null, the row naming it, where Python's json would write `-Infinity`."""
    from divviz.views.run_files import metrics_csv

    writer = store.RunWriter(tmp_path / "run", {**RunConfig.make(steps=1).to_dict(), "task": "=1+1"}, 1)
    writer.append(1, {"step": 1, "loss": -0.5, "kl/k3": float("-inf"), '=HYPERLINK("http://x","y")': 1.0}, None, [])
    line = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0]
    row = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert row["kl/k3"] is None and row["nonfinite"] == "kl/k3 = -inf" and row["loss"] == -0.5
    csv = metrics_csv([store.read_run(tmp_path / "run")])
    header, first = csv.splitlines()[:2]
    assert "'=HYPERLINK" in header and not re.search(r"(^|,)\"?[=+@]", header)
    assert ",-0.5," in first and "=1+1" not in first.replace("'=1+1", "")


def test_a_parameter_given_twice_is_refused_in_one_line(capsys, tmp_path):
    from divviz.catalogue import instances

    with pytest.raises(DivvizInputError, match="parameter 'delta' is given twice"):
        instances.parse("kl3:delta=0.05:delta=0.1")
    assert cli.main(["train", "--measure", "kl3", "--param", "delta=0.05", "--param", "delta=0.1", "--steps", "1",
                     "--runs-dir", str(tmp_path)]) == 2
    assert "given twice" in capsys.readouterr().err


def test_a_damaged_published_grid_is_hidden_in_one_line_and_the_rest_stays(tmp_path, monkeypatch, capsys):
    """A published folder with one metrics file cut short, another grid's evaluation edited (its SHA-256 no longer
    the manifest's), a third grid intact: the two damaged grids are hidden, each with one line naming the file, on the
    CLI and the Runs page; the intact grid and the user's own runs stay listed; a link inside the published folder
    to a file outside is never followed; no partial unpack is left in the cache."""
    import gzip
    import shutil

    from divviz.runs import published

    source = published.ROOT
    shared = tmp_path / "published"
    for grid in ("builtin-cpu", "smollm2-135m-learn-cpu", "smollm2-135m-learn-cpu-2"):
        shutil.copytree(source / grid, shared / grid, symlinks=True)
    cut = next((shared / "builtin-cpu").glob("*/metrics.jsonl.gz"))
    cut.write_bytes(cut.read_bytes()[:100])
    edited = next((shared / "smollm2-135m-learn-cpu").glob("*/eval.jsonl.gz"))
    rows = gzip.decompress(edited.read_bytes()).decode().replace('"eval/accuracy": 0.', '"eval/accuracy": 0.999')
    edited.write_bytes(gzip.compress(rows.encode()))
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    planted = next(p for p in (shared / "smollm2-135m-learn-cpu-2").iterdir() if p.is_dir())
    (planted / "notes.txt").symlink_to(secret)
    monkeypatch.setenv("DIVVIZ_PUBLISHED", str(shared))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mine = tmp_path / "runs"
    store.RunWriter(mine / "mine", RunConfig.make(steps=1).to_dict(), 1).finish("done")

    assert set(published.damaged()) == {"builtin-cpu", "smollm2-135m-learn-cpu"}
    assert f"{cut.parent.name}/metrics.jsonl.gz" in published.damaged()["builtin-cpu"]
    assert "SHA-256" in published.damaged()["smollm2-135m-learn-cpu"]
    assert set(published.manifests()) == {"smollm2-135m-learn-cpu-2"}
    unpacked = published.folder()
    assert not list(unpacked.rglob("notes.txt")) and len(list(unpacked.iterdir())) == 12
    assert not [p for p in unpacked.parent.iterdir() if p.name.startswith(".")]  # no partial unpack left
    assert cli.main(["runs", "--runs-dir", str(mine), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.count("is hidden, the rest is shown") == 2 and "metrics.jsonl.gz" in out.err
    assert [run["name"] for run in json.loads(out.out)] == ["mine"] and "Traceback" not in out.err
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(mine))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.switch_page("app_pages/runs.py").run()
    assert not at.exception
    assert sum("is hidden, the rest is shown" in unescape(w.value) for w in at.warning) == 2
    assert {"mine", planted.name} <= set(at.dataframe[0].value["run"])


def test_markup_in_a_runs_task_shows_as_text_in_the_legends(tmp_path):
    """An imported run whose task is `<a href=…>CLICK</a><b>bold</b>`: every legend of the Runs page's overlay,
    grouped by objective too, names it as text (plotly renders its HTML subset in legend names)."""
    from divviz.views import run_text, run_views

    hostile = '<a href="http://127.0.0.1:9/x">CLICK</a><b>bold</b>'
    writer = store.RunWriter(tmp_path / "run", {**RunConfig.make(steps=2).to_dict(), "task": hostile}, 2)
    for step in (1, 2):
        writer.append(step, {"step": step, "reward": 0.5, "entropy": 1.0, "loss": 0.1}, None, [])
    writer.finish("done")
    run = store.read_run(tmp_path / "run")
    rows = store.read_metrics(run.folder)
    label = f"{run_text.task_label(run.config)} · {run_text.run_label(run)}"  # the page's label, grouped
    for runs in ([(label, rows)], [(label, rows), (label, rows)]):  # one run; two seeds of one group (a mean too)
        charts = run_views.training_charts(runs)
        names = [trace["name"] for chart in charts.values() for trace in chart.figure.to_dict()["data"]
                 if trace.get("name")]
        assert names and not any("<a" in name or "<b>" in name for name in names)
        assert any(name.startswith("&lt;a href") for name in names)  # shown as the text it is


def test_a_link_asking_for_minutes_of_the_shared_cpu_is_capped_and_says_so(tmp_path, monkeypatch):
    """The 208-character Mass-reallocation link that took 123 s of the app's CPU: 20 KL3 entries keep their first 12
    (said in a warning), and 64 seeds × 500 iterations × μ = 8 × (K = 1,000 + 32 × 64 samples) is refused with what
    to lower, before anything trains."""
    import time

    from divviz.app.urlstate import MAX_LINK_ENTRIES

    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(tmp_path))
    entries = ",".join(f"kl3:delta={0.01 + 0.001 * i:g}" for i in range(20))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update({"m": entries, "seeds": "64", "k": "1000", "iterations": "500", "groups": "32",
                            "group_size": "64", "mu": "8"})
    at.run()
    started = time.monotonic()
    at.switch_page("app_pages/mass_reallocation.py").run()
    assert not at.exception, at.exception
    assert time.monotonic() - started < 30  # refused, not computed (it took 123 s)
    assert any(f"the first {MAX_LINK_ENTRIES} are shown" in unescape(w.value) for w in at.warning)
    assert any("one view computes at most" in unescape(e.value) for e in at.error)
