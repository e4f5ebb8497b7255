// End to end: two training steps of tests/fixtures/gpt-tiny.json recorded to a real SQLite file
// with storage::Writer::create, then read back through storage's Recording.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "keel/capture/recorder.h"
#include "keel/log.h"
#include "keel/storage/reader.h"
#include "keel/train.h"

namespace keel::capture {
namespace {

TEST(CaptureEndToEnd, RecordsTwoGptTinyStepsToAFile) {
  auto dir =
      std::filesystem::temp_directory_path() / ("keel_capture_e2e_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "run.db").string();
  GptConfig cfg = loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json");
  auto data = std::make_shared<const data::TextDataset>(
      std::string(200, 'a') + "the quick brown fox jumps over the lazy dog. ", "inline");
  Trainer trainer(cfg, Device("cpu"), 1, data, 2);
  storage::RunInfo run;
  run.backend = "cpu";
  run.device = "cpu";
  run.seed = 1;
  CaptureOptions opt;
  opt.stacks = true;
  opt.md5 = true;
  opt.stats = true;
  opt.allocator = true;
  {
    Recorder rec(path, run, opt);
    VerboseGuard g("blocks.1.attn:backward");
    trainer.run(2);
    rec.finish();
    ASSERT_EQ(rec.status(), RecorderStatus::Finished) << rec.error();
  }
  storage::Recording r = storage::Recording::open(path);
  EXPECT_EQ(r.run().status, "finished");
  EXPECT_EQ(CaptureOptions::fromJson(r.run().captureOptionsJson), opt);
  auto steps = r.steps();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(std::isnan(steps[1].loss));
  EXPECT_GT(r.opCount(), 100);
  auto ops = r.stepOps(2);
  ASSERT_FALSE(ops.empty());
  bool sawBackward = false;
  for (auto& o : ops) {
    sawBackward = sawBackward || o.phase == "backward";
    EXPECT_GE(o.stackId, 1);
  }
  EXPECT_TRUE(sawBackward);
  auto st = r.stack(ops.front().stackId);
  ASSERT_TRUE(st.has_value());
  EXPECT_FALSE(st->frames.empty());
  storage::LogQuery lq;
  lq.step = 2;
  auto logs = r.logs(lq);
  EXPECT_FALSE(logs.empty());
  std::filesystem::remove_all(dir);
}

TEST(CaptureEndToEnd, UnwritablePathIsAStorageError) {
  EXPECT_THROW(Recorder("/nonexistent-dir/x/run.db", storage::RunInfo{}, CaptureOptions{}),
               storage::StorageError);
}

}  // namespace
}  // namespace keel::capture
