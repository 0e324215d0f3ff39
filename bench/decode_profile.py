"""Where the sampler's time goes, per decoded token: SmolLM2's decode loop under torch.profiler.

The learn setting's sampling stage (8 prompts × 8 completions, up to 24 tokens at τ = 0.7) in bfloat16 autocast:
one warm-up call, then one profiled call. Prints, per decoded token, the host syncs (`aten::_local_scalar_dense`: a
tensor read on the host, `.item()` or `int()`; `aten::nonzero`, whose size the host must wait for), the kernels
launched and the wall time; on CUDA also the device's busy time, whose share of the wall time says whether the loop
keeps the GPU fed or leaves it waiting on Python and launches. Then the ten operators with the most time of their
own, each as a share of the whole call (its baseline): the profile a change to the sampler starts from;
docs/benchmarks.md holds its runs.

    python bench/decode_profile.py [--device cpu|cuda]
"""

import argparse
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from divviz.engine.config import RunConfig
from divviz.engine.grpo import make_batch, make_trainer
from divviz.engine.smollm2 import NAME

HOST_SYNCS = ("aten::_local_scalar_dense", "aten::nonzero")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def profiled_sampling(device: str):
    """(the profiler, the rollout, wall seconds) of the learn setting's sampling stage at step 1, after step 0's."""
    trainer = make_trainer(RunConfig.make(model=NAME, device=device, dtype="bfloat16"))
    make_batch(trainer, 0)  # the warm-up: kernels chosen, caches filled
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if trainer.device.type == "cuda" else [])
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        batch = make_batch(trainer, 1)
        sync()
        wall = time.perf_counter() - start
    return prof, batch.rollout, wall, trainer.device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)  # as a pool's run samples
    prof, rollout, wall, device = profiled_sampling(args.device)
    tokens = rollout.completion_ids.shape[1]  # decoded positions: the prefill's token and one per decode step
    averages = prof.key_averages()
    count = {event.key: event.count for event in averages}
    syncs = sum(count.get(name, 0) for name in HOST_SYNCS)
    launches = sum(count.get(name, 0) for name in LAUNCHES)
    print(f"{NAME} learn setting, {device} bfloat16 autocast: one sampling call, {rollout.completion_ids.shape[0]} "
          f"completions, {tokens} decoded positions, {wall:.3f} s")
    print(f"  per decoded position: {wall / tokens * 1e3:.1f} ms wall, {syncs / tokens:.1f} host syncs "
          f"({', '.join(f'{name} {count.get(name, 0)}' for name in HOST_SYNCS)} in all)"
          + (f", {launches / tokens:.0f} kernel launches" if device.type == "cuda" else ""))
    if device.type == "cuda":
        busy = sum(event.self_device_time_total for event in averages if event.device_type == DeviceType.CUDA) / 1e6
        print(f"  the GPU busy {busy:.3f} s of {wall:.3f} s ({busy / wall:.0%}): the rest it waits for the host")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(averages.table(sort_by=sort, row_limit=10, max_name_column_width=48))


if __name__ == "__main__":
    main()
