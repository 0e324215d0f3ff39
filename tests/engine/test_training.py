"""Real training on the built-in model: mini-batch updates (K = 1 is μ full-batch steps exactly; with K > 1 the first
mini-batch is on-policy to the bit and the later ones are not, K × μ optimiser steps), the held-out set (never
trained on) and its evaluation, the stability metrics and their collapse flag on crafted series, and bf16's choice."""

import copy
import time

import pytest
import torch

from divviz.catalogue.params import DivvizInputError
from divviz.engine.config import RunConfig
from divviz.engine.evaluate import evaluate
from divviz.engine.grpo import make_batch, make_trainer, update
from divviz.engine.minibatch import minibatch_rows
from divviz.engine.policy import cpu_has_bf16, pick_dtype
from divviz.engine.rollout import completion_logps
from divviz.engine.stability import KL_COLLAPSE, WINDOW, Stability
from divviz.engine.tasks import HELD_OUT, TASKS
from divviz.metrics import proportion
from divviz.runs import store
from divviz.runs.train import eval_steps, train


def trainer(**settings):
    return make_trainer(RunConfig.make(task="reverse", prompts=8, group_size=4, seed=3, **settings))


def adam_steps(tr) -> int:
    """Optimiser steps AdamW has taken (its per-parameter step count)."""
    return int(next(iter(tr.optimiser.state.values()))["step"])


def test_one_minibatch_is_mu_full_batch_steps_bit_for_bit():
    """K = 1 is one mini-batch, the whole batch: μ AdamW steps of the objective from π_old (its no-grad forward
    here, the first training forward's in the engine), written out step by step, to the bit: π_old, the weights
    and the record's ratios."""
    tr = trainer(mu=2, minibatches=1)
    batch = make_batch(tr, 0)
    model, optimiser = copy.deepcopy(tr.model), None
    with torch.no_grad():
        logp_old = completion_logps(tr.model, batch.rollout, tr.cfg.temperature, tr.autocast)
    done = update(tr, batch, tr.objective, None, 0)

    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tr.cfg.lr, weight_decay=0.0,
                                  foreach=True)
    model.train()
    for _ in range(2):
        logp = completion_logps(model, batch.rollout, tr.cfg.temperature, tr.autocast)
        out = tr.objective(logp, logp_old, batch.adv, batch.rollout.completion_mask,
                           max_completion_length=tr.cfg.max_new_tokens)
        optimiser.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.cfg.max_grad_norm)
        optimiser.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), tr.model.state_dict().values()))
    assert torch.equal(done.logp_old, logp_old) and torch.equal(done.out.ratio, out.ratio) and done.minibatch is None
    assert adam_steps(tr) == 2 and not any("by_minibatch" in key for key in done.fractions)


def test_minibatches_first_is_on_policy_to_the_bit_and_later_ones_are_not():
    tr = trainer(mu=2, minibatches=4, lr=1e-2)
    batch = make_batch(tr, 0)
    parts = minibatch_rows(32, 4, tr.cfg.seed * 104_729 + 0)
    assert sorted(torch.cat(parts).tolist()) == list(range(32)) and all(len(p) == 8 for p in parts)
    done = update(tr, batch, tr.objective, None, 0)
    assert adam_steps(tr) == 8  # K × μ optimiser steps
    by_step = [done.fractions[f"kl/k3_by_minibatch/{i}"] for i in range(1, 9)]
    assert by_step[0] == 0.0 and all(kl > 0 for kl in by_step[1:])  # on-policy exactly once, then off-policy
    assert done.minibatch.tolist() == [k for row in range(32) for k, p in enumerate(parts) if row in p.tolist()]
    # π_old is the sampling policy for every mini-batch: the forward of the start weights on the same rows
    start = make_trainer(tr.cfg)
    first = batch.rollout.rows(parts[0])
    with torch.no_grad():
        want = completion_logps(start.model, first, tr.cfg.temperature, start.autocast)
    assert torch.equal(done.logp_old[parts[0]], want)
    assert done.out.ratio.shape == batch.rollout.completion_mask.shape


def test_minibatches_must_divide_the_batch():
    with pytest.raises(DivvizInputError, match="do not split into 3 equal mini-batches"):
        RunConfig.make(prompts=4, group_size=4, minibatches=3)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_held_out_set_is_fixed_distinct_and_never_trained_on(name):
    task = TASKS[name]
    held_out = task.held_out()
    assert len({prompt for prompt, _ in held_out}) == HELD_OUT and held_out == TASKS[name].held_out()
    prompts = {prompt for prompt, _ in held_out}
    trained = {prompt for seed in range(400) for prompt, _ in task.batch(seed, 16)}
    assert not prompts & trained
    assert all(task.correct(p, a, a) for p, a in held_out)  # each held-out reference is a right answer


def test_a_runs_evaluations_are_at_start_every_n_and_end_with_wilson_intervals(tmp_path):
    cfg = RunConfig.make(task="reverse", prompts=4, group_size=4, steps=5, eval_every=2, seed=1)
    assert eval_steps(cfg) == {0, 2, 4, 5}
    folder = train(cfg, tmp_path)
    evals = store.read_evals(folder)
    assert [row["step"] for row in evals] == [0, 2, 4, 5]
    for row in evals:
        for name in ("eval/accuracy", "eval/accuracy_greedy"):
            k = round(row[name] * HELD_OUT)
            assert (row[name], row[f"{name}_low"], row[f"{name}_high"]) == proportion(k, HELD_OUT)
    rows = store.read_metrics(folder)
    assert all({"stability/max_kl", "stability/max_clip", "stability/collapsed"} <= set(row) for row in rows)
    config = store.read_run(folder).config  # what the run recorded once started is not a setting: it reads back
    assert config["precision"] == "float32" and RunConfig.from_dict(config) == cfg
    assert rows[-1]["stability/max_kl"] == max(row["kl/k3"] for row in rows)


def test_evaluation_is_the_same_for_the_same_weights_and_greedy_is_deterministic():
    tr = trainer()
    scores = [evaluate(tr.model, tr.tokenizer, tr.task, tr.prompt_format, temperature=1.0, max_new_tokens=8,
                       device=tr.device, autocast=tr.autocast) for _ in range(2)]
    assert {k: v for k, v in scores[0].items() if k != "eval/time"} == \
        {k: v for k, v in scores[1].items() if k != "eval/time"}
    assert scores[0]["eval/n"] == HELD_OUT


def feed(rewards, kls, entropies=None):
    stability = Stability()
    entropies = entropies or [1.0] * len(rewards)
    return [stability.update(step, {"reward": r, "kl/k3": k, "entropy": e, "clip_ratio/region_mean": 0.01})
            for step, (r, k, e) in enumerate(zip(rewards, kls, entropies), start=1)]


def test_collapse_needs_the_reward_to_halve_while_the_kl_is_large():
    rise, fall = [0.2, 0.4, 0.6, 0.6, 0.6, 0.6], [0.1] * 6
    rows = feed(rise + fall, [0.001] * 6 + [2 * KL_COLLAPSE] * 6)
    steps = [row.get("stability/collapse_step") for row in rows]
    first = next(i for i, s in enumerate(steps, start=1) if s is not None)
    assert 6 < first <= 12 and all(s == first for s in steps[first - 1:])
    assert rows[-1]["stability/collapsed"] == 1.0 and rows[-1]["stability/max_kl"] == 2 * KL_COLLAPSE
    quiet = feed(rise + fall, [0.001] * 12)  # the same fall with small updates: a hard stretch, not a collapse
    assert all(row["stability/collapsed"] == 0.0 for row in quiet)
    never = feed([0.05] * 6 + [0.0] * 6, [1.0] * 12)  # a run that never learned has nothing to lose
    assert never[-1]["stability/collapsed"] == 0.0


def test_entropy_collapse_counts_too():
    rows = feed([0.5] * 12, [0.001] * 12, [1.0] * WINDOW + [0.01] * 7)
    assert rows[-1]["stability/collapsed"] == 1.0 and rows[WINDOW - 1]["stability/collapsed"] == 0.0


def test_bf16_is_chosen_only_where_the_device_has_it():
    cpu = torch.device("cpu")
    assert pick_dtype("float32", cpu, "smollm2-135m") is None
    assert pick_dtype("auto", cpu, "builtin") is None  # the tiny model keeps float32
    assert pick_dtype("auto", cpu, "smollm2-135m") == (torch.bfloat16 if cpu_has_bf16() else None)
    if not cpu_has_bf16():
        with pytest.raises(DivvizInputError, match="no native bfloat16"):
            pick_dtype("bfloat16", cpu, "smollm2-135m")


def test_bf16_minibatches_keep_the_first_ratios_exactly_one():
    if not cpu_has_bf16():
        pytest.skip("this CPU has no native bfloat16")
    tr = trainer(mu=1, minibatches=2, dtype="bfloat16")
    assert tr.dtype == torch.bfloat16
    done = update(tr, make_batch(tr, 0), tr.objective, None, 0)
    assert done.fractions["kl/k3_by_minibatch/1"] == 0.0 and done.fractions["kl/k3_by_minibatch/2"] > 0


def test_the_same_batch_comparison_reports_its_progress():
    """The lab's progress bar hears of the sampling, then of each measure's update, in order."""
    from divviz.catalogue.divergences import clip_test
    from divviz.engine.compare import same_batch
    from divviz.losses import Objective

    heard = []
    cfg = RunConfig.make(task="reverse", prompts=2, group_size=4, mu=2)
    same_batch(cfg, [("ratio", Objective(clip=clip_test("ratio"))), ("kl3", Objective(clip=clip_test("kl3")))],
               progress=lambda done, total, text: heard.append((done, total, text)))
    assert [(done, total) for done, total, _ in heard] == [(1, 3), (2, 3), (3, 3)]
    assert heard[0][2].startswith("sampled") and "kl3" in heard[2][2]


def test_a_comparison_from_a_checkpoint_penalises_against_the_runs_start_policy(tmp_path):
    """From a run's checkpoint, a penalty's π_ref is the run's start policy, not the checkpoint: the record's π_ref
    differs from its π_old (the checkpoint's), and from the start weights the two are the same."""
    from divviz.engine.compare import same_batch

    cfg = RunConfig.make(task="reverse", prompts=2, group_size=4, steps=10, lr=1e-2, seed=1)
    folder = train(cfg, tmp_path)
    checkpoint = store.checkpoint_path(folder, 10)
    penalised = RunConfig.make(**{**cfg.to_dict(), "penalty": "k3", "beta": 0.1})

    def facts(weights):
        (result,) = same_batch(cfg, [("k3", penalised)], weights=weights)
        tokens = [c["tokens"] for g in result.record["groups"] for c in g["completions"]]
        return [(a, b) for t in tokens for a, b in zip(t["pi_old"], t["pi_ref"]) if a is not None]

    assert all(a == b for a, b in facts(None))
    from_checkpoint = facts(checkpoint)
    assert from_checkpoint and not all(a == b for a, b in from_checkpoint)


def test_the_inspector_shows_the_minibatch_each_completion_trained_in(tmp_path):
    from divviz.views import token_view

    folder = train(RunConfig.make(task="reverse", prompts=4, group_size=4, steps=1, minibatches=4), tmp_path)
    record = store.read_completions(folder, 1)
    completions = [c for g in record["groups"] for c in g["completions"]]
    assert {c["minibatch"] for c in completions} <= {1, 2, 3, 4}
    page = token_view.record_html(record, "ratio")
    assert page.count(" · mini-batch ") == len(completions) and " · mean w " in page


def stop_after(step: int):
    def on_step(result):
        if result.metrics["step"] == step:
            raise KeyboardInterrupt
    return on_step


def test_a_stopped_run_resumes_from_its_resume_state_as_if_never_stopped(tmp_path):
    """Stopped after step 5 (its resume state saved after step 4) and trained again in the same folder, as the pool
    does with a run `runner.resume_run` queued: every metric, evaluation and sample equals an unbroken run's, and
    the state file is gone once the run is done."""
    from divviz.runs import resume

    cfg = RunConfig.make(task="reverse", prompts=4, group_size=4, seed=5, steps=8, checkpoint_every=4, eval_every=4,
                         minibatches=2, lr=3e-3)
    whole = train(cfg, tmp_path / "whole")
    broken = train(cfg, tmp_path / "broken", on_step=stop_after(5))
    assert store.read_run(broken).state == "stopped" and resume.saved_step(broken) == 4
    assert len(store.read_metrics(broken)) == 5 and not (whole / resume.FILE).exists()
    claimed = time.time()  # the pool claims it again an hour later: its status's clock is the claim's
    store.write_status(broken, {**store.read_status(broken), "started": claimed + 3600, "updated": claimed + 3600})
    train(cfg, tmp_path / "broken", folder=broken)
    assert store.read_run(broken).state == "done" and not (broken / resume.FILE).exists()
    status = store.read_status(broken)  # its time is its steps' (all 8), not the last stretch's, nor the wait's
    assert sum(r["step_time"] for r in store.read_metrics(broken)) <= status["updated"] - status["started"] < 3600

    def same(rows):
        return [{k: v for k, v in row.items() if k not in store.CLOCK_KEYS} for row in rows]

    assert [r["step"] for r in store.read_metrics(broken)] == list(range(1, 9))
    assert same(store.read_metrics(broken)) == same(store.read_metrics(whole))
    assert same(store.read_evals(broken)) == same(store.read_evals(whole))
    assert (broken / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    assert sorted(p.name for p in (broken / "tokens").iterdir()) == sorted(p.name for p in (whole / "tokens").iterdir())


def test_resume_run_queues_a_stopped_run_in_its_folder_and_refuses_others(tmp_path, monkeypatch):
    from divviz.runs import runner

    monkeypatch.setattr(runner, "ensure_pool", lambda root: None)  # the pool itself is tested in test_room
    cfg = RunConfig.make(task="reverse", prompts=4, group_size=4, steps=4, checkpoint_every=2)
    folder = train(cfg, tmp_path / "runs", on_step=stop_after(3))
    (folder / ".stop").write_text("")
    assert runner.resume_run(folder) == 2
    status = store.read_status(folder)
    assert status["state"] == "queued" and "resume after step 2" in status["message"] and not (folder / ".stop").exists()
    with pytest.raises(DivvizInputError, match="only a stopped or interrupted run"):
        runner.resume_run(folder)
    lagging = train(RunConfig.make(task="reverse", prompts=4, group_size=4, steps=4, checkpoint_every=2,
                                   rollout_lag=1), tmp_path / "runs", on_step=stop_after(3))
    assert runner.resume_run(lagging) == 0 and "start again" in store.read_status(lagging)["message"]
    lagging_cfg = RunConfig.make(task="reverse", prompts=4, group_size=4, steps=4, checkpoint_every=2, rollout_lag=1,
                                 eval_every=2)
    again = train(lagging_cfg, tmp_path / "again", on_step=stop_after(3))
    train(lagging_cfg, tmp_path / "again", folder=again)  # from step 0 again: no row of the first start is left
    assert [r["step"] for r in store.read_metrics(again)] == [1, 2, 3, 4]
    assert [r["step"] for r in store.read_evals(again)] == [0, 2, 4]
