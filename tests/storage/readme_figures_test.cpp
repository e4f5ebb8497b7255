// README.md (and docs/recording.md) state figures the code also knows: how many built-in ops there
// are and which schema a recording has. These tests read the documents and check each stated
// figure against the registry, `keel ops` and a fresh recording, so the prose cannot drift.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdio.h>

#include <fstream>
// libstdc++ 12's regex trips GCC's -Wmaybe-uninitialized inside std::function under the asan
// preset's optimisation (a false positive in the library header, not in this file).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <sstream>
#include <string>
#include <vector>

#include "keel/base/text.h"
#include "keel/op_ids.h"
#include "keel/registry.h"
#include "keel/storage/schema.h"
#include "keel/storage/writer.h"
#include "storage_test_util.h"

namespace keel::storage {
namespace {

std::string readDoc(const std::string& relPath) {
  return readFile(std::string(KEEL_SOURCE_DIR) + "/" + relPath, relPath);
}

// The number in group 1 of every match of `pattern` (line breaks count as spaces).
std::vector<int> statedNumbers(const std::string& text, const std::string& pattern) {
  std::vector<int> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it)
    out.push_back(std::stoi((*it)[1].str()));
  return out;
}

#ifdef KEEL_CLI_PATH
// The op count `keel ops` prints on its last line ("<N> ops"), -1 when it cannot be run.
int cliOpCount() {
  FILE* p = ::popen((std::string("'") + KEEL_CLI_PATH + "' ops 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (::pclose(p) != 0) return -1;
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"((\d+) ops\s*$)"))) return -1;
  return std::stoi(m[1].str());
}
#endif

int userVersion(const std::string& path) {
  sqlite3* db = nullptr;
  int version = -1;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
      version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return version;
}

// "Engine in one page": `op_ids.h` lists the N built-in ops.
TEST(ReadmeFigures, BuiltinOpCountIsTheRegistrysAndKeelOps) {
  std::vector<int> stated =
      statedNumbers(readDoc("README.md"), R"(lists\s+the\s+(\d+)\s+built-in\s+ops)");
  ASSERT_EQ(stated.size(), 1u) << "README.md should say once how many built-in ops op_ids.h lists";
  EXPECT_EQ(stated[0], kNumBuiltinOps);
  EXPECT_EQ(stated[0], Registry::get().size());  // this process registers no op of its own
#ifdef KEEL_CLI_PATH
  EXPECT_EQ(stated[0], cliOpCount());
#endif
}

// "the current schema, vN" (README) and "currently **N**" (docs/recording.md) name the version a
// new recording carries.
TEST(ReadmeFigures, SchemaVersionIsTheOneANewRecordingCarries) {
  testing::TempDir dir;
  const std::string path = dir.file("fresh.db");
  Writer::create(path, testing::sampleRun())->close();
  const int fresh = userVersion(path);
  EXPECT_EQ(fresh, kSchemaVersion);

  std::vector<int> readme =
      statedNumbers(readDoc("README.md"), R"(the\s+current\s+schema,?\s+v(\d+))");
  ASSERT_FALSE(readme.empty()) << "README.md should name the current schema version";
  for (int v : readme) EXPECT_EQ(v, fresh) << "README.md: the current schema";
  std::vector<int> recording =
      statedNumbers(readDoc("docs/recording.md"), R"(currently\s+\*\*(\d+)\*\*)");
  ASSERT_EQ(recording.size(), 1u) << "docs/recording.md should state the schema version once";
  EXPECT_EQ(recording[0], fresh) << "docs/recording.md";
}

}  // namespace
}  // namespace keel::storage
