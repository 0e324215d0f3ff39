"""The Claims page's first run in a fresh process, as on a fresh clone: with the published sign-flip p's
(`published/sign-flip-p.json`) against a baseline without them, in one run of this script.

Each reading is a new Python process with an empty divviz cache (no p kept from an earlier run) that runs the page's
whole script once in Streamlit's `AppTest` (its imports included, as a server's first load of the page) and then
once more (a rerun, everything cached). The baseline reads a copy of published/ without the p file, so it draws
every cell's flips as a fresh clone did before the p's were published. Target: the first load ≤ 3 s (docs/benchmarks.md).

    python bench/claims_first_load.py [--repeat N]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_RUN = """
import sys, time
from streamlit.testing.v1 import AppTest
start = time.perf_counter()
at = AppTest.from_file(sys.argv[1], default_timeout=900)
at.run()
first = time.perf_counter() - start
assert not at.exception, at.exception
start = time.perf_counter()
at.run()
print(first, time.perf_counter() - start)
"""


def page_run(published: Path, scratch: Path) -> tuple[float, float]:
    """(first run, rerun) seconds of the Claims page in a fresh process reading `published`, its cache empty."""
    cache = Path(tempfile.mkdtemp(dir=scratch))
    env = {**os.environ, "DIVVIZ_PUBLISHED": str(published), "DIVVIZ_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", PAGE_RUN, str(ROOT / "app_pages" / "claims.py")], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="readings of each (alternating)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        baseline = scratch / "published-without-p"
        shutil.copytree(ROOT / "published", baseline)
        (baseline / "sign-flip-p.json").unlink(missing_ok=True)
        readings = {"without the published p's (baseline)": [], "with them": []}
        for _ in range(args.repeat):
            readings["without the published p's (baseline)"].append(page_run(baseline, scratch))
            readings["with them"].append(page_run(ROOT / "published", scratch))
    with open("/proc/loadavg") as load:
        print(f"load average at the end: {load.read().split()[0]}")
    medians = {}
    for name, runs in readings.items():
        medians[name] = statistics.median(first for first, _ in runs)
        print(f"{name}: first run " + ", ".join(f"{first:.2f}" for first, _ in runs)
              + f" s (median {medians[name]:.2f}); rerun median {statistics.median(r for _, r in runs):.2f} s")
    base, now = medians.values()
    print(f"first load: {now:.2f} s against {base:.2f} s, {base / now:.1f}× faster; target ≤ 3 s: "
          f"{'met' if now <= 3 else 'not met'}")


if __name__ == "__main__":
    main()
