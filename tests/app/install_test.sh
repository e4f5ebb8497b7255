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
# The README's `--config configs/gpt-mini.json` run outside the source tree: one line naming the
# installed config (it said only "cannot open config file"), exit 2.
elsewhere=$(mktemp -d)
set +e
said=$(cd "$elsewhere" && KEEL_BLAS_TUNE=0 "$prefix/bin/keel" train --config configs/gpt-mini.json \
  --steps 1 2>&1)
status=$?
set -e
rm -rf "$elsewhere"
want="keel: error: --config configs/gpt-mini.json: no such file in $elsewhere; the installed one is $prefix/share/keel/configs/gpt-mini.json (--config $prefix/share/keel/configs/gpt-mini.json)"
[ "$status" = 2 ] && [ "$said" = "$want" ] || {
  echo "install_test: keel train outside the tree gave $status: $said" >&2
  echo "install_test: wanted: $want" >&2
  exit 1
}
echo "installed into $prefix"
