// Inputs that must be files are files (issue 20): a FIFO, a device or a directory given as a
// config, an AOA rules file, a trace or a recording is one line and exit 2 — never a hang — and
// JSON nested 100,000 deep or a 40 MB config is refused in one line instead of crashing or being
// read whole (Note [Bounded JSON], keel/base/text.h). Through the real keel binary, each call
// bounded by `timeout` so a regression fails instead of hanging the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using keel::test::CliResult;
using keel::test::expectOneLineError;

class KeelInputs : public keel::test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  }

  // 124 (timeout's status) if keel blocked.
  CliResult keel(const std::string& args) {
    return keel::test::runKeelCli(args, dir_.string(), "timeout 30");
  }
  std::string path(const std::string& name) { return (dir_ / name).string(); }
  std::string q(const std::string& name) {  // (appended: GCC 12's -Wrestrict misfires on + here)
    std::string s(1, '\'');
    s += path(name);
    s += '\'';
    return s;
  }
};

TEST_F(KeelInputs, FifosAndDevicesAreRefusedNotReadForever) {
  expectOneLineError(keel("record --config " + q("fifo") + " -o " + q("r.db")),
                     "config file is a FIFO, not a regular file");
  expectOneLineError(keel("train --config " + q("fifo") + " --steps 1"), "is a FIFO");
  expectOneLineError(keel("record --config /dev/zero -o " + q("r.db")),
                     "/dev/zero: config file is a character device");
  for (const std::string cmd : {"inspect", "ops", "export csv", "export trace", "memory stats"})
    expectOneLineError(keel(cmd + " " + q("fifo")), "is a FIFO, not a regular file");
  expectOneLineError(keel("diff " + q("fifo") + " " + q("fifo")), "is a FIFO");
  expectOneLineError(keel("memory replay " + q("fifo")), "is a FIFO");
  expectOneLineError(keel("memory replay /dev/zero"), "is a character device");
  // AOA rules: a FIFO and a directory (it used to be read as an empty rule file).
  CliResult train =
      keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --ckpt-dir " + q("ck"));
  ASSERT_EQ(train.status, 0) << train.err;
  const std::string ck =
      (dir_ / "ck" / fs::directory_iterator(dir_ / "ck")->path().filename()).string();
  expectOneLineError(keel("ckpt plan '" + ck + "' --target-tp 1 --aoa " + q("fifo")),
                     "AOA rules file is a FIFO");
  fs::create_directory(dir_ / "rules");
  expectOneLineError(keel("ckpt plan '" + ck + "' --target-tp 1 --aoa " + q("rules")),
                     "AOA rules file is a directory");
}

// A damaged allocator event (bytes -1, read as 2^64 - 1) is refused by `keel memory replay` in
// one line, by the reader (Note [Damaged recordings]): it used to make the vmm allocator grow to
// 6-17 GB before std::bad_alloc.
TEST_F(KeelInputs, ADamagedAllocationSizeIsRefusedNotReplayed) {
  CliResult rec =
      keel("record --config tests/fixtures/gpt-tiny.json --steps 1 --allocator -o " + q("r.db"));
  ASSERT_EQ(rec.status, 0) << rec.err;
  const std::string damage =
      "python3 -c \"import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("
      "'UPDATE mem_events SET bytes=-1 WHERE id=(SELECT min(id) FROM mem_events WHERE "
      "kind_sid=(SELECT id FROM strings WHERE text=\\\"alloc\\\"))'); c.commit()\" " +
      q("r.db");
  ASSERT_EQ(std::system(damage.c_str()), 0);
  expectOneLineError(
      keel("memory replay " + q("r.db") + " --allocator vmm"),
      "allocator event claims -1 bytes (out of range 0 .. 2^44), in mem_events row ");
}

// Recordings that open but are wrong inside (Note [Damaged recordings]): a forward link in a
// cycle, and a dump claiming 3 GiB (the studio took 3.2 GB when its op was selected), are one
// line naming the file, the table and the row, exit 2, from every command that reads them.
TEST_F(KeelInputs, ADamagedRecordingIsOneLine) {
  CliResult rec = keel(
      "record --config tests/fixtures/gpt-tiny.json --steps 1 --dumps --dump-ops "
      "matmul -o " +
      q("r.db"));
  ASSERT_EQ(rec.status, 0) << rec.err;
  auto damage = [&](const std::string& copy, const std::string& sql) {
    fs::copy_file(path("r.db"), path(copy));
    const std::string cmd =
        "python3 -c \"import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
        "c.executescript(sys.argv[2]); "
        "c.commit()\" " +
        q(copy) + " '" + sql + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  };
  // Two backward ops linking each other: the first one's link points forward.
  damage(
      "cycle.db",
      "UPDATE ops SET forward_seq = (SELECT max(seq) FROM ops WHERE forward_seq > 0) WHERE seq = "
      "(SELECT min(seq) FROM ops WHERE forward_seq > 0); UPDATE ops SET forward_seq = (SELECT "
      "min(seq) FROM ops WHERE forward_seq > 0) WHERE seq = (SELECT max(seq) FROM ops WHERE "
      "forward_seq > 0);");
  const std::string cycle =
      "damaged recording " + path("cycle.db") + ": op ";  // then "<seq> links to forward op ..."
  for (const std::string cmd : {"ops", "export csv", "export trace"}) {
    const CliResult r = keel(cmd + " " + q("cycle.db"));
    expectOneLineError(r, cycle);
    expectOneLineError(r, ", which did not run before it, in ops row ");
  }
  expectOneLineError(keel("diff " + q("r.db") + " " + q("cycle.db")), cycle);
  damage("dump.db", "UPDATE dumps SET raw_bytes = 3 << 30 WHERE id = (SELECT min(id) FROM dumps);");
  const CliResult r = keel("diff " + q("r.db") + " " + q("dump.db"));
  expectOneLineError(r, "damaged recording " + path("dump.db") + ": dump of op ");
  expectOneLineError(r, " claims 3221225472 bytes (out of range 0 .. 2^30), in dumps row 1");
}

TEST_F(KeelInputs, DeepOrHugeJsonIsOneLine) {
  const std::string base =
      R"("vocab_size": 256, "seq_len": 16, "n_layer": 1, "n_head": 1, "d_model": 8)";
  std::ofstream(path("deep.json")) << "{\"name\": " << std::string(100000, '[')
                                   << std::string(100000, ']') << ", " << base << "}";
  expectOneLineError(keel("record --config " + q("deep.json") + " -o " + q("r.db")),
                     "deep.json: JSON nested 100001 levels deep, more than the 64 allowed");
  expectOneLineError(keel("train --config " + q("deep.json") + " --steps 1"), "levels deep");
  // 40 MB of leading whitespace: refused by size, not parsed.
  {
    std::ofstream f(path("big.json"));
    f << std::string(40 << 20, ' ') << "{" << base << "}";
  }
  expectOneLineError(keel("record --config " + q("big.json") + " -o " + q("r.db")),
                     "config file is 40.0 MiB, more than the 1.00 MiB allowed");
  // A model or batch far beyond the machine: one line naming the fields (it used to crash with
  // SIGSEGV, or train until killed).
  for (const char* field : {"d_model", "batch_size", "n_layer"}) {
    nlohmann::json c = nlohmann::json::parse("{" + base + "}");
    c[field] = int64_t(1) << 62;
    std::ofstream(path("huge.json"), std::ios::trunc) << c.dump();
    expectOneLineError(keel("record --config " + q("huge.json") + " -o " + q("r.db")),
                       std::string(field) + " 4611686018427387904");
  }
  // A config nested a little (a list in a field) is still read: the bound is on depth.
  std::ofstream(path("ok.json")) << "{" << base << ", \"name\": \"ok\"}";
  CliResult ok = keel("record --config " + q("ok.json") + " --steps 1 -o " + q("r.db"));
  EXPECT_EQ(ok.status, 0) << ok.err;
}

}  // namespace
