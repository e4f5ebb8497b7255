// See alloc_trace_io.h.
#include "keel/capture/alloc_trace_io.h"

#include <unordered_map>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/storage/reader.h"

namespace keel::capture {

AllocTrace allocTraceFromRecording(const storage::Recording& rec) {
  AllocTrace t;
  std::unordered_map<uint64_t, uint64_t> liveByAddress;  // address -> trace id
  uint64_t nextId = uint64_t(1) << 62;                   // ids for events without a Buffer
  int64_t step = -1;
  int64_t row = 0;  // the event's position among the recording's allocator events
  for (const auto& m : rec.memEvents({})) {
    ++row;
    if (m.kind != MemEventKind::Alloc && m.kind != MemEventKind::Free) continue;
    if (m.step != step) {
      step = m.step;
      t.events.push_back({TraceEvent::Step, uint64_t(step), 0});
    }
    if (m.kind == MemEventKind::Alloc) {
      // A damaged row (bytes -1 reads as 2^64 - 1) would make the replay reserve without bound.
      if (m.bytes > kMaxTraceBlock)
        throw Error("damaged recording " + rec.path() + ": allocator event " + std::to_string(row) +
                    " allocates " + std::to_string(int64_t(m.bytes)) +
                    " bytes (out of range 0 .. 2^44)");
      uint64_t id = m.bufferId ? m.bufferId : nextId++;
      liveByAddress[m.address] = id;
      t.events.push_back({TraceEvent::Alloc, id, m.bytes});
    } else if (auto it = liveByAddress.find(m.address); it != liveByAddress.end()) {
      t.events.push_back({TraceEvent::Free, it->second, 0});
      liveByAddress.erase(it);
    }
  }
  if (t.allocs() == 0)
    throw Error("recording " + rec.path() +
                " has no allocator events (record with `keel record --allocator` or --all)");
  return t;
}

AllocTrace loadAllocTrace(const std::string& path) {
  requireRegularFile(path, "trace");
  if (storage::sqliteHeader(path) != storage::SqliteHeader::Sqlite) return readAllocTrace(path);
  return allocTraceFromRecording(storage::Recording::open(path));
}

}  // namespace keel::capture
