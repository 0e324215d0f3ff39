"""`divviz catalogue` and `divviz bounds`: output, JSON contract, the earlier spellings still read, and bad input (exit 2,
one line)."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import pytest

from divviz.cli import build_parser, main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_catalogue_lists_every_entry(capsys):
    code, out, _ = run(capsys, "catalogue")
    assert code == 0
    for name in ("ratio", "clip_higher", "kl1", "kl2", "kl3", "prob_tv", "k3", "prob_l2", "mirror",
                 "fkl", "urkl_rf", "dual_clip", "TIS_token", "IcePop_sequence", "rejection", "bypass"):
        assert f"\n{name} " in "\n" + out
    assert "(divviz train --rollout-is token --rollout-is-threshold U)" in out  # a rollout correction's flags


def test_catalogue_json(capsys):
    code, out, _ = run(capsys, "catalogue", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and rows["kl3"]["family"] == "clip"
    assert rows["kl3"]["params"][0] == {"name": "delta", "default": 0.05, "kind": "float",
                                        "range": "a finite number in (0, 50]", "doc": "KL3 level δ",
                                        "trl_name": None}
    assert rows["clip_higher"]["params"][1]["trl_name"] == "epsilon_high"
    assert rows["IcePop_token"]["family"] == "rollout" and [p["name"] for p in rows["IcePop_token"]["params"]] == [
        "icepop_l", "icepop_u"] and rows["bypass"]["flags"] == "--bypass-mode"


def test_the_earlier_spellings_are_still_read(capsys):
    """`divviz measures` is `divviz catalogue`, `--measure` is `--clip-test` (bounds, train's parser, rescore)."""
    assert run(capsys, "measures", "--json") == run(capsys, "catalogue", "--json")
    assert run(capsys, "bounds", "--measure", "kl3:delta=0.02", "--json") == \
        run(capsys, "bounds", "--clip-test", "kl3:delta=0.02", "--json")
    parser = build_parser()
    for words in (["train"], ["rescore", "RUN", "--step", "1"]):
        assert parser.parse_args([*words, "--measure", "kl3"]).clip_test in ("kl3", ["kl3"])
        assert parser.parse_args([*words, "--clip-test", "kl3"]).clip_test in ("kl3", ["kl3"])


def test_a_reader_that_stops_reading_is_not_an_error():
    """`divviz catalogue --json | head`: the reader is gone before divviz writes (`true` reads nothing and exits
    while Python starts); exit 0, nothing on stderr."""
    piped = subprocess.run(f"{sys.executable} -m divviz catalogue --json | true; exit ${{PIPESTATUS[0]}}",
                           shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""


def test_bounds_json_kl3(capsys):
    code, out, _ = run(capsys, "bounds", "--measure", "kl3", "--param", "delta=0.05", "--json")
    data = json.loads(out)
    assert code == 0 and set(data) == {"measure", "params", "lower", "upper"}
    assert data["measure"] == "kl3" and data["params"] == {"delta": 0.05}
    assert data["lower"] == pytest.approx(0.716189455169, rel=1e-12)
    assert data["upper"] == pytest.approx(1.350403255977, rel=1e-12)


def test_bounds_of_the_same_measure_at_several_settings(capsys):
    code, out, _ = run(capsys, "bounds", "--measure", "kl3:delta=0.0177", "--measure", "kl3:delta=0.0231",
                       "--measure", "ratio", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["params"] for r in rows] == [{"delta": 0.0177}, {"delta": 0.0231}, {"eps": 0.2}]
    assert rows[0]["upper"] == pytest.approx(1.2001293059, abs=1e-9)  # through PPO's upper edge
    assert rows[1]["lower"] == pytest.approx(0.8001743002, abs=1e-9)  # through its lower edge
    _, one, _ = run(capsys, "bounds", "--measure", "kl3:delta=0.05", "--json")
    _, same, _ = run(capsys, "bounds", "--measure", "kl3", "--param", "delta=0.05", "--json")
    assert json.loads(one) == json.loads(same)


def test_bounds_unbounded_and_pi_old(capsys):
    _, out, _ = run(capsys, "bounds", "--measure", "kl1", "--param", "delta=0.1", "--json")
    assert json.loads(out)["upper"] is None
    _, out, _ = run(capsys, "bounds", "--measure", "prob_tv", "--param", "delta=0.1", "--pi-old", "0.25", "--json")
    assert (json.loads(out)["lower"], json.loads(out)["upper"]) == pytest.approx((0.6, 1.4))
    code, out, _ = run(capsys, "bounds", "--measure", "ratio")
    assert code == 0 and "0.8 <= w <= 1.2" in out


@pytest.mark.parametrize("argv, message", [
    (["bounds", "--measure", "kl3", "--param", "delta=nan"], "kl3: parameter 'delta' must be a finite number in (0, 50]; got 'nan'"),
    (["bounds", "--measure", "kl3", "--param", "delta=-1"], "got '-1'"),
    (["bounds", "--measure", "kl3", "--param", "delta"], "expected NAME=VALUE, got 'delta'"),
    (["bounds", "--measure", "kl3", "--param", "eps=0.2"], "kl3: unknown parameter 'eps'"),
    (["bounds", "--measure", "kl9"], "unknown measure 'kl9'"),
    (["bounds", "--measure", "k3"], "'k3' is a penalty; only clip tests have a feasible ratio interval"),
    (["bounds", "--measure", "prob_tv"], "pass --pi-old P with P in (0, 1]"),
    (["bounds", "--measure", "prob_tv", "--pi-old", "0"], "parameter 'pi_old' must be a finite number in (0, 1]"),
    (["bounds"], "give a clip test: --clip-test NAME"),
    (["bounds", "--measure", "kl3:delta=7e9"], "kl3: parameter 'delta' must be a finite number in (0, 50]"),
    (["bounds", "--measure", "kl3:delta=0.1", "--measure", "ratio", "--param", "eps=0.1"],
     "--param belongs to a single --clip-test"),
    (["train", "--measure", "kl3:eps=0.2"], "kl3: unknown parameter 'eps'"),
    (["train", "--penalty2", "prob_l2"], "--penalty2 needs its own coefficient --beta2"),
    (["train", "--beta2", "0.1"], "--beta2 was given without a penalty (--penalty2)"),
    (["train", "--scale-rewards", "std"], "unknown scale_rewards 'std'; choose group, batch or none"),
    (["train", "--baseline", "prompt"], "unknown baseline 'prompt'; choose group or batch"),
    (["train", "--off-policy-mask", "-1"], "parameter 'off_policy_mask_threshold' must be a finite number in [0, 1e+06]"),
    (["train", "--off-policy-mask-threshold", "-1"],
     "parameter 'off_policy_mask_threshold' must be a finite number in [0, 1e+06]"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("divviz: error: ") and message in err


def test_console_script_is_installed():
    exe = shutil.which("divviz") or str(__import__("pathlib").Path(sys.executable).with_name("divviz"))
    proc = subprocess.run([exe, "bounds", "--measure", "kl3", "--param", "delta=0.5", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["upper"] == pytest.approx(2.35768, rel=1e-5)
    proc = subprocess.run([exe, "bounds", "--measure", "kl3", "--param", "delta=inf"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_train_takes_a_mirror_maps_phi_from_a_file_and_refuses_a_bad_one(tmp_path, capsys):
    phi = tmp_path / "es_state.json"
    phi.write_text(json.dumps({"best_phi": [0.002] * 378 + [0.3, 0.7]}))
    code, out, err = run(capsys, "train", "--steps", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens",
                         "4", "--runs-dir", str(tmp_path / "runs"), "--now", "--penalty", "mirror_phi",
                         "--penalty-param", f"phi=@{phi}", "--beta", "0.1")
    assert code == 0, err
    (config,) = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/config.json")]
    assert config["penalty"] == "mirror_phi" and len(config["penalty_params"]["phi"].split()) == 380
    for text, says in ((json.dumps([1.0] * 10), "φ needs 380 numbers"), (None, "cannot read φ from")):
        path = tmp_path / "bad.json"
        if text is not None:
            path.write_text(text)
        else:
            path = tmp_path / "missing.json"
        code, out, err = run(capsys, "train", "--penalty", "mirror_phi", "--penalty-param", f"phi=@{path}")
        assert code == 2 and err.count("\n") == 1 and says in err


def every_command(parser, path=()):
    """Each command and subcommand of the parser, as the words that name it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from every_command(sub, (*path, name))


def test_the_help_of_every_command_exits_0(capsys):
    """`divviz … --help` prints its usage for every command: a help text with a bare % (e.g. "95% intervals") once
    made argparse raise instead."""
    commands = list(every_command(build_parser()))
    assert ("train",) in commands and ("claims",) in commands
    for words in [(), *commands]:
        with pytest.raises(SystemExit) as exit_:
            main([*words, "--help"])
        assert exit_.value.code == 0, words
        assert "usage: divviz" in capsys.readouterr().out, words


def test_two_threads_can_probe_one_runs_folder_at_once(tmp_path):
    """Two trainers in one process (threads, a notebook) check the runs folder at the same moment: each probe is its
    own file, so neither finds the other's gone."""
    from concurrent.futures import ThreadPoolExecutor
    from divviz.runs.store import writable_runs_folder

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: writable_runs_folder(tmp_path), range(400))) == [tmp_path] * 400
    assert not list(tmp_path.iterdir())  # every probe removed


def test_a_listing_of_the_runs_folder_never_sees_the_probe(tmp_path):
    """A pool or a page lists the runs folder while a trainer checks it: on Linux the probe has no name (O_TMPFILE),
    so no listing, however timed, finds a file that is not a run."""
    import threading
    from divviz.runs.store import writable_runs_folder

    done, seen = threading.Event(), set()

    def probe():
        for _ in range(300):
            writable_runs_folder(tmp_path)
        done.set()

    thread = threading.Thread(target=probe)
    thread.start()
    while not done.is_set():
        seen.update(os.listdir(tmp_path))
    thread.join()
    assert not seen
