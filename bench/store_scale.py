"""What the lab costs as runs grow long and many: the Runs page over run folders of S steps, in the engine's format.

For each S, N run folders (config.json and status.json as `RunWriter` writes them; metrics.jsonl with the 28
metrics of an engine row per step) and, in AppTest (Streamlit's own test runner, the page's whole script): the Runs
page's first render, the rerun that overlays 10 of the runs, a plain rerun, the rerun after one row is appended to an
overlaid run (a live update), and the bytes of the charts sent; then `divviz runs --json` over 500 runs.
Targets (issue: long runs): the rerun with 10 of 30 runs of 10,000 steps overlaid ≤ 1.0 s and ≤ 2× the same with
100-step runs; a live update's cost flat (within 1.5×) from 1,000 to 50,000 steps. The chromium side is
bench/chart_draw.py.

    python bench/store_scale.py [--sizes 100 1000 10000 50000] [--runs 30]
"""

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from divviz import cli  # noqa: E402
from divviz.runs.tail import METRICS  # noqa: E402
from tests.runs.test_tail import long_runs  # noqa: E402  (the tests' run folders, with this bench's rows)

APP = str(ROOT / "app.py")
METRIC_NAMES = ("reward", "reward_std", "frac_reward_zero_std", "accuracy", "completions/mean_length",
                "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "kl/k1", "kl/k2", "kl/k3",
                "clip_ratio/overshoot_mean", "entropy", "top1_mass", "loss", "grad_norm", "step_time", "tokens_per_s",
                "mass_to_argmax", *(f"mass_shift/{b}" for b in ("[0, 0.01)", "[0.01, 0.05)", "[0.05, 0.1)",
                                                               "[0.1, 0.2)", "[0.2, 0.4)", "[0.4, 0.6)", "[0.6, 0.8)",
                                                               "[0.8, 1]")))


def row(step: int, seed: int) -> bytes:
    values = {name: round(((step * 7919 + seed * 104729 + k * 31) % 1000) / 1000, 6)
              for k, name in enumerate(METRIC_NAMES)}
    return (json.dumps({"step": step, **values}) + "\n").encode()


def make_runs(root: Path, runs: int, steps: int) -> list[Path]:
    return long_runs(root, runs, steps, row)


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def page(root: Path, size: int, folders: list[Path]) -> dict:
    import os

    os.environ["DIVVIZ_RUNS_DIR"] = str(root)
    METRICS.clear()  # a fresh server: nothing read yet
    at = AppTest.from_file(APP, default_timeout=600)
    at.run()
    out = {"first render": timed(lambda: at.switch_page("app_pages/runs.py").run())}
    chosen = at.multiselect(key="runs:chosen")
    out["overlay 10 runs"] = timed(lambda: chosen.set_value([f.name for f in folders[:10]]).run())
    out["rerun"] = timed(at.run)
    with open(folders[0] / "metrics.jsonl", "a") as handle:
        handle.write(row(size + 1, 0))
    out["live update (1 row appended)"] = timed(at.run)
    out["chart bytes"] = sum(len(c.proto.spec) for c in at.get("plotly_chart"))
    assert not at.exception, at.exception
    return out


def divviz_runs(runs: int, steps: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_runs(root, runs, steps)
        METRICS.clear()
        with contextlib.redirect_stdout(io.StringIO()):
            return timed(lambda: cli.main(["runs", "--json", "--runs-dir", str(root)]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10_000, 50_000])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    results = {}
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            runs = args.runs if size <= 10_000 else 10
            folders = make_runs(Path(tmp), runs, size)
            results[size] = (runs, page(Path(tmp), size, folders))
            print(f"S = {size}: {runs} runs, " + ", ".join(
                f"{k} {v:.3f} s" if isinstance(v, float) else f"{k} {v:,}" for k, v in results[size][1].items()),
                flush=True)
    keys = list(next(iter(results.values()))[1])
    print(f"\n| steps per run (runs) | {' | '.join(keys)} |")
    print("|---" * (len(keys) + 1) + "|")
    for size, (runs, out) in results.items():
        print(f"| {size:,} ({runs}) | " + " | ".join(f"{out[k]:.3f} s" if isinstance(out[k], float) else f"{out[k]:,}"
                                                     for k in keys) + " |")
    print(f"\n`divviz runs --json` over 500 runs of 1,000 steps: {divviz_runs(500, 1000):.2f} s")
    if 100 in results and 10_000 in results:
        small, large = results[100][1]["rerun"], results[10_000][1]["rerun"]
        print(f"rerun with 10 runs overlaid, 10,000 vs 100 steps: {large:.3f} s vs {small:.3f} s = {large / small:.2f}× "
              "(targets ≤ 1.0 s and ≤ 2×; the first overlay reads the runs cold: "
              f"{results[10_000][1]['overlay 10 runs']:.3f} s)")
    if 1000 in results and 50_000 in results:
        a, b = (results[s][1]["live update (1 row appended)"] for s in (1000, 50_000))
        print(f"live update, 50,000 vs 1,000 steps: {b / a:.2f}× (target ≤ 1.5×)")


if __name__ == "__main__":
    main()
