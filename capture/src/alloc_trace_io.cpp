// See alloc_trace_io.h.
#include "keel/capture/alloc_trace_io.h"

#include <unordered_map>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/storage/reader.h"

namespace keel::capture {

std::string noAllocatorEventsText(const storage::Recording& rec) {
  if (rec.run().backend == "torch")  // keel import torch-memory
    return "recording " + rec.path() +
           " has no allocator events: the PyTorch snapshot it was imported from holds no memory "
           "and no trace entry that changes memory";
  return "recording " + rec.path() +
         " has no allocator events (record with `keel record --allocator` or --all)";
}

AllocTrace allocTraceFromRecording(const storage::Recording& rec) {
  AllocTrace t;
  size_t events = 0;
  std::unordered_map<uint64_t, uint64_t> liveByAddress;  // address -> trace id
  std::unordered_map<uint64_t, uint64_t> liveIds;        // trace id -> its address, live blocks
  uint64_t nextId = uint64_t(1) << 62;                   // ids for events without a Buffer
  int64_t step = -1;
  for (const auto& m : rec.memEvents({})) {
    ++events;
    if (m.kind != MemEventKind::Alloc && m.kind != MemEventKind::Free) continue;
    if (m.step != step) {
      step = m.step;
      // Initialisation (step 0) comes before the first marker, as in `keel memory trace`'s
      // traces: a 3-step recording replayed as '4 steps'.
      if (step > 0) t.events.push_back({TraceEvent::Step, uint64_t(step), 0});
    }
    if (m.kind == MemEventKind::Alloc) {
      // m.bytes <= kMaxTraceBlock: the reader refuses larger ones (Note [Damaged recordings]).
      uint64_t id = m.bufferId ? m.bufferId : nextId++;
      // A Buffer allocated again while live (a damaged recording: Buffer ids are never reused)
      // frees its old block first, so the trace stays well formed, no id live twice (found by
      // fuzz_recording). A block whose address is allocated again stays live, as before.
      if (auto old = liveIds.find(id); old != liveIds.end()) {
        t.events.push_back({TraceEvent::Free, id, 0});
        if (auto a = liveByAddress.find(old->second); a != liveByAddress.end() && a->second == id)
          liveByAddress.erase(a);
        liveIds.erase(old);
      }
      liveByAddress[m.address] = id;
      liveIds[id] = m.address;
      t.events.push_back({TraceEvent::Alloc, id, m.bytes});
    } else if (auto it = liveByAddress.find(m.address); it != liveByAddress.end()) {
      t.events.push_back({TraceEvent::Free, it->second, 0});
      liveIds.erase(it->second);
      liveByAddress.erase(it);
    }
  }
  if (events == 0) throw Error(noAllocatorEventsText(rec));
  if (t.allocs() == 0)
    throw Error("recording " + rec.path() + " has " + std::to_string(events) + " allocator event" +
                (events == 1 ? "" : "s") + " but no allocation among them: nothing to replay");
  return t;
}

AllocTrace loadAllocTrace(const std::string& path) {
  requireRegularFile(path, "trace");
  if (storage::sqliteHeader(path) != storage::SqliteHeader::Sqlite) return readAllocTrace(path);
  return allocTraceFromRecording(storage::Recording::open(path));
}

}  // namespace keel::capture
