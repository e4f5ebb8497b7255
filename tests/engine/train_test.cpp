// Tests for data loading and the training loop: batches are shifted and seed-determined; a short
// run is bit-for-bit reproducible on `cpu` and `cpu-ref` (losses and every parameter byte) for the
// dense, MoE and rotary-position tiny configs; the two backends agree on the first loss; and
// training lowers the loss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "keel/data.h"
#include "keel/train.h"
#include "test_util.h"
#include "train_test_util.h"

namespace keel {
namespace {

using test::bytesOf;
using test::corpus;
using test::kCpu;
using test::kCpuRef;
const std::string kSrc = KEEL_SOURCE_DIR;

GptConfig tiny(const std::string& name) {
  return loadGptConfig(kSrc + "/tests/fixtures/" + name + ".json");
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> params;
};

RunResult runSteps(const GptConfig& cfg, Device d, uint64_t seed, int64_t steps) {
  Trainer tr(cfg, d, seed, corpus(), steps);
  RunResult r;
  for (auto& s : tr.run(steps)) r.losses.push_back(s.loss);
  for (auto& [n, t] : tr.model().namedParameters()) r.params.emplace_back(n, bytesOf(t));
  return r;
}

// ---- data ---------------------------------------------------------------------------------

TEST(DataTest, ByteTokenizerRoundTrips) {
  std::string text = "Keel\n\xff\x00 ok";
  text.push_back('\0');
  auto toks = data::ByteTokenizer::encode(text);
  ASSERT_EQ(toks.size(), text.size());
  EXPECT_EQ(toks[0], 'K');
  EXPECT_EQ(toks[5], 255);
  EXPECT_EQ(data::ByteTokenizer::decode(toks), text);
  EXPECT_THROW(data::ByteTokenizer::decode({65, 256}), Error);
}

TEST(DataTest, DefaultCorpusAndSplits) {
  auto ds = corpus();
  EXPECT_GT(ds->numTokens(), 100000);
  EXPECT_EQ(ds->splitTokens(data::Split::Train) + ds->splitTokens(data::Split::Val),
            ds->numTokens());
  EXPECT_EQ(ds->splitTokens(data::Split::Val), ds->numTokens() / 10);
}

TEST(DataTest, BatchesAreShiftedAndSeedDetermined) {
  data::TextDataset ds(std::string(200, 'a') + "0123456789abcdefghijklmnopqrstuvwxyz", "mem");
  Generator g1(42), g2(42), g3(43);
  auto [x, y] = ds.getBatch(3, 8, g1, data::Split::Train, kCpuRef);
  ASSERT_EQ(x.shape(), (Shape{3, 8}));
  ASSERT_EQ(x.dtype(), DType::Int64);
  auto xv = x.toVector<int64_t>(), yv = y.toVector<int64_t>();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 7; ++t) EXPECT_EQ(yv[size_t(b * 8 + t)], xv[size_t(b * 8 + t + 1)]);
  auto [x2, y2] = ds.getBatch(3, 8, g2, data::Split::Train, kCpu);
  EXPECT_EQ(x2.toVector<int64_t>(), xv);
  EXPECT_EQ(y2.toVector<int64_t>(), yv);
  EXPECT_EQ(g1.offset(), 3u);
  auto [x3, y3] = corpus()->getBatch(4, 16, g3);
  auto [x4, y4] = corpus()->getBatch(4, 16, g3);
  EXPECT_NE(x3.toVector<int64_t>(), x4.toVector<int64_t>()) << "the generator advances";
  // The validation split is the tail: every validation window lies in the last 10%.
  data::TextDataset ds2(std::string(90, 'a') + std::string(10, 'b'), "mem");
  Generator g4(1);
  auto [vx, vy] = ds2.getBatch(4, 5, g4, data::Split::Val);
  for (int64_t v : vx.toVector<int64_t>()) EXPECT_EQ(v, 'b');
  EXPECT_THROW(ds2.getBatch(1, 10, g4, data::Split::Val), Error);  // 10 tokens < 11
}

TEST(DataTest, LoadErrorsNameThePath) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / ("keel_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir / "emptydir");
  std::string missing = (dir / "missing.txt").string();
  try {
    data::TextDataset::load(missing);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  std::string empty = (dir / "empty.txt").string();
  std::ofstream(empty).flush();
  EXPECT_THROW(data::TextDataset::load(empty), Error);
  EXPECT_THROW(data::TextDataset::load((dir / "emptydir").string()), Error);
  std::string ok = (dir / "ok.txt").string();
  std::ofstream(ok) << "hello world";
  EXPECT_EQ(data::TextDataset::load(ok).numTokens(), 11);
}

TEST(DataTest, DirectoryFilesAreDocumentsJoinedBySeparators) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(::testing::TempDir()) / ("keel_docs_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "b.txt") << "bbb";
  std::ofstream(dir / "a.txt") << "aa";
  std::ofstream(dir / "c.txt").flush();  // empty: no document
  std::ofstream(dir / "d.txt") << "dd\x1c"
                               << "eee";  // a separator inside a file opens another document
  data::TextDataset ds = data::TextDataset::load(dir.string());
  EXPECT_EQ(ds.numDocuments(), 4);
  ASSERT_EQ(ds.numTokens(), 2 + 1 + 3 + 1 + 6);
  Generator g(0);
  auto [x, y] = ds.getBatch(1, 11, g);  // the train split (12 tokens) has one window
  EXPECT_EQ(x.toVector<int64_t>(), data::ByteTokenizer::encode("aa\x1c"
                                                               "bbb\x1c"
                                                               "dd\x1c"
                                                               "e"));
  EXPECT_EQ(data::documentLengths(x), (std::vector<std::vector<int64_t>>{{2, 4, 3, 2}}));
  // A single file without separators is one document, taken as is.
  EXPECT_EQ(data::TextDataset::load((dir / "b.txt").string()).numDocuments(), 1);
  // The default corpus: one document per licence file.
  int64_t files = 0, bytes = 0;
  for (auto& e : fs::directory_iterator(data::kDefaultCorpusDir))
    if (!e.is_symlink() && e.is_regular_file() && e.file_size() > 0) {
      ++files;
      bytes += int64_t(e.file_size());
    }
  EXPECT_EQ(corpus()->numDocuments(), files);
  EXPECT_EQ(corpus()->numTokens(), bytes + files - 1);
}

TEST(DataTest, PackedBatchMaskFollowsTheDocumentBoundaries) {
  // Document d is a run of one letter, 1 to 9 long; neighbours (up to 19 apart) differ in letter.
  std::vector<std::string> docs;
  for (int d = 0; d < 60; ++d)
    docs.push_back(std::string(size_t(d * 7 % 9 + 1), char('a' + d % 20)));
  data::TextDataset ds = data::TextDataset::fromDocuments(docs, "mem");
  EXPECT_EQ(ds.numDocuments(), 60);
  const int64_t b = 8, s = 24;
  Generator g(3);
  auto [x, y] = ds.getBatch(b, s, g, data::Split::Train, kCpu);
  flashmask::Mask m = data::documentMask(x, kCpu);
  EXPECT_TRUE(m.causal);
  EXPECT_EQ(m.kind, flashmask::MaskKind::CausalDocument);
  ASSERT_EQ(m.startendRowIndices.shape(), (Shape{b, 1, s, 1}));
  const std::vector<int64_t> xv = x.toVector<int64_t>();
  int64_t boundaries = 0;
  for (int64_t r = 0; r < b; ++r) {
    // The oracle: a token's document is its letter; a separator belongs to the document it opens
    // (the next letter), or is a document of its own at the end of the row.
    std::vector<int64_t> doc(static_cast<size_t>(s));
    for (int64_t t = s - 1; t >= 0; --t) {
      const int64_t tok = xv[size_t(r * s + t)];
      doc[size_t(t)] = tok != data::kDocumentSeparator ? tok : t + 1 < s ? doc[size_t(t + 1)] : -1;
      if (t > 0 && tok == data::kDocumentSeparator) ++boundaries;
    }
    std::vector<uint8_t> vis =
        flashmask::denseVisibility(m.startendRowIndices, true, s, s, -1, r, 0);
    for (int64_t i = 0; i < s; ++i)
      for (int64_t j = 0; j < s; ++j)
        ASSERT_EQ(vis[size_t(i * s + j)], j <= i && doc[size_t(i)] == doc[size_t(j)] ? 1 : 0)
            << "row " << r << ", query " << i << ", key " << j;
  }
  EXPECT_GE(boundaries, 2 * b) << "rows of 24 tokens hold several documents";
}

// ---- training -----------------------------------------------------------------------------

class TrainRepro : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(TrainRepro, ThreeStepsAreBitwiseReproducible) {
  auto [cfgName, backend] = GetParam();
  GptConfig cfg = tiny(cfgName);
  Device d(backend);
  RunResult a = runSteps(cfg, d, 7, 3), b = runSteps(cfg, d, 7, 3);
  ASSERT_EQ(a.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isfinite(a.losses[i]));
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(double)), 0)
        << "step " << i + 1 << ": " << a.losses[i] << " vs " << b.losses[i];
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(a.params[i].second == b.params[i].second) << a.params[i].first << " differs";
  // A different seed gives a different run.
  RunResult c = runSteps(cfg, d, 8, 1);
  EXPECT_NE(c.losses[0], a.losses[0]);
}

INSTANTIATE_TEST_SUITE_P(TinyConfigs, TrainRepro,
                         ::testing::Combine(::testing::Values("gpt-tiny", "moe-tiny",
                                                              "gpt-tiny-rope"),
                                            ::testing::Values("cpu", "cpu-ref")),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

class TrainTiny : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainTiny, BackendsAgreeOnInitAndFirstLoss) {
  GptConfig cfg = tiny(GetParam());
  Trainer onCpu(cfg, kCpu, 3, corpus(), 10), onRef(cfg, kCpuRef, 3, corpus(), 10);
  auto pa = onCpu.model().namedParameters(), pb = onRef.model().namedParameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(bytesOf(pa[i].second) == bytesOf(pb[i].second))
        << pa[i].first << ": counter-based init differs between backends";
  StepStats a = onCpu.step(), b = onRef.step();
  EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::abs(b.loss)) << "cpu " << a.loss << " cpu-ref " << b.loss;
  EXPECT_NEAR(a.loss, std::log(256.0), 0.1) << "an untrained model is near-uniform";
  EXPECT_NEAR(a.gradNorm, b.gradNorm, 1e-3 * b.gradNorm);
}

TEST_P(TrainTiny, LossDecreasesOnCpu) {
  GptConfig cfg = tiny(GetParam());
  const int64_t steps = 30;
  Trainer tr(cfg, kCpu, 1, corpus(), steps);
  auto stats = tr.run(steps);
  double first = stats.front().lmLoss, last5 = 0;
  for (size_t i = stats.size() - 5; i < stats.size(); ++i) last5 += stats[i].lmLoss / 5.0;
  EXPECT_LT(last5, first - 1.0) << "first " << first << ", mean of last 5 " << last5;
  EXPECT_EQ(stats.back().step, steps);
  EXPECT_NEAR(stats.back().lr, cfg.min_lr, 1e-12);
  EXPECT_DOUBLE_EQ(stats.front().lr, cfg.lr / double(cfg.warmup_steps));
  for (auto& s : stats) {
    EXPECT_GT(s.tokensPerSec, 0.0);
    EXPECT_GT(s.gradNorm, 0.0);
    if (cfg.isMoe()) {
      EXPECT_GT(s.auxLoss, 0.5);
    }
  }
  double val = tr.evaluate(2);
  EXPECT_TRUE(std::isfinite(val));
  EXPECT_LT(val, first);
}

INSTANTIATE_TEST_SUITE_P(TinyConfigs, TrainTiny,
                         ::testing::Values("gpt-tiny", "moe-tiny", "gpt-tiny-rope"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Rotary positions (no wpe) learn from the first steps on both backends, the same run on each.
TEST(TrainerTest, RopeLowersTheLossInThreeStepsOnBothBackends) {
  GptConfig cfg = tiny("gpt-tiny-rope");
  ASSERT_EQ(cfg.position, "rope");
  for (Device d : {kCpu, kCpuRef}) {
    SCOPED_TRACE(d.name());
    RunResult a = runSteps(cfg, d, 7, 3), b = runSteps(cfg, d, 7, 3);
    ASSERT_EQ(a.losses.size(), 3u);
    EXPECT_LT(a.losses[2], a.losses[0]) << a.losses[0] << " -> " << a.losses[2];
    EXPECT_EQ(a.losses, b.losses);
    for (auto& [name, bytes] : a.params) EXPECT_NE(name, "wpe.weight");
  }
}

TEST(TrainerTest, DropoutIsSeededAndOffInEval) {
  GptConfig cfg = tiny("gpt-tiny");
  cfg.dropout = 0.2;
  RunResult a = runSteps(cfg, kCpu, 4, 2), b = runSteps(cfg, kCpu, 4, 2);
  EXPECT_EQ(a.losses, b.losses) << "dropout masks come from the run's seed";
  cfg.dropout = 0.0;
  RunResult c = runSteps(cfg, kCpu, 4, 2);
  EXPECT_NE(a.losses[0], c.losses[0]) << "dropout changes the training loss";
  // Evaluation runs in eval mode: no dropout, so the same weights give the same val loss.
  cfg.dropout = 0.2;
  Trainer withDrop(cfg, kCpu, 4, corpus(), 1);
  cfg.dropout = 0.0;
  Trainer noDrop(cfg, kCpu, 4, corpus(), 1);
  EXPECT_EQ(withDrop.evaluate(1), noDrop.evaluate(1));
}

TEST(TrainerTest, PackedDocumentsTrainDeterministicallyOnBothBackends) {
  // Short documents, so that every row is packed with several of them.
  std::vector<std::string> docs;
  for (int d = 0; d < 400; ++d)
    docs.push_back("doc " + std::to_string(d) + ": " +
                   std::string(size_t(d % 11 + 2), char('a' + d % 26)));
  auto packed =
      std::make_shared<const data::TextDataset>(data::TextDataset::fromDocuments(docs, "mem"));
  GptConfig cfg = tiny("gpt-tiny");
  cfg.pack_documents = true;
  cfg.attention_mask = "causal_document";
  for (Device d : {kCpu, kCpuRef}) {
    SCOPED_TRACE(d.name());
    Trainer a(cfg, d, 5, packed, 20), b(cfg, d, 5, packed, 20);
    std::vector<StepStats> sa = a.run(20), sb = b.run(d == kCpu ? 20 : 2);
    for (size_t i = 0; i < sb.size(); ++i) EXPECT_EQ(sa[i].loss, sb[i].loss) << "step " << i + 1;
    EXPECT_LT(sa.back().lmLoss, sa.front().lmLoss - 1.0)
        << "first " << sa.front().lmLoss << ", last " << sa.back().lmLoss;
    EXPECT_TRUE(std::isfinite(a.evaluate(1)));
  }
}

TEST(TrainerTest, EvalEveryReportsTheValidationLossWithoutChangingTraining) {
  GptConfig cfg = tiny("gpt-tiny");
  Trainer plain(cfg, kCpu, 6, corpus(), 4);
  cfg.eval_every = 2;
  cfg.eval_batches = 2;
  Trainer evaluating(cfg, kCpu, 6, corpus(), 4);
  std::vector<StepStats> a = plain.run(4), b = evaluating.run(4);
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(std::memcmp(&a[i].loss, &b[i].loss, sizeof(double)), 0) << "training is the same";
    EXPECT_TRUE(std::isnan(a[i].valLoss));
    // Steps 2 and 4 evaluated: the mean of 2 validation batches of the weights after the step.
    EXPECT_EQ(std::isnan(b[i].valLoss), i % 2 == 0);
  }
  EXPECT_EQ(b[3].valLoss, evaluating.evaluate(2)) << "the same weights, the same batches";
  EXPECT_NE(b[1].valLoss, b[3].valLoss);
  // A validation split too short for a batch is refused up front, naming the field.
  auto small = std::make_shared<const data::TextDataset>(std::string(2000, 'a'), "mem", 0.004);
  try {
    Trainer t(cfg, kCpu, 0, small, 1);
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eval_every"), std::string::npos) << e.what();
  }
}

TEST(TrainerTest, RejectsBadSetups) {
  GptConfig cfg = tiny("gpt-tiny");
  cfg.vocab_size = 100;  // smaller than the byte vocabulary
  EXPECT_THROW(Trainer(cfg, kCpu, 0, corpus(), 1), Error);
  cfg = tiny("gpt-tiny");
  EXPECT_THROW(Trainer(cfg, kCpu, 0, corpus(), 0), Error);
  auto small = std::make_shared<const data::TextDataset>("short text", "mem");
  EXPECT_THROW(Trainer(cfg, kCpu, 0, small, 1), Error);
  cfg.optimizer = "sgd";
  cfg.lr = 0.1;
  cfg.min_lr = 0.01;
  Trainer sgd(cfg, kCpu, 0, corpus(), 2);
  EXPECT_TRUE(std::isfinite(sgd.step().loss));
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

// The shipped configs themselves (not only the tiny fixtures) must learn: a short run of
// gpt-mini and moe-mini on the default corpus lowers the loss well below ln(256).
class TrainShipped : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainShipped, LossDecreasesInSixSteps) {
  GptConfig cfg = loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/configs/" + GetParam() + ".json");
  Trainer tr(cfg, Device("cpu"), 1, corpus(), 200);  // the schedule of a 200-step run
  auto stats = tr.run(6);
  EXPECT_GT(stats.front().lmLoss, 5.4);  // ≈ ln 256 at initialisation
  EXPECT_LT(stats.back().lmLoss, stats.front().lmLoss - 0.5)
      << "first " << stats.front().lmLoss << ", step 6 " << stats.back().lmLoss;
}

INSTANTIATE_TEST_SUITE_P(Configs, TrainShipped, ::testing::Values("gpt-mini", "moe-mini"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace keel
