#!/usr/bin/env bash
# Keel as an outside project sees it: `cmake --install` into a scratch prefix; every installed
# header compiles on its own; both examples/ projects configure and build against the INSTALLED
# package (find_package(Keel), no build tree), run through the installed `keel record --workload`,
# and their recordings hold ops — tiny-gpt's own op squared_relu with its MD5, forward and
# backward. The MLP's standalone programs record themselves through Keel::capture, one with a
# training loop of its own (keel::Step).
# Usage: install_examples_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CXX
set -euo pipefail
cmake="$1" build="$2" src="$3" work="$4" cxx="$5"
prefix="$work/prefix"
rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
die() { echo "install_examples_test: $*" >&2; exit 1; }
for f in lib/libkeel_engine.so lib/libkeel_capture.so lib/libkeel_storage.so \
  lib/libkeel_analysis.so include/keel/workload.h include/keel/version.h \
  include/keel/capture/recorder.h include/keel/storage/reader.h \
  include/keel/analysis/graph_dot.h lib/cmake/Keel/KeelConfig.cmake \
  lib/cmake/Keel/KeelConfigVersion.cmake lib/cmake/Keel/KeelTargets.cmake; do
  [ -e "$prefix/$f" ] || die "missing $prefix/$f"
done
[ ! -e "$prefix/include/keel/kernel_util.h" ] || die "engine internals were installed"
"$src/tests/install/public_headers_test.sh" "$cxx" "$prefix/include"

export KEEL_BLAS_TUNE=0
keel="$prefix/bin/keel"
for ex in mlp tiny-gpt; do
  # Only the installed prefix: no package registry, nothing from the build tree.
  "$cmake" -S "$src/examples/$ex" -B "$work/$ex" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/$ex.configure.log" 2>&1 ||
    { cat "$work/$ex.configure.log" >&2; die "configuring examples/$ex failed"; }
  grep -q "^Keel_DIR:PATH=$prefix/lib/cmake/Keel$" "$work/$ex/CMakeCache.txt" ||
    die "examples/$ex did not find Keel in $prefix"
  "$cmake" --build "$work/$ex" -j2 >"$work/$ex.build.log" 2>&1 ||
    { tail -40 "$work/$ex.build.log" >&2; die "building examples/$ex failed"; }
done

# ops DB ARGS...: the op-call count `keel ops` reports.
ops() { "$keel" ops "$@" | tail -1 | awk '{print $1}'; }

# The MLP workload, with its config.
echo '{"hidden": 16, "samples": 128}' >"$work/mlp.json"
"$keel" record --workload "$work/mlp/libmlp.so" --workload-config "$work/mlp.json" --steps 3 \
  --md5 --stacks -o "$work/mlp.db" >"$work/mlp.out"
grep -q "^keel record: mlp on cpu, 3 steps" "$work/mlp.out" || die "mlp: $(cat "$work/mlp.out")"
grep -q "^recorded 3 steps" "$work/mlp.out" || die "mlp: $(cat "$work/mlp.out")"
"$keel" inspect "$work/mlp.db" | grep -q "status finished" || die "mlp: run not finished"
[ "$(ops "$work/mlp.db" --step 1 --name matmul)" -gt 0 ] || die "mlp: no matmul in step 1"
[ "$(ops "$work/mlp.db" --step 2 --scope fc1)" -gt 0 ] || die "mlp: no op under scope fc1"

# tiny-gpt and its own op.
"$keel" record --workload "$work/tiny-gpt/libtiny_gpt.so" --steps 2 --md5 --stacks \
  -o "$work/gpt.db" >"$work/gpt.out"
grep -q "^recorded 2 steps" "$work/gpt.out" || die "tiny-gpt: $(cat "$work/gpt.out")"
"$keel" ops "$work/gpt.db" --step 1 --phase forward --name squared_relu >"$work/sq.txt"
grep -Eq ' forward +squared_relu +blocks\.0\.mlp +[0-9.]+ +[0-9a-f]{16} ' "$work/sq.txt" ||
  die "tiny-gpt: no squared_relu op with an MD5 under blocks.0.mlp: $(cat "$work/sq.txt")"
[ "$(ops "$work/gpt.db" --step 1 --phase backward --name squared_relu_backward)" -ge 2 ] ||
  die "tiny-gpt: squared_relu_backward missing from the backward pass"
[ "$(ops "$work/gpt.db" --step 2 --name flashmask_attention)" -gt 0 ] ||
  die "tiny-gpt: no attention op in step 2"

# The standalone MLP program records itself.
(cd "$work" && "$work/mlp/mlp_train" 2 "$work/self.db" >/dev/null)
"$keel" inspect "$work/self.db" | grep -q "status finished" || die "mlp_train: run not finished"
[ "$(ops "$work/self.db" --step 2 --name matmul)" -gt 0 ] || die "mlp_train: no matmul in step 2"
# A loop of its own: keel::Step marks 2 epochs x 4 mini-batches as steps 1..8, each with its loss.
(cd "$work" && "$work/mlp/mlp_loop" 2 "$work/loop.db" >"$work/loop.out")
grep -q "^step 8  loss " "$work/loop.out" || die "mlp_loop: $(cat "$work/loop.out")"
"$keel" inspect "$work/loop.db" >"$work/loop.inspect"
grep -Eq "^  step 8 +loss [0-9]\.[0-9]{4} " "$work/loop.inspect" ||
  die "mlp_loop: step 8 and its loss missing: $(cat "$work/loop.inspect")"
! grep -q "step 9" "$work/loop.inspect" || die "mlp_loop: more than 8 steps"
[ "$(ops "$work/loop.db" --step 5 --name matmul)" -gt 0 ] || die "mlp_loop: no matmul in step 5"
echo "examples built against $prefix and recorded"
