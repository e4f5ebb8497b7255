// The schema is declared once (kSchema in storage/src/schema.cpp): a new recording's tables and
// indexes equal those of a file made from the frozen v1 DDL and migrated forward, it carries the
// declared version, and every column of it is commented. See Note [One schema declaration].
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "keel/storage/reader.h"
#include "keel/storage/schema.h"
#include "keel/storage/writer.h"
#include "storage_test_util.h"

namespace keel::storage {
namespace {

using testing::sampleRun;
using testing::TempDir;

// A read-only connection for inspecting a file's schema.
class Conn {
 public:
  explicit Conn(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
      ADD_FAILURE() << "cannot open " << path;
  }
  ~Conn() { sqlite3_close(db_); }
  // Every row of `sql` as strings (NULL -> "NULL").
  std::vector<std::vector<std::string>> rows(const std::string& sql) const {
    std::vector<std::vector<std::string>> out;
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return out;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        auto* t = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
        row.emplace_back(t ? t : "NULL");
      }
      out.push_back(std::move(row));
    }
    sqlite3_finalize(st);
    return out;
  }
  int64_t integer(const std::string& sql) const {
    auto r = rows(sql);
    return r.empty() ? -1 : std::stoll(r[0][0]);
  }

 private:
  sqlite3* db_ = nullptr;
};

// DDL as SQLite keeps it in sqlite_master, minus `--` comments, whitespace made canonical: one
// space between words, none around ( ) and ','. A column added by ALTER TABLE ("...last_col\n,
// new_col INTEGER)") and the same column declared in place ("last_col, -- comment\n new_col
// INTEGER\n)") normalize to the same text. Quoted literals are copied as they are.
std::string normalizeSql(std::string_view sql) {
  std::string out;
  bool gap = false;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (c == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
      while (i < sql.size() && sql[i] != '\n') ++i;
      gap = true;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      gap = true;
      continue;
    }
    const bool tight = std::string_view("(),").find(c) != std::string_view::npos ||
                       (!out.empty() && (out.back() == '(' || out.back() == ','));
    if (gap && !out.empty() && !tight) out.push_back(' ');
    gap = false;
    if (c == '\'' || c == '"') {  // a literal or quoted name: verbatim up to its closing quote
      size_t end = sql.find(c, i + 1);
      if (end == std::string_view::npos) end = sql.size() - 1;
      out.append(sql.substr(i, end - i + 1));
      i = end;
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// Every table and index of the file, one line each, sorted by name: "type name on tbl: sql".
// SQLite's own indexes (UNIQUE, composite keys) have no SQL; their columns stand in for it.
std::string schemaOf(const std::string& path) {
  Conn db(path);
  std::ostringstream out;
  for (const auto& r : db.rows("SELECT type, name, tbl_name, sql FROM sqlite_master"
                               " WHERE type IN ('table', 'index') ORDER BY name")) {
    out << r[0] << ' ' << r[1] << " on " << r[2] << ": ";
    if (r[3] != "NULL") {
      out << normalizeSql(r[3]);
    } else {
      for (const auto& c : db.rows("PRAGMA index_info('" + r[1] + "')")) out << c[2] << ' ';
    }
    out << '\n';
  }
  return out.str();
}

// What a user's run produces: the writer creates the file from the declaration and, at close,
// builds the deferred secondary indexes.
std::string writeFreshRecording(const TempDir& dir) {
  std::string path = dir.file("fresh.db");
  auto w = Writer::create(path, sampleRun());
  w->close();
  return path;
}

TEST(SchemaDeclaration, NormalizeSqlDropsCommentsAndCanonicalizesSpacing) {
  EXPECT_EQ(normalizeSql("CREATE TABLE t (\n  a INTEGER,  -- x, y\n  b TEXT   -- z\n)"),
            "CREATE TABLE t(a INTEGER,b TEXT)");
  EXPECT_EQ(normalizeSql("CREATE TABLE t (\n  a INTEGER  -- x\n, b TEXT DEFAULT 'a  -- b')"),
            "CREATE TABLE t(a INTEGER,b TEXT DEFAULT 'a  -- b')");
  EXPECT_EQ(normalizeSql("CREATE INDEX i ON t (a , b)"), "CREATE INDEX i ON t(a,b)");
}

// The declaration and the migrations cannot drift: a v1 file made from the frozen v1 DDL (and a
// v2 and a v3 file, made from it plus the deltas) migrated to the current version has exactly
// the tables, columns, constraints and indexes a new recording has.
TEST(SchemaDeclaration, FreshFileEqualsEveryMigratedVersion) {
  TempDir dir;
  const std::string fresh = schemaOf(writeFreshRecording(dir));
  ASSERT_NE(fresh.find("table op_tensors on op_tensors: "), std::string::npos) << fresh;
  ASSERT_NE(fresh.find("index ops_step_phase on ops: "), std::string::npos) << fresh;
  for (int from = 1; from < kSchemaVersion; ++from) {
    SCOPED_TRACE(::testing::Message() << "from version " << from);
    std::string path = dir.file(std::to_string(from) + ".db");
    createEmptyRecording(path, from);
    {
      Conn db(path);
      EXPECT_EQ(db.integer("PRAGMA user_version"), from);
    }
    if (from == 1) {  // really the v1 layout: one row per tensor, indexes built at creation
      const std::string v1 = schemaOf(path);
      EXPECT_NE(v1.find("table tensors on tensors: "), std::string::npos) << v1;
      EXPECT_EQ(v1.find("op_tensors"), std::string::npos) << v1;
      EXPECT_EQ(v1.find("buffer_id INTEGER NOT NULL DEFAULT 0"), std::string::npos) << v1;
    }
    EXPECT_EQ(migrateRecording(path), from);
    EXPECT_EQ(schemaOf(path), fresh);
  }
}

// createEmptyRecording at the current version is the declaration too, before the writer's close
// adds the secondary indexes: same tables, and no index beyond SQLite's own.
TEST(SchemaDeclaration, EmptyCurrentFileHasTheDeclaredTablesAndNoSecondaryIndexes) {
  TempDir dir;
  std::string path = dir.file("empty.db");
  createEmptyRecording(path, kSchemaVersion);
  auto tables = [](const std::string& schema) {
    std::istringstream in(schema);
    std::string out, line;
    while (std::getline(in, line))
      if (line.rfind("table ", 0) == 0) out += line + '\n';
    return out;
  };
  const std::string empty = schemaOf(path);
  EXPECT_EQ(tables(empty), tables(schemaOf(writeFreshRecording(dir))));
  Conn db(path);
  EXPECT_EQ(db.integer("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND sql NOT NULL"),
            0)
      << empty;
}

// A new file says which schema it holds: the declared current version and Keel's application id.
TEST(SchemaDeclaration, FreshFileCarriesTheDeclaredVersion) {
  TempDir dir;
  std::string empty = dir.file("empty.db");
  createEmptyRecording(empty, kSchemaVersion);
  for (const std::string& path : {writeFreshRecording(dir), empty}) {
    SCOPED_TRACE(path);
    {
      Conn db(path);
      EXPECT_EQ(db.integer("PRAGMA user_version"), kSchemaVersion);
      EXPECT_EQ(db.integer("PRAGMA application_id"), kApplicationId);
    }
  }
  EXPECT_EQ(Recording::open(dir.file("fresh.db")).schemaVersion(), kSchemaVersion);
}

// The declaration comments every column: in a new file's sqlite_master (which keeps the CREATE
// TABLE text as declared) each column has a line of its own carrying a `--` comment.
TEST(SchemaDeclaration, EveryColumnIsCommented) {
  TempDir dir;
  Conn db(writeFreshRecording(dir));
  auto tables = db.rows(
      "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'");
  ASSERT_GE(tables.size(), 13u);
  for (const auto& t : tables) {
    std::vector<std::string> lines;
    std::istringstream in(t[1]);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (const auto& col : db.rows("PRAGMA table_info('" + t[0] + "')")) {
      const std::string& name = col[1];
      auto it = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) {
        size_t at = l.find_first_not_of(' ');
        return at != std::string::npos && l.compare(at, name.size(), name) == 0 &&
               at + name.size() < l.size() && l[at + name.size()] == ' ';
      });
      if (it == lines.end()) {
        ADD_FAILURE() << t[0] << "." << name << " has no line of its own:\n" << t[1];
        continue;
      }
      EXPECT_NE(it->find("--"), std::string::npos) << t[0] << "." << name << ": " << *it;
    }
  }
}

}  // namespace
}  // namespace keel::storage
