"""One GRPO step of SmolLM2-135M-Instruct, three ways, side by side in one run: divviz, TRL's GRPOTrainer, a bare loop.

The same model (a fresh copy each, its last `trainable_blocks` blocks trained), the chat prompts of the `add` task
through its template, prompts × G, completion length, temperature, learning rate, μ and K mini-batches of the
model's defaults (`divviz/engine/models.py`: its learning setting) or as given, AdamW, DAPO's token-mean loss, the
forward passes in float32 or under bfloat16 autocast. Targets: divviz ≤ 1.25× bare and ≤ 0.8× TRL; bfloat16's divviz
step ≤ 0.6× float32's (`--compare-dtypes`).

    (a) divviz   `divviz.engine.grpo.grpo_step`, the whole call: sample, rewards, advantages, π_old, μ × K updates
                 with the loss's per-token facts, the after-update forward and every metric, the step inspector's record
    (b) TRL      `trl.GRPOTrainer.train` (beta=0, loss_type="dapo", num_iterations=μ, steps_per_generation=K, bf16
                 when bfloat16); step time from a callback
    (c) bare     the same KV-cached sampler, π_old without grad per mini-batch, and μ × K forward/backward passes of
                 the clipped loss, nothing else

The held-out evaluation (`engine/evaluate.py`: 128 problems, sampled and greedy) is timed once after the steps, and
its matrix-product FLOPs counted as a step's are: its row of the table is one evaluation, not a step.

The floor: each way's matrix-product FLOPs in one step, counted by `torch.utils.flop_counter.FlopCounterMode`
(every mm, addmm, bmm and attention kernel, forward and backward; TRL's over two of its steps, halved), over this
device's measured matrix-product peak in the run's precision and threads (the best of SmolLM2's own shapes, the
operands already in that precision): the seconds a step would take if it did nothing but its matrix products at
peak. Each way's step time is printed as a multiple of its floor (target ≤ 2.5 for divviz at the learn setting).
`--mu 2 --minibatches 8` is the binding setting (target: its step ≤ 1.3× the learn step).

Each figure is the median over the steps after one warm-up step; the three alternate step by step (a callback runs
a divviz and a bare step after each of TRL's), so they see the same load. Peak memory: each way alone in a fresh
process, the highest resident set (CPU) or allocated GPU memory (CUDA) during two steps once its model is loaded.

    python bench/real_model.py [--steps N] [--device cpu|cuda] [--trainable-blocks N] [--mu N] [--minibatches K]
                               [--dtype float32|bfloat16] [--compare-dtypes] [--peak-memory] [--no-flops]
                               [--peak-only]
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import replace

import torch

from divviz.catalogue.aggregation import group_advantages
from divviz.engine.config import RunConfig
from divviz.engine.grpo import grpo_step, make_trainer
from divviz.engine.minibatch import minibatch_rows
from divviz.engine.policy import cpu_has_bf16, load_policy, pick_device, pick_dtype, train_last_blocks
from divviz.engine.prompts import prompt_ids
from divviz.engine.rollout import completion_logps, decode_completions, encode_prompts, sample
from divviz.engine.smollm2 import NAME
from divviz.engine.tasks import get_task
from divviz.runs.train import held_out_evaluation


def config(device: str, steps: int, blocks: int | None, mu: int | None, minibatches: int | None,
           dtype: str) -> RunConfig:
    extra = {key: value for key, value in (("trainable_blocks", blocks), ("mu", mu), ("minibatches", minibatches))
             if value is not None}
    return RunConfig.make(model=NAME, device=device, steps=steps, clip="ratio", aggregation="dapo", dtype=dtype,
                          eval_every=0, **extra)


def autocast_for(cfg: RunConfig):
    dtype = pick_dtype(cfg.dtype, pick_device(cfg.device), cfg.model)
    return (lambda: torch.autocast(pick_device(cfg.device).type, dtype=dtype)) if dtype else nullcontext


FACTS: dict[str, list[tuple[float, float]]] = {}  # precision → each divviz step's (clip fraction, reward)


def divviz_step(cfg: RunConfig):
    trainer = make_trainer(cfg)
    facts = FACTS.setdefault(cfg.dtype, [])

    def step(s):
        start = time.perf_counter()
        metrics = grpo_step(trainer, s).metrics
        facts.append((metrics["clip_ratio/region_mean"], metrics["reward"]))
        return time.perf_counter() - start
    return step


def bare_step(cfg: RunConfig):
    """Sample, reward, advantages, π_old, then μ forward/backward passes of PPO's clipped loss (token mean)."""
    task, device = get_task(cfg.task), pick_device(cfg.device)
    model, tok = load_policy(cfg.model, task)
    model.to(device)
    train_last_blocks(model, cfg.trainable_blocks)
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0,
                                  foreach=True)
    autocast = autocast_for(cfg)

    def step(s):
        start = time.perf_counter()
        pairs = task.batch(seed=s, n=cfg.prompts)
        ids, mask = encode_prompts(prompt_ids(tok, task, [p for p, _ in pairs], "chat"), tok.pad_token_id,
                                   cfg.group_size, device)
        rollout = sample(model, ids, mask, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                         max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                         generator=torch.Generator(device=device).manual_seed(s), autocast=autocast)
        texts = decode_completions(tok, rollout)
        rewards = torch.tensor([task.reward(p, a, c, chat=True)
                                for (p, a), c in zip([q for q in pairs for _ in range(cfg.group_size)], texts)])
        adv = group_advantages(rewards.view(cfg.prompts, cfg.group_size), True).reshape(-1, 1).to(device)
        keep = rollout.completion_mask
        parts = minibatch_rows(len(adv), cfg.minibatches, s)
        with torch.no_grad():
            old = [completion_logps(model, rollout.rows(rows), cfg.temperature, autocast) for rows in parts]
        for _ in range(cfg.mu):
            for rows, logp_old in zip(parts, old):
                logp = completion_logps(model, rollout.rows(rows), cfg.temperature, autocast)
                ratio = (logp - logp_old).exp()
                loss = -(torch.min(ratio * adv[rows], ratio.clamp(0.8, 1.2) * adv[rows]) * keep[rows]).sum() / (
                    keep.sum() / cfg.minibatches)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        return time.perf_counter() - start
    return step


def trl_trainer(cfg: RunConfig, output_dir: str, callbacks):
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    task, device = get_task(cfg.task), pick_device(cfg.device)
    model, tok = load_policy(cfg.model, task)
    train_last_blocks(model, cfg.trainable_blocks)
    rows = [{"prompt": [{"role": "user", "content": task.question(p)}], "compact": p, "answer": a}
            for s in range(cfg.steps + 2) for p, a in task.batch(seed=s, n=cfg.prompts)]

    def reward(completions, answer, compact, **_):
        return [task.reward(p, a, c[-1]["content"], chat=True) for p, c, a in zip(compact, completions, answer)]

    args = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=cfg.prompts * cfg.group_size // cfg.minibatches,
                      num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens,
                      num_iterations=cfg.mu, steps_per_generation=cfg.minibatches, beta=0.0, loss_type="dapo",
                      temperature=cfg.temperature, learning_rate=cfg.lr, lr_scheduler_type="constant",
                      weight_decay=0.0, bf16=pick_dtype(cfg.dtype, device, cfg.model) == torch.bfloat16,
                      use_cpu=device.type == "cpu", gradient_checkpointing=False,
                      max_steps=(cfg.steps + 1) * cfg.mu * cfg.minibatches, logging_steps=1,
                      report_to="none", save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
                      shuffle_dataset=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # it prints every log line
    return trainer


def time_side_by_side(cfg: RunConfig):
    """Step times of TRL, divviz and bare, alternating: after each of TRL's steps (μ × K of its optimiser steps) a
    callback runs one divviz step and one bare step. Step 0 of each is a warm-up, not counted."""
    from transformers import TrainerCallback

    others = {"divviz": divviz_step(cfg), "bare": bare_step(cfg)}
    times = {"TRL": [], "divviz": [], "bare": []}

    per_step = cfg.mu * cfg.minibatches

    class SideBySide(TrainerCallback):
        start = None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % per_step == 0:  # a GRPO step begins: TRL generates, then μ × K optimiser steps
                self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % per_step == 0:
                times["TRL"].append(time.perf_counter() - self.start)
                for name, step in others.items():
                    times[name].append(step(state.global_step // per_step - 1))

    with tempfile.TemporaryDirectory() as out:
        trl_trainer(cfg, out, [SideBySide()]).train()
    return {name: values[1:] for name, values in times.items()}


def resident_gib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**30


def peak_memory(way: str, cfg: RunConfig) -> float:
    """GiB at the peak of two steps of `way` alone in this process, the model loaded (loading has a peak of its
    own, which is not a step's): the resident set sampled every 5 ms on the CPU, allocated memory on CUDA."""
    device = pick_device(cfg.device)
    if way == "TRL":
        with tempfile.TemporaryDirectory() as out:
            trainer = trl_trainer(RunConfig.make(**{**cfg.to_dict(), "steps": 1}), out, [])
            run = trainer.train
    else:
        step = (divviz_step if way == "divviz" else bare_step)(cfg)
        run = lambda: (step(0), step(1))  # noqa: E731
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        run()
        return torch.cuda.max_memory_allocated() / 2**30
    peak, done = [resident_gib()], threading.Event()

    def sample():
        while not done.wait(0.005):
            peak.append(resident_gib())
    watcher = threading.Thread(target=sample)
    watcher.start()
    run()
    done.set()
    watcher.join()
    return max(peak)


PEAK_SHAPES = ((1536, 576, 1536), (1536, 1536, 576), (1536, 576, 49152))  # (m, k, n): a block's, the output layer's


def matmul_peak(cfg: RunConfig, reps: int = 5, trials: int = 5) -> float:
    """FLOP/s of this device's best matrix product in the run's precision and threads: the best of `trials` timings
    of `reps` products of each of PEAK_SHAPES, the operands already in that precision (what autocast's kernels see
    once their weights are cast). The best, not the median: a shared machine's neighbours only ever lower it (one
    timing each read 989 and 2,200 GFLOP/s here on one day)."""
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device, cfg.model) or torch.float32
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = 0.0
    for m, k, n in PEAK_SHAPES:
        a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        for _ in range(trials):
            sync()
            start = time.perf_counter()
            for _ in range(reps):
                a @ b
            sync()
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start))
    return best


def counted_flops(run) -> int:
    """The matrix-product FLOPs `run()` performs (FlopCounterMode: mm, addmm, bmm, attention, forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def step_flops(cfg: RunConfig) -> dict[str, float]:
    """Each way's matrix-product FLOPs in one step, counted (divviz and bare: a step after a warm-up; TRL: its first
    two steps, halved)."""
    flops = {}
    for way, make in (("divviz", divviz_step), ("bare", bare_step)):
        step = make(cfg)
        step(0)
        flops[way] = counted_flops(lambda: step(1))
    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(RunConfig.make(**{**cfg.to_dict(), "steps": 1}), out, [])
        flops["TRL"] = counted_flops(trainer.train) / 2
    return flops


def evaluation(cfg: RunConfig, count: bool) -> tuple[float, float]:
    """(seconds, matrix-product FLOPs) of one held-out evaluation (`engine/evaluate.py`) of the start model at these
    settings: the warm-up call counted (with `count`; NaN without), the next one timed."""
    trainer = make_trainer(cfg)
    flops = counted_flops(lambda: held_out_evaluation(trainer)) if count else float("nan")
    return held_out_evaluation(trainer)["eval/time"], flops


def measure(cfg: RunConfig, args) -> dict[str, float]:
    """Median seconds per step of divviz, TRL and bare; the evaluation's seconds; printed as a table with ratios."""
    print(f"{NAME}: {cfg.prompts} prompts × {cfg.group_size}, {cfg.max_new_tokens} new tokens, μ = {cfg.mu}, "
          f"K = {cfg.minibatches}, {cfg.dtype} ({pick_dtype(cfg.dtype, pick_device(cfg.device), cfg.model) or 'float32'}), "
          + (f"last {cfg.trainable_blocks} blocks trained" if cfg.trainable_blocks else "every parameter trained")
          + f"; median of {args.steps} steps after a warm-up", flush=True)
    times = time_side_by_side(cfg)
    d, t, b = (statistics.median(times[k]) for k in ("divviz", "TRL", "bare"))
    e, eval_flops = evaluation(cfg, not args.no_flops)
    flags = ["--trainable-blocks", str(cfg.trainable_blocks), "--mu", str(cfg.mu), "--minibatches",
             str(cfg.minibatches), "--dtype", cfg.dtype]
    peaks = {way: float(subprocess.run([sys.executable, __file__, "--peak", way, "--device", args.device, *flags],
                                       capture_output=True, text=True, check=True).stdout.split()[-1])
             for way in ("divviz", "TRL", "bare")} if args.peak_memory else {}
    flops = {} if args.no_flops else step_flops(cfg)
    peak = matmul_peak(cfg)
    print(f"{'':<10} {'s/step':>8} {'peak GiB':>9} {'GFLOP':>8} {'floor s':>8} {'× floor':>8}"
          + ("  (peak: two steps alone, the model loaded)" if peaks else ""))
    flops["evaluation"] = eval_flops
    for way, seconds in (("divviz", d), ("TRL", t), ("bare", b), ("evaluation", e)):
        floor = flops.get(way, float("nan")) / peak
        print(f"{way:<10} {seconds:>8.2f} {peaks.get(way, float('nan')):>9.2f} {flops.get(way, float('nan')) / 1e9:>8.1f} "
              f"{floor:>8.2f} {seconds / floor:>8.1f}")
    print(f"divviz/bare {d / b:.2f} (target ≤ 1.25), divviz/TRL {d / t:.2f} (target ≤ 0.8); held-out evaluation "
          f"{e:.1f} s ({e / d:.1f} steps' worth); matrix-product peak {peak / 1e9:.0f} GFLOP/s "
          f"({pick_dtype(cfg.dtype, pick_device(cfg.device), cfg.model) or 'float32'}, {torch.get_num_threads()} "
          "threads, the best of SmolLM2's shapes)", flush=True)
    return {"divviz": d, "TRL": t, "bare": b, "eval": e, **{f"{way} GFLOP": f / 1e9 for way, f in flops.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trainable-blocks", type=int, help="instead of the model's default (0: every parameter)")
    parser.add_argument("--mu", type=int, help="passes over each batch, instead of the model's default")
    parser.add_argument("--minibatches", type=int, help="K, instead of the model's default (1: one step per pass)")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16")
    parser.add_argument("--compare-dtypes", action="store_true",
                        help="float32, then bfloat16, and bfloat16's divviz step over float32's (target ≤ 0.6)")
    parser.add_argument("--peak-memory", action="store_true", help="also each way's peak memory, alone")
    parser.add_argument("--no-flops", action="store_true", help="leave out the counted FLOPs and the floor")
    parser.add_argument("--peak-only", action="store_true", help="only the matrix-product peak the floor is taken at")
    parser.add_argument("--peak", help=argparse.SUPPRESS)  # one way's peak memory, in a child process
    args = parser.parse_args()
    cfg = config(args.device, args.steps, args.trainable_blocks, args.mu, args.minibatches, args.dtype)
    if args.peak:
        print(json.dumps(peak_memory(args.peak, cfg)))
        return
    if args.peak_only:
        print(f"matrix-product peak {matmul_peak(cfg) / 1e9:.0f} GFLOP/s ({cfg.dtype}, {torch.get_num_threads()} "
              "threads, the best of SmolLM2's shapes)")
        return
    torch.manual_seed(0)
    device = pick_device(args.device)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else "")
          + f", native bfloat16: {torch.cuda.is_bf16_supported() if device.type == 'cuda' else cpu_has_bf16()}")
    if not args.compare_dtypes:
        measure(cfg, args)
        return
    fp32 = measure(replace(cfg, dtype="float32"), args)
    bf16 = measure(replace(cfg, dtype="bfloat16"), args)
    for dtype, facts in FACTS.items():  # the same seeds and prompts in both precisions, step by step
        print(f"{dtype}: divviz's clip fraction by step " + ", ".join(f"{c:.4f}" for c, _ in facts)
              + "; reward " + ", ".join(f"{r:.3f}" for _, r in facts))
    print(f"bfloat16/float32: divviz {bf16['divviz'] / fp32['divviz']:.2f} (target ≤ 0.6), TRL "
          f"{bf16['TRL'] / fp32['TRL']:.2f}, bare {bf16['bare'] / fp32['bare']:.2f}, evaluation "
          f"{bf16['eval'] / fp32['eval']:.2f}", flush=True)


if __name__ == "__main__":
    main()
