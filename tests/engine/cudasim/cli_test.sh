#!/usr/bin/env bash
# The cuda backend through the real keel binary, on the CUDA simulator (Note [CUDA simulator]):
# what a user runs to compare backends. gpt-mini recorded for 2 steps on cpu and on cuda: the same
# losses to the printed 4 decimals, `keel diff` equal within tolerance with the initialisation
# bit-identical (Philox on the device = the host's), the cuda run bitwise reproducible, and a
# perturbed matmul on the cuda side found as the root divergence. moe-mini (routing, index_add,
# scatter) trains 2 steps on cuda with cpu's losses.
# Usage: cli_test.sh KEEL_BINARY SIMULATOR_PLUGIN SOURCE_DIR
set -euo pipefail
keel="$1"
export KEEL_CUDA_BACKEND="$2"
src="$3"
dir=$(mktemp -d)
fail() { echo "FAIL: $* (logs and recordings kept in $dir)" >&2; exit 1; }
losses() { grep -o 'loss [0-9.]*' "$1" | tr '\n' ' '; }

"$keel" record --config "$src/configs/gpt-mini.json" --steps 2 --backend cpu --md5 --stats -o "$dir/cpu.db" >"$dir/cpu.log" 2>&1 ||
  fail "keel record --backend cpu: $(tail -3 "$dir/cpu.log")"
"$keel" record --config "$src/configs/gpt-mini.json" --steps 2 --backend cuda --md5 --stats -o "$dir/cuda.db" >"$dir/cuda.log" 2>&1 ||
  fail "keel record --backend cuda: $(tail -3 "$dir/cuda.log")"
grep -q 'on cuda:0' "$dir/cuda.log" || fail "the run was not on cuda:0: $(head -2 "$dir/cuda.log")"
[ "$(losses "$dir/cpu.log")" = "$(losses "$dir/cuda.log")" ] ||
  fail "losses differ: cpu $(losses "$dir/cpu.log") vs cuda $(losses "$dir/cuda.log")"
[ "$(grep -c '^step [12]/2  loss [0-9]' "$dir/cuda.log")" = 2 ] || fail "cuda steps: $(cat "$dir/cuda.log")"

rc=0
"$keel" diff "$dir/cpu.db" "$dir/cuda.db" >"$dir/diff.txt" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "keel diff cpu cuda exited $rc: $(head -4 "$dir/diff.txt")"
grep -q '^EQUAL within tolerance' "$dir/diff.txt" || fail "$(head -3 "$dir/diff.txt")"
grep -Eq '^ +0 +([0-9]+) +\1 +\1 +0 +0 +0 +0 +identical' "$dir/diff.txt" ||
  fail "initialisation is not bit-identical: $(sed -n 5,7p "$dir/diff.txt")"

for r in cuda2 cuda3; do
  "$keel" record --config "$src/configs/gpt-mini.json" --steps 1 --backend cuda --md5 -o "$dir/$r.db" >"$dir/$r.log" 2>&1 ||
    fail "keel record ($r): $(tail -3 "$dir/$r.log")"
done
rc=0
"$keel" diff --atol 0 --rtol 0 "$dir/cuda2.db" "$dir/cuda3.db" >"$dir/diff-cuda.txt" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "two cuda runs differ: $(head -4 "$dir/diff-cuda.txt")"

KEEL_TEST_PERTURB=matmul:5 "$keel" record --config "$src/configs/gpt-mini.json" --steps 1 --backend cuda --md5 --stats -o "$dir/perturbed.db" >"$dir/perturbed.log" 2>&1 ||
  fail "keel record (perturbed): $(tail -3 "$dir/perturbed.log")"
rc=0
"$keel" diff "$dir/cpu.db" "$dir/perturbed.db" >"$dir/diff-perturbed.txt" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "keel diff of a perturbed run exited $rc"
grep -q '^first divergence: step 1 .* matmul' "$dir/diff-perturbed.txt" ||
  fail "the perturbed matmul was not found: $(grep -m2 'divergence' "$dir/diff-perturbed.txt")"

"$keel" train --config "$src/configs/moe-mini.json" --steps 2 --backend cpu >"$dir/moe-cpu.log" 2>&1 ||
  fail "moe-mini on cpu: $(tail -3 "$dir/moe-cpu.log")"
"$keel" train --config "$src/configs/moe-mini.json" --steps 2 --backend cuda >"$dir/moe-cuda.log" 2>&1 ||
  fail "moe-mini on cuda: $(tail -3 "$dir/moe-cuda.log")"
[ "$(losses "$dir/moe-cpu.log")" = "$(losses "$dir/moe-cuda.log")" ] ||
  fail "moe-mini losses differ: cpu $(losses "$dir/moe-cpu.log") vs cuda $(losses "$dir/moe-cuda.log")"
[ "$(grep -c '^step [12]/2  loss [0-9]' "$dir/moe-cuda.log")" = 2 ] || fail "moe-mini cuda steps: $(cat "$dir/moe-cuda.log")"
rm -rf "$dir"
echo "ok: gpt-mini and moe-mini on cuda (simulated) match cpu"
