#!/usr/bin/env bash
# `cmake --install` into a scratch prefix puts the binaries, the .desktop entry, the icon and the
# configs where a desktop and keel-studio's "New session…" dialog look for them; the installed
# keel runs from there.
# Usage: install_test.sh CMAKE BUILD_DIR PREFIX
set -euo pipefail
cmake="$1" build="$2" prefix="$3"
rm -rf "$prefix"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
for f in bin/keel bin/keel-studio share/applications/keel-studio.desktop \
  share/icons/hicolor/scalable/apps/keel-studio.svg share/keel/configs/gpt-mini.json; do
  [ -s "$prefix/$f" ] || { echo "install_test: missing $prefix/$f" >&2; exit 1; }
done
grep -q '^Exec=keel-studio %f$' "$prefix/share/applications/keel-studio.desktop"
ops=$(KEEL_BLAS_TUNE=0 "$prefix/bin/keel" ops)
grep -q matmul <<<"$ops"
echo "installed into $prefix"
