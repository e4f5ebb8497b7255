"""PyTorch CUDA memory snapshots as Keel recordings, for the studio's memory view and
`keel memory stats`: no browser tab to crash, every event kept, and the fragmentation figures.
A snapshot is what torch.cuda.memory._snapshot() returns (PyTorch 2.x: a dict of segments and
allocator traces; 1.13: the list of segments alone, no trace), or a pickle of it (2.x's
torch.cuda.memory._dump_snapshot() writes one; in 1.13, pickle.dump(_snapshot(), f)).

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
    """Writes the allocator events of `device` in snapshot `source` into the Keel recording
    `out_path`: `source` is a path to a pickled snapshot, or what torch.cuda.memory._snapshot()
    returned in this process (a dict in PyTorch 2.x, a list in 1.13). Returns the number of
    events written. Raises SnapshotError (one line, naming `source`'s path, or "the snapshot
    dict/list" for one in memory) for anything Keel cannot read."""
    from . import _keel

    if isinstance(source, (dict, list)):
        # A snapshot this process holds is pickled (writing a pickle runs nothing) and read back
        # by the same reader as a file; errors name it as what was passed, not the temporary file.
        name = f"the snapshot {type(source).__name__}"
        fd, path = tempfile.mkstemp(suffix=".pickle")
        try:
            with os.fdopen(fd, "wb") as f:
                try:
                    pickle.dump(source, f, protocol=4)
                except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
                    raise SnapshotError(f"{name}: cannot be pickled: {e}") from None
            return _import(_keel, path, name, out_path, device)
        finally:
            os.unlink(path)
    try:
        path = os.fspath(source)
    except TypeError:
        raise TypeError("import_snapshot: source must be a path or what "
                        "torch.cuda.memory._snapshot() returns (a dict or a list), not "
                        f"{type(source).__name__}") from None
    return _import(_keel, path, None, out_path, device)


def _import(_keel, path, name, out_path, device):
    """The import of the pickle at `path`; `name`, when given, names it in errors and in the
    recording (an in-memory snapshot's temporary file is nobody's business)."""
    try:
        return _keel.import_torch_memory(path, os.fspath(out_path), device,
                                         name or "")["events"]
    except RuntimeError as e:
        raise SnapshotError(str(e)) from None
