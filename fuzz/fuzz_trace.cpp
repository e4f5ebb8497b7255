// libFuzzer target: allocation traces in the text format (docs/memory.md). A trace that parses is
// well formed (every free names a live block, no id is live twice, sizes 1 .. 2^44) and reads back
// the same after writeAllocTrace; anything else must be a keel::Error naming the line.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_set>

#include "keel/alloc_trace.h"
#include "keel/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const keel::AllocTrace t = keel::parseAllocTrace(in, "fuzz.trace");
    std::unordered_set<uint64_t> live;
    for (const keel::TraceEvent& e : t.events)
      if ((e.kind == keel::TraceEvent::Alloc &&
           (!live.insert(e.id).second || e.bytes == 0 || e.bytes > keel::kMaxTraceBlock)) ||
          (e.kind == keel::TraceEvent::Free && !live.erase(e.id)))
        __builtin_trap();
    std::ostringstream out;
    keel::writeAllocTrace(t, out);
    std::istringstream again(out.str());
    const keel::AllocTrace u = keel::parseAllocTrace(again, "written.trace");
    if (u.events.size() != t.events.size()) __builtin_trap();
    for (size_t i = 0; i < t.events.size(); ++i)
      if (u.events[i].kind != t.events[i].kind || u.events[i].id != t.events[i].id ||
          u.events[i].bytes != t.events[i].bytes)
        __builtin_trap();
  } catch (const keel::Error&) {
  }
  return 0;
}
