// PyTorch CUDA memory snapshots (the pickle torch.cuda.memory._dump_snapshot() writes in 2.x, or
// the list PyTorch 1.13's torch.cuda.memory._snapshot() returns, pickled) as Keel recordings:
// read with the restricted unpickler (storage/src/pickle.h, Note [Restricted unpickler]) and
// written as one recording's allocator events, for `keel memory`, the studio's memory view and
// the fragmentation figures. See Note [Torch memory snapshots].
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "keel/base/output_path.h"
#include "keel/base/vocabulary.h"
#include "keel/storage/records.h"

namespace keel::storage {

// The allocator an imported snapshot's recording names (RunInfo::allocator).
inline constexpr std::string_view kTorchAllocatorName = "PyTorch CUDA caching";

// One device's allocator history from a snapshot, ready to be written.
struct TorchMemorySnapshot {
  struct Event {
    // reserve, release, alloc or free; oom: a request refused (`bytes`; `deviceFree`: what the
    // device had free then, by cudaMemGetInfo)
    MemEventKind kind = MemEventKind::Alloc;
    uint64_t address = 0, bytes = 0;
    int64_t stackId = -1;
    int64_t timeUs = 0;  // the trace entry's time_us; 0 when it has none
    uint64_t deviceFree = 0;
  };
  int device = 0;
  std::vector<Event> initial;       // the state the trace starts from: reserves, then live blocks
  std::vector<Event> trace;         // the trace's entries that change the picture, in order
  std::vector<StackRecord> stacks;  // ids 1..n, frames innermost first
  uint64_t segments = 0;            // the device's segments in the snapshot
  uint64_t traceEntries = 0;        // every entry of the device's trace, skipped kinds included
  std::vector<int> devices;         // the devices with segments or a trace, ascending
};

struct TorchMemoryReadOptions {
  int device = 0;
  int64_t maxBytes = int64_t(4) << 30;  // what the reader may hold (the trace is not held)
};

// Reads a snapshot from `file` (its current position to its end, `size` bytes; read twice).
// Throws StorageError with one line naming `name` for anything that is not a snapshot, or has no
// memory of the device.
TorchMemorySnapshot readTorchMemorySnapshot(std::FILE* file, uint64_t size, const std::string& name,
                                            const TorchMemoryReadOptions& options = {});
TorchMemorySnapshot readTorchMemorySnapshot(const std::string& path,
                                            const TorchMemoryReadOptions& options = {});

struct TorchMemoryWritten {
  uint64_t events = 0;
  uint64_t peakAllocated = 0, peakReserved = 0;
  uint64_t endAllocated = 0, endReserved = 0;
};

// Writes `snapshot` as a new recording at `path` (which must not exist; callers write beside the
// target and rename). `engineVersion` goes into the run's metadata, `source` into its options.
TorchMemoryWritten writeTorchMemoryRecording(const TorchMemorySnapshot& snapshot,
                                             const std::string& path,
                                             const std::string& engineVersion,
                                             const std::string& source);

// The whole import, as `keel import torch-memory`, the studio's File > Import and keel_torch run
// it: the output guard (Note [Outputs never destroy inputs]: `output` is not the snapshot nor any
// of `otherInputs`; errors name it as `outputOption`), the read, then the recording written beside
// `output` under its lock and renamed over it once complete.
struct TorchMemoryImportOptions {
  TorchMemoryReadOptions read;
  std::string engineVersion;        // e.g. "torch memory snapshot, keel 0.2.0"
  std::string outputOption = "-o";  // how errors name the output
  std::vector<NamedInput> otherInputs;
  // How errors and the recording (its capture options' "source") name the snapshot; "" its path.
  // keel_torch's import of an in-memory snapshot passes "the snapshot list", not a temp file.
  std::string sourceName;
};

struct TorchMemoryImported {
  int device = 0;
  uint64_t segmentsAtStart = 0, blocksAtStart = 0;  // live when the trace starts
  uint64_t traceEntries = 0, traceEvents = 0;       // entries, and those that change memory
  uint64_t ooms = 0;                                // of those, requests refused (oom)
  uint64_t stacks = 0;
  TorchMemoryWritten written;
  double readSeconds = 0, writeSeconds = 0;
};

TorchMemoryImported importTorchMemorySnapshot(const std::string& snapshot,
                                              const std::string& output,
                                              const TorchMemoryImportOptions& options);

}  // namespace keel::storage
