// Stack capture (glibc backtrace, which walks with the unwinder: no symbol lookup on the engine
// thread) and libdw symbolization on the writer thread. See stacks.h. Symbolization failures give
// frames with an empty function/file rather than errors: a stack is a debugging aid.
#include "stacks.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace keel::capture {

void captureStack(RawStack& out, int skip, int maxFrames) {
  void* buf[128];
  int want = std::min(128, maxFrames + skip + 1);
  int n = backtrace(buf, want);
  out.clear();
  for (int i = skip + 1; i < n; ++i) out.push_back(reinterpret_cast<uintptr_t>(buf[i]));
}

size_t RawStackHash::operator()(const RawStack& s) const noexcept {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the addresses
  for (uintptr_t a : s) {
    h ^= uint64_t(a);
    h *= 1099511628211ull;
  }
  return size_t(h);
}

int64_t StackTable::intern(const RawStack& s, bool& isNew) {
  auto [it, fresh] = ids_.try_emplace(s, int64_t(ids_.size()) + 1);
  isNew = fresh;
  return it->second;
}

struct Symbolizer::Dw {
  Dwfl_Callbacks callbacks{};
  Dwfl* dwfl = nullptr;
  char* debuginfoPath = nullptr;
  Dw() {
    callbacks.find_elf = dwfl_linux_proc_find_elf;
    callbacks.find_debuginfo = dwfl_standard_find_debuginfo;
    callbacks.debuginfo_path = &debuginfoPath;
    dwfl = dwfl_begin(&callbacks);
    if (!dwfl) return;
    dwfl_report_begin(dwfl);
    if (dwfl_linux_proc_report(dwfl, getpid()) != 0 || dwfl_report_end(dwfl, nullptr, nullptr)) {
      dwfl_end(dwfl);
      dwfl = nullptr;
    }
  }
  ~Dw() {
    if (dwfl) dwfl_end(dwfl);
  }
};

Symbolizer::Symbolizer() : dw_(std::make_unique<Dw>()) {}
Symbolizer::~Symbolizer() = default;

namespace {
std::string demangle(const char* name) {
  if (!name) return {};
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || !d) return name;
  std::string s(d);
  std::free(d);
  return s;
}

bool isCaptureFrame(std::string_view fn) {
  for (std::string_view p : {"keel::capture::", "keel::detail::notify", "keel::dispatch"})
    if (fn.substr(0, p.size()) == p) return true;
  return false;
}
}  // namespace

const storage::StackFrame& Symbolizer::frame(uintptr_t addr) {
  auto it = cache_.find(addr);
  if (it != cache_.end()) return it->second;
  storage::StackFrame f;
  f.address = addr;
  if (dw_->dwfl) {
    // A return address points after the call; look up the call instruction itself.
    Dwarf_Addr pc = Dwarf_Addr(addr) - 1;
    if (Dwfl_Module* mod = dwfl_addrmodule(dw_->dwfl, pc)) {
      f.function = demangle(dwfl_module_addrname(mod, pc));
      if (Dwfl_Line* line = dwfl_module_getsrc(mod, pc)) {
        int lineNo = 0;
        if (const char* file = dwfl_lineinfo(line, nullptr, &lineNo, nullptr, nullptr, nullptr)) {
          f.file = file;
          f.line = lineNo;
        }
      }
    }
  }
  return cache_.emplace(addr, std::move(f)).first->second;
}

storage::StackRecord Symbolizer::symbolize(int64_t id, const RawStack& addrs) {
  storage::StackRecord r;
  r.id = id;
  bool top = true;
  for (uintptr_t a : addrs) {
    const storage::StackFrame& f = frame(a);
    if (top && isCaptureFrame(f.function)) continue;
    top = false;
    r.frames.push_back(f);
  }
  return r;
}

}  // namespace keel::capture
