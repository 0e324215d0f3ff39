"""Freed memory kept by the process that trains, so a step's large tensors do not fault their pages in again.

A learn step of SmolLM2-135M makes a dozen logit tensors of 16–64 completions × 24 positions × 49,152 tokens (75–300
MB each: the output layer's bfloat16 product, its float32 cast, the log-softmax, their gradients) and frees each
within the step. glibc's malloc serves every block over 32 MB with its own `mmap` and unmaps it when freed, so the
next such tensor starts as untouched pages: the kernel zeroes and maps each 4 KiB page at its first write, and on a
2-core CPU that page-faulting, not the arithmetic, was about a fifth of the step (docs/benchmarks.md).
`keep_freed_memory` tells malloc (`mallopt`) to take every block from its heap and to give the heap's top back to
the system only past 2 GiB free, so a freed tensor's pages go to the next one as they are. What is computed does
not change — the same kernels on the same values, only where the bytes live — and a step's every metric and
trained weight is the same to the bit (tests/engine/test_real_model.py; the page faults: tests/engine/test_memory.py).
The process's resident memory stays near its peak until it ends, which a training process reaches in its first step.

Linux with glibc only: elsewhere (macOS, musl) there is no `mallopt` of these parameters and nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1  # glibc's malloc.h: the free space at the heap's top kept before it is given back
M_MMAP_MAX = -4  # the most blocks served by their own mmap; 0: none, every block from the heap
KEEP_BYTES = 2**31 - 1  # the largest trim threshold mallopt takes (2 GiB): more than a step frees at once


@functools.cache
def keep_freed_memory() -> bool:
    """Tell glibc's malloc to serve every block from its heap and keep what is freed (once per process); whether it
    took both settings. Call it in a process that trains on the CPU, before its first step."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_MMAP_MAX, 0))
