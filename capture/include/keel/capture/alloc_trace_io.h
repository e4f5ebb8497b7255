// Allocation traces from recordings: the alloc/free events a Recorder stored (`keel record
// --allocator`) as an engine AllocTrace, so a recorded run replays through any allocator like a
// text trace (`keel memory replay run.db`). Blocks are named by their Buffer id, else by address.
#pragma once
#include <string>

#include "keel/alloc_trace.h"

namespace keel::storage {
class Recording;
}

namespace keel::capture {

// The recording's alloc/free events, with a step mark wherever the step changes. Throws
// keel::Error when the recording has no allocator events.
AllocTrace allocTraceFromRecording(const storage::Recording& rec);
// "recording R has no allocator events (record with ...)": what a recording without any says,
// in the terms of where it came from (an imported PyTorch snapshot's trace changed no memory).
std::string noAllocatorEventsText(const storage::Recording& rec);
// A recording (an SQLite file) or a text trace (docs/memory.md), by the file's first bytes.
AllocTrace loadAllocTrace(const std::string& path);

}  // namespace keel::capture
