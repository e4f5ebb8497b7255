#!/usr/bin/env python3
# Writes the many-key seeds of the fuzz corpus (Note [Linear headers]), too large to commit (12 MB
# and 10 MB), into OUT_DIR/<target>/: a safetensors file of 200,000 empty tensors (the header that
# made `keel ckpt inspect` run for minutes) and checkpoint metadata of 100,000 keys. Reading
# either took minutes (quadratic in the keys) before headers were parsed linearly; fuzz/run.sh
# writes them and replays every seed whole, so a quadratic reader times out there.
# Usage: fuzz/many_keys.py OUT_DIR
import json
import os
import struct
import sys

if len(sys.argv) != 2:
    sys.exit("usage: fuzz/many_keys.py OUT_DIR")
out = sys.argv[1]
os.makedirs(os.path.join(out, "safetensors"), exist_ok=True)
os.makedirs(os.path.join(out, "metadata"), exist_ok=True)

empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
header = {f"t{i:06d}": empty for i in range(200000)}
text = json.dumps(header, separators=(",", ":")).encode()
with open(os.path.join(out, "safetensors", "many-empty-tensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)

shard = [{"file": 0, "offset": [0], "shape": [0], "byte_range": [8, 8]}]
keys = {f"k{i:06d}": {"dtype": "F32", "shape": [0], "shards": shard} for i in range(100000)}
meta = {"format": "keel-flexcheckpoint", "version": 1, "files": ["f"], "keys": keys}
with open(os.path.join(out, "metadata", "many-keys.json"), "w") as f:
    f.write(json.dumps(meta, separators=(",", ":")))
