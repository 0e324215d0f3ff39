#!/usr/bin/env bash
# Here, before a session with a lent GPU: what bench/device/run.sh needs there, which has no network, in .device/
# (ignored): the wheels its image lacks (pinned as this checkout's environment has them) and SmolLM2's 98 MB GGUF in
# two parts, since one call carries at most 64 MiB with the working tree. Then make the two calls it prints, the
# second within the machine's 30 s warm window (a warm machine keeps the first call's ignored files).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/part1 .device/part2 .device/wheels
pinned() { "$PY" -m pip freeze | grep -iE "^($1)==" ; }
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .device/wheels $(pinned 'trl|gguf|datasets|dill|multiprocess') 2>&1 | grep -v '^WARNING: Location' || true
gguf=$("$PY" -c "from divviz.engine.smollm2 import gguf_file; print(gguf_file())")
tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')  # xargs may run stat more than once
first=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))  # the first call's room, less a margin
size=$(stat -c %s "$gguf")
(( first > size / 2 )) || { echo "the working tree ($tree bytes) leaves too little room for half the model" >&2; exit 1; }
head -c "$first" "$gguf" > .device/part1/gguf
tail -c +"$(( first + 1 ))" "$gguf" > .device/part2/gguf
du -sh .device/*
cat <<CALLS
Now, with the device tool:
  run  carry [".device/part1"]  command "cp .device/part1/gguf /tmp/divviz-gguf.part1"  (starts the machine; a carried
                                  folder does not outlast its call)
  run  carry [".device/part2", ".device/wheels"]  command "bash bench/device/run.sh"         timeout_s 540
then give_back, and add what came back (machine.txt and one file a benchmark) to docs/benchmarks.md.
CALLS
