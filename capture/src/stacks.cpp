// Stack capture (glibc backtrace, which walks with the unwinder: no symbol lookup on the engine
// thread) and libdw symbolization on the writer thread. See stacks.h. Symbolization failures give
// frames with an empty function/file rather than errors: a stack is a debugging aid.
#include "stacks.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
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

namespace {
// The demangled name of a function DIE or of an inlined call's DIE (through its abstract origin
// and specification to the linkage name). A function without one (internal linkage: an anonymous
// namespace, a static function) is named by its plain name qualified by the namespaces and
// classes around its declaration, as the demangler names the same function when it is not
// inlined: "keel::cli::(anonymous namespace)::run", not "run".
std::string dieFunction(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name})
    if (const char* n = dwarf_formstring(dwarf_attr_integrate(die, at, &attr))) return demangle(n);
  const char* n = dwarf_diename(die);
  if (!n) return "";
  // The declaration: follow the abstract origin and the specification to the DIE whose parents
  // are the function's namespaces and classes.
  Dwarf_Die decl = *die;
  for (int hops = 0; hops < 8; ++hops) {
    Dwarf_Die next;
    Dwarf_Attribute ref;
    if (!dwarf_formref_die(dwarf_attr(&decl, DW_AT_abstract_origin, &ref), &next) &&
        !dwarf_formref_die(dwarf_attr(&decl, DW_AT_specification, &ref), &next))
      break;
    decl = next;
  }
  std::string qualified = n;
  Dwarf_Die* parents = nullptr;
  const int count = dwarf_getscopes_die(&decl, &parents);
  for (int i = 1; i < count; ++i) {  // parents[0] is decl itself; the unit ends the chain
    const int tag = dwarf_tag(&parents[i]);
    if (tag != DW_TAG_namespace && tag != DW_TAG_class_type && tag != DW_TAG_structure_type &&
        tag != DW_TAG_union_type)
      continue;
    const char* scope = dwarf_diename(&parents[i]);
    const char* unnamed = tag == DW_TAG_namespace ? "(anonymous namespace)" : "{unnamed type}";
    qualified = std::string(scope ? scope : unnamed) + "::" + qualified;
  }
  std::free(parents);
  return qualified;
}

// DW_AT_call_file / DW_AT_call_line of an inlined call: where its caller called it.
void callSite(Dwarf_Die* inlined, Dwarf_Files* files, std::string& file, int& line) {
  file.clear();
  line = 0;
  Dwarf_Attribute attr;
  Dwarf_Word v = 0;
  if (files && dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &v) == 0)
    if (const char* f = dwarf_filesrc(files, v, nullptr, nullptr)) file = f;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &v) == 0) line = int(v);
}
}  // namespace

const std::vector<storage::StackFrame>& Symbolizer::frames(uintptr_t addr) {
  auto it = cache_.find(addr);
  if (it != cache_.end()) return it->second;
  std::vector<storage::StackFrame> out;
  storage::StackFrame f;
  f.address = addr;
  // A return address points after the call; look up the call instruction itself.
  const Dwarf_Addr pc = Dwarf_Addr(addr) - 1;
  if (Dwfl_Module* mod = dw_->dwfl ? dwfl_addrmodule(dw_->dwfl, pc) : nullptr) {
    const std::string physical = demangle(dwfl_module_addrname(mod, pc));
    // The innermost location, from the line table.
    std::string file;
    int line = 0;
    if (Dwfl_Line* l = dwfl_module_getsrc(mod, pc))
      if (const char* name = dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr))
        file = name;  // as the line table names it, like the call sites below
    // The inlined calls around pc, innermost first, up to the function they were inlined into.
    // dwarf_getscopes gives the innermost scope at pc (then the abstract definition's parents);
    // dwarf_getscopes_die walks that scope's concrete parents: every inlined call, then the
    // function (as eu-addr2line -i does).
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(mod, pc, &bias);
    Dwarf_Die* scopes = nullptr;
    Dwarf_Die* chain = nullptr;
    const int n = cu ? dwarf_getscopes(cu, pc - bias, &scopes) : 0;
    const int m = n > 0 ? dwarf_getscopes_die(&scopes[0], &chain) : 0;
    for (int i = 0; i < m; ++i) {
      const int tag = dwarf_tag(&chain[i]);
      if (tag == DW_TAG_subprogram) break;
      if (tag != DW_TAG_inlined_subroutine) continue;  // lexical blocks
      f.function = dieFunction(&chain[i]);
      f.file = file;
      f.line = line;
      out.push_back(f);
      // Where its caller called it, named through the file table of the call's own unit.
      Dwarf_Die unit;
      Dwarf_Files* files = nullptr;
      size_t fileCount = 0;
      if (!dwarf_diecu(&chain[i], &unit, nullptr, nullptr) ||
          dwarf_getsrcfiles(&unit, &files, &fileCount) != 0)
        files = nullptr;
      callSite(&chain[i], files, file, line);
    }
    std::free(chain);
    std::free(scopes);
    f.function = physical;
    f.file = file;
    f.line = line;
  }
  out.push_back(std::move(f));
  return cache_.emplace(addr, std::move(out)).first->second;
}

storage::StackRecord Symbolizer::symbolize(int64_t id, const RawStack& addrs) {
  storage::StackRecord r;
  r.id = id;
  bool top = true;
  for (uintptr_t a : addrs)
    for (const storage::StackFrame& f : frames(a)) {
      if (top && isCaptureFrame(f.function)) continue;
      top = false;
      r.frames.push_back(f);
    }
  return r;
}

}  // namespace keel::capture
