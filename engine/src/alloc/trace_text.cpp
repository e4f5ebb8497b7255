// Allocation traces, the text format (docs/memory.md): parsed with every line checked, and written.
// Apart from the engine's observers and allocators, so it builds alone (fuzz/fuzz_trace.cpp). A
// parsed trace is well formed: every free names a live block, no id is live twice.
#include <algorithm>
#include <charconv>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include "keel/alloc_trace.h"
#include "keel/base/text.h"
#include "keel/error.h"

namespace keel {

size_t AllocTrace::allocs() const {
  return size_t(std::count_if(events.begin(), events.end(),
                              [](const TraceEvent& e) { return e.kind == TraceEvent::Alloc; }));
}
size_t AllocTrace::steps() const {
  return size_t(std::count_if(events.begin(), events.end(),
                              [](const TraceEvent& e) { return e.kind == TraceEvent::Step; }));
}

AllocTrace parseAllocTrace(std::istream& in, const std::string& name) {
  constexpr uint64_t kMaxBlock = kMaxTraceBlock;
  constexpr size_t kMaxTraceLine = 4096;
  AllocTrace t;
  std::unordered_set<uint64_t> live;
  std::string line;
  int64_t lineNo = 0;
  auto bad = [&](const std::string& what) {
    return Error(detail::concat(name, ":", lineNo, ": ", what));
  };
  // Lines are read at most kMaxTraceLine bytes at a time: a huge file of zeros or one 5 MB token
  // is refused at its first line instead of being read whole into memory.
  std::streambuf* buf = in.rdbuf();
  auto nextLine = [&] {
    line.clear();
    for (int c = buf->sbumpc(); c != std::char_traits<char>::eof(); c = buf->sbumpc()) {
      if (c == '\n') return true;
      if (line.size() == kMaxTraceLine)
        throw bad(detail::concat("line longer than ", kMaxTraceLine,
                                 " bytes; an allocation trace has lines like 'a ID BYTES'"));
      line.push_back(char(c));
    }
    in.setstate(std::ios::eofbit);
    return !line.empty();
  };
  while (buf && (++lineNo, nextLine())) {
    if (lineNo == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();                // CRLF
    // A text trace has no control bytes: a pickle, a binary or a damaged file says what it is
    // not, instead of echoing its bytes (a NUL cut the line, ESC drove the terminal).
    auto control = [](char c) {
      return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
    };
    if (auto c = std::find_if(line.begin(), line.end(), control); c != line.end())
      throw bad("binary data (byte " + visibleText(std::string(1, *c)) +
                "): not an allocation trace (lines like 'a ID BYTES') nor a Keel recording");
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind)) continue;
    // Unsigned decimal only: istream would wrap "-1" to 2^64 - 1.
    auto number = [&](uint64_t& v) {
      std::string tok;
      if (!(ls >> tok)) return false;
      auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
      return ec == std::errc() && end == tok.data() + tok.size();
    };
    TraceEvent e;
    if (kind == "a") {
      e.kind = TraceEvent::Alloc;
      if (!number(e.id) || !number(e.bytes)) throw bad("expected 'a ID BYTES'");
      if (e.bytes == 0 || e.bytes > kMaxBlock)
        throw bad(detail::concat("block size ", e.bytes, " is out of range (1 .. 2^44)"));
      if (!live.insert(e.id).second) throw bad(detail::concat("block ", e.id, " is already live"));
    } else if (kind == "f") {
      e.kind = TraceEvent::Free;
      if (!number(e.id)) throw bad("expected 'f ID'");
      if (!live.erase(e.id))
        throw bad(detail::concat("free of block ", e.id, ", which is not live"));
    } else if (kind == "s") {
      e.kind = TraceEvent::Step;
      if (!number(e.id)) throw bad("expected 's STEP'");
    } else {
      throw bad("unknown event '" + visibleText(clipText(kind, 40)) + "' (expected a, f or s)");
    }
    std::string extra;
    if (ls >> extra)
      throw bad("unexpected '" + visibleText(clipText(extra, 40)) + "' after the event");
    t.events.push_back(e);
  }
  if (in.bad()) throw Error(name + ": read error");
  return t;
}

AllocTrace readAllocTrace(const std::string& path) {
  requireRegularFile(path, "allocation trace");
  std::ifstream f(path);
  if (!f) throw Error("cannot open allocation trace '" + path + "'");
  return parseAllocTrace(f, path);
}

void writeAllocTrace(const AllocTrace& t, std::ostream& out) {
  out << "# keel allocation trace: a ID BYTES | f ID | s STEP\n";
  for (const auto& e : t.events) {
    switch (e.kind) {
      case TraceEvent::Alloc:
        out << "a " << e.id << ' ' << e.bytes << '\n';
        break;
      case TraceEvent::Free:
        out << "f " << e.id << '\n';
        break;
      case TraceEvent::Step:
        out << "s " << e.id << '\n';
        break;
    }
  }
}

}  // namespace keel
