// Internal entry points of schema.cpp: create the schema at a version and run the migration table.
// Both expect the caller to hold no open transaction; each runs in one transaction of its own.
#pragma once
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sqlite.h"

namespace keel::storage::detail {

// Creates schema `version` (1..kSchemaVersion) and stamps application_id and user_version: the
// current version from its declaration (kSchema, tables only: secondary indexes come at close),
// an older one from kSchemaV1 plus the migrations up to it.
void createSchema(sql::Db& db, int version);
// Migrates a database at version `from` (< kSchemaVersion) to kSchemaVersion and builds the
// secondary indexes.
void migrateSchema(sql::Db& db, int from);
// Secondary indexes of the current schema (schema.cpp, beside kSchema), created (IF NOT EXISTS)
// when a writer closes a recording and after a migration; a recording whose writer was killed
// lacks them and is read with scans instead.
extern const char* const kDeferredIndexes;
// The summary tables (op_counts), rebuilt from the ops when a writer closes a recording and after
// a migration.
extern const char* const kSummaries;
// History: the full DDL of schema version 1 as shipped (schema_history.cpp). Only for creating
// older-version files; never the source of the current schema.
extern const char* const kSchemaV1;

// "recording <file> has schema version X, this keel reads up to Y".
std::string newerVersionMessage(const std::string& file, int64_t version);

}  // namespace keel::storage::detail

namespace keel::storage::detail {

// Shapes and strides as compact text: "4,16,64"; "" for rank 0 (Note [Recording encoding]).
inline void appendDims(std::string& out, const std::vector<int64_t>& dims) {
  out.clear();
  char buf[24];
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) out.push_back(',');
    auto r = std::to_chars(buf, buf + sizeof buf, dims[i]);
    out.append(buf, r.ptr);
  }
}
inline std::vector<int64_t> parseDims(std::string_view s) {
  std::vector<int64_t> dims;
  while (!s.empty()) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    dims.push_back(v);
    size_t used = static_cast<size_t>(p - s.data());
    if (ec != std::errc() || used == 0) break;
    s.remove_prefix(std::min(s.size(), used + 1));  // the number and its ','
  }
  return dims;
}

// The longest string the strings table holds (names, scopes, frames, attributes): a reader
// calls a longer one damaged, and the writer cuts one there (an imported snapshot's frame).
constexpr size_t kMaxStringBytes = 64 << 10;
// `text` cut at byte `at` (moved back to a UTF-8 boundary), saying how much was left out.
inline std::string cutText(std::string_view text, size_t at) {
  if (text.size() <= at) return std::string(text);
  while (at > 0 && (uint8_t(text[at]) & 0xC0) == 0x80) --at;
  return std::string(text.substr(0, at)) + "... (" + std::to_string(text.size() - at) +
         " more bytes)";
}

}  // namespace keel::storage::detail
