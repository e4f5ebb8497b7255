// Tests for training checkpoints: a run saved at step k (tp=4, tp=3, or resharded to tp=2
// afterwards) and resumed in a fresh Trainer with another seed gives the same losses and final
// weights as the uninterrupted run, bit for bit (AdamW and SGD, dense with dropout and MoE);
// a gpt-mini checkpoint split into separate q, k, v, fused by fused_qkv, split back and
// re-concatenated loads and gives the same loss; and the `keel train --save-every/--resume` and
// `keel ckpt` commands work, with one-line errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "ckpt/ckpt_internal.h"
#include "ckpt_test_util.h"
#include "keel/base/text.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/train.h"
#include "test_util.h"
#include "train_test_util.h"

namespace keel::ckpt {
namespace {

using keel::test::bytesOf;
using keel::test::corpus;
using test::tempDir;

const std::string kSrc = KEEL_SOURCE_DIR;

struct RunOut {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;
};

RunOut finish(Trainer& tr, int64_t steps) {
  RunOut r;
  for (auto& s : tr.run(steps)) r.losses.push_back(s.loss);
  for (const auto& p : tr.model().parameters()) r.params.push_back(bytesOf(p));
  return r;
}

struct ResumeCase {
  const char* config;
  const char* optimizer;
  double dropout;
};

class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeTest, SameLossCurveBitForBit) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/" + GetParam().config + ".json");
  cfg.optimizer = GetParam().optimizer;
  cfg.dropout = GetParam().dropout;
  const int64_t total = 8, at = 3;
  Trainer whole(cfg, Device(Backend::Cpu), 11, corpus(), total);
  RunOut ref = finish(whole, total);
  const double refVal = whole.evaluate(2);

  Trainer first(cfg, Device(Backend::Cpu), 11, corpus(), total);
  first.run(at);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(first, dir + "/" + stepDirName(at), 4);
  saveTrainingCheckpoint(first, dir + "/tp3", 3);
  TargetSpec t2;
  t2.tp = 2;
  convert(Checkpoint::open(dir + "/" + stepDirName(at)), dir + "/tp2", t2, nullptr);

  for (const std::string sub : {"", "/tp3", "/tp2"}) {
    // A different seed: everything the run depends on must come from the checkpoint.
    Trainer resumed(cfg, Device(Backend::Cpu), 999, corpus(), total);
    const std::string used = loadTrainingCheckpoint(resumed, dir + sub);
    if (sub.empty()) {
      EXPECT_EQ(used, dir + "/" + stepDirName(at)) << "latest step-* directory";
    }
    EXPECT_EQ(resumed.stepsDone(), at);
    EXPECT_EQ(resumed.seed(), 11u);
    RunOut got = finish(resumed, total - at);
    ASSERT_EQ(got.losses.size(), size_t(total - at));
    for (size_t i = 0; i < got.losses.size(); ++i)
      EXPECT_EQ(got.losses[i], ref.losses[size_t(at) + i]) << "step " << at + int64_t(i) + 1 << sub;
    EXPECT_EQ(got.params, ref.params) << sub;
    EXPECT_EQ(resumed.evaluate(2), refVal) << sub;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ResumeTest,
                         ::testing::Values(ResumeCase{"gpt-tiny", "adamw", 0.1},
                                           ResumeCase{"gpt-tiny", "sgd", 0.0},
                                           ResumeCase{"moe-tiny", "adamw", 0.0}),
                         [](const auto& info) {
                           return std::string(info.param.config).substr(0, 3) + "_" +
                                  info.param.optimizer;
                         });

TEST(TrainCheckpointTest, ErrorsOnMismatchedRuns) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 1, corpus(), 4);
  tr.run(1);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/c", 2);
  GptConfig wider = cfg;
  wider.d_model = 64;
  Trainer other(wider, Device(Backend::Cpu), 1, corpus(), 4);
  try {
    loadTrainingCheckpoint(other, dir + "/c");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), dir +
                                         "/c: key 'wte.weight' has shape [256, 32] in the "
                                         "checkpoint but the target expects [256, 64]");
  }
  GptConfig sgd = cfg;
  sgd.optimizer = "sgd";
  Trainer withSgd(sgd, Device(Backend::Cpu), 1, corpus(), 4);
  EXPECT_THROW(loadTrainingCheckpoint(withSgd, dir + "/c"), Error);
  EXPECT_THROW(loadTrainingCheckpoint(tr, dir + "/none"), Error);
  EXPECT_THROW(resolveCheckpoint(dir), Error);  // no step-* here
}

// The rules of the q/k/v round trip, written under dir: split gpt's fused qkv weight into q, k
// and v (separate), fuse those per head (fuse), and split that back and concatenate (back).
struct QkvRules {
  aoa::Program separate, fuse, back;
};
QkvRules qkvRules(const GptConfig& cfg, const std::string& dir) {
  const std::string h = std::to_string(cfg.n_head);
  auto rules = [&](const std::string& text, const std::string& name) {
    test::writeFile(dir + "/" + name, text);
    return aoa::parseFile(dir + "/" + name);
  };
  return {rules("blocks.$LAYER_ID.attn.qkv.weight -> blocks.$LAYER_ID.attn.q.weight, "
                "blocks.$LAYER_ID.attn.k.weight, blocks.$LAYER_ID.attn.v.weight, axis=0\n",
                "separate.aoa"),
          rules("blocks.$LAYER_ID.attn.q.weight, blocks.$LAYER_ID.attn.k.weight, "
                "blocks.$LAYER_ID.attn.v.weight -> blocks.$LAYER_ID.attn.wqkv, fused_qkv, "
                "num_heads=" +
                    h + "\n",
                "fuse.aoa"),
          rules("blocks.$LAYER_ID.attn.wqkv -> q.$LAYER_ID, k.$LAYER_ID, v.$LAYER_ID, fused_qkv, "
                "num_heads=" +
                    h +
                    "\nq.$LAYER_ID, k.$LAYER_ID, v.$LAYER_ID -> "
                    "blocks.$LAYER_ID.attn.qkv.weight, axis=0\n",
                "back.aoa")};
}

// Note: gpt-mini keeps q, k and v fused in one [3·d, d] weight, q rows first. The rules below
// split it into separate q, k, v (checkpoint A), fuse those with fused_qkv (per head: q, k, v
// rows; checkpoint B), split B back and concatenate q, k, v again (checkpoint C).
TEST(TrainCheckpointTest, SeparateQkvToFusedQkvAndBackGivesTheSameLoss) {
  GptConfig cfg = loadGptConfig(kSrc + "/configs/gpt-mini.json");
  Trainer tr(cfg, Device(Backend::Cpu), 3, corpus(), 20);
  tr.run(2);
  const double loss = tr.evaluate(2);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/orig", 2);
  auto [separate, fuse, back] = qkvRules(cfg, dir);
  TargetSpec spec;
  spec.tp = 4;
  convert(Checkpoint::open(dir + "/orig"), dir + "/A", spec, &separate);
  spec.tp = 1;
  convert(Checkpoint::open(dir + "/A"), dir + "/B", spec, &fuse);
  spec.tp = 2;
  convert(Checkpoint::open(dir + "/B"), dir + "/C", spec, &back);

  const Checkpoint a = Checkpoint::open(dir + "/A");
  EXPECT_NE(a.metadata().find("blocks.3.attn.k.weight"), nullptr);
  EXPECT_NE(a.metadata().find("blocks.3.attn.k.weight::exp_avg_sq"), nullptr);
  EXPECT_EQ(a.metadata().find("blocks.3.attn.qkv.weight"), nullptr);
  EXPECT_EQ(a.metadata().find("blocks.0.attn.q.weight")->shards.size(), 4u) << "column-parallel";
  // B's fused rows differ from the original [q; k; v] layout: row hd is k's first row.
  test::Arr orig = test::assemble(dir + "/orig", "blocks.0.attn.qkv.weight");
  test::Arr fused = test::assemble(dir + "/B", "blocks.0.attn.wqkv");
  const size_t row = size_t(cfg.d_model) * 4, hd = size_t(cfg.headDim());
  EXPECT_EQ(0, std::memcmp(fused.bytes.data() + hd * row,
                           orig.bytes.data() + size_t(cfg.d_model) * row, row));
  EXPECT_NE(fused.bytes, orig.bytes);
  EXPECT_TRUE(test::sameArr(test::assemble(dir + "/C", "blocks.0.attn.qkv.weight"), orig));

  Trainer loaded(cfg, Device(Backend::Cpu), 77, corpus(), 20);
  loadTrainingCheckpoint(loaded, dir + "/C");
  EXPECT_EQ(loaded.evaluate(2), loss);
  EXPECT_EQ(loaded.step().loss, tr.step().loss);
}

// Note [Key order]: keys made by rules took the end of the key order, each followed by its own
// state, so a round trip through rules (separate q/k/v, fuse them per head, and back) held the
// same tensors in other bytes. A produced key takes its sources' place: the round trip writes the
// plain conversion's bytes.
TEST(TrainCheckpointTest, ARoundTripThroughRulesWritesThePlainConversionsBytes) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 3, corpus(), 4);
  tr.run(1);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/orig", 3);
  auto [separate, fuse, back] = qkvRules(cfg, dir);
  TargetSpec spec;
  spec.tp = 2;
  convert(Checkpoint::open(dir + "/orig"), dir + "/sep", spec, &separate);
  spec.tp = 3;
  convert(Checkpoint::open(dir + "/sep"), dir + "/fused", spec, &fuse);
  spec.tp = 1;
  convert(Checkpoint::open(dir + "/fused"), dir + "/back", spec, &back);
  convert(Checkpoint::open(dir + "/orig"), dir + "/plain", spec, nullptr);
  const std::string file = "/model-00000-of-00001.safetensors";
  EXPECT_TRUE(test::readFileBytes(dir + "/back" + file) ==
              test::readFileBytes(dir + "/plain" + file))
      << "the files' bytes differ";
  EXPECT_EQ(test::readFileBytes(dir + "/back/keel-checkpoint.json"),
            test::readFileBytes(dir + "/plain/keel-checkpoint.json"));
  // The separated keys sit where qkv sat, each followed by nothing else's state: parameters in
  // model order, then each parameter's state.
  std::vector<std::string> keys;
  const Checkpoint sep = Checkpoint::open(dir + "/sep");
  for (const KeyInfo& k : sep.metadata().keys) keys.push_back(k.key);
  const auto at = [&](const std::string& k) {
    return std::find(keys.begin(), keys.end(), k) - keys.begin();
  };
  EXPECT_EQ(at("blocks.0.attn.q.weight") + 1, at("blocks.0.attn.k.weight"));
  EXPECT_LT(at("blocks.0.attn.v.weight"), at("blocks.0.attn.proj.weight"));
  EXPECT_LT(at("lm_head.weight"), at("wte.weight::exp_avg"));
  EXPECT_EQ(at("blocks.0.attn.q.weight::exp_avg") + 2, at("blocks.0.attn.q.weight::step"));
  EXPECT_EQ(at("blocks.0.attn.q.weight::step") + 1, at("blocks.0.attn.k.weight::exp_avg"));
  EXPECT_LT(at("blocks.0.attn.v.weight::step"), at("blocks.0.attn.proj.weight::exp_avg"));
}

// train_state's step was trusted: a checkpoint whose step was edited (or put together from two)
// resumed at step 2 with AdamW counters at 5 (the wrong learning rate, no word). It must agree
// with the optimizer's step counters.
TEST(TrainCheckpointTest, AStepThatDisagreesWithTheStepCountersIsRefused) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 1, corpus(), 6);
  tr.run(3);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/c", 2);
  const std::string meta = dir + "/c/keel-checkpoint.json";
  const std::string good = test::readFileBytes(meta);
  for (int64_t step : {2, 4, 0}) {
    SCOPED_TRACE(step);
    nlohmann::json j = nlohmann::json::parse(good);
    j["train_state"]["step"] = step;
    test::writeFile(meta, j.dump());
    Trainer other(cfg, Device(Backend::Cpu), 1, corpus(), 6);
    try {
      loadTrainingCheckpoint(other, dir + "/c");
      ADD_FAILURE() << "resumed";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                dir + "/c: train_state says step " + std::to_string(step) +
                    " but the optimizer's step counters say 3 ('wte.weight::step'): the "
                    "metadata and the tensors disagree (edited, or put together from two "
                    "checkpoints); refusing to resume");
    }
  }
  test::writeFile(meta, good);
  Trainer other(cfg, Device(Backend::Cpu), 1, corpus(), 6);
  loadTrainingCheckpoint(other, dir + "/c");
  EXPECT_EQ(other.stepsDone(), 3);
}

// Note [Resumed settings]: a checkpoint resumed with another config of the same shapes trained
// another curve without a word. What differs is named (the config's name, and each setting that
// changes training with both values), and the resume goes on.
TEST(TrainCheckpointTest, ResumingWithOtherSettingsNamesThem) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 1, corpus(), 4);
  tr.run(1);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/c", 1);
  const std::string tail = ": the resumed run trains with this run's settings, not the saved run's";
  std::string warning = "unset";
  {
    Trainer same(cfg, Device(Backend::Cpu), 1, corpus(), 4);
    loadTrainingCheckpoint(same, dir + "/c", nullptr, &warning);
    EXPECT_EQ(warning, "");
  }
  GptConfig other = cfg;
  other.dropout = 0.25;
  other.lr = 0.02;
  other.eval_every = 3;  // validation settings do not change training: not named
  {
    Trainer t(other, Device(Backend::Cpu), 1, corpus(), 4);
    loadTrainingCheckpoint(t, dir + "/c", nullptr, &warning);
    EXPECT_EQ(warning, dir +
                           "/c was saved by a run of config 'gpt-tiny' with other settings; "
                           "saved vs this run: dropout 0.0 vs 0.25, lr 0.01 vs 0.02" +
                           tail);
    EXPECT_EQ(t.stepsDone(), 1);
  }
  other.name = "gpt-other";
  {
    Trainer t(other, Device(Backend::Cpu), 1, corpus(), 4);
    loadTrainingCheckpoint(t, dir + "/c", nullptr, &warning);
    EXPECT_EQ(warning, dir +
                           "/c was saved by a run of config 'gpt-tiny', and this run's config "
                           "is 'gpt-other'; saved vs this run: dropout 0.0 vs 0.25, lr 0.01 "
                           "vs 0.02" +
                           tail);
  }
  // A checkpoint that records only the config's name (saved before the settings were).
  const std::string meta = dir + "/c/keel-checkpoint.json";
  nlohmann::json j = nlohmann::json::parse(test::readFileBytes(meta));
  j["train_state"].erase("config");
  test::writeFile(meta, j.dump());
  {
    Trainer t(other, Device(Backend::Cpu), 1, corpus(), 4);
    loadTrainingCheckpoint(t, dir + "/c", nullptr, &warning);
    EXPECT_EQ(warning, dir +
                           "/c was saved by a run of config 'gpt-tiny', and this run's config is "
                           "'gpt-other'" +
                           tail);
  }
}

// Note [A save replaces nothing]: a save removed whatever step-N and step-N.tmp it found, so a
// second run saving into one folder replaced the first run's checkpoints and removed its save in
// progress. Both are refused now, and left as they were.
TEST(TrainCheckpointTest, ASaveReplacesNoFolderItDidNotWrite) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 1, corpus(), 4);
  tr.run(1);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/step-000001", 1);
  const std::string meta = keel::readFile(dir + "/step-000001/keel-checkpoint.json");
  try {
    saveTrainingCheckpoint(tr, dir + "/step-000001", 2);
    ADD_FAILURE() << "replaced an existing checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir +
                  "/step-000001 already exists, and this run did not write it (another run "
                  "saving into the same folder?); refusing to replace it");
  }
  EXPECT_EQ(keel::readFile(dir + "/step-000001/keel-checkpoint.json"), meta);
  // Another writer's save in progress (or one cut short) is not removed.
  std::filesystem::create_directories(dir + "/step-000002.tmp");
  test::writeFile(dir + "/step-000002.tmp/part", "theirs");
  try {
    saveTrainingCheckpoint(tr, dir + "/step-000002", 1);
    ADD_FAILURE() << "saved over another writer's step-000002.tmp";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/step-000002.tmp exists: another process is "
                                               "saving this checkpoint"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(keel::readFile(dir + "/step-000002.tmp/part"), "theirs");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-000002"));
}

// Note [Resumed architecture]: n_head (or position, norm) changes what the saved weights mean
// with the same shapes; the resume went ahead with a "settings" warning. Refused in one line.
TEST(TrainCheckpointTest, ResumingWithAnotherArchitectureIsRefused) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 1, corpus(), 4);
  tr.run(1);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/c", 1);
  GptConfig heads = cfg;
  heads.n_head = cfg.n_head * 2;
  Trainer t(heads, Device(Backend::Cpu), 1, corpus(), 4);
  try {
    std::string warning;
    loadTrainingCheckpoint(t, dir + "/c", nullptr, &warning);
    ADD_FAILURE() << "resumed with another n_head; warning: " << warning;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir + "/c was saved by a model of another architecture (saved vs this run: n_head " +
                  std::to_string(cfg.n_head) + " vs " + std::to_string(heads.n_head) +
                  "): its weights mean something else in this model; resume with the config it "
                  "was saved with");
  }
  EXPECT_EQ(t.stepsDone(), 0);
}

// ---- the command-line tool --------------------------------------------------------------------

#ifdef KEEL_CLI_PATH
using keel::test::expectOneLineError;
using keel::test::runKeelCli;

std::vector<std::string> stepLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream is(out);
  for (std::string l; std::getline(is, l);)
    if (l.rfind("step ", 0) == 0) lines.push_back(l.substr(0, l.find("  lr")));
  return lines;
}

TEST(CkptCliTest, TrainSaveEveryAndResume) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --seed 4 --eval-batches 0 ";
  auto whole = runKeelCli(base + "--steps 6", dir);
  ASSERT_EQ(whole.status, 0) << whole.err;
  auto part =
      runKeelCli(base + "--steps 6 --save-every 2 --ckpt-dir " + dir + "/ck --ckpt-tp 4", dir);
  ASSERT_EQ(part.status, 0) << part.err;
  EXPECT_NE(part.out.find("saved " + dir + "/ck/step-000004 (tp=4)"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir + "/ck/step-000006/keel-checkpoint.json"));
  auto resumed = runKeelCli(base + "--steps 6 --resume " + dir + "/ck/step-000004 --seed 123", dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + dir + "/ck/step-000004 at step 4 (seed 4)"),
            std::string::npos)
      << resumed.out;
  auto a = stepLines(whole.out), b = stepLines(resumed.out);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], a[4]);
  EXPECT_EQ(b[1], a[5]);

  auto inspect = runKeelCli("ckpt inspect " + dir + "/ck/step-000002", dir);
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("4 files"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("blocks.0.attn.qkv.weight"), std::string::npos);
  EXPECT_NE(inspect.out.find("4 shards along axis 0"), std::string::npos);

  test::writeFile(dir + "/r.aoa", "blocks.$LAYER_ID.attn.qkv.weight^T -> t.$LAYER_ID\n");
  auto plan =
      runKeelCli("ckpt plan " + dir + "/ck/step-000002 --target-tp 2 --aoa " + dir + "/r.aoa", dir);
  ASSERT_EQ(plan.status, 0) << plan.err;
  EXPECT_NE(plan.out.find("-> 92 target keys in 2 files (tp=2)"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("permute [1,0]"), std::string::npos);
  EXPECT_NE(plan.out.find("bytes moved:"), std::string::npos);

  auto conv = runKeelCli(
      "ckpt convert " + dir + "/ck/step-000002 " + dir + "/tp1 --target-tp 1 --threads 2", dir);
  ASSERT_EQ(conv.status, 0) << conv.err;
  EXPECT_NE(conv.out.find("(tp=1)"), std::string::npos) << conv.out;
  auto again = runKeelCli(base + "--steps 6 --resume " + dir + "/tp1", dir);
  ASSERT_EQ(again.status, 0) << again.err;
  auto c = stepLines(again.out);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[3], a[5]);
}

// A --ckpt-dir holding another run's checkpoints is refused before the first step, its files
// kept: a second run silently replaced step-000002, and --resume DIR then continued the other
// run. Continuing the run from its own folder writes there as before.
TEST(CkptCliTest, AnotherRunsCheckpointFolderIsRefusedAndKept) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  ASSERT_EQ(runKeelCli(base + "--steps 2 --save-every 2 --ckpt-dir " + dir + "/ck", dir).status, 0);
  const std::string shard = dir + "/ck/step-000002/model-00000-of-00001.safetensors";
  const std::string before = keel::readFile(shard);
  expectOneLineError(
      runKeelCli(base + "--steps 2 --seed 5 --save-every 2 --ckpt-dir " + dir + "/ck", dir),
      "--ckpt-dir " + dir +
          "/ck already holds another run's checkpoints (step-000002); choose "
          "an empty folder, or continue that run with --resume " +
          dir + "/ck");
  EXPECT_EQ(keel::readFile(shard), before);
  // A save cut short (killed mid-write) leaves a .tmp folder: not a checkpoint, nor a later one.
  std::filesystem::create_directories(dir + "/ck/step-000003.tmp");
  const auto resumed = runKeelCli(
      base + "--steps 4 --save-every 2 --ckpt-dir " + dir + "/ck --resume " + dir + "/ck", dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/ck/step-000004"));
  EXPECT_EQ(keel::readFile(shard), before);
  // A retry from an earlier step of the same folder would replace the later ones: refused.
  const std::string step4 = keel::readFile(dir + "/ck/step-000004/keel-checkpoint.json");
  expectOneLineError(
      runKeelCli(base + "--steps 4 --seed 5 --save-every 2 --ckpt-dir " + dir + "/ck --resume " +
                     dir + "/ck/step-000002",
                 dir),
      "--ckpt-dir " + dir +
          "/ck holds step-000004, after the step-000002 this run resumes from: saving there "
          "would replace it; choose another --ckpt-dir");
  EXPECT_EQ(keel::readFile(dir + "/ck/step-000004/keel-checkpoint.json"), step4);
  // Checked before the first step, not at the first save: a folder under a file, --ckpt-tp alone.
  expectOneLineError(runKeelCli(base + "--steps 2 --ckpt-dir " + shard + "/x", dir),
                     "--ckpt-dir " + shard + "/x: " + shard + " is not a directory");
  expectOneLineError(runKeelCli(base + "--steps 2 --ckpt-tp 2", dir), "--ckpt-tp needs --ckpt-dir");
}

// Note [Checkpoint file digests]: one changed byte in a tensor's data (still a valid float) was
// resumed silently and trained into NaN. Each file's MD5 is in the metadata (the digest md5sum
// prints); resume, inspect and convert name the changed file, and a checkpoint without digests
// (saved before them) is read as before.
TEST(CkptCliTest, AChangedByteInACheckpointFileIsNamedNotTrainedOn) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  ASSERT_EQ(runKeelCli(base + "--steps 2 --ckpt-dir " + dir + "/ck", dir).status, 0);
  const std::string step = dir + "/ck/step-000002";
  const std::string file = step + "/model-00000-of-00001.safetensors";
  const auto meta = nlohmann::json::parse(keel::readFile(step + "/keel-checkpoint.json"));
  ASSERT_EQ(meta.at("file_md5").size(), 1u);
  EXPECT_EQ(meta.at("file_md5")[0].get<std::string>(), keel::ckpt::detail::fileMd5(file));
  const std::string good = keel::readFile(file);
  std::string bad = good;
  bad[bad.size() - 100] ^= 0x01;  // a low mantissa bit of a float near the end
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << bad;
  }
  const std::string named = file + ": its MD5 is ";
  expectOneLineError(runKeelCli(base + "--steps 4 --resume " + dir + "/ck", dir), named);
  expectOneLineError(runKeelCli("ckpt inspect --verify " + dir + "/ck", dir), named);
  expectOneLineError(
      runKeelCli("ckpt convert --verify " + dir + "/ck " + dir + "/cv --target-tp 2", dir), named);
  EXPECT_FALSE(std::filesystem::exists(dir + "/cv"));
  // Converting checks the source's MD5s unasked (a conversion passed the damage on, and --md5
  // then recorded new digests that vouched for it): one line, nothing written.
  expectOneLineError(
      runKeelCli("ckpt convert --md5 " + dir + "/ck " + dir + "/out/cv --target-tp 1", dir), named);
  EXPECT_FALSE(std::filesystem::exists(dir + "/out"));
  const auto unverified = runKeelCli("ckpt inspect " + dir + "/ck", dir);
  ASSERT_EQ(unverified.status, 0) << unverified.err;
  EXPECT_NE(unverified.out.find("files: (MD5s recorded: --verify checks them)"), std::string::npos)
      << unverified.out;
  // Restored, it resumes; without digests in the metadata (an older checkpoint) too.
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << good;
  }
  ASSERT_EQ(runKeelCli(base + "--steps 3 --resume " + dir + "/ck", dir).status, 0);
  const auto verifiedOut = runKeelCli("ckpt inspect --verify " + dir + "/ck", dir);
  EXPECT_NE(verifiedOut.out.find("files: (each file's MD5 verified against the metadata)"),
            std::string::npos)
      << verifiedOut.out << verifiedOut.err;
  // A conversion records its files' MD5s when asked (--md5), and its output then resumes checked.
  ASSERT_EQ(
      runKeelCli("ckpt convert --md5 " + dir + "/ck " + dir + "/cv2 --target-tp 2", dir).status, 0);
  const auto converted = nlohmann::json::parse(keel::readFile(dir + "/cv2/keel-checkpoint.json"));
  ASSERT_EQ(converted.at("file_md5").size(), 2u);
  EXPECT_EQ(
      converted.at("file_md5")[1].get<std::string>(),
      keel::ckpt::detail::fileMd5(dir + "/cv2/" + converted.at("files")[1].get<std::string>()));
  auto old = meta;
  old.erase("file_md5");
  {
    std::ofstream out(step + "/keel-checkpoint.json", std::ios::trunc);
    out << old.dump(1);
  }
  const auto inspect = runKeelCli("ckpt inspect " + dir + "/ck", dir);
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("files: (no MD5s recorded)"), std::string::npos) << inspect.out;
  EXPECT_EQ(inspect.err, "");
  // --verify of it checked nothing and said nothing of it: it warns.
  const auto nothing = runKeelCli("ckpt inspect --verify " + dir + "/ck", dir);
  ASSERT_EQ(nothing.status, 0) << nothing.err;
  EXPECT_NE(nothing.err.find("keel: warning: --verify: "), std::string::npos) << nothing.err;
  EXPECT_NE(nothing.err.find(" records no MD5s (a conversion without --md5): nothing was checked"),
            std::string::npos)
      << nothing.err;
  ASSERT_EQ(runKeelCli(base + "--steps 3 --resume " + dir + "/ck", dir).status, 0);
}

// A converted checkpoint whose rules dropped or renamed part of a parameter's optimizer state:
// without 'w::step' or 'w::exp_avg' the run trained on from fresh state (another loss curve, no
// word), without 'w::exp_avg_sq' it failed inside the update ("input 3 is undefined"), a renamed
// state said "parameter 0". Each is refused before the first step, naming the key.
TEST(CkptCliTest, PartOfAParametersOptimizerStateIsRefused) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  ASSERT_EQ(runKeelCli(base + "--steps 2 --ckpt-dir " + dir + "/ck", dir).status, 0);
  int n = 0;
  for (const auto& [rule, error] : std::vector<std::pair<std::string, std::string>>{
           {"wte.weight::step -> _", "lacks 'wte.weight::step'"},
           {"wte.weight::exp_avg -> _", "lacks 'wte.weight::exp_avg'"},
           {"wte.weight::exp_avg_sq -> _", "lacks 'wte.weight::exp_avg_sq'"},
           {"wte.weight::exp_avg -> wte.weight::momentum",
            "'wte.weight::momentum' is not a state of adamw (its states: exp_avg, exp_avg_sq, "
            "step)"}}) {
    SCOPED_TRACE(rule);
    const std::string out = dir + "/c" + std::to_string(++n);
    test::writeFile(dir + "/s.aoa", rule + "\n");
    ASSERT_EQ(
        runKeelCli("ckpt convert " + dir + "/ck " + out + " --target-tp 1 --aoa " + dir + "/s.aoa",
                   dir)
            .status,
        0);
    const auto r = runKeelCli(base + "--steps 4 --resume " + out, dir);
    expectOneLineError(r, out + ": ");
    EXPECT_NE(r.err.find(error), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step 3/"), std::string::npos) << r.out;
  }
}

// keel ckpt plan's "read" is the bytes the targets need; convert read more (nearby pieces are
// read in one go, gaps included) and printed that figure alone: both are printed now.
TEST(CkptCliTest, ConvertSaysWhatItReadBeyondThePlan) {
  const std::string dir = tempDir();
  ASSERT_EQ(runKeelCli("train --config tests/fixtures/gpt-tiny.json --eval-batches 0 --steps 1 "
                       "--ckpt-tp 3 --ckpt-dir " +
                           dir + "/ck",
                       dir)
                .status,
            0);
  const auto plan = runKeelCli("ckpt plan " + dir + "/ck --target-tp 2", dir);
  ASSERT_EQ(plan.status, 0) << plan.err;
  const size_t at = plan.out.find(" read (");
  ASSERT_NE(at, std::string::npos) << plan.out;
  const std::string needed = plan.out.substr(at + 7, plan.out.find(')', at) - at - 7);
  const auto conv = runKeelCli("ckpt convert " + dir + "/ck " + dir + "/out --target-tp 2", dir);
  ASSERT_EQ(conv.status, 0) << conv.err;
  EXPECT_NE(
      conv.out.find(" read (" + needed + " of it the targets', the rest gaps read in one go)"),
      std::string::npos)
      << conv.out << plan.out;
}

// One file of a checkpoint of several read alone has its parts' shapes: inspect and convert say
// so (it was quiet); the file of a one-file checkpoint is the whole and gets no word.
TEST(CkptCliTest, OneFileOfACheckpointOfSeveralSaysSo) {
  const std::string dir = tempDir();
  const std::string base =
      "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 --steps 1 ";
  ASSERT_EQ(runKeelCli(base + "--ckpt-dir " + dir + "/ck --ckpt-tp 2", dir).status, 0);
  ASSERT_EQ(runKeelCli(base + "--ckpt-dir " + dir + "/one", dir).status, 0);
  const std::string part = dir + "/ck/step-000001/model-00001-of-00002.safetensors";
  for (const std::string& cmd :
       {"ckpt inspect " + part, "ckpt convert " + part + " " + dir + "/out --target-tp 1"}) {
    const auto r = runKeelCli(cmd, dir);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "keel: warning: " + part + " is one of the 2 files of the checkpoint " + dir +
                         "/ck/step-000001: read alone, its tensors are that file's parts; give "
                         "the folder for the whole\n");
  }
  const auto whole =
      runKeelCli("ckpt inspect " + dir + "/one/step-000001/model-00000-of-00001.safetensors", dir);
  EXPECT_EQ(whole.status, 0) << whole.err;
  EXPECT_EQ(whole.err, "");
}

// A train_state field that is there but holds the wrong thing is named with what it holds (a
// step of "4" or 1e30 said "needs step, seed, ..."; a step of -3 "Trainer: cannot resume at step
// -3", naming no checkpoint).
TEST(CkptCliTest, ABadTrainStateFieldIsNamed) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  ASSERT_EQ(runKeelCli(base + "--steps 1 --ckpt-dir " + dir + "/ck", dir).status, 0);
  const std::string meta = dir + "/ck/step-000001/keel-checkpoint.json";
  const std::string good = keel::readFile(meta);
  for (const auto& [field, value, error] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"step", "4", "train_state.step must be a whole number ≥ 0, got \"4\""},
           {"step", 1e30, "train_state.step must be a whole number ≥ 0, got 1e+30"},
           {"step", -3, "train_state.step must be a whole number ≥ 0, got -3"},
           {"seed", -1, "train_state.seed must be a whole number in [0, 2^64-1], got -1"},
           {"seed", nullptr, "train_state.seed must be a whole number in [0, 2^64-1], got null"}}) {
    SCOPED_TRACE(field + " = " + value.dump());
    nlohmann::json j = nlohmann::json::parse(good);
    j["train_state"][field] = value;
    test::writeFile(meta, j.dump());
    expectOneLineError(runKeelCli(base + "--steps 3 --resume " + dir + "/ck", dir),
                       dir + "/ck/step-000001: " + error);
  }
  nlohmann::json j = nlohmann::json::parse(good);
  j["train_state"].erase("seed");
  test::writeFile(meta, j.dump());
  expectOneLineError(runKeelCli(base + "--steps 3 --resume " + dir + "/ck", dir),
                     "train_state needs step, seed, batch_generator and dropout_generator (it "
                     "lacks seed)");
}

// Note [Interrupts]: Ctrl-C or SIGTERM during keel ckpt convert left a half-written DST (no
// metadata), said nothing, and the rerun was refused ("exists and is not empty"). It stops
// between shards, removes what it wrote (a DST that was there empty is emptied), says so in one
// line and exits 128 + signal. The source: 1 GiB of sparse zeros in row-parallel keys (split
// along axis 1: copied through memory), so the conversion is still running when the test sees
// DST's files and sends the signal.
TEST(CkptCliTest, AnInterruptedConversionLeavesDstAsItWas) {
  const std::string dir = tempDir();
  const std::string src = dir + "/big.safetensors";
  {
    std::vector<st::WriteEntry> entries;
    for (int l = 0; l < 16; ++l)
      entries.push_back(
          {"blocks." + std::to_string(l) + ".mlp.w2.weight", st::DType::F32, {2048, 8192}});
    st::Writer w(src, entries, {});
    w.close();  // never written: a sparse file of zeros
  }
  std::filesystem::create_directories(dir + "/was-empty");
  for (const auto& [sig, dst, existed] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"INT", dir + "/new", false}, {"TERM", dir + "/was-empty", true}}) {
    SCOPED_TRACE(sig);
    const std::string out = dir + "/out.txt", err = dir + "/err.txt", rc = dir + "/rc.txt";
    const std::string script = dir + "/int.sh";
    std::ofstream(script) << "KEEL_BLAS_TUNE=0 '" << KEEL_CLI_PATH << "' ckpt convert '" << src
                          << "' '" << dst << "' --target-tp 2 --threads 1 >'" << out << "' 2>'"
                          << err << "' & pid=$!\n"
                          << "for i in $(seq 3000); do compgen -G '" << dst
                          << "/*.safetensors' >/dev/null && break; sleep 0.01; done\n"
                          << "kill -" << sig << " $pid; wait $pid; echo $? >'" << rc << "'\n";
    ASSERT_EQ(std::system(("bash '" + script + "'").c_str()), 0);
    EXPECT_EQ(keel::readFile(rc), sig == "INT" ? "130\n" : "143\n") << keel::readFile(err);
    EXPECT_EQ(keel::readFile(err), "keel: ckpt convert interrupted (SIG" + sig + "): " + src +
                                       " was not converted; " + dst + " is left as it was\n");
    EXPECT_EQ(keel::readFile(out), "");
    EXPECT_EQ(std::filesystem::exists(dst), existed);
    if (existed) {
      EXPECT_TRUE(std::filesystem::is_empty(dst));
    }
  }
  std::filesystem::remove(src);
}

// A plain file is not a checkpoint: keel ckpt said "safetensors header length ... exceeds the
// file" of notes, where keel train --resume said what it is. Both say it in the same words.
TEST(CkptCliTest, APlainFileIsNamedAsOne) {
  const std::string dir = tempDir();
  test::writeFile(dir + "/notes", "notadir\n");
  const std::string said = dir + "/notes is a file, not a checkpoint (a step-* folder, ";
  for (const std::string& cmd :
       {"ckpt inspect " + dir + "/notes", "ckpt plan " + dir + "/notes --target-tp 2",
        "ckpt convert " + dir + "/notes " + dir + "/x --target-tp 2"})
    expectOneLineError(runKeelCli(cmd, dir),
                       said + "a --ckpt-dir holding them, or a .safetensors file)");
  expectOneLineError(
      runKeelCli("train --config tests/fixtures/gpt-tiny.json --steps 2 --resume " + dir + "/notes",
                 dir),
      said + "or a --ckpt-dir holding them)");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
}

// Note [Resumed settings]: --resume with another config of the same shapes gives one warning
// naming what differs, and trains on.
TEST(CkptCliTest, ResumingWithAnotherConfigWarnsInOneLine) {
  const std::string dir = tempDir();
  const std::string base = "train --eval-batches 0 --steps 2 ";
  ASSERT_EQ(runKeelCli(base + "--config tests/fixtures/gpt-tiny.json --save-every 1 --ckpt-dir " +
                           dir + "/ck",
                       dir)
                .status,
            0);
  nlohmann::json cfg =
      nlohmann::json::parse(keel::readFile(kSrc + "/tests/fixtures/gpt-tiny.json"));
  cfg["name"] = "gpt-tiny-b";
  cfg["batch_size"] = 2;
  test::writeFile(dir + "/b.json", cfg.dump());
  const auto r =
      runKeelCli(base + "--config " + dir + "/b.json --resume " + dir + "/ck/step-000001", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "keel: warning: " + dir +
                       "/ck/step-000001 was saved by a run of config 'gpt-tiny', and this run's "
                       "config is 'gpt-tiny-b'; saved vs this run: batch_size 4 vs 2: the resumed "
                       "run trains with this run's settings, not the saved run's\n");
  EXPECT_NE(r.out.find("resumed from " + dir + "/ck/step-000001 at step 1"), std::string::npos)
      << r.out;
  // Another n_head is another architecture (Note [Resumed architecture]): refused, exit 2.
  cfg["n_head"] = cfg["n_head"].get<int>() * 2;
  test::writeFile(dir + "/h.json", cfg.dump());
  expectOneLineError(
      runKeelCli(base + "--config " + dir + "/h.json --resume " + dir + "/ck/step-000001", dir),
      "was saved by a model of another architecture (saved vs this run: n_head 2 vs 4)");
}

// Runs `script` (bash, in the source folder) and returns its exit status.
int runScript(const std::string& dir, const std::string& script) {
  const std::string path = dir + "/cli_script.sh";
  test::writeFile(path, "cd '" + kSrc + "'\nexport KEEL_BLAS_TUNE=0\n" + script + "\n");
  const int raw = std::system(("bash '" + path + "'").c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// The step-* entries of a --ckpt-dir, and whether each is a finished checkpoint.
std::vector<std::string> stepEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string() +
                    (std::filesystem::exists(e.path() / kMetadataFile) ? "" : " (unfinished)"));
  std::sort(names.begin(), names.end());
  return names;
}

// Note [One run per --ckpt-dir]: two runs given one --ckpt-dir both saved into it, each replacing
// the other's step-N. The second is refused before its first step in one line naming the first
// run's pid, and the first run's checkpoints are untouched.
TEST(CkptCliTest, ASecondRunIntoTheSameCkptDirIsRefused) {
  const std::string dir = tempDir();
  const std::string keel = "'" + std::string(KEEL_CLI_PATH) + "'";
  const std::string train = keel +
                            " train --config tests/fixtures/gpt-tiny.json --eval-batches 0 "
                            "--threads 1 --ckpt-dir '" +
                            dir + "/ck' ";
  // The first run is held still (SIGSTOP) once it has saved twice, holding its lock while the
  // second tries: a gpt-tiny step and its save take about 3 ms, and a run left going wrote 32 GB
  // of checkpoints when a test binary was killed mid-way. A guard kills it after 60 s in any
  // case.
  const int status = runScript(
      dir, train + "--steps 1000000 --save-every 1 >'" + dir + "/first.txt' 2>&1 & pid=$!\n" +
               "( sleep 60; kill -9 $pid ) >/dev/null 2>&1 & guard=$!\n" +
               "for i in $(seq 600); do grep -q '^saved .*step-000002' '" + dir +
               "/first.txt' && break; sleep 0.1; done\nkill -STOP $pid\n" + train +
               "--steps 2 --seed 5 >'" + dir + "/second.txt' 2>'" + dir + "/second.err'; rc=$?\n" +
               "echo $pid >'" + dir +
               "/pid'; kill -INT $pid; kill -CONT $pid; wait $pid; kill $guard 2>/dev/null; "
               "exit $rc");
  EXPECT_EQ(status, 2);
  const std::string pid = keel::readFile(dir + "/pid");
  EXPECT_EQ(keel::readFile(dir + "/second.err"),
            "keel: error: --ckpt-dir " + dir + "/ck is being written by another process (pid " +
                pid.substr(0, pid.find('\n')) + "); refusing to write it at the same time\n");
  EXPECT_EQ(keel::readFile(dir + "/second.txt"), "");  // not one step
  // Every checkpoint is the first run's (seed 0), none unfinished, and the lock is gone.
  for (const auto& [step, name] : stepCheckpoints(dir + "/ck")) {
    const auto meta =
        nlohmann::json::parse(keel::readFile(dir + "/ck/" + name + "/" + kMetadataFile));
    EXPECT_EQ(meta["train_state"]["seed"], 0) << name;
  }
  for (const std::string& e : stepEntries(dir + "/ck"))
    EXPECT_EQ(e.find("unfinished"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ck/.keel.lock"));
  // A save cut short (its process killed) leaves step-N.tmp; the next run into the folder,
  // holding the lock, removes it.
  std::filesystem::create_directories(dir + "/ck/step-999999.tmp/x");
  const int64_t last = stepCheckpoints(dir + "/ck").back().first;
  const auto resumed = runKeelCli(
      "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 "
      "--steps " +
          std::to_string(last + 1) + " --ckpt-dir " + dir + "/ck --resume " + dir + "/ck",
      dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ck/step-999999.tmp"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/ck/" + stepDirName(last + 1) + "/" + kMetadataFile));
}

// Note [Interrupts]: Ctrl-C or SIGTERM killed keel train by the signal, without a word, leaving a
// step-N.tmp. It stops between two steps now, in one line naming the latest checkpoint, with exit
// 128 + signal, and every checkpoint it wrote is complete.
TEST(CkptCliTest, AnInterruptedTrainStopsBetweenStepsKeepingItsCheckpoints) {
  const std::string dir = tempDir();
  const std::string keel = "'" + std::string(KEEL_CLI_PATH) + "'";
  for (const char* sig : {"INT", "TERM"}) {
    const std::string ck = dir + "/ck" + sig, out = dir + "/out" + sig, err = dir + "/err" + sig;
    // Held still (SIGSTOP) while the signal is sent, so it saves no more than a few steps past
    // the third (a run left going fills the disk: see ASecondRunIntoTheSameCkptDirIsRefused).
    const int status = runScript(
        dir, keel +
                 " train --config tests/fixtures/gpt-tiny.json --eval-batches 0 --threads 1 "
                 "--steps 1000000 --save-every 1 --ckpt-dir '" +
                 ck + "' >'" + out + "' 2>'" + err + "' & pid=$!\n" +
                 "for i in $(seq 600); do grep -q '^saved .*step-000003' '" + out +
                 "' && break; sleep 0.1; done\nkill -STOP $pid; kill -" + sig +
                 " $pid; kill -CONT $pid\n( sleep 60; kill -9 $pid ) >/dev/null 2>&1 & guard=$!\n"
                 "wait $pid; rc=$?; kill $guard 2>/dev/null; exit $rc");
    EXPECT_EQ(status, std::string(sig) == "INT" ? 130 : 143) << keel::readFile(err);
    const auto steps = stepCheckpoints(ck);
    ASSERT_FALSE(steps.empty());
    const std::string latest = ck + "/" + steps.back().second;
    EXPECT_EQ(keel::readFile(err), "keel: train interrupted (SIG" + std::string(sig) +
                                       ") after step " + std::to_string(steps.back().first) +
                                       " of 1000000; the latest checkpoint is " + latest + "\n");
    for (const std::string& e : stepEntries(ck))
      EXPECT_EQ(e.find("unfinished"), std::string::npos) << e;  // no step-N.tmp
    EXPECT_EQ(runKeelCli("ckpt inspect --verify " + latest, dir).status, 0);
  }
  // Without --ckpt-dir: the same line, saying nothing was saved.
  const int status = runScript(
      dir, keel +
               " train --config tests/fixtures/gpt-tiny.json --eval-batches 0 --threads 1 "
               "--steps 1000000 >'" +
               dir + "/plain.txt' 2>'" + dir + "/plain.err' & pid=$!\n" +
               "for i in $(seq 600); do grep -q '^step *3/' '" + dir +
               "/plain.txt' && break; sleep 0.1; done\nkill -INT $pid; wait $pid");
  EXPECT_EQ(status, 130);
  const std::string said = keel::readFile(dir + "/plain.err");
  EXPECT_EQ(said.rfind("keel: train interrupted (SIGINT) after step ", 0), 0u) << said;
  EXPECT_NE(said.find(" of 1000000; nothing was saved (no --ckpt-dir)\n"), std::string::npos)
      << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1);
}

// A --ckpt-dir that cannot be made (/proc takes no new folder; every check of its path passed)
// trained every step and failed at the first save. It is made before the first step now; a run
// refused later (here: a --resume that does not exist) leaves no folder it made.
TEST(CkptCliTest, ACkptDirThatCannotBeMadeIsRefusedBeforeTheFirstStep) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  const auto r = runKeelCli(base + "--steps 2 --ckpt-dir /proc/keel-no-such-folder", dir);
  expectOneLineError(r, "--ckpt-dir /proc/keel-no-such-folder: cannot create the folder");
  EXPECT_EQ(r.out.find("step "), std::string::npos) << r.out;
  expectOneLineError(
      runKeelCli(base + "--steps 2 --ckpt-dir " + dir + "/new/ck --resume " + dir + "/none", dir),
      "no such checkpoint directory");
  EXPECT_FALSE(std::filesystem::exists(dir + "/new"));
}

// A newer step-N without keel-checkpoint.json (an interrupted copy) was passed over silently for
// an older step; --resume DIR and keel ckpt inspect DIR name it.
TEST(CkptCliTest, ANewerStepWithoutMetadataIsNamed) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  ASSERT_EQ(runKeelCli(base + "--steps 2 --save-every 2 --ckpt-dir " + dir + "/ck", dir).status, 0);
  std::filesystem::create_directories(dir + "/ck/step-000004");
  std::filesystem::copy(dir + "/ck/step-000002/model-00000-of-00001.safetensors",
                        dir + "/ck/step-000004/");
  const std::string warning =
      "keel: warning: " + dir + "/ck/step-000004 has no " + kMetadataFile + " (incomplete?); ";
  const auto resumed = runKeelCli(base + "--steps 3 --resume " + dir + "/ck", dir);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(resumed.err, warning + "resuming from step-000002\n");
  const auto inspect = runKeelCli("ckpt inspect " + dir + "/ck", dir);
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_EQ(inspect.err, warning + "reading step-000002\n");
}

// keel ckpt inspect DIR/keel-checkpoint.json warned that it was "one of the N files" and then
// failed; a FIFO or a device was "no such checkpoint". Each is one line saying what it is.
TEST(CkptCliTest, TheMetadataFileOrAFifoIsNamedAsSuch) {
  const std::string dir = tempDir();
  ASSERT_EQ(runKeelCli("train --config tests/fixtures/gpt-tiny.json --eval-batches 0 --steps 1 "
                       "--ckpt-dir " +
                           dir + "/ck --ckpt-tp 2",
                       dir)
                .status,
            0);
  const std::string step = dir + "/ck/step-000001";
  const auto meta = runKeelCli("ckpt inspect " + step + "/" + kMetadataFile, dir);
  expectOneLineError(meta, step + "/" + kMetadataFile + " is the metadata of the checkpoint " +
                               step + ": give the folder (" + step + ")");
  EXPECT_EQ(meta.err.find("warning"), std::string::npos) << meta.err;
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  for (const std::string& cmd :
       {"ckpt inspect " + dir + "/fifo", "ckpt plan " + dir + "/fifo --target-tp 2",
        "train --config tests/fixtures/gpt-tiny.json --resume " + dir + "/fifo"})
    expectOneLineError(runKeelCli(cmd, dir), dir + "/fifo is a FIFO, not a regular file");
  expectOneLineError(runKeelCli("ckpt inspect /dev/null", dir),
                     "/dev/null is a character device, not a regular file");
}

// --ckpt-tp's help said "default: the run's --tp", where it is 1 and a multi-rank run refuses it.
TEST(CkptCliTest, CkptTpHelpSaysWhatItDoes) {
  const auto help = runKeelCli("train --help", tempDir());
  ASSERT_EQ(help.status, 0);
  EXPECT_EQ(help.out.find("the run's --tp"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("(default 1; a"), std::string::npos) << help.out;
}

TEST(CkptCliTest, OneLineErrors) {
  const std::string dir = tempDir();
  const std::string base = "train --config tests/fixtures/gpt-tiny.json --eval-batches 0 ";
  expectOneLineError(runKeelCli(base + "--steps 2 --save-every 1", dir),
                     "--save-every needs --ckpt-dir");
  expectOneLineError(runKeelCli(base + "--steps 2 --resume " + dir + "/none", dir),
                     "no such checkpoint directory");
  ASSERT_EQ(runKeelCli(base + "--steps 2 --ckpt-dir " + dir + "/ck", dir).status, 0);
  expectOneLineError(runKeelCli(base + "--steps 2 --resume " + dir + "/ck", dir),
                     "is at step 2, not before --steps 2: nothing left to train");
  // A converted checkpoint inside the source's folder sat among the run's own steps.
  expectOneLineError(
      runKeelCli("ckpt convert " + dir + "/ck " + dir + "/ck/step-000002/tp2 --target-tp 2", dir),
      "DST " + dir + "/ck/step-000002/tp2 is inside the source checkpoint's directory " + dir +
          "/ck; refusing to write among the inputs");
  EXPECT_FALSE(std::filesystem::exists(dir + "/ck/step-000002/tp2"));
  // Another model's checkpoint names both configs, not an AOA rule keel train cannot take.
  ASSERT_EQ(runKeelCli("train --config configs/gpt-mini.json --steps 1 --eval-batches 0 "
                       "--ckpt-dir " +
                           dir + "/mini",
                       dir)
                .status,
            0);
  expectOneLineError(runKeelCli(base + "--steps 2 --resume " + dir + "/mini", dir),
                     dir +
                         "/mini/step-000001: saved by a run of config 'gpt-mini', and this "
                         "run's config is 'gpt-tiny': the models differ (the checkpoint's "
                         "'blocks.2.attn.proj.weight' is not in this model); resume with the "
                         "config the checkpoint was saved with");
  expectOneLineError(runKeelCli("ckpt inspect " + dir + "/nothing", dir), "no such checkpoint");
  // A DST that is a link to nothing (it said "cannot create (File exists)").
  std::filesystem::create_symlink(dir + "/nowhere", dir + "/dangling");
  expectOneLineError(
      runKeelCli("ckpt convert " + dir + "/ck " + dir + "/dangling --target-tp 1", dir),
      dir + "/dangling: a symbolic link to " + dir + "/nowhere, which does not exist");
  EXPECT_FALSE(std::filesystem::exists(dir + "/nowhere"));
  expectOneLineError(
      runKeelCli("ckpt convert " + dir + "/ck/step-000002 " + dir + "/ck --target-tp 1", dir),
      "is not empty (refusing to overwrite)");
  test::writeFile(dir + "/bad.aoa", "wte.weight -> x\nnorm_f.weight -> x\n");
  expectOneLineError(
      runKeelCli("ckpt plan " + dir + "/ck --target-tp 2 --aoa " + dir + "/bad.aoa", dir),
      dir + "/bad.aoa:2:18: rule produces 'x', which already exists");
  test::writeFile(dir + "/junk.safetensors", std::string("\xff\xff\xff\xff\0\0\0\0{}", 10));
  expectOneLineError(runKeelCli("ckpt inspect " + dir + "/junk.safetensors", dir),
                     "exceeds the file");
  expectOneLineError(runKeelCli("ckpt plan " + dir + "/ck --target-tp 0", dir), "--target-tp");
  expectOneLineError(runKeelCli("ckpt", dir), "");
}
#endif

}  // namespace
}  // namespace keel::ckpt
