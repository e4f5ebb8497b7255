#!/usr/bin/env bash
# Writes fuzz/corpus/recording: small recordings made by `keel record` itself (shrunk to 512-byte
# pages), and copies of one damaged each way Note [Damaged recordings] detects (the cases of
# tests/storage/recording_errors_test.cpp). Usage: fuzz/make_recording_corpus.sh KEEL_BINARY
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
keel="$(realpath "${1:?usage: fuzz/make_recording_corpus.sh KEEL_BINARY}")"
out="$here/corpus/recording"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
cd "$here/.."
cfg=tests/fixtures/gpt-tiny.json
# One module's ops with stacks, MD5s, statistics, kernels and dumps (of fills: zstd frames that
# expand many times); one op's allocator events, the run's, with stacks.
"$keel" record --config $cfg --steps 1 --stacks --md5 --rounded-md5 3 --stats --dumps \
  --dump-ops fill --scope blocks.0.attn -o "$tmp/full.db" >/dev/null
"$keel" record --config $cfg --steps 1 --allocator --ops fill -o "$tmp/memory.db" >/dev/null
# Two steps of the graph alone; a NaN from step 1 on (nonfinite_ops).
"$keel" record --config $cfg --steps 2 --ops matmul,add -o "$tmp/graph.db" >/dev/null
KEEL_TEST_PERTURB=matmul:20:nan "$keel" record --config $cfg --steps 1 --stats --ops matmul \
  -o "$tmp/nan.db" >/dev/null
python3 - "$tmp" "$out" <<'PY'
import os, shutil, sqlite3, sys
tmp, out = sys.argv[1], sys.argv[2]
def shrink(src, dst):
    shutil.copy(src, dst)
    c = sqlite3.connect(dst, isolation_level=None)
    c.execute("PRAGMA page_size = 512")
    c.execute("VACUUM")
    c.close()
for name in ("full", "memory", "graph", "nan"):
    shrink(f"{tmp}/{name}.db", f"{out}/{name}.db")
damage = {
    "forward-cycle": "UPDATE ops SET forward_seq = seq WHERE seq = (SELECT min(seq) FROM ops WHERE forward_seq > 0)",
    "negative-seq": "UPDATE ops SET seq = -seq WHERE seq = (SELECT max(seq) FROM ops)",
    "steps-woven": "UPDATE ops SET step = 2 WHERE seq = (SELECT min(seq) + 1 FROM ops WHERE step = 1)",
    "missing-string": "UPDATE ops SET name_sid = 99999 WHERE seq = (SELECT min(seq) FROM ops)",
    "string-id-2-40": "INSERT INTO strings(id, text) VALUES (1 << 40, 'far')",
    "long-string": "UPDATE strings SET text = hex(zeroblob(33000)) WHERE id = (SELECT name_sid FROM ops LIMIT 1)",
    "deep-scope": "UPDATE strings SET text = 'a' || replace(hex(zeroblob(100)), '00', '.a') WHERE id = (SELECT scope_sid FROM ops LIMIT 1)",
    "mem-bytes-minus-1": ("memory", "UPDATE mem_events SET bytes = -1 WHERE id = (SELECT min(id) FROM mem_events)"),
    "dump-3-gib": "UPDATE dumps SET raw_bytes = 3 << 30 WHERE id = (SELECT min(id) FROM dumps)",
    "dump-1-gib-zstd": "UPDATE dumps SET raw_bytes = 1 << 30 WHERE id = (SELECT min(id) FROM dumps)",
    "log-level-9": "INSERT INTO logs(op_seq, step, level, scope_sid, message, time_ns) VALUES (1, 1, 9, 1, 'x', 0)",
    "nonfinite-missing-op": "INSERT INTO nonfinite_ops VALUES (1 << 40)",
    "packed-truncated": "UPDATE op_tensors SET data = substr(data, 1, 20) WHERE op_seq = (SELECT min(op_seq) FROM op_tensors)",
    "packed-count": "UPDATE op_tensors SET count = count + 1 WHERE op_seq = (SELECT min(op_seq) FROM op_tensors)",
    "kernel-missing": "UPDATE ops SET kernel_id = 99999 WHERE seq = (SELECT min(seq) FROM ops WHERE kernel_id IS NOT NULL)",
}
for name, sql in damage.items():
    base, sql = sql if isinstance(sql, tuple) else ("full", sql)
    dst = f"{out}/damaged-{name}.db"
    shutil.copy(f"{out}/{base}.db", dst)
    c = sqlite3.connect(dst, isolation_level=None)
    c.executescript(sql)
    c.execute("VACUUM")
    c.close()
PY
ls -l "$out"
