"""python3 -m keel_torch import-snapshot SNAPSHOT -o OUT.db [--device N]: a PyTorch CUDA memory
snapshot as a Keel recording (keel_torch.snapshot): the pickle torch.cuda.memory._dump_snapshot()
writes (PyTorch 2.x), or a pickle of what torch.cuda.memory._snapshot() returns (2.x's dict,
1.13's list of segments). Errors: one line, exit status 2."""
import argparse
import sys

from .snapshot import SnapshotError, import_snapshot


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m keel_torch")
    sub = ap.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import-snapshot", help="a PyTorch memory snapshot as a Keel recording")
    imp.add_argument("snapshot", help="the pickle: torch.cuda.memory._dump_snapshot()'s (2.x), or "
                     "torch.cuda.memory._snapshot() pickled (2.x or 1.13)")
    imp.add_argument("-o", "--output", required=True)
    imp.add_argument("--device", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        n = import_snapshot(a.snapshot, a.output, a.device)
    except (SnapshotError, RuntimeError, OSError) as e:
        print(f"keel_torch: error: {e}", file=sys.stderr)
        return 2
    print(f"keel_torch: {n} allocator events from {a.snapshot} -> {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
