#!/usr/bin/env bash
# There, on a lent GPU (one call of at most 10 minutes, after bench/device/prepare.sh's first call): the stress
# setting's pilot pair declared for a GPU (`claims_lm.declared_seeds`), as many seeds as the call allows, published into a
# grid of the GPU's name and sent back as $OUT/published.tar.gz (unpack it into published/ here).
# GRID names this lease's grid (a new one per lease: h200, then h200-2, …); the cells published grids hold are skipped.
# The pair is closed at its 16 published seeds (`claims_lm.CLOSED_AT`): as it stands, a lease trains nothing here.
#   COMMIT=<this checkout's commit> GRID=h200-2 RUNS=16 UNTIL=470 bash bench/device/train_pair.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/setup.sh
export DIVVIZ_MAX_RUNS=${RUNS:-16} DIVVIZ_RUNS_DIR=/tmp/runs-pair
"$PY" scripts/train_declared.py --runs-dir "$DIVVIZ_RUNS_DIR" --setting stress --device "$DEVICE" \
    --until "${UNTIL:-470}" --commit "${COMMIT:?the commit}" \
    --grid-suffix "${GRID:?a new grid name for this lease, e.g. h200-2}" --out /tmp/published 2>&1 | tee "$OUT/train_pair.txt"
mkdir -p /tmp/published && tar -czf "$OUT/published.tar.gz" -C /tmp/published .
ls -la "$OUT"
