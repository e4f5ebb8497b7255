// Tests for the `keel` command-line tool, run as a child process: every error (bad config, unknown
// backend, bad option) exits 2 with exactly one "keel: error:" line on stderr; `keel ops` and a
// 3-step `keel train` succeed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
const std::string kSrc = KEEL_SOURCE_DIR;

using keel::test::CliResult;
using keel::test::expectOneLineError;

// One folder per test: ctest runs the tests of this file in parallel.
CliResult runKeel(const std::string& args, const std::string& env = "") {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::path dir =
      fs::path(::testing::TempDir()) / ("keel_cli_test_" + std::to_string(::getpid()) + "_" + test);
  fs::create_directories(dir);
  return keel::test::runKeelCli(args, dir.string(), env);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(KEEL_CLI_PATH)) << "keel binary missing: " << KEEL_CLI_PATH;
  }
};

TEST_F(CliTest, MissingConfigFile) {
  expectOneLineError(runKeel("train --config no/such.json --steps 1"), "no/such.json");
}

TEST_F(CliTest, BadConfigContent) {
  fs::path bad =
      fs::path(::testing::TempDir()) / ("keel_cli_bad_" + std::to_string(::getpid()) + ".json");
  std::ofstream(bad) << "{\"vocab_size\": 256, \"seq_len\": 16, \"n_layer\": 2, \"n_head\": 3,\n"
                        " \"d_model\": 32}";
  expectOneLineError(runKeel("train --config '" + bad.string() + "' --steps 1"), "n_head");
  std::ofstream(bad) << "{ not json";
  expectOneLineError(runKeel("train --config '" + bad.string() + "' --steps 1"), "invalid JSON");
}

TEST_F(CliTest, UnknownBackend) {
  expectOneLineError(runKeel("train --config tests/fixtures/gpt-tiny.json --backend tpu --steps 1"),
                     "tpu");
}

TEST_F(CliTest, ParseErrors) {
  expectOneLineError(runKeel("train --config tests/fixtures/gpt-tiny.json --bogus"), "bogus");
  expectOneLineError(runKeel("train --config tests/fixtures/gpt-tiny.json --steps 0"), "steps");
  expectOneLineError(runKeel("train --config tests/fixtures/gpt-tiny.json --steps x"), "steps");
  expectOneLineError(runKeel("train"), "config");
  expectOneLineError(runKeel(""), "subcommand");
  expectOneLineError(runKeel("frobnicate"), "frobnicate");
  expectOneLineError(
      runKeel("train --config tests/fixtures/gpt-tiny.json --steps 1 --data /no/such/file"),
      "/no/such/file");
}

// Every numeric option has a range, and a value outside it is one line naming the option, the
// value and the range in words (not CLI11's 300-digit bound); nothing is wrapped or taken as
// "not given" silently.
TEST_F(CliTest, OutOfRangeValuesAreOneLineInWords) {
  const std::string train = "train --config tests/fixtures/gpt-tiny.json ";
  const std::string rec = "record --config tests/fixtures/gpt-tiny.json -o /tmp/never.db ";
  const std::pair<std::string, std::string> cases[] = {
      {train + "--steps -1", "--steps: must be a whole number in [1, 1000000000], got '-1'"},
      {train + "--steps 9223372036854775808", "--steps: must be a whole number in [1, 1000000000]"},
      {train + "--steps 10000000000", "got '10000000000'"},
      {train + "--steps 1e3", "got '1e3'"},
      {train + "--seed -1",
       "--seed: must be a whole number in [0, 18446744073709551615], got '-1'"},
      {train + "--seed 18446744073709551616", "--seed: must be a whole number in [0, "},
      {train + "--data ''", "--data: must not be empty"},
      {train + "--ckpt-dir ''", "--ckpt-dir: must not be empty"},
      {train + "--threads 0", "--threads: must be a whole number ≥ 1, got '0'"},
      {rec + "--seed -1", "--seed: must be a whole number"},
      {rec + "--rounded-md5 18", "--rounded-md5: must be a whole number in [1, 17], got '18'"},
      {"diff a.db b.db --atol -1", "--atol: must be a finite number ≥ 0, got '-1'"},
      {"diff a.db b.db --atol nan", "--atol: must be a finite number ≥ 0, got 'nan'"},
      {"diff a.db b.db --rtol inf", "--rtol: must be a finite number ≥ 0, got 'inf'"},
      {"diff a.db b.db --ulps -1", "--ulps: must be a whole number ≥ 0, got '-1'"},
      {"ops a.db --step -5", "--step: must be a whole number ≥ 0, got '-5'"},
      {"ops a.db --limit -1", "--limit: must be a whole number ≥ 0, got '-1'"},
      {"ckpt plan a", "--target-tp is required"},
      // Empty names are not "not given".
      {train + "--resume ''", "--resume: must not be empty"},
      {"ops ''", "recording: must not be empty"},
      {"ckpt plan a --target-tp 2 --aoa ''", "--aoa: must not be empty"},
      {"ckpt convert a '' --target-tp 2", "DST: must not be empty"},
      {"memory trace /tmp/never.trace --generate-moe --skew -1",
       "--skew: must be a finite number in [0, 8], got '-1'"},
      {"memory trace /tmp/never.trace --generate-moe --skew nan",
       "--skew: must be a finite number in [0, 8], got 'nan'"},
      {"memory stats a.db --event abc", "--event: must be a whole number ≥ 0, got 'abc'"},
      // A trace of a config's training or a generated one: the other's options were ignored.
      {"memory trace /tmp/never.trace --config configs/gpt-mini.json --generate-moe",
       "--config excludes --generate-moe"},
      {"memory trace /tmp/never.trace --experts 4", "--experts requires --generate-moe"},
      // Options each in range whose blocks are not (a trace every reader then refused).
      {"memory trace /tmp/never.trace --generate-moe --experts 64 --top-k 64 --layers 1 "
       "--tokens 16777216 --d-model 65536 --d-ff 262144 --moe-steps 1",
       "MoE trace: these options make a block of 47749527502848 bytes, past a trace block's "
       "limit of 2^44"},
      // launch: -n missing named (it read as "arguments not expected: x --config train"), and a
      // hostfile mpirun cannot open is one line and 2 (mpirun printed a banner and exited 0).
      {"launch train --config x",
       "keel launch: -n N, the number of ranks, is required (keel launch -n 4 train ...)"},
      {"launch --hostfile /nonexistent/hosts -n 2 train --config x",
       "keel launch: --hostfile /nonexistent/hosts: no such file"},
      {"launch --hostfile /dev/null -n 2 train --config x",
       "/dev/null: the hostfile is a character device, not a regular file"},
      // A layout that does not fit the ranks: one line before mpirun starts (it was one line per
      // rank, then mpirun's report of a failed job).
      {"launch -n 2 train --config x --dp 4",
       "keel launch -n 2: parallel layout: dp 4 x tp 1 = 4 ranks, but 2 are asked for (-n)"},
      {"launch -n 1 train --config x --dp 2",
       "keel launch -n 1: parallel layout: dp 2 x tp 1 = 2 ranks, but 1 is asked for (-n)"},
      {"launch -n 4 train --config x --tp=3",
       "keel launch -n 4: parallel layout: --tp 3 does not divide the 4 ranks the launcher "
       "started"},
      {"launch -n 2 record --config x -o r.db --zero --tp 2",
       "keel launch -n 2: --zero shards the optimizer state across data-parallel ranks, and this "
       "run has dp 1"},
      {"memory stats a.db --event 99999999999999999999",
       "--event: must be a whole number ≥ 0, at most 9223372036854775807, got "
       "'99999999999999999999'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    const CliResult r = runKeel(args);
    expectOneLineError(r, message);
    EXPECT_LT(r.err.size(), 200u) << r.err;
  }
}

TEST_F(CliTest, HelpExitsZero) {
  CliResult r = runKeel("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
}

// Every help page, every subcommand's included, lines its options' descriptions up in one column
// (CLI11's 30): CLI11 pads by bytes, and a bound written "≥" in an option's type pushed its
// description two columns right of the others (`keel ops --help`: --step, --limit).
TEST_F(CliTest, EveryHelpPageAlignsItsDescriptions) {
  auto displayWidth = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::vector<std::string> pages{""};
  int checked = 0;
  std::set<std::string> visited;
  while (!pages.empty()) {
    const std::string page = pages.back();
    pages.pop_back();
    visited.insert(page);
    const CliResult r = runKeel(page + " --help");
    ASSERT_EQ(r.status, 0) << page << r.err;
    bool subcommands = false;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line[0] != ' ') subcommands = line == "Subcommands:";
      // "  NAME<two or more spaces>DESCRIPTION": the description's column.
      if (line.size() < 4 || line.compare(0, 2, "  ") != 0 || line[2] == ' ') continue;
      const size_t gap = line.find("  ", 2);
      if (gap == std::string::npos) {
        if (subcommands) pages.push_back(page + " " + line.substr(2));
        continue;
      }
      const size_t text = line.find_first_not_of(' ', gap);
      if (text == std::string::npos) continue;
      EXPECT_EQ(displayWidth(line.substr(0, text)), 30u) << "keel" << page << " --help: " << line;
      ++checked;
      if (subcommands) pages.push_back(page + " " + line.substr(2, gap - 2));
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_TRUE(visited.count(" memory replay") && visited.count(" ckpt convert")) << visited.size();
}

TEST_F(CliTest, OpsListsTheRegistry) {
  CliResult r = runKeel("ops");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_NE(r.out.find("matmul"), std::string::npos);
  EXPECT_NE(r.out.find("adamw_step"), std::string::npos);
  EXPECT_NE(r.out.find("cpu-ref"), std::string::npos);
}

TEST_F(CliTest, TrainPrintsOneLinePerStep) {
  CliResult r = runKeel(
      "train --config tests/fixtures/gpt-tiny.json --backend cpu-ref --steps 3 --seed 5 "
      "--eval-batches 1");
  ASSERT_EQ(r.status, 0) << r.err;
  int steps = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("step ", 0) == 0) {
      ++steps;
      EXPECT_NE(line.find("loss"), std::string::npos) << line;
      EXPECT_NE(line.find("lr"), std::string::npos) << line;
      EXPECT_NE(line.find("tok/s"), std::string::npos) << line;
    }
  EXPECT_EQ(steps, 3) << r.out;
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("val loss"), std::string::npos) << r.out;
  // A run gone NaN prints nan everywhere, never -nan (the summary's val loss said -nan).
  const CliResult nan =
      runKeel("train --config tests/fixtures/gpt-tiny.json --steps 3 --eval-batches 1",
              "KEEL_TEST_PERTURB=matmul:20:nan");
  ASSERT_EQ(nan.status, 0) << nan.err;
  EXPECT_NE(nan.out.find("; val loss nan"), std::string::npos) << nan.out;
  EXPECT_EQ(nan.out.find("-nan"), std::string::npos) << nan.out;
}

}  // namespace
