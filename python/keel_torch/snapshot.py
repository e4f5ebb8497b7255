"""PyTorch CUDA memory snapshots (torch.cuda.memory._snapshot(), or the pickle
torch.cuda.memory._dump_snapshot() writes) as Keel recordings, for the studio's memory view and
`keel memory stats`: no browser tab to crash, every event kept, and the fragmentation figures.

    python3 -m keel_torch import-snapshot snapshot.pickle -o mem.db [--device 0]

Mapping (docs/memory.md's replay): a snapshot's segments are the allocator's state when it was
taken, its trace the events that led there. The state the trace starts from is that state with
the trace undone, newest first (an alloc's block removed, a completed free's block put back; the
same for segments); it becomes `reserve` events for its segments and `alloc` events for its live
blocks. Then each trace entry in order —
segment_alloc -> reserve, segment_free -> release, alloc -> alloc, free_completed -> free
(free_requested, snapshot and oom entries carry no change of the picture and are skipped). Each
event's stack is its trace entry's frames (innermost first). A snapshot has no training steps:
the events are the recording's step 0, and it has no loss to show.
"""

import pickle
import socket


class SnapshotError(Exception):
    """A snapshot Keel cannot read: one line saying why."""


def _load(source):
    if isinstance(source, dict):
        return source
    try:
        with open(source, "rb") as f:
            data = pickle.load(f)
    except FileNotFoundError:
        raise SnapshotError(f"{source}: no such file")
    except Exception as e:
        raise SnapshotError(f"{source}: not a PyTorch memory snapshot ({type(e).__name__}: {e})")
    if not isinstance(data, dict) or "segments" not in data:
        raise SnapshotError(f"{source}: not a PyTorch memory snapshot (no 'segments')")
    return data


def import_snapshot(source, out_path, device=0):
    """Writes the allocator events of `device` in snapshot `source` (a path or the dict) into
    the Keel recording `out_path`. Returns the number of events written."""
    from . import _keel
    import json
    import time

    snap = _load(source)
    segments = [s for s in snap.get("segments", []) if s.get("device", 0) == device]
    traces = snap.get("device_traces", [])
    trace = traces[device] if device < len(traces) and traces[device] else []
    dev = f"cuda:{device}"
    rec = _keel.Recording(out_path, dev, socket.gethostname(), "{}", 0,
                          json.dumps({"framework": "torch", "imported": "memory snapshot"}),
                          "memory snapshot")
    stacks = {}

    def stack(frames):
        if not frames:
            return -1
        key = tuple((f.get("name", ""), f.get("filename", ""), int(f.get("line", 0))) for f in frames)
        if key not in stacks:
            stacks[key] = len(stacks) + 1
            rec.stack(stacks[key], list(key))
        return stacks[key]

    # The state before the trace: the snapshot's, with the trace undone newest first.
    blocks, segs = {}, {}
    for seg in segments:
        segs[seg["address"]] = seg["total_size"]
        addr = seg["address"]
        for block in seg.get("blocks", []):
            if block.get("state") in ("active_allocated", "active_pending_free"):
                blocks[addr] = (block["size"], block.get("frames"))
            addr += block["size"]
    for e in reversed(trace):
        action = e.get("action")
        if action == "alloc":
            blocks.pop(e["addr"], None)
        elif action == "free_completed":
            blocks[e["addr"]] = (e["size"], e.get("frames"))
        elif action == "segment_alloc":
            segs.pop(e["addr"], None)
        elif action == "segment_free":
            segs[e["addr"]] = e["size"]
    allocated = reserved = 0
    n = 0
    clock = 0

    def emit(kind, addr, size, frames=None, time_us=None):
        nonlocal allocated, reserved, n, clock
        if kind == "alloc":
            allocated += size
        elif kind == "free":
            allocated -= size
        elif kind == "reserve":
            reserved += size
        elif kind == "release":
            reserved -= size
        clock = max(clock + 1, int(time_us * 1000) if time_us else 0)
        rec.mem(kind, dev, int(addr), int(size), 0, stack(frames), clock, max(allocated, 0),
                max(reserved, 0))
        n += 1

    try:
        for addr in sorted(segs):
            emit("reserve", addr, segs[addr])
        for addr in sorted(blocks):
            emit("alloc", addr, blocks[addr][0], blocks[addr][1])
        kinds = {"segment_alloc": "reserve", "segment_free": "release", "alloc": "alloc",
                 "free_completed": "free"}
        for e in trace:
            kind = kinds.get(e.get("action"))
            if kind:
                emit(kind, e["addr"], e["size"], e.get("frames"), e.get("time_us"))
        rec.close("finished")
    except KeyError as e:
        rec.close(f"failed: damaged snapshot (missing {e})")
        raise SnapshotError(f"damaged snapshot: an entry has no {e}")
    return n
