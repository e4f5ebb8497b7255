// RAII wrappers for sqlite3* and sqlite3_stmt*: a Db owns one connection, a Stmt one prepared
// statement. Every failure becomes a StorageError naming the recording file and sqlite's message;
// nothing here aborts. Internal to keel_storage (not installed, not used outside storage/src).
#pragma once
#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "keel/storage/errors.h"

namespace keel::storage::sql {

// A PRAGMA quick_check finding as a person reads it: "page 4 of the file is damaged" for
// "*** in database main *** Page 4: btreeInitPage() returns error code 11"; one line.
std::string integrityText(std::string_view check);

// One-line message for an sqlite result code: "recording <file>: <what>: <sqlite message>", with
// corruption, not-a-database and disk-full spelled out so users see what to do.
// sysErrno: the OS error behind an I/O error (sqlite3_system_errno), 0 unknown.
std::string describe(const std::string& file, const std::string& what, int rc, const char* msg,
                     int sysErrno = 0);

class Db {
 public:
  Db() = default;
  // Opens `path` with sqlite3_open_v2 `flags` (plus NOMUTEX: a connection is used by one thread
  // at a time, so SQLite's per-call mutexes are pure cost); throws StorageError.
  Db(const std::string& path, int flags);
  Db(Db&& o) noexcept : db_(o.db_), path_(std::move(o.path_)) { o.db_ = nullptr; }
  Db& operator=(Db&& o) noexcept;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  ~Db() { close(); }

  // Closes the connection (finalize every Stmt first). Never throws.
  void close() noexcept;
  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }
  // Runs one or more statements without results; throws on error.
  void exec(const char* sqlText, const char* what = "statement failed");
  // Throws StorageError for result code rc (uses the connection's current message).
  [[noreturn]] void fail(const std::string& what, int rc) const;
  // The single integer result of a pragma or query such as "PRAGMA user_version".
  int64_t queryInt(const char* sqlText);

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

class Stmt {
 public:
  Stmt() = default;
  Stmt(const Db& db, std::string_view sqlText);
  Stmt(Stmt&& o) noexcept : db_(o.db_), st_(o.st_) { o.st_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(st_); }

  // Binds are 1-based like sqlite's. Text and blobs are bound SQLITE_STATIC: keep the data alive
  // until step() has returned false or reset() has run.
  void bind(int i, int64_t v) { check(sqlite3_bind_int64(st_, i, v)); }
  void bind(int i, uint64_t v) { check(sqlite3_bind_int64(st_, i, static_cast<int64_t>(v))); }
  void bind(int i, int v) { check(sqlite3_bind_int64(st_, i, v)); }
  // NaN binds as NULL (sqlite's own rule, stated here so readers map NULL back to NaN).
  void bind(int i, double v) {
    check(std::isnan(v) ? sqlite3_bind_null(st_, i) : sqlite3_bind_double(st_, i, v));
  }
  void bindText(int i, std::string_view v) {
    check(sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC));
  }
  void bindBlob(int i, const void* p, size_t n) {
    check(sqlite3_bind_blob64(st_, i, n ? p : "", n, SQLITE_STATIC));
  }
  void bindNull(int i) { check(sqlite3_bind_null(st_, i)); }
  // Binds v... to parameters first, first + 1, ... in order: anything a string_view takes as text,
  // numbers through bind. Arguments are evaluated before any is bound, in no set order, so pass
  // values, not calls whose side effects must happen in sequence.
  template <typename... V>
  Stmt& bindFrom(int first, const V&... v) {
    int i = first;
    (bindOne(i++, v), ...);
    return *this;
  }

  bool prepared() const { return st_ != nullptr; }
  // Steps once: true with a row, false when done. Throws StorageError on any error.
  bool step();
  // Runs a statement that returns no rows, then resets it for reuse.
  void run() {
    step();
    reset();
  }
  void reset() noexcept {
    sqlite3_reset(st_);
    sqlite3_clear_bindings(st_);
  }

  bool isNull(int c) const { return sqlite3_column_type(st_, c) == SQLITE_NULL; }
  int64_t i64(int c) const { return sqlite3_column_int64(st_, c); }
  uint64_t u64(int c) const { return static_cast<uint64_t>(sqlite3_column_int64(st_, c)); }
  // NULL reads as NaN (see bind(double)).
  double f64(int c) const { return isNull(c) ? std::nan("") : sqlite3_column_double(st_, c); }
  std::string_view textView(int c) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, c));
    return p ? std::string_view(p, static_cast<size_t>(sqlite3_column_bytes(st_, c)))
             : std::string_view();
  }
  std::string text(int c) const { return std::string(textView(c)); }
  const void* blob(int c) const { return sqlite3_column_blob(st_, c); }
  size_t blobSize(int c) const { return static_cast<size_t>(sqlite3_column_bytes(st_, c)); }

 private:
  template <typename V>
  void bindOne(int i, const V& v) {
    if constexpr (std::is_convertible_v<const V&, std::string_view>)
      bindText(i, v);
    else
      bind(i, v);
  }
  void check(int rc) const {
    if (rc != SQLITE_OK) db_->fail("bind failed", rc);
  }
  const Db* db_ = nullptr;
  sqlite3_stmt* st_ = nullptr;
};

}  // namespace keel::storage::sql
