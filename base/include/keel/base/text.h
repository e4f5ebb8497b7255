// Small text helpers of the shared vocabulary: module-scope matching, byte counts for people, and
// reading a whole file. One definition each, used by every layer.
#pragma once
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

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

// A byte count in MiB with one decimal ("3.0 MiB"): table columns that compare sizes side by side.
inline std::string formatMiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// The whole file as bytes. Throws keel::Error "<path>: cannot open <what> (missing or
// unreadable)" or "<path>: error reading <what>".
inline std::string readFile(const std::string& path, std::string_view what = "file") {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(detail::concat(path, ": cannot open ", what, " (missing or unreadable)"));
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(detail::concat(path, ": error reading ", what));
  return out;
}

}  // namespace keel
