// RAII wrappers for sqlite3 handles (see sqlite.h): open, exec, prepare, step, and the one place
// that turns an sqlite result code into a one-line StorageError naming the file.
#include "sqlite.h"

#include <sys/resource.h>
#include <algorithm>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace keel::storage::sql {

// A write past a file-size limit (EFBIG, SIGXFSZ being ignored) or onto a full disk is reported
// as such, whatever SQLite's code (SQLITE_FULL, or SQLITE_IOERR_WRITE for EFBIG).
std::string integrityText(std::string_view check) {
  std::string m(check);
  std::replace(m.begin(), m.end(), '\n', ' ');
  if (m.rfind("*** in database main *** ", 0) == 0) m.erase(0, 25);
  // "Page 4: btreeInitPage() returns error code 11", "Tree 2 page 3 cell 0: ...": the page.
  size_t at = m.rfind("Page ", 0) == 0 ? 5 : std::string::npos;
  if (at == std::string::npos && (m.rfind("Tree ", 0) == 0 || m.rfind("On tree page ", 0) == 0))
    if (const size_t p = m.find(" page "); p != std::string::npos) at = p + 6;
  if (at != std::string::npos) {
    size_t end = at;
    while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end]))) ++end;
    if (end > at) return "page " + m.substr(at, end - at) + " of the file is damaged";
  }
  return m;
}

std::string describe(const std::string& file, const std::string& what, int rc, const char* msg,
                     int sysErrno) {
  std::string m = msg ? msg : sqlite3_errstr(rc);
  std::replace(m.begin(), m.end(), '\n', ' ');  // messages are one line
  // (Past a file-size limit write() returns short, with no errno: SQLite says "disk I/O error".)
  rlimit fsize{};
  const bool fsizeLimited = getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY;
  if ((rc & 0xff) == SQLITE_IOERR &&
      (sysErrno == EFBIG || sysErrno == ENOSPC || sysErrno == EDQUOT ||
       (sysErrno == 0 && fsizeLimited && (rc == SQLITE_IOERR_WRITE || rc == SQLITE_IOERR))))
    rc = SQLITE_FULL;
  if ((rc & 0xff) == SQLITE_IOERR && sysErrno != 0)
    m += std::string(": ") + std::strerror(sysErrno);
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
      return "recording " + file + " is corrupted or truncated (" + m + ")";
    case SQLITE_NOTADB:
      return "recording " + file + " is not an SQLite database (" + m + ")";
    case SQLITE_FULL:
      return "recording " + file + ": " + what +
             ": the disk is full or a size limit was reached (" + m + ")";
    case SQLITE_CANTOPEN:
      return "recording " + file + ": cannot open or create (" + m + ")";
    case SQLITE_READONLY:
      return "recording " + file + ": not writable (" + m + ")";
    default:
      return "recording " + file + ": " + what + " (" + m + ")";
  }
}

Db::Db(const std::string& path, int flags) : path_(path) {
  // Note [SQLite memory statistics]: SQLite's allocation statistics take a global mutex on every
  // malloc; keel never reads them, so turn them off once, before SQLite initialises. If something
  // else in the process initialised SQLite first, the call fails harmlessly.
  static const bool memstatusOff = [] {
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    return true;
  }();
  (void)memstatusOff;
  int rc = sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    throw StorageError(describe(path, "cannot open", rc, msg.c_str()));
  }
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, 5000);
}

Db& Db::operator=(Db&& o) noexcept {
  if (this != &o) {
    close();
    db_ = o.db_;
    path_ = std::move(o.path_);
    o.db_ = nullptr;
  }
  return *this;
}

void Db::close() noexcept {
  if (db_) sqlite3_close_v2(db_);
  db_ = nullptr;
}

void Db::exec(const char* sqlText, const char* what) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sqlText, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    throw StorageError(describe(path_, what, rc, msg.c_str(), sqlite3_system_errno(db_)));
  }
}

void Db::fail(const std::string& what, int rc) const {
  throw StorageError(describe(path_, what, rc, db_ ? sqlite3_errmsg(db_) : nullptr,
                              db_ ? sqlite3_system_errno(db_) : 0));
}

int64_t Db::queryInt(const char* sqlText) {
  Stmt s(*this, sqlText);
  return s.step() ? s.i64(0) : 0;
}

Stmt::Stmt(const Db& db, std::string_view sqlText) : db_(&db) {
  int rc = sqlite3_prepare_v3(db.get(), sqlText.data(), static_cast<int>(sqlText.size()),
                              SQLITE_PREPARE_PERSISTENT, &st_, nullptr);
  if (rc != SQLITE_OK) db.fail("cannot prepare query", rc);
}

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(st_);
    db_ = o.db_;
    st_ = o.st_;
    o.st_ = nullptr;
  }
  return *this;
}

bool Stmt::step() {
  int rc = sqlite3_step(st_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  std::string msg = sqlite3_errmsg(db_->get());
  sqlite3_reset(st_);
  throw StorageError(
      describe(db_->path(), "query failed", rc, msg.c_str(), sqlite3_system_errno(db_->get())));
}

}  // namespace keel::storage::sql
