// Recorder: installs an engine observer that turns op calls, steps, logs and allocator events into
// storage records and hands them through a bounded queue to ONE writer thread (batched commits).
// Invariants: memory stays bounded (the engine blocks, or drops and counts, when the queue is
// full); a writer error never crashes the engine — it is reported by status()/error().
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "keel/capture/options.h"
#include "keel/storage/records.h"
#include "keel/storage/writer.h"

namespace keel::capture {

enum class RecorderStatus : uint8_t { Recording, Finished, Failed };

struct RecorderCounts {
  int64_t ops = 0, steps = 0, stacks = 0, logs = 0, mems = 0, dumps = 0;  // written
  int64_t droppedOps = 0, droppedLogs = 0, droppedMems = 0, droppedDumps = 0;
  int64_t droppedHashes = 0;  // tensors recorded without checksums (drop policy, backlog full)
  // The hashing thread (Note [Hashing off the engine thread]): tensors and element bytes hashed,
  // how many of those tensors the engine's thread hashed itself (a buffer about to be written, a
  // full backlog) and how many the writer's, and the most element bytes that waited at once.
  int64_t hashedTensors = 0, hashedBytes = 0, hashedByEngine = 0, hashedByWriter = 0;
  int64_t peakHashBacklogBytes = 0;
  int64_t copiedBeforeWrite = 0;  // waiting tensors copied because their buffer was to be written
};

namespace detail {
class CaptureObserver;
}

class Recorder {
 public:
  // Creates the recording with storage::Writer::create(path, run) (run.captureOptionsJson is set
  // from options; a start time, host, engine version or allocator left unset is this process's)
  // and starts recording. Throws storage::StorageError if the file cannot be made.
  Recorder(const std::string& path, storage::RunInfo run, CaptureOptions options = {});
  // Records through a writer made elsewhere (tests use an in-memory one).
  explicit Recorder(std::unique_ptr<storage::Writer> writer, CaptureOptions options = {});
  // finish(); never throws.
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Uninstalls the observer, drains the queue, commits, sets the run status (finished, or
  // "failed: <reason>") and closes the writer. Idempotent; never throws.
  void finish();
  // finish(), recording the run's status as "failed: <reason>" (the run itself failed, e.g. an op
  // threw): everything captured so far is kept.
  void finishFailed(const std::string& reason);
  // finish(), recording the status as "stopped: <reason>" (a break condition or the user ended
  // the run early; it did not fail).
  void finishStopped(const std::string& reason);

  // Blocks until every record captured so far is committed (readable by another connection), or
  // the recording failed. A debugger calls it when it pauses the run. No-op after finish().
  void flush();
  // Tells the recorder that step `step` begins next, before the engine says so: what the caller
  // records first (a MemoryTrackingScope of the step) then counts as that step's, and at a step
  // range's first step the recorder has resumed for it (Note [A step range's first step]).
  void beforeStep(int64_t step);
  RecorderStatus status() const;
  bool failed() const { return status() == RecorderStatus::Failed; }
  std::string error() const;  // "" unless failed
  RecorderCounts counts() const;
  const CaptureOptions& options() const;

 private:
  std::shared_ptr<detail::CaptureObserver> obs_;
};

}  // namespace keel::capture
