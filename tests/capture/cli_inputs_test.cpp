// Inputs that must be files are files (issue 20): a FIFO, a device or a directory given as a
// config, an AOA rules file, a trace or a recording is one line and exit 2 — never a hang — and
// JSON nested 100,000 deep or a 40 MB config is refused in one line instead of crashing or being
// read whole (Note [Bounded JSON], keel/base/text.h), and a checkpoint of 200,000 tensors is read
// in bounded time. Through the real keel binary, each call bounded by `timeout` so a regression
// fails instead of hanging the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/checkpoint.h"
#include "keel/safetensors.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using keel::test::CliResult;
using keel::test::expectOneLineError;

class KeelInputs : public keel::test::KeelCliTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  }

  // 124 (timeout's status) if keel blocked.
  CliResult keel(const std::string& args) const { return KeelCliTest::keel(args, "timeout 30"); }
  // Runs the SQL `script` on the file `name` (through Python's sqlite3) and returns the first
  // column of the first row of its last statement, "" when it returns none.
  std::string sql(const std::string& name, const std::string& script) {
    const std::string out = path("sql_out.txt");
    std::ofstream(path("sql.py"))
        << "import sqlite3, sys\n"
           "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
           "parts = [p for p in sys.argv[2].split(';') if p.strip()]\n"
           "row = None\n"
           "for p in parts: row = c.execute(p).fetchone()\n"
           "open(sys.argv[3], 'w').write('' if row is None else str(row[0]))\n";
    std::ofstream(path("sql.txt")) << script;
    const std::string cmd = "python3 " + q("sql.py") + " " + q(name) + " \"$(cat " + q("sql.txt") +
                            ")\" " + q("sql_out.txt");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << script;
    std::ifstream in(out);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Exit status 2 and exactly the line "keel: error: <message>".
  static void expectExactError(const CliResult& r, const std::string& message) {
    EXPECT_EQ(r.status, 2) << r.out << r.err;
    EXPECT_EQ(r.err, "keel: error: " + message + "\n");
  }
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
  // A workload library: dlopen of a FIFO blocked forever.
  expectOneLineError(keel("record --workload " + q("fifo") + " -o " + q("r.db")),
                     "the workload library is a FIFO, not a regular file");
  expectOneLineError(keel("record --config /dev/zero -o " + q("r.db")),
                     "/dev/zero: config file is a character device");
  for (const std::string cmd : {"inspect", "ops", "export csv", "export trace", "memory stats"})
    expectOneLineError(keel(cmd + " " + q("fifo")), "is a FIFO, not a regular file");
  expectOneLineError(keel("diff " + q("fifo") + " " + q("fifo")), "is a FIFO");
  expectOneLineError(keel("memory replay " + q("fifo")), "is a FIFO");
  // /dev/zero as a trace grew to 6 GB.
  for (const std::string alloc : {"", " --allocator vmm"})
    expectExactError(keel("memory replay /dev/zero" + alloc),
                     "/dev/zero: trace is a character device, not a regular file");
  // AOA rules: a FIFO and a directory (it used to be read as an empty rule file).
  CliResult train =
      keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --ckpt-dir " + q("ck"));
  ASSERT_EQ(train.status, 0) << train.err;
  const std::string ck =
      (dir_ / "ck" / fs::directory_iterator(dir_ / "ck")->path().filename()).string();
  expectOneLineError(keel("ckpt plan '" + ck + "' --target-tp 1 --aoa " + q("fifo")),
                     "AOA rules file is a FIFO, not a regular file (write the rules to a file)");
  fs::create_directory(dir_ / "rules");
  expectOneLineError(keel("ckpt plan '" + ck + "' --target-tp 1 --aoa " + q("rules")),
                     "AOA rules file is a directory");
  // A checkpoint whose shard or metadata is a FIFO: inspect, convert and resume refuse it (the
  // shard's open used to wait for a writer forever).
  for (const char* node : {"model-00000-of-00001.safetensors", "keel-checkpoint.json"}) {
    const fs::path bad = dir_ / (std::string("ckfifo-") + node);
    fs::copy(ck, bad);
    fs::remove(bad / node);
    ASSERT_EQ(::mkfifo((bad / node).c_str(), 0600), 0);
    const std::string what = std::string(node).find(".json") != std::string::npos
                                 ? "checkpoint metadata is a FIFO, not a regular file"
                                 : "the safetensors file is a FIFO, not a regular file";
    expectOneLineError(keel("ckpt inspect '" + bad.string() + "'"), what);
    expectOneLineError(keel("ckpt convert '" + bad.string() + "' " + q("cv") + " --target-tp 1"),
                       what);
    expectOneLineError(keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --resume '" +
                            bad.string() + "'"),
                       what);
    EXPECT_FALSE(fs::exists(dir_ / "cv"));
  }
  // A PyTorch memory snapshot that is a FIFO or a device.
  expectExactError(keel("import torch-memory " + q("fifo") + " -o " + q("t.db")),
                   path("fifo") + ": the memory snapshot is a FIFO, not a regular file");
  expectExactError(keel("import torch-memory /dev/zero -o " + q("t.db")),
                   "/dev/zero: the memory snapshot is a character device, not a regular file");
  EXPECT_FALSE(fs::exists(dir_ / "t.db"));
}

// Inputs that are huge where a line or a token is expected are refused at once in a short line:
// a 2 GiB file of zeros as an allocation trace (it used to be read into one line), a 5 MB token
// in a trace and a 500 KB key in a config (each used to be quoted whole in the error line).
TEST_F(KeelInputs, HugeLinesAndTokensGiveAShortLine) {
  { std::ofstream f(path("zeros.trace")); }
  fs::resize_file(dir_ / "zeros.trace", uintmax_t(2) << 30);  // sparse: no disk used
  expectExactError(
      keel("memory replay " + q("zeros.trace")),
      path("zeros.trace") +
          ":1: line longer than 4096 bytes; an allocation trace has lines like 'a ID BYTES'");
  std::ofstream(path("token.trace")) << "a 1 16\nf 1 " << std::string(5 << 20, 'x') << "\n";
  CliResult token = keel("memory replay " + q("token.trace"));
  expectOneLineError(token, "token.trace:2: line longer than 4096 bytes");
  std::ofstream(path("word.trace")) << "a 1 16\n" << std::string(3000, 'z') << "\n";
  CliResult word = keel("memory replay " + q("word.trace"));
  expectExactError(word, path("word.trace") + ":2: unknown event '" + std::string(26, 'z') +
                             " … (2960 bytes left out) … " + std::string(14, 'z') +
                             "' (expected a, f or s)");
  // A config key of 500 KB: the error line quotes its start and end.
  std::ofstream(path("key.json"))
      << R"({"vocab_size": 256, "seq_len": 16, "n_layer": 1, "n_head": 1, "d_model": 8, ")"
      << std::string(500000, 'k') << R"(": 1})";
  CliResult key = keel("record --config " + q("key.json") + " -o " + q("r.db"));
  expectOneLineError(key, "key.json: field 'kkkkkkkkkk");
  expectOneLineError(key, " bytes left out) … kkkkkkkkkk");
  EXPECT_LT(key.err.size(), 400u) << key.err.size();
  EXPECT_FALSE(fs::exists(dir_ / "r.db"));
}

// A damaged allocator event (bytes -1, read as 2^64 - 1) is refused by `keel memory replay` in
// one line, by the reader (Note [Damaged recordings]): it used to make the vmm allocator grow to
// 6-17 GB before std::bad_alloc.
TEST_F(KeelInputs, ADamagedAllocationSizeIsRefusedNotReplayed) {
  CliResult rec =
      keel("record --config tests/fixtures/gpt-tiny.json --steps 1 --allocator -o " + q("r.db"));
  ASSERT_EQ(rec.status, 0) << rec.err;
  const std::string row = sql(
      "r.db",
      "UPDATE mem_events SET bytes = -1 WHERE id = (SELECT min(id) FROM mem_events WHERE kind_sid ="
      " (SELECT id FROM strings WHERE text = 'alloc')); SELECT id FROM mem_events WHERE bytes = "
      "-1");
  ASSERT_FALSE(row.empty());
  for (const std::string& cmd : {"memory replay " + q("r.db") + " --allocator vmm",
                                 "memory replay " + q("r.db"), "memory stats " + q("r.db")})
    expectExactError(keel(cmd),
                     "damaged recording " + path("r.db") +
                         ": allocator event claims -1 bytes (out of range 0 .. 2^44), in "
                         "mem_events row " +
                         row);
}

// Recordings that open but are wrong inside (Note [Damaged recordings]): a forward link in a
// cycle, a negative sequence number, and a dump claiming 3 GiB (the studio took 3.2 GB when its
// op was selected), are one line naming the file, the table and the row, exit 2, from every
// command that reads them.
TEST_F(KeelInputs, ADamagedRecordingIsOneLine) {
  CliResult rec = keel(
      "record --config tests/fixtures/gpt-tiny.json --steps 1 --dumps --dump-ops "
      "matmul -o " +
      q("r.db"));
  ASSERT_EQ(rec.status, 0) << rec.err;
  // The first and the last backward op (each links to an earlier forward op), the last op, and
  // the first dump's op, role and index.
  const std::string first = sql("r.db", "SELECT min(seq) FROM ops WHERE forward_seq > 0"),
                    last = sql("r.db", "SELECT max(seq) FROM ops WHERE forward_seq > 0"),
                    lastOp = sql("r.db", "SELECT max(seq) FROM ops"),
                    dump = sql("r.db",
                               "SELECT op_seq || ' ' || (CASE role WHEN 0 THEN 'input' ELSE "
                               "'output' END) || ' ' || idx FROM dumps ORDER BY id LIMIT 1");
  ASSERT_FALSE(first.empty() || last.empty() || first == last || dump.empty());
  auto damaged = [&](const std::string& copy, const std::string& script) {
    fs::copy_file(path("r.db"), path(copy));
    sql(copy, script);
    return "damaged recording " + path(copy) + ": ";
  };
  // Two backward ops linking each other: the first one's link points forward.
  const std::string cycle =
      damaged("cycle.db", "UPDATE ops SET forward_seq = " + last + " WHERE seq = " + first +
                              "; UPDATE ops SET forward_seq = " + first + " WHERE seq = " + last);
  const std::string cycleLine = cycle + "op " + first + " links to forward op " + last +
                                ", which did not run before it, in ops row " + first;
  for (const std::string cmd : {"ops", "export csv", "export trace"})
    expectExactError(keel(cmd + " " + q("cycle.db")), cycleLine);
  expectExactError(keel("diff " + q("r.db") + " " + q("cycle.db")), cycleLine);
  const std::string negative =
      damaged("negative.db", "UPDATE ops SET seq = -seq WHERE seq = " + lastOp);
  expectExactError(keel("ops " + q("negative.db")),
                   negative + "op seq -" + lastOp + " is not positive, in ops row -" + lastOp);
  const std::string huge = damaged(
      "dump.db", "UPDATE dumps SET raw_bytes = 3 << 30 WHERE id = (SELECT min(id) FROM dumps)");
  expectExactError(keel("diff " + q("r.db") + " " + q("dump.db")),
                   huge + "dump of op " + dump +
                       " claims 3221225472 bytes (out of range 0 .. 2^30), in dumps row 1");
}

// `keel diff --json` on recorded strings that are not UTF-8 (a scope with a 0xFF byte) writes
// U+FFFD for the bad bytes: it used to fail with nlohmann's bare "[json.exception.type_error.316]".
TEST_F(KeelInputs, DiffJsonReplacesBytesThatAreNotUtf8) {
  CliResult rec = keel("record --config tests/fixtures/gpt-tiny.json --steps 1 -o " + q("r.db"));
  ASSERT_EQ(rec.status, 0) << rec.err;
  fs::copy_file(path("r.db"), path("bad.db"));
  sql("bad.db",
      "UPDATE strings SET text = CAST(X'626C6F636B732EFF2E61' AS TEXT) WHERE text = "
      "'blocks.0.attn'");
  const CliResult r = keel("diff --json " + q("r.db") + " " + q("bad.db"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("verdict"), "values-not-compared");  // recorded without MD5s or statistics
  int replaced = 0;
  for (const nlohmann::json& p : j.at("pairs"))
    if (p.value("scope", "") == "blocks.\xef\xbf\xbd.a") ++replaced;
  EXPECT_GT(replaced, 0) << r.out.substr(0, 2000);
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
  for (const char* field : {"d_model", "batch_size", "n_layer", "vocab_size", "d_ff"}) {
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

// A checkpoint of 200,000 tensors is inspected, planned, converted and resumed from in bounded
// time: each of these was quadratic in the tensors (Note [Linear headers]: 40,000 took 13 s to
// load, 200,000 minutes). `timeout` bounds each command loosely; bench_ckpt's BM_Ckpt*Keys
// measure the speed (linear in the keys).
TEST_F(KeelInputs, ACheckpointWithManyTensorsIsReadInBoundedTime) {
  constexpr int kTensors = 200000;
  auto slow = [&](const std::string& args) {
    return keel::test::runKeelCli(args, dir_.string(), "timeout 60");
  };
  auto name = [](int i) {  // t000000, t000001, ...
    char n[16];
    std::snprintf(n, sizeof n, "t%06d", i);
    return std::string(n);
  };
  std::vector<keel::st::WriteEntry> entries;
  for (int i = 0; i < kTensors; ++i) entries.push_back({name(i), keel::st::DType::F32, {0}});
  keel::st::Writer(path("many.safetensors"), entries).close();

  CliResult inspect = slow("ckpt inspect " + q("many.safetensors"));
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find(": 1 file, 200000 keys, 200000 shards, 0 B\n"), std::string::npos)
      << inspect.out.substr(0, 300);
  const size_t first = inspect.out.find("\n  t000000 "), last = inspect.out.find("\n  t199999 ");
  EXPECT_TRUE(first != std::string::npos && last != std::string::npos && first < last)
      << "keys in the header's order";
  CliResult plan = slow("ckpt plan " + q("many.safetensors") + " --target-tp 2 --max-reads 0");
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_EQ(plan.out.substr(0, plan.out.find('\n')),
            "plan: 200000 source keys in 1 file -> 200000 target keys in 2 files (tp=2), 200000 "
            "target shards, 0 reads");
  CliResult convert =
      slow("ckpt convert " + q("many.safetensors") + " " + q("tp2") + " --target-tp 2 --threads 2");
  ASSERT_EQ(convert.status, 0) << convert.err;
  EXPECT_NE(convert.out.find("(tp=2): 200000 shards in 2 files, 0 B written, 0 B read"),
            std::string::npos)
      << convert.out;

  // A training checkpoint with the 200,000 tensors added: resuming from it reads them all and
  // refuses them in one line (they match nothing in the model).
  CliResult train =
      slow("train --config tests/fixtures/gpt-tiny.json --steps 1 --ckpt-dir " + q("ck"));
  ASSERT_EQ(train.status, 0) << train.err;
  const auto trained = keel::ckpt::Checkpoint::open(keel::ckpt::resolveCheckpoint(path("ck")));
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<keel::ckpt::HostTensor> tensors;
  for (const auto& k : trained.metadata().keys)
    bytes.emplace_back(keel::st::byteCount(k.shape, k.dtype, k.key));
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto& k = trained.metadata().keys[i];
    tensors.push_back({k.key, k.dtype, k.shape, bytes[i].data()});
  }
  keel::ckpt::loadTensors(trained, nullptr, tensors);
  for (const auto& e : entries) tensors.push_back({e.name, e.dtype, e.shape, nullptr});
  keel::ckpt::TargetSpec one;
  keel::ckpt::saveTensors(path("big"), tensors, one, trained.metadata().trainState);
  expectOneLineError(
      slow("train --config tests/fixtures/gpt-tiny.json --steps 2 --resume " + q("big")),
      "checkpoint keys 't000000', 't000001', 't000002' and 199997 more match nothing in the "
      "target (drop them with 'key -> _': keel ckpt convert --aoa RULES writes a checkpoint "
      "without them)");
}

}  // namespace
