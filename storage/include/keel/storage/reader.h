// Recording: the only read API over a recording file. Opens read-only (also a file whose writer is
// still running or was killed: SQLite's WAL recovery) and answers queries with plain value structs
// from records.h. Not thread-safe: one Recording per thread. Ranges are half-open [begin, end).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/storage/errors.h"
#include "keel/storage/records.h"

namespace keel::storage {

struct OpQuery {
  std::optional<int64_t> step;
  std::optional<Phase> phase;
  std::optional<std::string> name;  // exact op name
  std::optional<std::string>
      scopePrefix;  // keel::scopeWithin: "blocks.1" matches blocks.1 and blocks.1.*, not blocks.10
  std::optional<uint64_t> seqBegin, seqEnd;
  int64_t limit = -1;       // < 0: no limit
  bool withTensors = true;  // fill OpRecord::tensors
};

struct OpCount {
  std::string name;
  Phase phase = Phase::Forward;
  int64_t count = 0;
};

struct LogQuery {
  std::optional<int64_t> step;
  std::optional<uint64_t> opSeqBegin, opSeqEnd;
  std::optional<LogLevel> maxLevel;  // e.g. Warn: errors and warnings only
  int64_t limit = -1;
};

struct MemQuery {
  std::optional<int64_t> timeBegin, timeEnd;  // ns
  std::optional<uint64_t> opSeqBegin, opSeqEnd;
  int64_t limit = -1;
};

// What a file's first 16 bytes say: SQLite's header ("SQLite format 3" and a NUL), some other
// bytes (or fewer than 16), no bytes at all, or nothing readable. The one header check of
// Recording::open and of inputs that may be a recording or something else (allocator traces).
enum class SqliteHeader { Unreadable, Empty, Other, Sqlite };
SqliteHeader sqliteHeader(const std::string& path);
// Whether the file starts as a Python pickle of protocol 2 to 5 does (a PyTorch memory snapshot,
// which `keel import torch-memory` and the studio's File > Import turn into a recording).
bool looksLikePickle(const std::string& path);

struct DroppedCount {
  std::string kind;
  int64_t count = 0;
};

// One kernel that ran ops in a recording, with the ops it ran (by name, most calls first).
struct KernelUse {
  KernelRecord kernel;
  int64_t calls = 0;
  std::vector<std::pair<std::string, int64_t>> ops;  // op name, calls
};

class Recording {
 public:
  // Opens `path` read-only. Throws StorageError with a one-line message naming the file when it is
  // missing, not an SQLite file, not a Keel recording, corrupted or truncated, or from a newer
  // schema. An older schema is migrated in place first (see schema.h). `verify` runs SQLite's
  // PRAGMA quick_check (reads every page once; turn off for a fast live reopen).
  static Recording open(const std::string& path, bool verify = true);

  Recording(Recording&&) noexcept;
  Recording& operator=(Recording&&) noexcept;
  ~Recording();

  const std::string& path() const;
  int schemaVersion() const;

  RunInfo run() const;
  std::vector<StepRecord> steps() const;  // by step
  int64_t opCount() const;
  // Ops matching every set field of `q`, in execution (seq) order.
  std::vector<OpRecord> ops(const OpQuery& q) const;
  std::optional<OpRecord> op(uint64_t seq) const;
  // Counts per (name, phase), most frequent first; all steps when `step` is empty.
  std::vector<OpCount> opCountsByNameAndPhase(std::optional<int64_t> step = {}) const;
  std::optional<StackRecord> stack(int64_t id) const;
  std::vector<LogRecord> logs(const LogQuery& q) const;       // in logging order
  std::vector<MemRecord> memEvents(const MemQuery& q) const;  // in event order
  std::vector<DumpRecord> dumps(uint64_t opSeq) const;
  // The values of one dumped tensor (decompressed, converted to double, contiguous row-major);
  // nullopt when that tensor was not dumped. Throws StorageError when the dump is damaged (bad
  // zstd frame, size that does not match dtype and shape, unknown dtype or codec).
  std::optional<std::vector<double>> dumpValues(uint64_t opSeq, Role role, int32_t index) const;
  std::vector<DroppedCount> dropped() const;
  // The kernels that ran the recorded ops (schema v7), most calls first; empty for older files.
  std::vector<KernelUse> kernelUses() const;
  // The earliest op (by seq) where NaN/Inf values appear (nonFiniteAppearsAt: Note [Where
  // non-finite values appear]), with its tensors.
  std::optional<OpRecord> firstNonFinite() const;
  // Every op of every step (step 0, initialisation, first), with tensors, by step then seq: what
  // a whole-run diff reads.
  std::vector<OpRecord> allOps() const;
  // Every op of `step` with its tensors, by seq: the bulk loader diff and graph views use.
  std::vector<OpRecord> stepOps(int64_t step) const;

 private:
  struct Impl;
  explicit Recording(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::storage
