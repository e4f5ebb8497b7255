// Native call stacks: raw return addresses captured cheaply on the engine thread (backtrace),
// deduplicated by address vector into stack ids, and symbolized lazily on the writer thread with
// libdw (function demangled, file, line), cached per address. Internal to keel_capture.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/base/non_copyable.h"
#include "keel/storage/records.h"

namespace keel::capture {

using RawStack = std::vector<uintptr_t>;

// Return addresses of the caller's stack, innermost first, skipping `skip` frames above the
// caller (the capture function itself is always skipped). At most `maxFrames` frames.
void captureStack(RawStack& out, int skip, int maxFrames = 64);

struct RawStackHash {
  size_t operator()(const RawStack& s) const noexcept;
};

// Engine-thread side: address vector -> id (ids 1, 2, ...). intern() reports whether it is new.
class StackTable {
 public:
  int64_t intern(const RawStack& s, bool& isNew);

 private:
  std::unordered_map<RawStack, int64_t, RawStackHash> ids_;
};

// Writer-thread side: symbolizes frames with libdw, caching per address. An address inside
// inlined code gives one frame per inlined call, innermost first (the inlined function at the
// line the line table gives, then each caller at its call site), so a frame's function and line
// belong together: an inlined Module::operator() no longer reads as "SwiGLU::forwardImpl at
// nn.h:86". Leading frames inside capture and the dispatcher (keel::capture::*,
// keel::detail::notify*, keel::dispatch*) are dropped so a stack starts at the code that called
// the op.
class Symbolizer : NonCopyable {
 public:
  Symbolizer();
  ~Symbolizer();
  storage::StackRecord symbolize(int64_t id, const RawStack& addrs);

 private:
  // The frames of one return address, innermost first (several when the call was inlined).
  const std::vector<storage::StackFrame>& frames(uintptr_t addr);
  struct Dw;
  std::unique_ptr<Dw> dw_;
  std::unordered_map<uintptr_t, std::vector<storage::StackFrame>> cache_;
};

}  // namespace keel::capture
