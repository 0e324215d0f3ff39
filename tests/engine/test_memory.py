"""Freed memory kept by a training process (`engine/memory.py`): with it, large tensors come from glibc's heap and
take the pages of those freed before them instead of faulting fresh pages in; without it glibc maps and unmaps each.
Each way runs in its own process, since the setting is the process's. That a real step is the same to the bit with
and without, and how many page faults it saves, is test_real_model.py's."""

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt's settings are glibc's")

# A 256 MB tensor made and freed, then three logit-sized ones (16 completions × 24 positions × 49,152 tokens in
# float32, 75 MB each): where the first lived (glibc's heap or a mapping of its own) and the page faults the three
# cost. Kept, they take the freed tensor's pages as they are; glibc's own gives each a fresh mapping.
CHILD = """
import json, resource, sys, torch
from divviz.engine.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def in_heap(address):
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("[heap]"):
            low, high = (int(x, 16) for x in line.split()[0].split("-"))
            if low <= address < high:
                return True
    return False
freed = torch.ones(64 << 20)
heap = in_heap(freed.data_ptr())
del freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
logits = [torch.ones(16, 24, 49152) for _ in range(3)]
print(json.dumps({"kept": kept, "heap": heap, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def child(way: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_freed_pages_go_to_the_next_tensors_as_they_are():
    kept, default = child("keep"), child("default")
    assert kept == {"kept": True, "heap": True, "faults": 0}
    pages = 3 * 16 * 24 * 49152 * 4 // 4096  # the three tensors' 4 KiB pages: 55,296
    assert not default["heap"] and default["faults"] >= pages  # glibc's own: a fresh mapping each, faulted page by page


def test_it_is_set_once_per_process():
    from divviz.engine.memory import keep_freed_memory

    assert keep_freed_memory() is keep_freed_memory() is True
