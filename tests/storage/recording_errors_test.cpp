// Bad input and crash safety: every unusable file gives a one-line StorageError naming it; a
// writer killed with SIGKILL leaves every committed step readable; a full disk or an unwritable
// path fails clearly; older schemas migrate, newer ones are refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "keel/storage/reader.h"
#include "keel/storage/schema.h"
#include "keel/storage/writer.h"
#include "storage_test_util.h"

namespace keel::storage {
namespace {

using testing::sampleOp;
using testing::sampleRun;
using testing::TempDir;

// Opening `path` throws a StorageError whose single line names the file and contains `what`.
void expectOpenFails(const std::string& path, const std::string& what) {
  try {
    Recording::open(path);
    ADD_FAILURE() << "opened " << path;
  } catch (const StorageError& e) {
    std::string msg = e.what();
    std::printf("%s\n", msg.c_str());
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

void execSql(const std::string& path, const std::string& sqlText) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sqlText.c_str(), nullptr, nullptr, &err), SQLITE_OK)
      << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// A recording written at schema `version` holding `rows` (SQL in that version's columns), opened
// by today's reader, which migrates it: checked to be at kSchemaVersion.
Recording openOldRecording(const std::string& path, int version, const std::string& rows) {
  createEmptyRecording(path, version);
  execSql(path, rows);
  Recording rec = Recording::open(path);
  EXPECT_EQ(rec.schemaVersion(), kSchemaVersion);
  return rec;
}

// A closed, checkpointed recording with `steps` steps of 40 ops each.
void writeRecording(const std::string& path, int steps) {
  auto w = Writer::create(path, sampleRun());
  uint64_t seq = 1;
  for (int64_t s = 1; s <= steps; ++s) {
    w->writeStep({s, 0, 1, 0.5});
    for (int i = 0; i < 40; ++i) w->writeOp(sampleOp(seq++, s));
    w->commit();
  }
  w->close();
}

TEST(RecordingOpen, MissingFile) {
  TempDir dir;
  expectOpenFails(dir.file("nope.db"), "no such file");
}

TEST(RecordingOpen, RandomBytesAreNotSqlite) {
  TempDir dir;
  std::string path = dir.file("random.db");
  std::ofstream f(path, std::ios::binary);
  std::mt19937 rng(7);
  for (int i = 0; i < 8192; ++i) f.put(static_cast<char>(rng()));
  f.close();
  expectOpenFails(path, "not an SQLite file");
  std::ofstream(dir.file("empty.db")).close();
  expectOpenFails(dir.file("empty.db"), "empty");
}

TEST(RecordingOpen, SqliteFileThatIsNotARecording) {
  TempDir dir;
  std::string path = dir.file("other.db");
  execSql(path, "CREATE TABLE t(x); INSERT INTO t VALUES (1);");
  expectOpenFails(path, "not a Keel recording");
}

TEST(RecordingOpen, TruncatedFile) {
  TempDir dir;
  std::string path = dir.file("cut.db");
  writeRecording(path, 3);
  auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  expectOpenFails(path, "corrupted");
}

TEST(RecordingOpen, PagesOverwrittenWithGarbage) {
  TempDir dir;
  std::string path = dir.file("garbage.db");
  writeRecording(path, 3);
  auto size = std::filesystem::file_size(path);
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    std::mt19937 rng(11);
    f.seekp(static_cast<std::streamoff>(size / 2));  // keep the header page, smash the middle
    for (int i = 0; i < 3 * 8192; ++i) f.put(static_cast<char>(rng()));
  }
  expectOpenFails(path, "corrupted");
}

TEST(RecordingOpen, NewerSchemaVersionIsRefused) {
  TempDir dir;
  std::string path = dir.file("future.db");
  writeRecording(path, 1);
  execSql(path, "PRAGMA user_version = " + std::to_string(kSchemaVersion + 1));
  expectOpenFails(path, "recording " + path + " has schema version " +
                            std::to_string(kSchemaVersion + 1) + ", this keel reads up to " +
                            std::to_string(kSchemaVersion));
}

TEST(RecordingMigration, Version1IsUpgradedOnOpen) {
  TempDir dir;
  std::string path = dir.file("v1.db");
  createEmptyRecording(path, 1);
  // A v1 writer's rows, written by hand: run, one string, one op.
  execSql(path,
          "INSERT INTO run VALUES (1, 'cpu', 'cpu', 'h', '{}', 5, '0.0.1', 0, '{}', 'finished');"
          "INSERT INTO strings(id, text) VALUES (1, 'forward'), (2, 'relu'), (3, '');"
          "INSERT INTO ops VALUES (1, 1, 1, 2, 3, 3, 0, 10, 20, 0, NULL);");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    EXPECT_NE(sqlite3_exec(db, "SELECT * FROM dropped", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  Recording rec = Recording::open(path);
  EXPECT_EQ(rec.schemaVersion(), kSchemaVersion);
  EXPECT_EQ(rec.run().engineVersion, "0.0.1");
  EXPECT_TRUE(rec.dropped().empty());  // table added by the 1 -> 2 migration
  ASSERT_EQ(rec.opCount(), 1);
  EXPECT_EQ(rec.op(1)->name, "relu");
  EXPECT_EQ(migrateRecording(path), kSchemaVersion);  // idempotent
}

// v2 kept one SQL row per tensor; v3 packs them per op. The migration converts every row, keeps
// NaN statistics, and indexes the first non-finite output.
TEST(RecordingMigration, Version2TensorRowsArePackedOnOpen) {
  TempDir dir;
  const std::string path = dir.file("v2.db");
  Recording rec = openOldRecording(
      path, 2,
      "INSERT INTO run VALUES (1, 'cpu', 'cpu', 'h', '{}', 5, '0.0.2', 0, '{}', 'finished');"
      "INSERT INTO strings(id, text) VALUES (1, 'forward'), (2, 'matmul'), (3, ''),"
      " (4, 'float32'), (5, 'cpu'), (6, 'exp');"
      "INSERT INTO ops VALUES (1, 1, 1, 2, 3, 3, 0, 10, 20, 0, NULL),"
      " (2, 1, 1, 6, 3, 3, 0, 30, 40, 0, NULL);"
      // op 1: two inputs, one output with stats; op 2: output with an Inf.
      "INSERT INTO tensors VALUES"
      " (1, 1, 0, 12, 1, 7, '2,3', '3,1', 0, 4, 5, 24, 'aaaa', NULL, -1, 2, 0.5, 1.25, 2, 0, 0,"
      " 1),"
      " (1, 0, 1, 11, 0, 6, '3,3', '1,3', 4, 4, 5, 36, 'bbbb', 'rr', NULL, NULL, NULL, NULL,"
      " NULL, NULL, NULL, NULL),"
      " (1, 0, 0, 10, 2, 5, '2,3', '3,1', 0, 4, 5, 24, NULL, NULL, NULL, NULL, NULL, NULL,"
      " NULL, NULL, NULL, NULL),"
      " (2, 1, 0, 13, 1, 8, '', '', 0, 4, 5, 4, 'cccc', NULL, NULL, NULL, NULL, NULL, NULL,"
      " 0, 1, 0);");
  auto ops = rec.stepOps(1);
  ASSERT_EQ(ops.size(), 2u);
  ASSERT_EQ(ops[0].tensors.size(), 3u);
  const TensorRecord& in0 = ops[0].tensors[0];
  EXPECT_EQ(in0.role, Role::Input);
  EXPECT_EQ(in0.index, 0);
  EXPECT_EQ(in0.tensorId, 10u);
  EXPECT_EQ(in0.version, 2u);
  EXPECT_EQ(in0.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_FALSE(in0.hasStats);
  EXPECT_TRUE(in0.md5.empty());
  const TensorRecord& in1 = ops[0].tensors[1];
  EXPECT_EQ(in1.index, 1);
  EXPECT_EQ(in1.offset, 4);
  EXPECT_EQ(in1.strides, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(in1.md5, "bbbb");
  EXPECT_EQ(in1.md5Rounded, "rr");
  const TensorRecord& out = ops[0].tensors[2];
  EXPECT_EQ(out.role, Role::Output);
  EXPECT_EQ(out.dtype, "float32");
  EXPECT_EQ(out.device, "cpu");
  EXPECT_EQ(out.bytes, 24);
  EXPECT_EQ(out.bufferId, 7u);
  ASSERT_TRUE(out.hasStats);
  EXPECT_EQ(out.stats.min, -1);
  EXPECT_EQ(out.stats.std, 1.25);
  EXPECT_EQ(out.stats.zeroCount, 1);
  ASSERT_EQ(ops[1].tensors.size(), 1u);
  EXPECT_TRUE(std::isnan(ops[1].tensors[0].stats.min));  // NULL in v2 = NaN
  EXPECT_TRUE(ops[1].tensors[0].shape.empty());
  ASSERT_TRUE(rec.firstNonFinite().has_value());
  EXPECT_EQ(rec.firstNonFinite()->seq, 2u);
  EXPECT_EQ(migrateRecording(path), kSchemaVersion);  // idempotent
}

// v3 allocator events had no buffer, tag or label; after the 3 -> 4 migration they read as
// "none" (buffer 0, empty tag and label) and keep every other field.
TEST(RecordingMigration, Version3MemEventsReadWithoutBufferTagOrLabel) {
  TempDir dir;
  const std::string path = dir.file("v3.db");
  Recording rec = openOldRecording(
      path, 3,
      "INSERT INTO run VALUES (1, 'cpu', 'cpu', 'h', '{}', 5, '0.0.3', 0, '{}', 'finished');"
      "INSERT INTO strings(id, text) VALUES (1, 'alloc'), (2, 'cpu');"
      // the 12 columns of a v3 mem_events row, in order
      "INSERT INTO mem_events VALUES (1, 100, 1, 2, 4096, 512, 0, 7, 1, NULL, 512, 8192);");
  auto events = rec.memEvents({});
  ASSERT_EQ(events.size(), 1u);
  const MemRecord& m = events[0];
  EXPECT_EQ(m.kind, MemEventKind::Alloc);
  EXPECT_EQ(m.device, "cpu");
  EXPECT_EQ(m.timeNs, 100);
  EXPECT_EQ(m.address, 4096u);
  EXPECT_EQ(m.bytes, 512u);
  EXPECT_EQ(m.opSeq, 7u);
  EXPECT_EQ(m.stackId, -1);
  EXPECT_EQ(m.allocatedAfter, 512u);
  EXPECT_EQ(m.reservedAfter, 8192u);
  EXPECT_EQ(m.bufferId, 0u);
  EXPECT_EQ(m.tag, MemTag::None);
  EXPECT_TRUE(m.label.empty());
  EXPECT_EQ(migrateRecording(path), kSchemaVersion);  // idempotent
}

// A v4 run row (no allocator column) reads with the allocator unknown and everything else kept;
// a new recording stores the allocator it is given.
TEST(RecordingMigration, Version4RunReadsWithoutAllocator) {
  TempDir dir;
  const std::string path = dir.file("v4.db");
  Recording rec = openOldRecording(
      path, 4,
      "INSERT INTO run VALUES (1, 'cpu-ref', 'cpu', 'h', '{}', 5, '0.0.4', 9, '{}', "
      "'finished');");
  const RunInfo r = rec.run();
  EXPECT_EQ(r.backend, "cpu-ref");
  EXPECT_EQ(r.seed, 5u);
  EXPECT_EQ(r.startTimeUnixNs, 9);
  EXPECT_EQ(r.status, "finished");
  EXPECT_EQ(r.allocator, "");

  std::string fresh = dir.file("fresh.db");
  RunInfo run = testing::sampleRun();
  run.allocator = "caching";
  Writer::create(fresh, run)->close();
  EXPECT_EQ(Recording::open(fresh).run().allocator, "caching");
}

// A damaged packed row (truncated BLOB) is a one-line error naming the file and the op.
TEST(RecordingErrors, TruncatedPackedTensorsIsAClearError) {
  TempDir dir;
  std::string path = dir.file("packed.db");
  writeRecording(path, 1);
  execSql(path, "UPDATE op_tensors SET data = substr(data, 1, 20) WHERE op_seq = 3");
  Recording rec = Recording::open(path);
  try {
    rec.stepOps(1);
    ADD_FAILURE() << "read a truncated row";
  } catch (const StorageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("op 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(RecordingMigration, NewerVersionRefusedByMigrate) {
  TempDir dir;
  std::string path = dir.file("v9.db");
  createEmptyRecording(path, kSchemaVersion);
  execSql(path, "PRAGMA user_version = 9");
  try {
    migrateRecording(path);
    ADD_FAILURE() << "migrated a newer file";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("has schema version 9"), std::string::npos) << e.what();
  }
}

TEST(RecordingWriter, UnwritablePathThrowsNamingIt) {
  for (std::string path :
       {std::string("/proc/nonexistent/x.db"), std::string("/nonexistent-keel-dir/sub/x.db")}) {
    try {
      Writer::create(path, sampleRun());
      ADD_FAILURE() << "created " << path;
    } catch (const StorageError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST(RecordingWriter, ReadOnlyDirectoryThrows) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  std::string sub = dir.file("ro");
  std::filesystem::create_directory(sub);
  std::filesystem::permissions(
      sub, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  EXPECT_THROW(Writer::create(sub + "/x.db", sampleRun()), StorageError);
  std::filesystem::permissions(sub, std::filesystem::perms::owner_all);
}

TEST(RecordingWriter, DiskFullThrowsAndCommittedStaysReadable) {
  TempDir dir;
  std::string path = dir.file("full.db");
  auto w = Writer::create(path, sampleRun(), WriterOptions{512 * 1024});
  int64_t committed = 0;
  std::string error;
  uint64_t seq = 1;
  for (int64_t step = 1; step <= 1000 && error.empty(); ++step) {
    try {
      w->writeStep({step, 0, 1, 1.0});
      for (int i = 0; i < 50; ++i) w->writeOp(sampleOp(seq++, step));
      w->commit();
      committed = step;
    } catch (const StorageError& e) {
      error = e.what();
    }
  }
  ASSERT_FALSE(error.empty()) << "the size limit was never reached";
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("disk full"), std::string::npos) << error;
  ASSERT_GT(committed, 0);
  // The writer stays usable for small things (the run can record its failure) ...
  EXPECT_NO_THROW(w->setRunStatus("failed: disk full"));
  EXPECT_NO_THROW(w->close());
  // ... and every committed step, with all its ops, reads back.
  Recording rec = Recording::open(path);
  EXPECT_EQ(static_cast<int64_t>(rec.steps().size()), committed);
  EXPECT_EQ(rec.opCount(), committed * 50);
  EXPECT_EQ(rec.stepOps(committed).size(), 50u);
  EXPECT_EQ(rec.run().status, "failed: disk full");
}

// A child writes three committed steps, starts a fourth, and SIGKILLs itself mid-transaction.
TEST(RecordingCrash, SigkillLosesOnlyTheOpenBatch) {
  TempDir dir;
  std::string path = dir.file("killed.db");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      auto w = Writer::create(path, sampleRun());
      uint64_t seq = 1;
      for (int64_t step = 1; step <= 4; ++step) {
        w->writeStep({step, 0, 0, kNoValue});
        // Enough rows that the open batch spills pages into the WAL before the kill.
        for (int i = 0; i < 2000; ++i) w->writeOp(sampleOp(seq++, step));
        if (step < 4) w->commit();
      }
      ::kill(::getpid(), SIGKILL);
    } catch (...) {
    }
    ::_exit(3);  // only reached on a failure: the parent sees exit code 3, not SIGKILL
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_TRUE(std::filesystem::exists(path + "-wal"));

  Recording rec = Recording::open(path);
  auto steps = rec.steps();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps.back().step, 3);
  EXPECT_EQ(rec.opCount(), 3 * 2000);
  EXPECT_EQ(rec.stepOps(3).size(), 2000u);
  EXPECT_EQ(rec.run().status, "running");
}

}  // namespace
}  // namespace keel::storage
