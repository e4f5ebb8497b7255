"""Plausible PyTorch CUDA memory snapshots, written with Python's pickle as
torch.cuda.memory._dump_snapshot() writes them, with the figures a correct importer must report.

A simulated caching allocator (segments of 2 MiB for small blocks and 20 MiB or the rounded
request for large ones, best-fit splitting, frees that return blocks to their segment, segments
released when empty now and then, as empty_cache() does) runs a training-like pattern: per
"step", activations allocated layer by layer and freed in reverse, temporaries freed at once,
weights and optimizer state allocated once. Every event carries frames: PyTorch shares one dict
per distinct frame between all stacks (so the pickle fetches it from its memo) and builds a new
list per traceback, and so does this.

Like PyTorch's ring buffer (max_entries), the trace kept is the last `keep` events; the snapshot's
segments are the state at the end. The expected figures follow Note [Torch memory snapshots]:
the importer starts from the state when the kept trace begins (reserved segments, then live
blocks), then replays the trace; peak and end allocated/reserved are computed here independently.

PyTorch 1.13 has no _dump_snapshot and no trace: its torch.cuda.memory._snapshot() returns the
list of segments alone, which users pickle themselves. generate_113() writes that list from the
same simulated allocator (as 1.13 splits blocks: a large free block leaving 1 MiB or less is
taken whole) and its block "history" (what was allocated in each block, in address order, the
block's own allocation first; each entry its own list of new frame dicts, as 1.13 builds them).
Its expected figures are the state at the end, and every event the importer must write.

    python3 tests/python/torch_snapshot_gen.py OUT.pickle --events N [--keep K] [--seed S]
        [--depth LO HI] [--devices D] [--protocol P] [--format 2|1.13]
                                                          prints the expected figures as JSON
"""

import argparse
import bisect
import json
import pickle
import random

MB = 1 << 20
SMALL = 1 << 20  # requests up to 1 MiB come from 2 MiB segments


def round_size(n):
    return max(512, (n + 511) // 512 * 512)


class Allocator:
    def __init__(self, rng, device, torch_113=False):
        self.rng = rng
        self.device = device
        self.next_addr = 0x7F0000000000 + device * (1 << 40)
        self.segments = {}  # addr -> {"size", "free": sorted [(addr, size)], "small": bool}
        self.live = {}  # addr -> (size, seg, frames)
        self.trace = []
        self.time_us = 1_700_000_000_000_000
        # PyTorch 1.13's split rule, and the request and rounded size in each alloc entry (what
        # its block history records); the 2.x snapshots are written without either.
        self.torch_113 = torch_113

    def event(self, action, addr, size, frames, **extra):
        self.time_us += self.rng.randint(1, 40)
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": self.time_us, "frames": frames, **extra})

    def alloc(self, request, frames):
        size = round_size(request)
        small = size <= SMALL
        best = None
        for seg_addr, seg in self.segments.items():
            if seg["small"] != small:
                continue
            for (a, s) in seg["free"]:
                if s >= size and (best is None or s < best[2]):
                    best = (seg_addr, a, s)
        if best is None:
            seg_size = 2 * MB if small else max(20 * MB, (size + 2 * MB - 1) // (2 * MB) * 2 * MB)
            seg_addr = self.next_addr
            self.next_addr += seg_size + 2 * MB
            self.segments[seg_addr] = {"size": seg_size, "free": [(seg_addr, seg_size)],
                                       "small": small}
            self.event("segment_alloc", seg_addr, seg_size, frames)
            best = (seg_addr, seg_addr, seg_size)
        seg_addr, a, s = best
        seg = self.segments[seg_addr]
        seg["free"].remove((a, s))
        rounded = size
        if self.torch_113 and not small and s - size <= SMALL:
            size = s  # 1.13 splits a large block only when more than 1 MiB would remain
        if s > size:
            bisect.insort(seg["free"], (a + size, s - size))
        self.live[a] = (size, seg_addr, frames)
        if self.torch_113:
            self.event("alloc", a, size, frames, real=request, rounded=rounded, seg=seg_addr)
        else:
            self.event("alloc", a, size, frames)
        return a

    def free(self, addr, frames):
        size, seg_addr, _ = self.live.pop(addr)
        self.event("free_requested", addr, size, frames)
        self.event("free_completed", addr, size, frames)
        seg = self.segments[seg_addr]
        bisect.insort(seg["free"], (addr, size))
        merged = []
        for (a, s) in seg["free"]:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        seg["free"] = merged

    def empty_cache(self, frames):
        for seg_addr in [a for a, s in self.segments.items() if s["free"] == [(a, s["size"])]]:
            self.event("segment_free", seg_addr, self.segments.pop(seg_addr)["size"], frames)


def frame_pool(rng, n):
    files = ["train.py", "model/gpt.py", "model/attention.py", "model/mlp.py",
             "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
             "/usr/lib/python3/dist-packages/torch/autograd/__init__.py",
             "/usr/lib/python3/dist-packages/torch/optim/adamw.py"]
    names = ["forward", "_call_impl", "backward", "step", "main", "attention", "mlp", "loss_fn",
             "_single_tensor_adamw", "linear", "layer_norm", "softmax"]
    return [{"filename": rng.choice(files), "line": rng.randint(1, 2000), "name": rng.choice(names)}
            for _ in range(n)]


def replay(trace):
    """The segments (address -> size) and live blocks (address -> (size, frames)) after `trace`."""
    segs, live = {}, {}
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            segs[e["addr"]] = e["size"]
        elif a == "segment_free":
            del segs[e["addr"]]
        elif a == "alloc":
            live[e["addr"]] = (e["size"], e["frames"])
        elif a == "free_completed":
            del live[e["addr"]]
    return segs, live


def train(al, rng, target, tb):
    """Training-like steps on `al` until its trace has `target` entries, cut there: the trace's
    end is whenever the snapshot was taken, mid-step."""
    weights = [al.alloc(rng.choice([4, 16, 64]) * MB, tb()) for _ in range(rng.randint(3, 8))]
    while len(al.trace) < target:
        acts = []
        for _ in range(rng.randint(4, 40)):
            acts.append(al.alloc(rng.choice([rng.randint(1, 4096) * 256,
                                             rng.randint(1, 64) * MB]), tb()))
            if rng.random() < 0.3:  # a temporary
                al.free(al.alloc(rng.randint(1, 2048) * 512, tb()), tb())
        for a in reversed(acts):
            al.free(a, tb())
        if rng.random() < 0.05:
            al.empty_cache(tb())
    del al.trace[target:]
    del weights


def generate(events, keep=None, seed=1, depth=(8, 24), devices=1):
    rng = random.Random(seed)
    frames = frame_pool(rng, 400)
    stacks = [rng.sample(frames, rng.randint(*depth)) for _ in range(600)]

    def tb():
        return list(rng.choice(stacks))  # a new list per traceback, shared frame dicts

    allocs = [Allocator(rng, d) for d in range(devices)]
    for d, al in enumerate(allocs):
        train(al, rng, events if d == 0 else max(1, events // 10), tb)
    # The allocators' state must match the (possibly cut) trace: rebuild it from the trace.
    snap = {"segments": [], "device_traces": [], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
    expected = {}
    for d, al in enumerate(allocs):
        segs, live = replay(al.trace)
        k = len(al.trace) if keep is None else min(keep, len(al.trace))
        cut = len(al.trace) - k
        # the state when the kept trace begins
        segs0, live0 = replay(al.trace[:cut])
        kept = al.trace[cut:]
        reserved = sum(segs0.values())
        allocated = sum(size for size, _ in live0.values())
        peak_r, peak_a = reserved, allocated
        n = len(segs0) + len(live0)
        for e in kept:
            a = e["action"]
            if a == "segment_alloc":
                reserved += e["size"]
            elif a == "segment_free":
                reserved -= e["size"]
            elif a == "alloc":
                allocated += e["size"]
            elif a == "free_completed":
                allocated -= e["size"]
            else:
                continue
            n += 1
            peak_r, peak_a = max(peak_r, reserved), max(peak_a, allocated)
        # segments as the snapshot shows them at the end (from the trace-consistent state)
        for seg_addr in sorted(segs):
            blocks, cursor = [], seg_addr
            for a in sorted(x for x in live if seg_addr <= x < seg_addr + segs[seg_addr]):
                if a > cursor:
                    blocks.append({"address": cursor, "size": a - cursor, "requested_size": 0,
                                   "state": "inactive"})
                size, fr = live[a]
                blocks.append({"address": a, "size": size, "requested_size": size,
                               "state": "active_allocated", "frames": fr})
                cursor = a + size
            if cursor < seg_addr + segs[seg_addr]:
                blocks.append({"address": cursor, "size": seg_addr + segs[seg_addr] - cursor,
                               "requested_size": 0, "state": "inactive"})
            snap["segments"].append({"device": d, "address": seg_addr, "total_size": segs[seg_addr],
                                     "stream": 0, "segment_type": "large",
                                     "segment_pool_id": (0, 0), "expandable": False,
                                     "frames": [], "blocks": blocks})
        snap["device_traces"].append(kept)
        expected[d] = {"events": n, "trace_entries": len(kept), "peak_allocated": peak_a,
                       "end_allocated": allocated, "peak_reserved": peak_r,
                       "end_reserved": reserved}
    return snap, expected


def replay_113(trace):
    """replay() with each segment's block history as PyTorch 1.13 keeps it: address -> (request,
    traceback) of what was allocated there; an allocation drops the entries it covers (its
    rounded size from its address) and adds its own; frees keep them; a released segment's go."""
    segs, live = replay(trace)
    history = {}
    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            history[e["addr"]] = {}
        elif a == "segment_free":
            del history[e["addr"]]
        elif a == "alloc":
            h = history[e["seg"]]
            for k in [k for k in h if e["addr"] <= k < e["addr"] + e["rounded"]]:
                del h[k]
            h[e["addr"]] = (e["real"], e["frames"])
    return segs, live, history


def generate_113(events, seed=1, depth=(8, 24), devices=1):
    """What PyTorch 1.13's torch.cuda.memory._snapshot() returns after
    _record_memory_history(True) (torch/csrc/cuda/Module.cpp there): a list of segments, each
    {device, address, total_size, allocated_size, active_size, stream, segment_type, blocks};
    each block {size, state} and, where anything was allocated in it, history [{addr,
    real_size, frames}]. Blocks have no address and the list no trace. Some live blocks are
    active_pending_free (freed, a stream still using them): live to the importer, as in 2.x
    snapshots; one history entry in 20 has no frames (no Python context). Returns (the list,
    expected figures per device with the events the importer must write: reserves, then allocs
    with their stack's innermost frame)."""
    rng = random.Random(seed)
    pool = frame_pool(rng, 400)
    stacks = [rng.sample(pool, rng.randint(*depth)) for _ in range(600)]

    def tb():
        return rng.choice(stacks)

    snap, expected = [], {}
    for d in range(devices):
        al = Allocator(rng, d, torch_113=True)
        train(al, rng, events if d == 0 else max(1, events // 10), tb)
        segs, live, history = replay_113(al.trace)
        reserved = allocated = 0
        reserves, allocs = [], []
        for seg_addr in sorted(segs):
            end = seg_addr + segs[seg_addr]
            hist = history[seg_addr]
            spans, cursor = [], seg_addr
            for a in sorted(x for x in live if seg_addr <= x < end):
                if a > cursor:
                    spans.append((cursor, a - cursor, "inactive"))
                state = "active_pending_free" if rng.random() < 0.1 else "active_allocated"
                spans.append((a, live[a][0], state))
                cursor = a + live[a][0]
            if cursor < end:
                spans.append((cursor, end - cursor, "inactive"))
            blocks = []
            for start, size, state in spans:
                block = {"size": size, "state": state}
                entries = []
                for k in sorted(k for k in hist if start <= k < start + size):
                    entry = {"addr": k, "real_size": hist[k][0]}
                    if rng.random() >= 0.05:  # a new list of new frame dicts per entry
                        entry["frames"] = [dict(f) for f in hist[k][1]]
                    entries.append(entry)
                if entries:
                    block["history"] = entries
                blocks.append(block)
                if state != "inactive":
                    own = entries[0] if entries and entries[0]["addr"] == start else {}
                    f = own.get("frames")
                    allocs.append(["alloc", start, size,
                                   [f[0]["filename"], f[0]["line"], f[0]["name"]] if f else None])
                    allocated += size
            reserves.append(["reserve", seg_addr, segs[seg_addr], None])
            reserved += segs[seg_addr]
            snap.append({
                "device": d, "address": seg_addr, "total_size": segs[seg_addr],
                "allocated_size": sum(b["size"] for b in blocks
                                      if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "stream": 0,
                "segment_type": "small" if segs[seg_addr] == 2 * MB else "large",
                "blocks": blocks})
        expected[d] = {"events": len(reserves) + len(allocs), "trace_entries": 0,
                       "peak_allocated": allocated, "end_allocated": allocated,
                       "peak_reserved": reserved, "end_reserved": reserved,
                       "mem_events": reserves + allocs}
    return snap, expected


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--keep", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--depth", type=int, nargs=2, default=(8, 24))
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--protocol", type=int, default=4)
    ap.add_argument("--format", choices=["2", "1.13"], default="2",
                    help="PyTorch 2.x's dict with traces, or 1.13's list of segments")
    a = ap.parse_args()
    if a.format == "1.13":
        snap, expected = generate_113(a.events, a.seed, tuple(a.depth), a.devices)
    else:
        snap, expected = generate(a.events, a.keep, a.seed, tuple(a.depth), a.devices)
    with open(a.out, "wb") as f:
        pickle.dump(snap, f, protocol=a.protocol)
    print(json.dumps(expected))


if __name__ == "__main__":
    main()
