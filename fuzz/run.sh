#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (fuzz/CMakeLists.txt), replays every seed of each once
# and runs each briefly on its seed corpus (fuzz/corpus/<name>).
# Usage: fuzz/run.sh BUILD_DIR [SECONDS per target (20)] [NAME...] (default: all seven).
# Exit status 0 when no target found a crash; crash inputs are kept in BUILD_DIR/artifacts.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS] [NAMES]}"
seconds="${2:-20}"
shift 2 || shift $#
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
# Only the named targets are built: ctest runs the checkpoint parsers' and the other inputs'
# targets as two tests (tests/CMakeLists.txt), in two build folders, side by side.
names=(safetensors aoa metadata recording config trace torch_memory)
[ $# -gt 0 ] && names=("$@")
ninja -C "$build" -j"${KEEL_FUZZ_JOBS:-1}" "${names[@]/#/fuzz_}" >/dev/null
mkdir -p "$build/artifacts"
# Seeds too large to commit (200,000 empty tensors, 100,000 metadata keys), written per run.
case " ${names[*]} " in *" safetensors "* | *" metadata "*) python3 "$here/many_keys.py" "$build/seeds" ;; esac
# Per target: every seed once, whole (fuzzing reads them cut to -max_len; the many-key seeds time
# out on a reader that is quadratic in the keys, fuzz/many_keys.py: about 10 s each here under the
# sanitizers, hours for a quadratic reader), then its share of SECONDS (in halves: metadata,
# config and trace are small formats that run thousands of inputs a second) with the largest
# input (recordings are SQLite images of a few tens of KB).
for name in "${names[@]}"; do
  work="$build/corpus-$name"
  mkdir -p "$work"
  case "$name" in
    metadata) t=$(( (seconds + 1) / 2 )); len=4096 ;;
    config|trace|torch_memory) t=$(( (seconds + 1) / 2 )); len=8192 ;;
    recording) t=$(( seconds * 3 / 2 )); len=262144 ;;
    *) t="$seconds"; len=4096 ;;
  esac
  seeds=("$here/corpus/$name"/*)
  [ -d "$build/seeds/$name" ] && seeds+=("$build/seeds/$name"/*)
  if ! "$build/fuzz_$name" -timeout=60 -rss_limit_mb=2048 \
    -artifact_prefix="$build/artifacts/$name-" "${seeds[@]}" >"$build/replay-$name.log" 2>&1; then
    echo "fuzz_$name: a seed failed (see $build/replay-$name.log)"
    tail -5 "$build/replay-$name.log"
    exit 1
  fi
  echo "fuzz_$name: ${t} s"
  ASAN_OPTIONS=detect_leaks=1 "$build/fuzz_$name" -max_total_time="$t" -max_len="$len" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" \
    "$work" "$here/corpus/$name" 2>&1 | grep -E "^(stat::number_of_executed_units|stat::new_units_added|Done )|ERROR|SUMMARY|Test unit written" || true
  if ls "$build/artifacts/$name-"* >/dev/null 2>&1; then
    echo "fuzz_$name found a crash: $(ls "$build/artifacts/$name-"*)"
    exit 1
  fi
done
