#!/usr/bin/env bash
# A 2 GB PyTorch memory snapshot with 5,000,000 trace entries (issue 19; memory_viz's tab dies past
# 1 GB and hides events past ~600k): written by Python's pickle from the simulated caching
# allocator of tests/python/torch_snapshot_gen.py (one new frames list per entry, 120-200 frames
# deep, frame dicts shared as PyTorch shares them), imported with `keel import torch-memory`
# (wall time and peak memory), then the studio's memory view on the recording
# (BM_MemoryRecording*: read + model + open and paint, cursor moves, range selections).
# Usage: bench/torch_snapshot_import.sh BUILD_DIR [WORK_DIR (/tmp/keel-snapshot-bench)]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:?usage: bench/torch_snapshot_import.sh BUILD_DIR [WORK_DIR]}" && pwd)"
work="${2:-/tmp/keel-snapshot-bench}"
mkdir -p "$work"
snap="$work/snapshot-5M.pickle"
if [ ! -s "$snap" ]; then
  echo "writing $snap (about 2 minutes and 7 GB of Python memory)"
  python3 "$here/tests/python/torch_snapshot_gen.py" "$snap" --events 5000000 --depth 120 200 \
    >"$work/expected.json"
fi
echo "snapshot: $(stat -c %s "$snap") bytes; expected: $(cat "$work/expected.json")"
rm -f "$work/snapshot-5M.db"
/usr/bin/time -f "keel import torch-memory: %e s wall, %M KB peak RSS" \
  "$build/app/keel" import torch-memory "$snap" -o "$work/snapshot-5M.db"
KEEL_BENCH_MEMORY_RECORDING="$work/snapshot-5M.db" "$build/bench/keel_bench" \
  --benchmark_filter='BM_MemoryRecording' 2>&1 | grep -E "^BM_|^---|^Benchmark"
