// Workloads (keel/workload.h): the loader refuses a library built for another workload API
// version with one clear error; a workload that throws in its second step fails its run with an
// error naming the workload and the step, and the recording keeps the first step (status
// "failed: ..."). Through the loader API in process and through `keel record --workload`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/storage/reader.h"
#include "keel/workload.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using keel::test::CliResult;
using keel::test::expectOneLineError;

std::string workloadPath(const std::string& name) {
  return std::string(KEEL_TEST_WORKLOAD_DIR) + "/libtest_" + name + ".so";
}

// Runs f, expecting a keel::Error whose message contains every fragment.
template <typename F>
void expectError(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected a keel::Error";
  } catch (const keel::Error& e) {
    std::string msg = e.what();
    for (const auto& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(WorkloadLoader, RefusesAMismatchedApiVersion) {
  expectError([] { keel::loadWorkload(workloadPath("api_version_999")); },
              {"api_version_999", "workload API version 999", "loads version 1", "rebuild"});
}

TEST(WorkloadLoader, RefusesAFileThatIsNotAWorkload) {
  expectError([] { keel::loadWorkload("/nonexistent/libnothing.so"); },
              {"cannot load workload '/nonexistent/libnothing.so'"});
}

TEST(WorkloadLoader, TurnsAThrowingStepIntoAnErrorNamingTheStep) {
  keel::WorkloadInfo info = keel::loadWorkload(workloadPath("throws_in_step2"));
  EXPECT_EQ(info.name, "throws-in-step-2");
  EXPECT_EQ(info.description, "fails its second step (a loader test)");
  keel::WorkloadParams params;
  keel::WorkloadRun run(info, params);
  keel::WorkloadMetrics m = run.step();
  EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_GT(m.loss, 0.0);
  EXPECT_EQ(run.steps(), 1);
  expectError([&] { run.step(); },
              {"workload 'throws-in-step-2' failed in step 2: injected failure in step 2"});
  EXPECT_EQ(run.steps(), 1);
}

TEST(WorkloadLoader, TurnsAThrowingConstructorIntoAnError) {
  keel::WorkloadInfo info = keel::loadWorkload(workloadPath("throws_in_step2"));
  keel::WorkloadParams params;
  params.configJson = R"({"fail_in_create": true})";
  expectError([&] { keel::WorkloadRun run(info, params); },
              {"workload 'throws-in-step-2': fail_in_create was set"});
}

TEST(WorkloadLoader, TheBuiltInTrainerIsAWorkload) {
  keel::WorkloadInfo info = keel::gptWorkload();
  EXPECT_EQ(info.name, "gpt");
  EXPECT_EQ(info.source, "built-in");
  keel::WorkloadParams params;
  expectError([&] { keel::WorkloadRun run(info, params); }, {"needs a model config"});
}

// Note [Built-in config parsed once]: a run of the built-in trainer from the host's parsed config
// never reads params.configJson, trains the same bits as the C path from the text, and fails
// with the C path's message.
TEST(WorkloadLoader, TheBuiltInTrainerRunsFromTheHostsParsedConfig) {
  const std::string path = std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json";
  const keel::GptConfig cfg = keel::loadGptConfig(path);
  keel::WorkloadParams params;
  params.configJson = "not JSON: would fail if parsed";
  std::unique_ptr<keel::WorkloadRun> parsed = keel::gptWorkloadRun(cfg, params);
  EXPECT_EQ(parsed->info().name, "gpt");
  const double loss = parsed->step().loss;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(parsed->steps(), 1);

  keel::WorkloadParams text;
  text.configJson = keel::readFile(path);
  text.configPath = path;
  keel::WorkloadRun viaText(keel::gptWorkload(), text);
  EXPECT_EQ(viaText.step().loss, loss);

  params.dataPath = text.dataPath = "/nonexistent/corpus.txt";
  std::string viaTextError;
  try {
    keel::WorkloadRun run(keel::gptWorkload(), text);
  } catch (const keel::Error& e) {
    viaTextError = e.what();
  }
  EXPECT_NE(viaTextError.find("workload 'gpt': "), std::string::npos) << viaTextError;
  expectError([&] { keel::gptWorkloadRun(cfg, params); }, {viaTextError});
}

class WorkloadRecord : public keel::test::KeelCliTest {};

TEST_F(WorkloadRecord, MismatchedApiVersionIsOneErrorLineAndNoRecording) {
  CliResult r = keel("record --workload '" + workloadPath("api_version_999") + "' --steps 2 -o '" +
                     path("v.db") + "'");
  expectOneLineError(r, "was built for workload API version 999");
  EXPECT_FALSE(fs::exists(path("v.db")));
}

TEST_F(WorkloadRecord, ThrowingSecondStepFailsTheRunAndKeepsTheFirstStep) {
  CliResult r = keel("record --workload '" + workloadPath("throws_in_step2") +
                     "' --steps 3 --md5 -o '" + path("t.db") + "'");
  expectOneLineError(r, "workload 'throws-in-step-2' failed in step 2: injected failure in step 2");
  EXPECT_NE(r.out.find("step 1/3  loss"), std::string::npos) << r.out;

  auto rec = keel::storage::Recording::open(path("t.db"));
  EXPECT_EQ(rec.run().status.rfind("failed: ", 0), 0u) << rec.run().status;
  EXPECT_NE(rec.run().status.find("injected failure in step 2"), std::string::npos);
  auto steps = rec.steps();
  ASSERT_GE(steps.size(), 1u);
  EXPECT_EQ(steps[0].step, 1);
  EXPECT_GT(steps[0].endNs, 0);
  EXPECT_TRUE(std::isfinite(steps[0].loss));
  auto ops = rec.stepOps(1);
  bool matmul = false, backward = false;
  for (const auto& op : ops) {
    matmul = matmul || op.name == "matmul";
    backward = backward || op.phase == keel::Phase::Backward;
  }
  EXPECT_TRUE(matmul);
  EXPECT_TRUE(backward);
  // Step 2's forward ran before the failure and was recorded too.
  EXPECT_FALSE(rec.stepOps(2).empty());
}

// A user's helper in an anonymous namespace, inlined (no symbol, no linkage name), is a stack
// frame named with its namespaces and at its own line: it read as a bare "project". The
// workload is built with -g, as a user's model often is; with -g1 (Keel's own release build)
// DWARF keeps no namespaces and the bare name is all there is.
TEST_F(WorkloadRecord, StacksQualifyAnInlinedHelperInAnAnonymousNamespace) {
  ASSERT_EQ(keel("record --workload '" + workloadPath("inlined_helper") +
                 "' --steps 1 --stacks -o '" + path("s.db") + "'")
                .status,
            0);
  auto rec = keel::storage::Recording::open(path("s.db"));
  std::optional<keel::storage::StackRecord> stack;
  for (const auto& op : rec.stepOps(1))
    if (op.name == "matmul" && op.phase == keel::Phase::Forward && op.stackId >= 0)
      stack = rec.stack(op.stackId);
  ASSERT_TRUE(stack);
  std::string text;
  for (const auto& f : stack->frames) text += f.function + "  " + f.file + "\n";
  const auto named = [&](const std::string& function) {
    for (const auto& f : stack->frames)
      if (f.function.rfind(function, 0) == 0) return &f;
    return static_cast<const keel::storage::StackFrame*>(nullptr);
  };
  const keel::storage::StackFrame* helper = named("user_model::(anonymous namespace)::project");
  ASSERT_NE(helper, nullptr) << text;
  EXPECT_NE(helper->file.find("tests/workloads/inlined_helper.cpp"), std::string::npos) << text;
  EXPECT_EQ(helper->line, 12) << text;
  EXPECT_NE(named("user_model::(anonymous namespace)::InlinedHelper::step"), nullptr) << text;
  for (const auto& f : stack->frames) EXPECT_NE(f.function, "project") << text;
}

TEST_F(WorkloadRecord, RecordNeedsAConfigOrAWorkload) {
  expectOneLineError(keel("record --steps 1 -o '" + path("n.db") + "'"), "--config is required");
}

}  // namespace
