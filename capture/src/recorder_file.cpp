// Recorder's file constructor: the one place capture calls storage::Writer::create. Kept apart so
// that code recording through its own Writer (tests) does not pull in the SQLite writer.
#include "keel/capture/recorder.h"

namespace keel::capture {

namespace {
std::unique_ptr<storage::Writer> openWriter(const std::string& path, storage::RunInfo& run,
                                            const CaptureOptions& options) {
  run.captureOptionsJson = options.toJson();
  return storage::Writer::create(path, run);
}
}  // namespace

Recorder::Recorder(const std::string& path, storage::RunInfo run, CaptureOptions options)
    : Recorder(openWriter(path, run, options), options) {}

}  // namespace keel::capture
