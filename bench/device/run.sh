#!/usr/bin/env bash
# There, on a lent GPU (one call, under 9 minutes; bench/device/prepare.sh made what it needs and says how to call
# it): SmolLM2's sampler and step on CUDA against their baselines, every figure printed and saved to $OUT.
#   1. bench/decode_profile.py --device cuda   per decoded token: host syncs, kernel launches, the GPU's busy share
#   2. bench/sampler.py --device cuda          the linear weights cast once per sampling call against every call
#   3. bench/real_model.py --device cuda --dtype bfloat16   divviz's step against TRL's and a bare loop's
# Locally, DEVICE=cpu OUT=/tmp/out PY=.venv/bin/python bash bench/device/run.sh tries the same plumbing on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/setup.sh
step() {  # name, seconds, command…: its output to $OUT/name.txt; a failure or a timeout is said and the next goes on
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $?" | tee -a "$OUT/machine.txt"
    grep -v '^USDT' "$OUT/$name.txt" | tail -n 30
}
step decode_profile 120 "$PY" bench/decode_profile.py --device "$DEVICE"
step sampler 150 "$PY" bench/sampler.py --device "$DEVICE" --steps 3
step real_model 240 "$PY" bench/real_model.py --device "$DEVICE" --dtype bfloat16 --steps 3
