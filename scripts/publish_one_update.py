"""Publish the one-update SmolLM2 batches this machine computed (`evidence/claims_real.py`'s cache) into
published/smollm2-135m-one-update/, so that a fresh clone's Claims page and `divviz claims --real` read them:

    python scripts/publish_one_update.py [--batches 16]

Only the files of the current design, config, measures and checkpoint (their names say so) are copied; a batch not
computed here is said, not published."""

import argparse
import shutil

from divviz.evidence import claims_real
from divviz.runs import published


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=claims_real.BATCHES_PARAM.default)
    args = parser.parse_args()
    target = published.root() / claims_real.PUBLISHED
    target.mkdir(parents=True, exist_ok=True)
    plan = claims_real.RealPlan(args.batches)
    copied = 0
    for batch, reward in plan.jobs:
        source = claims_real.cache_file(batch, reward)
        if source.is_file():
            shutil.copyfile(source, target / source.name)
            copied += 1
        else:
            print(f"batch {batch}, {reward} rewards: not computed here (divviz claims --real --batches {args.batches})")
    print(f"{copied} of {len(plan.jobs)} batches published in {target}")


if __name__ == "__main__":
    main()
