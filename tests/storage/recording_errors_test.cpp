// Bad input and crash safety: every unusable file gives a one-line StorageError naming it; a
// recording wrong inside is "damaged recording <file>: <what>, in <table> row <id>" for each kind
// of damage the reader detects, and reads as stored for each it tolerates (Note [Damaged
// recordings]); a writer killed with SIGKILL leaves every committed step readable; a full disk or
// an unwritable path fails clearly; older schemas migrate, newer ones are refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
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
  // A pickle (a PyTorch memory snapshot opened as a recording) and a zip (torch.save) say what
  // they are, and how a snapshot becomes a recording.
  std::ofstream(dir.file("snap.pickle"), std::ios::binary) << std::string("\x80\x04\x95", 3);
  expectOpenFails(dir.file("snap.pickle"),
                  "is not an SQLite file (it is a Python pickle: a PyTorch memory snapshot is "
                  "opened after `keel import torch-memory " +
                      dir.file("snap.pickle") + " -o run.db`)");
  std::ofstream(dir.file("model.pt"), std::ios::binary) << std::string("PK\x03\x04rest", 8);
  expectOpenFails(dir.file("model.pt"),
                  "is not an SQLite file (it is a zip archive, as torch.save writes: not a "
                  "recording)");
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

// Note [Reported NaN]: a v8 Keel run's ended steps keep reading their NULL loss (and NULL gradient
// norm, in a run that records one) as NaN; a PyTorch run's as not reported; a step that never
// ended as unknown. A new recording stores the bits it is given.
TEST(RecordingMigration, Version8StepsKeepTheirNaNReading) {
  TempDir dir;
  const std::string steps =
      "INSERT INTO steps VALUES (1, 0, 10, 2.5, 0.1, 1.5, 100, NULL, NULL),"
      " (2, 10, 20, NULL, 0.1, NULL, 100, NULL, NULL), (3, 20, 0, NULL, NULL, NULL, NULL, NULL,"
      " NULL);";
  const uint8_t loss = stepMetricBit(StepMetric::Loss), grad = stepMetricBit(StepMetric::GradNorm);
  const uint8_t val = stepMetricBit(StepMetric::ValLoss);  // step 2 evaluated (eval_every 2)
  for (const auto& [options, step2] :
       {std::pair<std::string, uint8_t>{"{}", uint8_t(loss | grad | val)},
        {R"({"framework":"torch"})", uint8_t(0)}}) {
    SCOPED_TRACE(options);
    const std::string path = dir.file("v8-" + std::to_string(step2) + ".db");
    Recording rec = openOldRecording(
        path, 8,
        "INSERT INTO run VALUES (1, 'cpu', 'cpu', 'h', '{\"eval_every\": 2}', 5, '0.2.0', 0, '" +
            options + "', 'finished', 'vmm', 0, 1, '');" + steps);
    const auto read = rec.steps();
    ASSERT_EQ(read.size(), 3u);
    EXPECT_EQ(read[0].nanMetrics, 0);
    EXPECT_EQ(read[1].nanMetrics, step2);
    EXPECT_EQ(read[1].reported(StepMetric::Loss), step2 != 0);
    EXPECT_EQ(read[1].reported(StepMetric::ValLoss), step2 != 0);
    EXPECT_FALSE(read[0].reported(StepMetric::ValLoss));  // step 1 did not evaluate
    EXPECT_EQ(read[2].nanMetrics, 0);                     // never ended: unknown
    EXPECT_EQ(migrateRecording(path), kSchemaVersion);    // idempotent
  }
  const std::string fresh = dir.file("fresh-nan.db");
  auto w = Writer::create(fresh, testing::sampleRun());
  StepRecord nanLoss{1, 0, 5};
  nanLoss.nanMetrics = loss;
  w->writeStep(nanLoss);
  w->writeStep({2, 5, 9});  // ended, nothing reported
  w->close();
  const auto read = Recording::open(fresh).steps();
  ASSERT_EQ(read.size(), 2u);
  EXPECT_TRUE(std::isnan(read[0].loss));
  EXPECT_TRUE(read[0].reported(StepMetric::Loss));
  EXPECT_FALSE(read[1].reported(StepMetric::Loss));
}

// A damaged page is named as one, not in SQLite's words ("*** in database main *** Page 4:
// btreeInitPage() returns error code 11").
TEST(RecordingErrors, ADamagedPageIsNamedInWords) {
  TempDir dir;
  const std::string path = dir.file("page.db");
  writeRecording(path, 4);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3 * 8192);  // page 4's b-tree header: its type byte
    f.put(char(0x7f));
  }
  try {
    Recording::open(path);
    ADD_FAILURE() << "opened a damaged file";
  } catch (const StorageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "recording " + path + " is corrupted or truncated (page 4 of the file is damaged)");
  }
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

int64_t queryInt(const std::string& path, const std::string& query) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, query.c_str(), -1, &st, nullptr), SQLITE_OK) << query;
  const int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

// One of everything the reader reads, small: steps 1 and 2 of 40 ops each (op 5 a backward op of
// op 2, op 41 one of op 2 too), a stack, a log line, an alloc and a free, and op 3's output 0
// dumped (raw, 2 float32 values); tensors as sampleOp makes them (stack ids 0..2, of which only 1
// is stored).
void writeFullRecording(const std::string& path) {
  auto w = Writer::create(path, sampleRun());
  uint64_t seq = 1;
  for (int64_t s = 1; s <= 2; ++s) {
    w->writeStep({s, 100 * s, 100 * s + 50, 0.5});
    for (int i = 0; i < 40; ++i, ++seq) {
      OpRecord o = sampleOp(seq, s, seq == 5 || seq == 41 ? Phase::Backward : Phase::Forward);
      if (seq == 41) o.forwardSeq = 2;
      w->writeOp(o);
    }
  }
  w->writeStack({1, {{0x1000, "f()", "a.cpp", 3}}});
  w->writeLog({3, 1, LogLevel::Info, "blocks.1", "hello", 10});
  MemRecord m;
  m.device = "cpu";
  m.address = 4096;
  m.bytes = 512;
  m.opSeq = 3;
  m.step = 1;
  m.bufferId = 37;
  w->writeMem(m);
  m.kind = MemEventKind::Free;
  w->writeMem(m);
  DumpRecord d;
  d.opSeq = 3;
  d.dtype = "float32";
  d.shape = {2};
  d.codec = "raw";
  d.data = std::vector<uint8_t>(8, 0);
  d.rawBytes = 8;
  w->writeDump(d);
  w->close();
}

// Everything the read API offers, read in full: what a command or view may ask of a recording.
void readEverything(const Recording& rec) {
  rec.run();
  rec.opCountsByNameAndPhase();
  rec.kernelUses();
  rec.firstNonFinite();
  for (const OpRecord& o : rec.allOps()) {
    if (o.stackId >= 0) rec.stack(o.stackId);
    for (const DumpRecord& d : rec.dumps(o.seq)) rec.dumpValues(o.seq, d.role, d.index);
  }
  rec.ops({});
  rec.logs({});
  rec.memEvents({});
  rec.dropped();
}

// A copy of a full recording (writeFullRecording) damaged by `sql` (its `{}` replaced by the id
// of the string `text`), then opened and read in full: the one line it must give after
// "damaged recording <file>: ".
struct Damage {
  std::string sql;
  std::string expected;  // "<what>, in <table> row <id>"
};

class RecordingDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = dir_.file("base.db");
    writeFullRecording(base_);
  }
  // The damaged copy's path.
  std::string damage(const std::string& sql) {
    const std::string path = dir_.file("damaged" + std::to_string(++n_) + ".db");
    std::filesystem::copy_file(base_, path);
    execSql(path, sql);
    return path;
  }
  void expectDamaged(const Damage& d) {
    const std::string path = damage(d.sql);
    try {
      readEverything(Recording::open(path));
      ADD_FAILURE() << "read without complaint: " << d.sql;
    } catch (const DamagedRecording& e) {
      EXPECT_EQ(std::string(e.what()), "damaged recording " + path + ": " + d.expected) << d.sql;
    }
  }
  int64_t sid(const std::string& text) {
    return queryInt(base_, "SELECT id FROM strings WHERE text = '" + text + "'");
  }
  TempDir dir_;
  std::string base_;
  int n_ = 0;
};

TEST_F(RecordingDamage, TheUndamagedFileReadsInFull) {
  Recording rec = Recording::open(base_);
  readEverything(rec);
  EXPECT_EQ(rec.allOps().size(), 80u);
  EXPECT_EQ(*rec.dumpValues(3, Role::Output, 0), (std::vector<double>{0.0, 0.0}));
}

// Forward links point back: a link forward, to itself or in a cycle cannot be read.
TEST_F(RecordingDamage, ForwardLinksToOpsNotEarlier) {
  expectDamaged({"UPDATE ops SET forward_seq = 6 WHERE seq = 5",
                 "op 5 links to forward op 6, which did not run before it, in ops row 5"});
  expectDamaged({"UPDATE ops SET forward_seq = 5 WHERE seq = 5",
                 "op 5 links to forward op 5, which did not run before it, in ops row 5"});
  expectDamaged({"UPDATE ops SET forward_seq = 41 WHERE seq = 5",
                 "op 5 links to forward op 41, which did not run before it, in ops row 5"});
  expectDamaged({"UPDATE ops SET forward_seq = -2 WHERE seq = 41",
                 "op 41 links to forward op -2, which did not run before it, in ops row 41"});
}

TEST_F(RecordingDamage, SequenceNumbersStepsAndTimesOutOfRange) {
  expectDamaged(
      {"UPDATE ops SET seq = -5 WHERE seq = 5", "op seq -5 is not positive, in ops row -5"});
  expectDamaged({"UPDATE ops SET seq = 0 WHERE seq = 1", "op seq 0 is not positive, in ops row 0"});
  expectDamaged({"UPDATE ops SET step = -1 WHERE seq = 1",
                 "op 1: step -1 is out of range (0 .. 2^31 - 1), in ops row 1"});
  expectDamaged({"UPDATE ops SET step = 1 << 40 WHERE seq = 80",
                 "op 80: step 1099511627776 is out of range (0 .. 2^31 - 1), in ops row 80"});
  expectDamaged({"UPDATE steps SET step = -4 WHERE step = 2",
                 "step -4 is out of range (1 .. 2^31 - 1), in steps row -4"});
  expectDamaged({"UPDATE ops SET begin_ns = -1 WHERE seq = 2",
                 "op 2: time -1 ns is out of range (0 .. 2^62), in ops row 2"});
  expectDamaged(
      {"UPDATE steps SET end_ns = 1 << 63 WHERE step = 1",
       "step 1: time -9223372036854775808 ns is out of range (0 .. 2^62), in steps row 1"});
}

// A step is one seq range: an op of step 2 inside step 1's range (or step 1's last op moved past
// step 2's first) is damage, not a reason to read step 1 around it.
TEST_F(RecordingDamage, StepsWovenIntoEachOther) {
  expectDamaged({"UPDATE ops SET step = 2 WHERE seq = 3",
                 "op 3 of step 2 lies among the ops of step 1 (seq 1 to 40), in ops row 3"});
  expectDamaged({"UPDATE ops SET seq = 100 WHERE seq = 40",
                 "op 41 of step 2 lies among the ops of step 1 (seq 1 to 100), in ops row 41"});
}

TEST_F(RecordingDamage, ReferencesToMissingStringsAndKernels) {
  expectDamaged({"UPDATE ops SET name_sid = 999 WHERE seq = 4",
                 "string 999 is not in the strings table, in ops row 4"});
  expectDamaged(
      {"UPDATE logs SET scope_sid = -3", "string -3 is not in the strings table, in logs row 1"});
  expectDamaged({"UPDATE frames SET file_sid = 999",
                 "string 999 is not in the strings table, in frames row 1"});
  expectDamaged({"UPDATE mem_events SET device_sid = 999 WHERE id = 2",
                 "string 999 is not in the strings table, in mem_events row 2"});
  expectDamaged({"UPDATE dumps SET dtype_sid = 999",
                 "string 999 is not in the strings table, in dumps row 1"});
  expectDamaged({"UPDATE ops SET kernel_id = 99 WHERE seq = 4",
                 "kernel 99 is not in the kernels table, in ops row 4"});
  expectDamaged({"UPDATE strings SET text = 'sideways' WHERE text = 'forward'",
                 "unknown phase 'sideways', in op_counts row 1"});
  expectDamaged({"UPDATE strings SET text = 'explode' WHERE text = 'alloc'",
                 "unknown memory event kind 'explode', in mem_events row 1"});
  expectDamaged({"INSERT INTO nonfinite_ops VALUES (999)",
                 "op 999 is not in the ops table, in nonfinite_ops row 999"});
}

// Strings: a 10 MB one where a name is expected, a scope nested past any model, an id that would
// size the cache to 2^40 entries.
TEST_F(RecordingDamage, AbsurdStrings) {
  expectDamaged({"UPDATE strings SET text = hex(zeroblob(5242880)) WHERE text = 'matmul'",
                 "string " + std::to_string(sid("matmul")) +
                     " is 10485760 bytes long (names, scopes and attributes are at most 65536), in "
                     "strings row " +
                     std::to_string(sid("matmul"))});
  // A scope 101 modules deep (the graph builds a cluster per level and every prefix of the path).
  expectDamaged(
      {"UPDATE strings SET text = 'a' || replace(hex(zeroblob(100)), '00', '.a') WHERE "
       "text = 'blocks.1.attn'",
       "op 1: scope nests 101 modules deep (at most 64), in ops row 1"});
  const int64_t rows = queryInt(base_, "SELECT count(*) FROM strings");
  expectDamaged({"INSERT INTO strings(id, text) VALUES (1 << 40, 'far')",
                 "string id 1099511627776 lies far past the " + std::to_string(rows) +
                     " strings before it, in strings row 1099511627776"});
}

TEST_F(RecordingDamage, AbsurdLogsEventsAndDumps) {
  expectDamaged({"UPDATE logs SET level = 9",
                 "log level 9 is out of range (0 error .. 4 verbose), in logs row 1"});
  expectDamaged({"UPDATE mem_events SET bytes = -1 WHERE id = 1",
                 "allocator event claims -1 bytes (out of range 0 .. 2^44), in mem_events row 1"});
  expectDamaged({"UPDATE dumps SET role = 7",
                 "dump of op 3: role 7 is out of range (0 input, 1 output), in dumps row 1"});
  expectDamaged({"UPDATE dumps SET idx = -1",
                 "dump of op 3: index -1 is out of range (0 .. 2^31 - 1), in dumps row 1"});
  // 3 GiB claimed: refused before anything is allocated (the studio took 3.2 GB).
  expectDamaged({"UPDATE dumps SET raw_bytes = 3 << 30",
                 "dump of op 3 output 0 claims 3221225472 bytes (out of range 0 .. 2^30), in dumps "
                 "row 1"});
  // 1 GiB from 8 bytes of "zstd": more than any frame of 8 bytes expands to.
  expectDamaged(
      {"UPDATE dumps SET raw_bytes = 1 << 30, codec_sid = (SELECT id FROM strings WHERE "
       "text = 'float32')",
       "dump of op 3 output 0 has unknown codec 'float32', in dumps row 1"});
  expectDamaged(
      {"INSERT INTO strings(text) VALUES ('zstd'); UPDATE dumps SET raw_bytes = 1 << 30, "
       "codec_sid = (SELECT id FROM strings WHERE text = 'zstd')",
       "dump of op 3 output 0 claims 1073741824 bytes, which its 8 compressed bytes do "
       "not hold, in dumps row 1"});
  expectDamaged({"UPDATE dumps SET shape = '3'",
                 "dump of op 3 output 0 holds 8 bytes, not the float32 elements of shape [3], in "
                 "dumps row 1"});
  expectDamaged({"UPDATE dumps SET shape = '4611686018427387904,4'",
                 "dump of op 3 output 0 holds 8 bytes, not the float32 elements of shape "
                 "[4611686018427387904,4], in dumps row 1"});
}

// Packed tensor entries that claim what no device holds (written through the writer, which packs
// whatever it is given).
TEST(RecordingErrors, PackedTensorsOfAbsurdSize) {
  TempDir dir;
  struct Case {
    std::vector<int64_t> shape;
    int64_t bytes;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{int64_t(1) << 40}, 4, "packed tensor output 0 claims 2^40 or more elements"},
      {{int64_t(1) << 21, int64_t(1) << 21, 0}, 0, ""},  // no elements: fine
      {{int64_t(1) << 32, int64_t(1) << 32},
       4,
       "packed tensor output 0 claims 2^40 or more elements"},
      {{4, -3}, 4, "packed tensor output 0 has a negative size -3"},
      {{4},
       int64_t(1) << 40,
       "packed tensor output 0 claims 1099511627776 bytes (out of range 0 .. 2^40 - 1)"},
      {{4}, -1, "packed tensor output 0 claims -1 bytes (out of range 0 .. 2^40 - 1)"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string path = dir.file("packed" + std::to_string(++n) + ".db");
    {
      auto w = Writer::create(path, sampleRun());
      w->writeStep({1, 0, 1, 0.5});
      for (uint64_t seq = 1; seq <= 3; ++seq) {
        OpRecord o = sampleOp(seq, 1);
        if (seq == 2) o.tensors[2].shape = c.shape, o.tensors[2].bytes = c.bytes;
        w->writeOp(o);
      }
      w->close();
    }
    Recording rec = Recording::open(path);
    try {
      const auto ops = rec.stepOps(1);
      EXPECT_TRUE(c.expected.empty()) << "read " << c.expected;
      EXPECT_EQ(ops.at(1).tensors.at(2).shape, c.shape);
    } catch (const DamagedRecording& e) {
      EXPECT_EQ(std::string(e.what()),
                "damaged recording " + path + ": op 2: " + c.expected + ", in op_tensors row 2");
    }
  }
}

// What the reader tolerates reads as stored: links to ops the file lacks (capture filters leave
// them), stacks the file lacks (a batch lost to a full disk), a 100 KB log message (cut at 64 KiB).
TEST_F(RecordingDamage, ToleratedDamageReadsAsStored) {
  const std::string path = damage(
      "DELETE FROM ops WHERE seq = 2; UPDATE logs SET op_seq = -7, message = 'é' || "
      "hex(zeroblob(50000)); UPDATE mem_events SET op_seq = 12345, stack_id = 77; DELETE FROM "
      "stack_frames");
  Recording rec = Recording::open(path);
  readEverything(rec);
  const auto ops = rec.stepOps(1);
  ASSERT_EQ(ops.size(), 39u);
  EXPECT_EQ(ops[3].seq, 5u);
  EXPECT_EQ(ops[3].forwardSeq, 2u);  // op 2 is gone: the link is kept, the op is not found
  EXPECT_FALSE(rec.op(2));
  EXPECT_FALSE(rec.stack(0));  // sampleOp's stack 0 was never stored
  EXPECT_TRUE(rec.stack(1)->frames.empty());
  const auto logs = rec.logs({});
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0].opSeq, uint64_t(-7));
  // 'é' (2 bytes) and 100,000 hex digits: cut at the 65,536th byte, a character boundary.
  EXPECT_EQ(logs[0].message.size(), 65536u + std::string("... (34466 more bytes)").size());
  EXPECT_EQ(logs[0].message.substr(65536), "... (34466 more bytes)");
  EXPECT_EQ(rec.memEvents({}).at(0).stackId, 77);
}

TEST(RecordingMigration, NewerVersionRefusedByMigrate) {
  TempDir dir;
  std::string path = dir.file("newer.db");
  createEmptyRecording(path, kSchemaVersion);
  const std::string newer = std::to_string(kSchemaVersion + 1);
  execSql(path, "PRAGMA user_version = " + newer);
  try {
    migrateRecording(path);
    ADD_FAILURE() << "migrated a newer file";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("has schema version " + newer), std::string::npos)
        << e.what();
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
  EXPECT_NE(error.find("the disk is full or a size limit was reached"), std::string::npos) << error;
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
