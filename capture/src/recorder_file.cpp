// Recorder's file constructor: the one place capture calls storage::Writer::create. Kept apart so
// that code recording through its own Writer (tests) does not pull in the SQLite writer.
#include <unistd.h>

#include <chrono>

#include "keel/allocator.h"
#include "keel/capture/recorder.h"
#include "keel/version.h"

namespace keel::capture {

namespace {
std::unique_ptr<storage::Writer> openWriter(const std::string& path, storage::RunInfo& run,
                                            const CaptureOptions& options) {
  run.captureOptionsJson = options.toJson();
  // What the caller left unset is this process's: a program recording its own training through
  // the API (examples/mlp's mlp_train) wrote "started 1970-01-01", no host, no keel version and
  // "allocator unknown" (keel record's RecordingRun fills them itself).
  if (run.startTimeUnixNs == 0)
    run.startTimeUnixNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  if (run.host.empty()) {
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) run.host = host;
  }
  if (run.engineVersion.empty()) run.engineVersion = KEEL_VERSION_STRING;
  if (run.allocator.empty()) try {
      run.allocator = std::string(allocatorKindName(defaultAllocatorKind()));
    } catch (const Error&) {  // a bad KEEL_ALLOCATOR: the first allocation says so
    }
  return storage::Writer::create(path, run);
}
}  // namespace

Recorder::Recorder(const std::string& path, storage::RunInfo run, CaptureOptions options)
    : Recorder(openWriter(path, run, options), options) {}

}  // namespace keel::capture
