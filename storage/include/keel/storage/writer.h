// Writer: appends records to one recording file (SQLite, WAL, prepared statements, batched
// transactions). Not thread-safe: capture/ owns one writer thread that calls it.
// Invariant: after commit() returns, everything written so far survives a crash of the process.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "keel/storage/errors.h"
#include "keel/storage/records.h"

namespace keel::storage {

struct WriterOptions {
  // Largest database the writer may grow to, in bytes (0: no limit). Past it, writes throw
  // StorageError exactly as on a full disk; what was committed stays readable.
  int64_t maxBytes = 0;
};

// A closed recording that viewers kept in WAL mode (a live session's views read it while it was
// written: Writer::close could not leave WAL) made self-contained: everything committed is
// checkpointed into the main file, so the .db alone holds the run (a copy of it read as 0 ops
// and "running"); with no other connection left, the file also leaves WAL mode and its -wal and
// -shm files go. Best effort and quiet: a file it cannot open or lock stays as it was.
void settleRecording(const std::string& path);

class Writer {
 public:
  // Creates (or truncates) the file and writes the schema and run row. Throws StorageError
  // (unwritable path, disk full, ...).
  static std::unique_ptr<Writer> create(const std::string& path, const RunInfo& run);
  static std::unique_ptr<Writer> create(const std::string& path, const RunInfo& run,
                                        const WriterOptions& options);
  virtual ~Writer() = default;

  virtual void writeStep(const StepRecord& s) = 0;  // insert or update (by step)
  virtual void writeOp(const OpRecord& op) = 0;
  virtual void writeStack(const StackRecord& s) = 0;  // once per id
  virtual void writeLog(const LogRecord& l) = 0;
  virtual void writeMem(const MemRecord& m) = 0;
  virtual void writeDump(const DumpRecord& d) = 0;
  virtual void setRunStatus(const std::string& status) = 0;
  // Records lost to a configured drop policy, by kind ("op", "log", "mem"); shown by inspect.
  virtual void addDropped(const std::string& kind, int64_t count) = 0;
  // Ends the current transaction (durable) and opens the next.
  virtual void commit() = 0;
  // Commits and closes; further calls throw.
  virtual void close() = 0;
  // After a failed write: records `status` and closes, as far as the file still allows; never
  // throws. (The SQLite writer falls back to a fresh connection: the one whose write failed may
  // refuse every later write.)
  virtual void closeWithStatus(const std::string& status) noexcept {
    try {
      setRunStatus(status);
      commit();
    } catch (...) {
    }
    try {
      close();
    } catch (...) {
    }
  }
};

}  // namespace keel::storage
