// Small text helpers of the shared vocabulary: module-scope matching, byte counts for people,
// numbers from the command line, and reading a whole file. One definition each, used by every
// layer.
#pragma once
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/base/error.h"

namespace keel {

// True when module scope `scope` is `prefix` or lies below it on a dot boundary ("blocks.1" holds
// "blocks.1.attn" but not "blocks.10"); an empty prefix holds every scope. The one scope match of
// verbose rules, capture filters, breakpoints and the views' filters.
constexpr bool scopeWithin(std::string_view scope, std::string_view prefix) {
  if (prefix.empty()) return true;
  if (scope.size() < prefix.size() || scope.substr(0, prefix.size()) != prefix) return false;
  return scope.size() == prefix.size() || scope[prefix.size()] == '.';
}

// "1 op", "2 ops": a count and its noun, singular for one.
inline std::string countText(uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

// "a, b, c": the parts with `sep` between them.
inline std::string joinText(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// A byte count for people, to three significant digits in binary units: "512 B", "1.50 KiB",
// "15.0 MiB", "150 GiB", "2.00 TiB".
inline std::string formatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
  }
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

// `v` for printf: a NaN without its sign bit, so "%.4f" prints "nan", not "-nan" (a NaN's sign
// means nothing; a NaN loss came out as "loss -nan").
inline double unsignedNaN(double v) {
  return std::isnan(v) ? std::fabs(v) : v;
}

// A byte count in MiB with one decimal ("3.0 MiB"): table columns that compare sizes side by side.
inline std::string formatMiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// All of `text` read as a finite number ("0.5", "1e-3", " 2" with blanks before it), or nullopt:
// nothing or something after the number, "inf", "nan", or out of double's range. The one reading
// of a number option (keel's validators, --break-on's thresholds).
inline std::optional<double> parseFiniteNumber(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// `text` if it is at most `max` bytes, else its start and its end with how much was left out
// between them: "START … (N bytes left out) … END", START two thirds of `max`. Every error a person
// reads goes through it (the keel tool's error line, the studio's dialogs, AOA's messages), so a
// 5 MB token in a trace or a 10 MB key in a rule file quotes a readable excerpt, not the whole
// thing. Cuts never split a UTF-8 sequence.
inline std::string clipText(std::string_view text, size_t max = 1000) {
  if (text.size() <= max) return std::string(text);
  auto isCont = [&](size_t i) { return i < text.size() && (uint8_t(text[i]) & 0xC0) == 0x80; };
  size_t head = max * 2 / 3, tail = text.size() - (max - head);
  while (head > 0 && isCont(head)) --head;
  while (isCont(tail)) ++tail;
  return detail::concat(text.substr(0, head), " … (", tail - head, " bytes left out) … ",
                        text.substr(tail));
}

// `text` with its control characters (a newline, ESC, NUL) written as \xNN, so a name or token
// from a hostile file prints as one line that cannot drive the terminal.
inline std::string visibleText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char ch : text) {
    if (ch >= 0x20 && ch != 0x7f) {
      out += char(ch);
      continue;
    }
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[ch >> 4];
    out += kHex[ch & 15];
  }
  return out;
}

// What kind of non-regular thing a path names ("a directory", "a FIFO", "a character device",
// ...), or "" for a regular file or nothing there. Inputs that must be files are checked with it
// before they are opened: opening a FIFO for reading blocks until a writer comes, and /dev/zero
// never ends.
inline std::string nonRegularKind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "not a regular file";
}

// Throws keel::Error "<path>: <what> is a FIFO, not a regular file" unless `path` is a regular
// file or does not exist (opening it then says so).
inline void requireRegularFile(const std::string& path, std::string_view what) {
  if (const std::string kind = nonRegularKind(path); !kind.empty())
    throw Error(detail::concat(path, ": ", what, " is ", kind, ", not a regular file"));
}

// Deepest bracket nesting of JSON text outside strings (0 for a scalar). A linear scan with no
// recursion, run before any JSON Keel reads is parsed (Note [Bounded JSON]).
inline size_t jsonNestingDepth(std::string_view s) {
  size_t depth = 0, deepest = 0;
  bool inString = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"')
      inString = true;
    else if ((c == '{' || c == '[') && ++depth > deepest)
      deepest = depth;
    else if ((c == '}' || c == ']') && depth > 0)
      --depth;
  }
  return deepest;
}

// Note [Bounded JSON]
// Every JSON document Keel reads (configs, capture options, checkpoint metadata and train state,
// safetensors headers) is checked by checkJsonDepth before it is parsed: a config with 100,000
// nested arrays in one field crashed the process (SIGSEGV, deep recursion) instead of giving one
// line. No Keel document nests deeper than a few levels; 64 leaves room for user metadata.
inline constexpr size_t kMaxJsonDepth = 64;

// Throws keel::Error "<source>: JSON nested N levels deep, more than the M allowed".
inline void checkJsonDepth(std::string_view text, std::string_view source,
                           size_t maxDepth = kMaxJsonDepth) {
  if (const size_t d = jsonNestingDepth(text); d > maxDepth)
    throw Error(detail::concat(source, ": JSON nested ", d, " levels deep, more than the ",
                               maxDepth, " allowed"));
}

// A JSON library's error as a person reads it: "[json.exception.parse_error.101] parse error at
// line 2, column 1: syntax error ..." becomes "line 2, column 1: syntax error ...", on one line.
inline std::string jsonErrorText(std::string_view what) {
  std::string s(what);
  if (s.rfind("[json.exception.", 0) == 0)
    if (const size_t close = s.find("] "); close != std::string::npos) s.erase(0, close + 2);
  if (s.rfind("parse error at ", 0) == 0) s.erase(0, 15);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// The largest model or workload config read (a real one is a few hundred bytes).
inline constexpr uint64_t kMaxConfigBytes = 1 << 20;

// The whole file as bytes, at most `maxBytes` (a config has no business being 40 MB). Throws
// keel::Error "<path>: cannot open <what> (missing or unreadable)", "<path>: <what> is a FIFO,
// not a regular file", or "<path>: <what> is 40.0 MiB, more than the 1.00 MiB allowed".
inline std::string readFile(const std::string& path, std::string_view what = "file",
                            uint64_t maxBytes = UINT64_MAX) {
  requireRegularFile(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(detail::concat(path, ": cannot open ", what, " (missing or unreadable)"));
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size >= 0 && uint64_t(size) > maxBytes)
    throw Error(detail::concat(path, ": ", what, " is ", formatBytes(uint64_t(size)),
                               ", more than the ", formatBytes(maxBytes), " allowed"));
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(detail::concat(path, ": error reading ", what));
  return out;
}

}  // namespace keel
