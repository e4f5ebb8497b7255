#!/usr/bin/env bash
# Screenshot test: records a clean and a perturbed run of gpt-tiny with the real `keel`, then has
# keel-studio (under one Xvfb when it is installed, else Qt's offscreen platform) render the
# replay of one, the comparison of both and a finished live session (and, at 1920x1080 and
# 1366x768, the replay, a NaN run, cpu vs cpu-ref, a failed session and moe-mini's memory view),
# saving the window and every view as PNGs into OUT_DIR for people to look at. Fails when the
# studio exits non-zero (a failed session: other than 2) or a picture is missing, empty or the
# wrong size.
# Usage: screenshot_test.sh KEEL KEEL_STUDIO SOURCE_DIR OUT_DIR
set -euo pipefail
keel="$1" studio="$2" src="$3" out="$4"
rm -rf "$out"
mkdir -p "$out"
cd "$src"
export KEEL_BLAS_TUNE=0
# The caching allocator gives the memory view segments to draw (training is bitwise the same).
KEEL_ALLOCATOR=caching "$keel" record --config tests/fixtures/gpt-tiny.json --steps 2 --seed 9 \
  --md5 --stats --stacks --allocator --verbose blocks.0.attn -o "$out/clean.db" >/dev/null
KEEL_TEST_PERTURB=matmul:5 "$keel" record --config tests/fixtures/gpt-tiny.json --steps 2 --seed 9 \
  --md5 --stats --stacks --allocator -o "$out/perturbed.db" >/dev/null
# One X server for the whole script, started here rather than by xvfb-run per call: xvfb-run
# replaces the program's exit status with its own 5 when removing its temporary directory races
# with the server, which hid the studio's real exit code. Xvfb picks a free display (-displayfd).
if command -v Xvfb >/dev/null; then
  Xvfb -displayfd 3 -screen 0 1920x1200x24 -nolisten tcp 3>"$out/.display" >/dev/null 2>&1 &
  xvfb_pid=$!
  trap 'kill "$xvfb_pid" 2>/dev/null || true' EXIT
  for _ in $(seq 100); do
    [ -s "$out/.display" ] && break
    kill -0 "$xvfb_pid" 2>/dev/null || { echo "Xvfb did not start" >&2; exit 1; }
    sleep 0.1
  done
  [ -s "$out/.display" ] || { echo "Xvfb did not report its display" >&2; exit 1; }
  export DISPLAY=":$(head -n1 "$out/.display")"
  run_studio() { "$studio" "$@"; }
else
  run_studio() { QT_QPA_PLATFORM=offscreen "$studio" "$@"; }
fi
run_studio "$out/clean.db" --select 40 --screenshot "$out/replay.png" --views-dir "$out/replay"
run_studio "$out/clean.db" --compare "$out/perturbed.db" --select-first-divergence \
  --screenshot "$out/compare.png" --views-dir "$out/compare"
# A finished live session, started the way scripts/run starts one.
run_studio --session tests/fixtures/gpt-tiny.json --run --steps 2 --seed 9 --output "$out/live.db" \
  --screenshot "$out/live.png" --views-dir "$out/live"
# At the two screen sizes a user meets first: a NaN run, cpu vs cpu-ref, clean vs perturbed, a
# finished and a failed live session, and moe-mini's memory view under the caching allocator.
KEEL_TEST_PERTURB=matmul:20:nan "$keel" record --config tests/fixtures/gpt-tiny.json --steps 2 \
  --seed 9 --md5 --stats --stacks -o "$out/nan.db" >/dev/null
"$keel" record --config tests/fixtures/gpt-tiny.json --steps 2 --seed 9 --backend cpu-ref --md5 \
  --stats --stacks -o "$out/ref.db" >/dev/null
"$keel" record --config configs/moe-mini.json --steps 2 --seed 9 --allocator --alloc caching \
  -o "$out/moe.db" >/dev/null
for size in 1920x1080 1366x768; do
  d="$out/$size"
  mkdir -p "$d"
  run_studio "$out/clean.db" --select 40 --size "$size" --screenshot "$d/replay.png" \
    --views-dir "$d/replay"
  run_studio "$out/nan.db" --size "$size" --screenshot "$d/nan.png" --views-dir "$d/nan"
  run_studio "$out/ref.db" --compare "$out/clean.db" --select-first-divergence --size "$size" \
    --screenshot "$d/cpu-vs-ref.png" --views-dir "$d/cpu-vs-ref"
  run_studio "$out/clean.db" --compare "$out/perturbed.db" --select-first-divergence --size "$size" \
    --screenshot "$d/compare.png" --views-dir "$d/compare"
  run_studio --session tests/fixtures/gpt-tiny.json --run --steps 2 --seed 9 \
    --output "$d/live.db" --size "$size" --screenshot "$d/live.png" --views-dir "$d/live"
  # A failed session still saves its picture, and exits 2.
  rc=0
  KEEL_TEST_PERTURB=matmul:50:fail run_studio --session tests/fixtures/gpt-tiny.json --run \
    --steps 2 --seed 9 --output "$d/failed.db" --size "$size" --screenshot "$d/failed.png" \
    --views-dir "$d/failed" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { echo "failed session: exit $rc, expected 2" >&2; exit 1; }
  run_studio "$out/moe.db" --size "$size" --show memory --screenshot "$d/moe-memory.png" \
    --views-dir "$d/moe"
done
python3 - "$out" <<'PY'
import struct, sys, os
out = sys.argv[1]
def size(path):
    with open(path, 'rb') as f:
        head = f.read(24)
    assert head[:8] == b'\x89PNG\r\n\x1a\n', path + ' is not a PNG'
    return struct.unpack('>II', head[16:24])
for name in ('replay.png', 'compare.png', 'live.png'):
    w, h = size(os.path.join(out, name))
    assert (w, h) == (1600, 1000), f'{name} is {w}x{h}, expected 1600x1000'
for sub, (ew, eh) in (('1920x1080', (1920, 1080)), ('1366x768', (1366, 768))):
    for name in ('replay', 'nan', 'cpu-vs-ref', 'compare', 'live', 'failed', 'moe-memory'):
        w, h = size(os.path.join(out, sub, name + '.png'))
        assert (w, h) == (ew, eh), f'{sub}/{name}.png is {w}x{h}'
for d in ('replay', 'compare', 'live'):
    for view in ('graph', 'ops', 'inspector', 'diff', 'logs', 'loss', 'memory'):
        p = os.path.join(out, d, view + '.png')
        if d != 'compare' and view == 'diff':
            continue
        if not os.path.exists(p):
            continue  # a view hidden behind another tab is not rendered
        assert os.path.getsize(p) > 2000, p + ' is (nearly) empty'
        w, h = size(p)
        assert w > 100 and h > 50, f'{p} is {w}x{h}'
print('screenshots in', out)
PY
