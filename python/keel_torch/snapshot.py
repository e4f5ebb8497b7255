"""PyTorch CUDA memory snapshots (the pickle torch.cuda.memory._dump_snapshot() writes, or the
dict torch.cuda.memory._snapshot() returns) as Keel recordings, for the studio's memory view and
`keel memory stats`: no browser tab to crash, every event kept, and the fragmentation figures.

    python3 -m keel_torch import-snapshot snapshot.pickle -o mem.db [--device 0]
    keel import torch-memory snapshot.pickle -o mem.db [--device 0]        (the same, in C++)

The file is read by Keel's restricted unpickler in C++ (storage/src/pickle.h, through the _keel
extension), never by Python's pickle module: a pickle can run code, and a snapshot is data.
How a snapshot becomes allocator events: Note [Torch memory snapshots] in
storage/src/torch_memory.cpp.
"""

import os
import pickle
import tempfile


class SnapshotError(Exception):
    """A snapshot Keel cannot read: one line saying why."""


def import_snapshot(source, out_path, device=0):
    """Writes the allocator events of `device` in snapshot `source` (a path, or the dict
    torch.cuda.memory._snapshot() returned in this process) into the Keel recording `out_path`.
    Returns the number of events written."""
    from . import _keel

    if isinstance(source, dict):
        # A dict this process holds is pickled (writing a pickle runs nothing) and read back by
        # the same reader as a file.
        fd, path = tempfile.mkstemp(suffix=".pickle")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(source, f, protocol=4)
            return import_snapshot(path, out_path, device)
        finally:
            os.unlink(path)
    try:
        return _keel.import_torch_memory(os.fspath(source), os.fspath(out_path), device)["events"]
    except RuntimeError as e:
        raise SnapshotError(str(e)) from None
