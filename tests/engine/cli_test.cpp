// Tests for the `keel` command-line tool, run as a child process: every error (bad config, unknown
// backend, bad option) exits 2 with exactly one "keel: error:" line on stderr; `keel ops` and a
// 3-step `keel train` succeed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
const std::string kSrc = KEEL_SOURCE_DIR;

using keel::test::CliResult;
using keel::test::expectOneLineError;

// One folder per test: ctest runs the tests of this file in parallel.
CliResult runKeel(const std::string& args) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::path dir =
      fs::path(::testing::TempDir()) / ("keel_cli_test_" + std::to_string(::getpid()) + "_" + test);
  fs::create_directories(dir);
  return keel::test::runKeelCli(args, dir.string());
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

TEST_F(CliTest, HelpExitsZero) {
  CliResult r = runKeel("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
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
}

}  // namespace
