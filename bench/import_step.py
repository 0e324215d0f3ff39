"""One imported step whose completions differ wildly in length: its import's time against the target.

The JSONL step a hostile or careless file can hold: one completion of 20,000 tokens beside 500 of one token each, in
one prompt's group (about 0.9 MB). `divviz import` scores it with `policy_loss` (`importers/steps.score_step`) and
writes a run; the time must grow with the tokens, not with completions × the longest completion (it took over 300 s
when every completion's clip states were computed again over the whole padded batch). Target: ≤ 2 s.

    python bench/import_step.py [--long N] [--short N]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from divviz.cli import main as divviz


def completion(n: int, i: int) -> dict:
    return {"text": "x" * n, "reward": float(i % 2), "ids": [7] * n, "pieces": ["x"] * n, "logp_old": [-1.0] * n,
            "logp": [-1.0 + 0.01 * (t % 7) for t in range(n)], "advantage": 0.5 if i % 2 else -0.5}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=20_000, help="tokens of the long completion")
    parser.add_argument("--short", type=int, default=500, help="one-token completions beside it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "step.jsonl"
        step = {"prompts": [{"prompt": "p", "completions": [completion(args.long, 0)]
                             + [completion(1, i + 1) for i in range(args.short)]}]}
        header = {"header": {"model": "builtin", "task": "reverse"}}
        path.write_text(json.dumps(header) + "\n" + json.dumps(step) + "\n")
        start = time.perf_counter()
        code = divviz(["import", str(path), "--runs-dir", str(Path(scratch) / "runs")])
        seconds, size = time.perf_counter() - start, path.stat().st_size
    print(f"one step, a {args.long:,}-token completion beside {args.short} of one token ({size / 1e6:.2f} "
          f"MB): imported in {seconds:.2f} s (exit {code}; target ≤ 2 s)")


if __name__ == "__main__":
    main()
