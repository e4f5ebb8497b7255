// keel export (graph, trace, csv) and keel ops through the real keel binary, where they meet the
// user's files and recordings: an export replaces only an earlier export of its own kind (never a
// model config, a manifest, an XML document or a spreadsheet), keeps a replaced file's mode and
// refuses a read-only one, leaves nothing behind when interrupted, and says why a recording made
// without some steps' ops has none to show.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "keel/base/text.h"
#include "keel/storage/reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using keel::test::CliResult;
using keel::test::expectOneLineError;

std::string slurp(const std::string& p) {
  return keel::readFile(p);
}

mode_t modeOf(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

class KeelExport : public keel::test::KeelCliTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fs::copy_file(fs::path(KEEL_SOURCE_DIR) / "tests/fixtures/gpt-tiny.json", dir_ / "c.json");
  }
  CliResult record(const std::string& out, const std::string& extra = "--steps 1") {
    return keel("record --config '" + path("c.json") + "' --seed 2 -o '" + path(out) + "' " +
                extra);
  }
  // `keel export KIND r.db ... -o OUT`
  CliResult exportTo(const std::string& kind, const std::string& out) {
    return keel("export " + kind + " '" + path("r.db") + "' -o '" + path(out) + "'");
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
  }
};

// The guard compared only an export's first byte or two ("{", "<?xml", "digraph", "seq,step,"),
// so a model config, a run folder's manifest.json, keel diff --json's output, an XML document,
// an SVG from another tool, a spreadsheet or another graph was replaced without a word. Each is
// now refused in one line and kept byte for byte; an earlier export of the same kind is still
// replaced (and an op CSV by a tensor CSV and back).
TEST_F(KeelExport, AnExportReplacesOnlyAnEarlierExportOfItsKind) {
  ASSERT_EQ(record("r.db").status, 0);
  write("manifest.json",
        "{\n  \"world_size\": 2,\n  \"ranks\": [\"rank-0.db\", \"rank-1.db\"]\n}\n");
  write("diff.json", "{\n  \"firstDivergence\": null\n}\n");
  write("pom.xml", "<?xml version=\"1.0\"?>\n<project><important/></project>\n");
  write(
      "other.svg",
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n");
  write("mine.csv", "seq,step,name\n1,2,my own spreadsheet\n");
  write("my.dot", "digraph G {\n  a -> b;\n}\n");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"trace", "c.json"},
      {"trace", "manifest.json"},
      {"trace", "diff.json"},
      {"graph --format svg", "pom.xml"},
      {"graph --format svg", "other.svg"},
      {"csv", "mine.csv"},
      {"csv --tensors", "mine.csv"},
      {"graph", "my.dot"},
      {"graph", "c.json"},
      {"csv", "pom.xml"}};
  for (const auto& [kind, file] : refused) {
    SCOPED_TRACE(kind + " -o " + file);
    const std::string before = slurp(path(file));
    expectOneLineError(exportTo(kind, file), "-o " + path(file) + " exists and is not ");
    EXPECT_EQ(slurp(path(file)), before);
  }
  // Earlier exports: replaced, each by the same kind.
  for (const auto& [kind, file] :
       std::vector<std::pair<std::string, std::string>>{{"trace", "t.json"},
                                                        {"graph", "g.dot"},
                                                        {"graph --format svg", "g.svg"},
                                                        {"csv", "o.csv"},
                                                        {"csv --tensors", "o.csv"},
                                                        {"csv", "o.csv"}}) {
    SCOPED_TRACE(kind + " -o " + file);
    for (int i = 0; i < 2; ++i) {
      const CliResult r = exportTo(kind, file);
      EXPECT_EQ(r.status, 0) << r.err;
    }
  }
  EXPECT_EQ(slurp(path("o.csv")).rfind("seq,step,phase,op,scope,thread,", 0), 0u);
}

// A replaced output keeps its permission bits (a private 0600 file came back 0644), for exports
// and recordings alike; one this user may not write is refused as `>` refuses it (it was replaced
// by a rename, and the old file's protection went with it).
TEST_F(KeelExport, AReplacedFileKeepsItsModeAndAReadOnlyOneIsRefused) {
  ASSERT_EQ(record("r.db").status, 0);
  ASSERT_EQ(exportTo("csv", "p.csv").status, 0);
  ASSERT_EQ(::chmod(path("p.csv").c_str(), 0600), 0);
  ASSERT_EQ(exportTo("csv --tensors", "p.csv").status, 0);
  EXPECT_EQ(modeOf(path("p.csv")), 0600u);
  ASSERT_EQ(::chmod(path("r.db").c_str(), 0640), 0);
  ASSERT_EQ(record("r.db").status, 0);
  EXPECT_EQ(modeOf(path("r.db")), 0640u);

  // A read-only export in a folder anyone may write; as root, keel runs as nobody.
  fs::create_directory(dir_ / "shared");
  ASSERT_EQ(::chmod(path("shared").c_str(), 0777), 0);
  ASSERT_EQ(exportTo("csv", "shared/ro.csv").status, 0);
  ASSERT_EQ(::chmod(path("shared/ro.csv").c_str(), 0444), 0);
  std::string as;
  if (::geteuid() == 0) {
    if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "root without setpriv";
    as = "setpriv --reuid=65534 --regid=65534 --clear-groups";
  }
  const std::string before = slurp(path("shared/ro.csv"));
  for (const std::string kind : {"csv", "csv --tensors"}) {
    expectOneLineError(
        keel("export " + kind + " '" + path("r.db") + "' -o '" + path("shared/ro.csv") + "'", as),
        "cannot write " + path("shared/ro.csv") + ": Permission denied");
  }
  EXPECT_EQ(slurp(path("shared/ro.csv")), before);
  EXPECT_EQ(modeOf(path("shared/ro.csv")), 0444u);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ / "shared"))
    left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"ro.csv"});
}

// Ctrl-C or SIGTERM while an export is written: the unfinished file is removed (it stayed as a
// hidden .NAME.partial-PID, megabytes nobody would notice), the earlier export is kept, and keel
// exits 128 + the signal with one line. The signal is sent once the partial file appears (the
// write of a 20 MB CSV); a run whose write ended first is tried again.
TEST_F(KeelExport, AnInterruptedExportLeavesNoPartialFile) {
  ASSERT_EQ(record("r.db", "--steps 200 --md5").status, 0);
  ASSERT_EQ(exportTo("csv", "t.csv").status, 0);
  const std::string earlier = slurp(path("t.csv"));
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    bool interrupted = false;
    for (int attempt = 0; attempt < 5 && !interrupted; ++attempt) {
      const std::string err = path("cli_sig_err.txt");
      std::vector<std::string> args{KEEL_CLI_PATH, "export", "csv",        "--tensors",
                                    path("r.db"),  "-o",     path("t.csv")};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        if (std::freopen("/dev/null", "w", stdout) == nullptr) ::_exit(99);
        if (std::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(99);
        ::setenv("KEEL_BLAS_TUNE", "0", 1);
        ::execv(KEEL_CLI_PATH, argv.data());
        ::_exit(98);
      }
      const std::string partial = path(".t.csv.partial-" + std::to_string(pid));
      int raw = 0;
      bool seen = false;
      while (!seen && ::waitpid(pid, &raw, WNOHANG) == 0) seen = fs::exists(partial);
      if (seen) {
        ::kill(pid, sig);
        ASSERT_EQ(::waitpid(pid, &raw, 0), pid);
      }
      EXPECT_FALSE(fs::exists(partial));
      if (!seen) {  // the export was written before its file was seen: try again
        ASSERT_EQ(exportTo("csv", "t.csv").status, 0);
        continue;
      }
      interrupted = true;
      ASSERT_TRUE(WIFEXITED(raw)) << "killed by signal " << WTERMSIG(raw);
      EXPECT_EQ(WEXITSTATUS(raw), 128 + sig);
      EXPECT_EQ(slurp(err), std::string("keel: interrupted (") +
                                (sig == SIGINT ? "SIGINT" : "SIGTERM") + "): " + path("t.csv") +
                                " not written\n");
      EXPECT_EQ(slurp(path("t.csv")), earlier);
    }
    EXPECT_TRUE(interrupted) << "no try caught the export while it wrote";
  }
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".t.csv."), std::string::npos) << e.path();
}

// Note [Streamed CSV]: a CSV is written page by page (4096 ops a page): a recording of more
// than a page has each op once, in order, across the pages' seams, the header once. --steps keeps
// the rows, and the trace's events, of those steps; steps without ops are an error naming the
// steps the recording has.
TEST_F(KeelExport, ACsvIsWrittenPageByPageAndStepsFilterTheExports) {
  ASSERT_EQ(record("r.db", "--steps 20 --md5").status, 0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("r.db"));
  const std::vector<keel::storage::OpRecord> all = rec.allOps();
  ASSERT_GT(all.size(), 4096u * 1 + 100);  // more than one page
  for (const std::string kind : {"csv", "csv --tensors"}) {
    SCOPED_TRACE(kind);
    ASSERT_EQ(exportTo(kind, "all.csv").status, 0);
    std::ifstream in(path("all.csv"));
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(line.rfind("seq,step,phase,op,scope,", 0), 0u);
    std::vector<uint64_t> seqs;
    while (std::getline(in, line)) {
      ASSERT_NE(line.rfind("seq,", 0), 0u) << "a second header";
      const uint64_t seq = std::stoull(line.substr(0, line.find(',')));
      if (seqs.empty() || seqs.back() != seq) seqs.push_back(seq);  // --tensors: rows per op
    }
    ASSERT_EQ(seqs.size(), all.size());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(seqs[i], all[i].seq) << i;
  }
  // --steps 2:3: the rows of steps 2 and 3, every one of them.
  size_t inRange = 0;
  for (const auto& op : all) inRange += op.step == 2 || op.step == 3;
  ASSERT_EQ(keel("export csv '" + path("r.db") + "' --steps 2:3 -o '" + path("s.csv") + "'").status,
            0);
  std::ifstream in(path("s.csv"));
  std::string line;
  std::getline(in, line);
  size_t rows = 0;
  while (std::getline(in, line)) {
    const size_t c1 = line.find(',');
    const std::string step = line.substr(c1 + 1, line.find(',', c1 + 1) - c1 - 1);
    EXPECT_TRUE(step == "2" || step == "3") << line;
    ++rows;
  }
  EXPECT_EQ(rows, inRange);
  // The trace of step 2: its ops and its step slice only.
  const CliResult t =
      keel("export trace '" + path("r.db") + "' --steps 2 -o '" + path("t.json") + "'");
  ASSERT_EQ(t.status, 0) << t.err;
  const std::string trace = slurp(path("t.json"));
  EXPECT_NE(trace.find("\"name\":\"step 2\""), std::string::npos);
  EXPECT_EQ(trace.find("\"name\":\"step 3\""), std::string::npos);
  EXPECT_EQ(trace.find("\"step\":3,"), std::string::npos);
  EXPECT_EQ(trace.find("\"step\":1,"), std::string::npos);
  expectOneLineError(
      keel("export csv '" + path("r.db") + "' --steps 99"),
      "recording " + path("r.db") + " has no ops in steps 99 (it has steps 1 to 20)");
  expectOneLineError(keel("export trace '" + path("r.db") + "' --steps 3:2"),
                     "--steps 3:2: the last step is before the first");
  expectOneLineError(keel("export csv '" + path("r.db") + "' --steps two"),
                     "--steps: expected A:B, A: or A (steps, e.g. 2:3), got 'two'");
}

// A recording made without some steps' ops (--step-range) or any (--no-graph) says so: export
// graph failed with "has no ops in step 1", which read like a broken recording, and export csv,
// export trace and ops printed an empty table with exit 0 and no word.
TEST_F(KeelExport, ARecordingWithoutTheStepsOpsSaysWhy) {
  ASSERT_EQ(record("range.db", "--steps 3 --step-range 2:3").status, 0);
  ASSERT_EQ(record("nograph.db", "--steps 1 --no-graph").status, 0);
  const std::string range = path("range.db"), nograph = path("nograph.db");
  expectOneLineError(
      keel("export graph '" + range + "'"),
      "recording " + range + ": step 1's ops were not recorded (only steps 2:3): try --step 2");
  expectOneLineError(keel("ops '" + range + "' --step 1"),
                     "step 1's ops were not recorded (only steps 2:3): try --step 2");
  const CliResult step2 = keel("export graph '" + range + "' --step 2");
  EXPECT_EQ(step2.status, 0) << step2.err;
  expectOneLineError(keel("export graph '" + nograph + "'"),
                     "recording " + nograph + ": recorded with --no-graph: it holds no op calls");
  // The other exports are valid, and empty of ops: one line on stderr says why.
  const std::string note =
      "keel: warning: recording " + nograph + ": recorded with --no-graph: it holds no op calls\n";
  for (const std::string cmd : {"export csv", "export csv --tensors", "export trace", "ops"}) {
    SCOPED_TRACE(cmd);
    const CliResult r = keel(cmd + " '" + nograph + "'");
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, note);
  }
  EXPECT_EQ(keel("export csv '" + nograph + "'").out,
            "seq,step,phase,op,scope,thread,begin_ns,end_ns,forward_seq,inputs,outputs,md5_out0\n");
  const CliResult csv = keel("export csv '" + range + "'");  // ops of steps 2 and 3: no note
  EXPECT_EQ(csv.status, 0);
  EXPECT_EQ(csv.err, "");
}

// CLI mistakes name what was meant: an export format keel does not have lists those it has (it
// said "The following arguments were not expected: r.db jsonl"); an empty recording name is
// refused by inspect as by the other commands; --rank asks for a run folder.
TEST_F(KeelExport, MistakesNameWhatWasMeant) {
  expectOneLineError(keel("export jsonl r.db"),
                     "keel export: unknown format 'jsonl' (expected graph, trace, csv; see keel "
                     "export --help)");
  expectOneLineError(keel("inspect ''"), "recording: must not be empty");
  ASSERT_EQ(record("r.db").status, 0);
  expectOneLineError(keel("export trace '" + path("r.db") + "' --rank 1"),
                     "--rank needs a run folder");
}

}  // namespace
