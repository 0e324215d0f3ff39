"""Write the golden steps tests/engine/test_grpo_step.py checks the GRPO step against (`tests/golden.py` says what
they are). Run it again, and commit what it writes, whenever a change to the step changes its numbers on purpose:

    python scripts/golden_step.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import golden  # noqa: E402


def main():
    for stem in golden.CASES:
        for dtype in golden.DTYPES:
            metrics = golden.write(stem, dtype)
            print(f"{golden.path(stem, dtype).relative_to(ROOT)}: reward {metrics['reward']:.4f}, clip "
                  f"{metrics['clip_ratio/region_mean']:.4f}", flush=True)


if __name__ == "__main__":
    main()
