"""The GRPO engine on the built-in model: real steps for each clip-test family and penalty, reproducibility,
the run folder contract, stop / kill / NaN paths, and a local Hugging Face model folder."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from divviz.catalogue.aggregation import AGGREGATIONS
from divviz.catalogue.divergences import CLIP_TESTS
from divviz.catalogue.params import DivvizInputError
from divviz.catalogue.penalties import PENALTIES
from divviz.catalogue.surrogates import SURROGATES
from divviz.engine.config import RunConfig, identity_keys, objective_from
from divviz.engine.grpo import make_trainer
from divviz.engine.policy import char_tokenizer, load_policy
from divviz.engine.tasks import TASKS, countdown_value, get_task
from divviz.runs import processes, runner, store
from divviz.runs.train import train

TINY = dict(steps=2, prompts=2, group_size=4, max_new_tokens=6, mu=2)
METRICS = ("reward", "reward_std", "accuracy", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean",
           "clip_ratio/overshoot_mean",
           "clip_ratio/region_mean", "kl/k1", "kl/k2", "kl/k3", "top1_mass", "mass_to_argmax", "grad_norm",
           "step_time", "tokens_per_s", "mass_shift/0–0.01", "mass_shift/0.8–1")


def run_tiny(tmp_path, **settings) -> Path:
    folder = train(RunConfig.make(**{**TINY, **settings}), tmp_path)
    return folder


def check_folder(folder: Path, steps: int, state: str = "done"):
    run = store.read_run(folder)
    assert run.state == state, run.message
    rows = store.read_metrics(folder)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:
        for key in METRICS:
            assert key in row and math.isfinite(row[key]), key
        assert all(0 <= row[k] <= 1 for k in row if k.startswith("clip_ratio/")), row
        assert row["kl/k2"] >= 0 and row["kl/k3"] >= 0 and row["entropy"] >= 0, row
        if row["frac_reward_zero_std"] < 1:  # some advantage is not 0, and the first pass is on-policy (w = 1):
            assert row["grad_norm"] > 0, row  # the loss has a gradient, whatever the objective
    tokens = store.read_tokens(folder, steps)
    assert tokens is not None and 0 < len(tokens["pi_old"]) <= 256
    assert ((tokens["pi_old"] > 0) & (tokens["pi_old"] <= 1)).all()
    return rows


@pytest.mark.parametrize("clip", list(CLIP_TESTS))
def test_a_few_real_steps_for_each_clip_test(tmp_path, clip):
    folder = run_tiny(tmp_path, clip=clip, dual_clip_c=3.0)
    check_folder(folder, 2)
    objective = RunConfig.from_dict(store.read_run(folder).config).objective
    assert objective.clip.name == clip and objective.dual_clip_c == 3.0  # it trained what it was asked


@pytest.mark.parametrize("penalty", list(PENALTIES))
def test_a_few_real_steps_for_each_penalty(tmp_path, penalty):
    rows = check_folder(run_tiny(tmp_path, clip="kl3", penalty=penalty, beta=0.05, aggregation="dapo"), 2)
    needs_ref = PENALTIES[penalty].needs_ref
    assert ("kl_ref/k3" in rows[0]) == needs_ref


@pytest.mark.parametrize("surrogate", list(SURROGATES))
def test_a_few_real_steps_for_each_surrogate(tmp_path, surrogate):
    """Every surrogate trains (those that mask with a clip test take kl3) with finite metrics, and its config
    round-trips; so does GSPO's sequence level and TRL's ratio cap."""
    clip = "kl3" if SURROGATES[surrogate].clip == "needs" else None
    folder = run_tiny(tmp_path, clip=clip, surrogate=surrogate, aggregation="dapo")
    check_folder(folder, 2)
    assert RunConfig.from_dict(store.read_run(folder).config).objective.surrogate.name == surrogate


def test_gspo_and_the_ratio_cap_train(tmp_path):
    check_folder(run_tiny(tmp_path / "gspo", clip="clip_higher", importance_sampling_level="sequence"), 2)
    check_folder(run_tiny(tmp_path / "cap", clip="clip_higher", ratio_cap=1.1), 2)


def test_two_penalties_train(tmp_path):
    """GBMPO's prob_l2kl: β·k3 and λ·prob_l2 toward the start policy, with the reference kept for both."""
    folder = run_tiny(tmp_path, clip="ratio", penalty="k3", beta=0.04, second_penalty="prob_l2", second_beta=0.1)
    check_folder(folder, 2)
    assert RunConfig.from_dict(store.read_run(folder).config).objective.label == "ratio ε=0.2 + 0.04·k3 + 0.1·prob_l2"


def test_the_off_policy_sequence_mask_trains(tmp_path):
    folder = run_tiny(tmp_path, clip="kl3", off_policy_mask_threshold=0.0)
    check_folder(folder, 2)
    assert RunConfig.from_dict(store.read_run(folder).config).objective.off_policy_mask_threshold == 0.0


def test_a_config_with_the_earlier_off_policy_mask_key_reads_as_its_threshold():
    """Published runs' config.json spell the threshold `off_policy_mask`: read as `off_policy_mask_threshold`, by the
    run config and by the objective alone, and written back in today's spelling."""
    cfg = RunConfig.from_dict({"clip": "ratio", "off_policy_mask": 0.25})
    assert cfg.objective.off_policy_mask_threshold == 0.25
    assert cfg.to_dict()["off_policy_mask_threshold"] == 0.25 and "off_policy_mask" not in cfg.to_dict()
    assert objective_from({"clip": "kl3", "off_policy_mask": 0.5}).off_policy_mask_threshold == 0.5
    # the hashes naming published results (claims_real's batches, the bandit grid) spell it as they were made
    assert identity_keys(cfg.to_dict()) == {**{k: v for k, v in cfg.to_dict().items()
                                               if k != "off_policy_mask_threshold"}, "off_policy_mask": 0.25}


def test_no_clip_and_every_aggregation(tmp_path):
    for aggregation in AGGREGATIONS:
        check_folder(run_tiny(tmp_path, clip=None, aggregation=aggregation, scale_rewards=False, mu=1, steps=1), 1)


def test_same_seed_same_metrics(tmp_path):
    a = store.read_metrics(run_tiny(tmp_path / "a", seed=3, steps=3))
    b = store.read_metrics(run_tiny(tmp_path / "b", seed=3, steps=3))
    drop = ("step_time", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in a] == \
        [{k: v for k, v in r.items() if k not in drop} for r in b]
    c = store.read_metrics(run_tiny(tmp_path / "c", seed=4, steps=3))
    assert [r["reward"] for r in c] != [r["reward"] for r in a] or [r["entropy"] for r in c] != [r["entropy"] for r in a]


def test_with_mu_one_the_ratio_is_exactly_one(tmp_path):
    folder = run_tiny(tmp_path, mu=1, clip="ratio")
    rows = store.read_metrics(folder)
    assert all(r["clip_ratio/region_mean"] == 0 for r in rows)
    assert (store.read_tokens(folder, 1)["ratio"] == 1).all()


def test_grpo_improves_reverse_on_the_builtin_model(tmp_path):
    rows = store.read_metrics(train(RunConfig.make(task="reverse", steps=30), tmp_path))
    first, last = (sum(r["accuracy"] for r in part) / len(part) for part in (rows[:5], rows[-5:]))
    assert last > first + 0.05, (first, last)


def test_nan_loss_fails_with_message_and_keeps_metrics(tmp_path, monkeypatch):
    cfg = RunConfig.make(**{**TINY, "steps": 4})
    trainer = make_trainer(cfg)
    updates = {"n": 0}
    trainer.optimiser.register_step_post_hook(lambda *_: updates.update(n=updates["n"] + 1))
    forward = trainer.model.forward

    def poisoned(*args, **kwargs):  # from the third step on (after 2·μ updates), the training logits are NaN
        out = forward(*args, **kwargs)
        if trainer.model.training and updates["n"] >= 2 * cfg.mu:
            out.logits = out.logits * float("nan")
        return out

    monkeypatch.setattr(trainer.model, "forward", poisoned)
    folder = train(cfg, tmp_path, trainer=trainer)
    run = store.read_run(folder)
    assert run.state == "failed" and "the loss became nan at step 3" in run.message
    assert [r["step"] for r in store.read_metrics(folder)] == [1, 2]


def worker_folder(tmp_path, steps=5000):  # far longer than any test waits
    cfg = RunConfig.make(**{**TINY, "steps": steps})
    folder = runner.start_run(cfg, tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and len(store.read_metrics(folder)) < 2:
        time.sleep(0.1)
    assert len(store.read_metrics(folder)) >= 2, (folder / "worker.log").read_text()
    return folder


def test_stop_is_immediate_and_keeps_the_metrics(tmp_path):
    folder = worker_folder(tmp_path)
    assert runner.is_running(folder)
    start = time.time()
    assert runner.stop_run(folder) == "stopping"  # at once; SIGTERM ends the run within moments
    while store.read_run(folder).state == "running" and time.time() - start < 5:
        time.sleep(0.05)
    run = store.read_run(folder)
    assert "stopped after step" in run.message and run.step >= 2
    check_folder(folder, run.step, "stopped")


def test_sigkill_leaves_a_readable_folder_the_pool_reports_failed(tmp_path):
    folder = worker_folder(tmp_path)
    pid = json.loads((folder / "status.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while time.time() < deadline and store.read_run(folder).state in ("running", "interrupted"):
        time.sleep(0.05)  # "interrupted" until the pool's next look (every 0.1 s) records how its child died
    run = store.read_run(folder)
    assert run.state == "failed" and "signal 9" in run.message  # the pool saw its child die
    assert len(store.read_metrics(folder)) >= 2 and all("reward" in r for r in store.read_metrics(folder))
    assert [r.state for r in store.list_runs(tmp_path)] == ["failed"]


def test_torn_and_corrupt_files_are_read_safely(tmp_path):
    folder = run_tiny(tmp_path)
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # a write cut by a kill
    assert len(store.read_metrics(folder)) == 2
    (folder / "status.json").write_text("{not json")
    run = store.read_run(folder)
    assert run.state == "corrupt" and "status.json is not JSON" in run.message
    (folder / "tokens" / "step_000001.npz").write_bytes(b"garbage")
    assert store.read_tokens(folder, 1) is None


def test_a_local_hugging_face_model_trains_through_model(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = char_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model_dir = tmp_path / "tiny-gpt2"
    GPT2LMHeadModel(config).save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    folder = run_tiny(tmp_path / "runs", model=str(model_dir), penalty="k3", beta=0.1)
    check_folder(folder, 2)
    assert json.loads((folder / "config.json").read_text())["model"] == str(model_dir)


def test_bad_models_get_clear_messages(tmp_path):
    task = get_task("add")
    with pytest.raises(DivvizInputError, match="model folder './nope' does not exist"):
        load_policy("./nope", task)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{broken")
    with pytest.raises(DivvizInputError, match="could not read a model config from"):
        load_policy(str(tmp_path / "broken"), task)
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=16)).save_pretrained(tmp_path / "bert")
    with pytest.raises(DivvizInputError, match="is not a causal language model"):
        load_policy(str(tmp_path / "bert"), task)


def test_tasks_and_exact_checkers():
    for task in TASKS.values():
        prompt, answer = task.make(__import__("random").Random(0))
        assert task.reward(prompt, answer, answer) == 1.0
        assert task.reward(prompt, answer, answer + "x") == 0.0
    cd = get_task("countdown")
    assert cd.reward("cd:3,5,7>22=", "3*5+7", "7+5*3") == 1.0  # any correct expression counts
    assert cd.reward("cd:3,5,7>22=", "3*5+7", "3*5+7+0") == 0.0  # 0 is not one of the numbers
    assert countdown_value("(3+5)*7", [3, 5, 7]) == 56 and countdown_value("3*3", [3, 5]) is None
    assert countdown_value("__import__('os')", [1]) is None
    assert get_task("add").reward("2+2=", "4", "5", format_reward=0.1) == 0.1


def test_cli_train_and_runs(tmp_path):
    exe = str(Path(sys.executable).with_name("divviz"))
    proc = subprocess.run([exe, "train", "--steps", "2", "--prompts", "2", "--group-size", "4", "--measure", "kl3",
                           "--param", "delta=0.1", "--runs-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path and store.read_run(folder).state == "done"
    listed = subprocess.run([exe, "runs", "--runs-dir", str(tmp_path), "--json"], capture_output=True, text=True)
    assert json.loads(listed.stdout)[0]["state"] == "done"
    for argv, message in ((["train", "--model", "./missing"], "model folder './missing' does not exist"),
                          (["train", "--steps", "-1"], "parameter 'steps'"),
                          (["train", "--device", "cuda"] if not torch.cuda.is_available() else ["train", "--task", "x"],
                           "no CUDA device" if not torch.cuda.is_available() else "unknown task")):
        proc = subprocess.run([exe, *argv, "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_process_that_ignores_sigterm_is_killed_and_marked_stopped(tmp_path):
    ignorer = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                "signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    assert ignorer.stdout.readline().strip() == b"ready"
    store.write_status(tmp_path, {"state": "running", **processes.running(ignorer.pid), "step": 7, "steps": 10})
    assert runner.stop_run(tmp_path, wait_s=1.0) == "stopping"  # returns at once; the kill comes 1 s later
    assert ignorer.wait(timeout=10) == -signal.SIGKILL
    time.sleep(0.2)
    assert "did not stop within 1 s of SIGTERM" in store.read_status(tmp_path)["message"]


def test_sigterm_during_a_write_waits_for_the_write(tmp_path):
    from divviz.runs.train import StopRequested, stop_on_sigterm, writing

    previous = signal.getsignal(signal.SIGTERM)
    stop_on_sigterm()
    try:
        with pytest.raises(StopRequested):
            with writing():
                os.kill(os.getpid(), signal.SIGTERM)  # delivered now, honoured after the block
                (tmp_path / "done").write_text("complete")
        assert (tmp_path / "done").read_text() == "complete"
        with pytest.raises(StopRequested):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_top_entropy_mask_is_trls_and_trains(tmp_path):
    """TRL's get_high_entropy_mask (its accelerator on one process) on a batch with padding equals
    `top_entropy_mask`; a run with the mask (ρ = 0.2) trains with finite metrics."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from trl import GRPOTrainer

    from divviz.engine.grpo import top_entropy_mask

    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(6, 9, generator=g) * 3
    mask = (torch.arange(9)[None] < torch.tensor([9, 4, 1, 7, 9, 2])[:, None]).float()
    trl = SimpleNamespace(accelerator=Accelerator(cpu=True))
    for quantile in (0.2, 0.5, 1.0):
        want = GRPOTrainer.get_high_entropy_mask(trl, entropy, mask, 1 - quantile)
        got = top_entropy_mask(entropy, mask, quantile)
        assert torch.equal(got, want) and 0 < got.sum() <= mask.sum()
    folder = run_tiny(tmp_path, clip="kl3", top_entropy_quantile=0.2)
    check_folder(folder, 2)
    assert store.read_run(folder).config["top_entropy_quantile"] == 0.2
