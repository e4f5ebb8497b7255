// Tests for sharded checkpoints and resharding: a model saved at tp=4 and converted to tp=2 and
// tp=1 holds the unsharded weights and optimizer state bit for bit; uneven sizes and cross-axis
// reshards with a tiny staging buffer; the interval-join planner finds exactly the overlapping
// shards (against a brute-force scan); threads give identical files; a single .safetensors file
// is a checkpoint; loading checks keys, shapes and dtypes; and metadata that disagrees with its
// shards (or is malformed) is a clear keel::Error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "ckpt_test_util.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/train.h"
#include "train_test_util.h"

namespace keel::ckpt {
namespace {

using namespace test;  // the FlexCheckpoint tests' shared helpers (ckpt_test_util.h)
using keel::test::corpus;

const std::string kSrc = KEEL_SOURCE_DIR;

Arr arrOf(const Tensor& t) {
  Tensor c = t.contiguous();
  Arr a;
  a.dtype = t.dtype() == DType::Int64 ? st::DType::I64 : st::DType::F32;
  a.shape = t.shape();
  const auto* p = static_cast<const uint8_t*>(c.data());
  a.bytes.assign(p, p + c.nbytes());
  return a;
}

TEST(ReshardTest, ModelSavedAtTp4ConvertsToTp2AndTp1BitForBit) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 5, corpus(), 10);
  tr.run(2);  // optimizer state exists
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/tp4", 4);
  Checkpoint c4 = Checkpoint::open(dir + "/tp4");
  ASSERT_EQ(c4.metadata().files.size(), 4u);
  // The sharding spec: column-parallel qkv/w1/w3 split rows, row-parallel proj/w2 split columns,
  // norms and embeddings whole.
  const KeyInfo* qkv = c4.metadata().find("blocks.0.attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_EQ(qkv->shards.size(), 4u);
  EXPECT_EQ(qkv->splitAxis, 0);
  EXPECT_EQ(qkv->shards[1].offset, (Dims{24, 0}));
  EXPECT_EQ(qkv->shards[1].shape, (Dims{24, 32}));
  EXPECT_EQ(c4.metadata().find("blocks.1.attn.proj.weight")->splitAxis, 1);
  EXPECT_EQ(c4.metadata().find("blocks.1.mlp.w2.weight::exp_avg")->splitAxis, 1);
  EXPECT_EQ(c4.metadata().find("wte.weight")->shards.size(), 1u);
  EXPECT_EQ(c4.metadata().find("blocks.0.norm1.weight::step")->shards.size(), 1u);
  // Replicated keys are written once and spread: no file holds more than its share plus the
  // largest replicated key.
  std::vector<uint64_t> bytes(4, 0);
  uint64_t total = 0, largest = 0;
  for (const auto& k : c4.metadata().keys)
    for (const auto& s : k.shards) {
      bytes[s.file] += s.end - s.begin;
      total += s.end - s.begin;
      if (k.shards.size() == 1) largest = std::max(largest, s.end - s.begin);
    }
  for (uint64_t b : bytes) EXPECT_LE(b, total / 4 + largest);

  TargetSpec t2;
  t2.tp = 2;
  convert(c4, dir + "/tp2", t2, nullptr);
  TargetSpec t1;
  convert(Checkpoint::open(dir + "/tp2"), dir + "/tp1", t1, nullptr);
  convert(c4, dir + "/tp1direct", t1, nullptr);
  EXPECT_EQ(Checkpoint::open(dir + "/tp2").metadata().files.size(), 2u);
  EXPECT_EQ(
      Checkpoint::open(dir + "/tp2").metadata().find("blocks.0.attn.qkv.weight")->shards.size(),
      2u);
  size_t checked = 0;
  auto& opt = tr.optimizer();
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& p = opt.params()[i];
    std::vector<std::pair<std::string, Arr>> want = {{p.name(), arrOf(p)}};
    for (const auto& [s, t] : opt.paramState(i)) want.push_back({p.name() + "::" + s, arrOf(t)});
    for (const auto& [key, ref] : want)
      for (const char* sub : {"/tp4", "/tp2", "/tp1", "/tp1direct"}) {
        EXPECT_TRUE(sameArr(test::assemble(dir + sub, key), ref)) << key << " in " << sub;
        ++checked;
      }
  }
  EXPECT_EQ(checked, opt.params().size() * 4 * 4);
  EXPECT_EQ(Checkpoint::open(dir + "/tp1").metadata().trainState, c4.metadata().trainState);
}

TEST(ReshardTest, EachSimulatedRankLoadsItsPart) {
  GptConfig cfg = loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json");
  Trainer tr(cfg, Device(Backend::Cpu), 6, corpus(), 10);
  const std::string dir = tempDir();
  saveTrainingCheckpoint(tr, dir + "/tp4", 4);  // no optimizer state yet: parameters only
  Checkpoint c = Checkpoint::open(dir + "/tp4");
  TargetSpec spec;
  spec.tp = 3;  // 96 qkv rows: 32 per rank; proj's 32 columns: 11, 11, 10
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::vector<float>> bufs;
    std::vector<HostTensor> targets;
    std::vector<Arr> want;
    for (const auto& [name, p] : tr.model().namedParameters()) {
      Arr full = arrOf(p);
      Dims shape = p.shape();
      int a = tensorParallelAxis(name, shape);
      if (a >= 0 && shape[size_t(a)] < 3) a = -1;
      Arr part = full;
      if (a >= 0) {
        int64_t o, len;
        splitRange(shape[size_t(a)], 3, rank, o, len);
        part = test::sliceArr(full, size_t(a), o, len);
      }
      bufs.emplace_back(size_t(part.numel()));
      targets.push_back({name, st::DType::F32, part.shape, bufs.back().data()});
      want.push_back(part);
    }
    loadRank(c, nullptr, spec, rank, targets);
    for (size_t i = 0; i < targets.size(); ++i) {
      Arr got = want[i];
      std::memcpy(got.bytes.data(), bufs[i].data(), got.bytes.size());
      EXPECT_TRUE(sameArr(got, want[i])) << targets[i].key << " rank " << rank;
    }
    if (rank == 2) {
      targets[5].shape = {32, 11};  // blocks.0.attn.proj.weight: rank 2 holds 10 columns
      EXPECT_EQ(errorOf([&] { loadRank(c, nullptr, spec, rank, targets); }),
                dir +
                    "/tp4: key 'blocks.0.attn.proj.weight' has shape [32, 32] in the "
                    "checkpoint, rank 2 of tp=3 holds [32, 10] (split along axis 1), but the "
                    "target expects [32, 11]");
    }
  }
}

TEST(ReshardTest, UnevenSizesAcrossAxesWithATinyStagingBuffer) {
  Arr a = randomArr(st::DType::F32, {10, 7}, 1), b = randomArr(st::DType::BF16, {3, 5, 11}, 2),
      s = randomArr(st::DType::I64, {}, 3);
  std::vector<std::pair<std::string, Arr>> named = {{"a", a}, {"b", b}, {"s", s}};
  const std::string dir = tempDir();
  test::saveArrs(dir + "/src", named, 3, 0);  // rows 4, 3, 3
  Checkpoint c = Checkpoint::open(dir + "/src");
  EXPECT_EQ(c.metadata().find("a")->shards[0].shape, (Dims{4, 7}));
  for (int tp : {1, 2, 4, 5}) {
    for (size_t staging : {size_t(8), size_t(64), size_t(1) << 20}) {
      TargetSpec spec;
      spec.tp = tp;
      spec.axis = [](const std::string&, const Dims& sh) { return int(sh.size()) - 1; };
      ConvertOptions opt;
      opt.stagingBytes = staging;
      const std::string dst = dir + "/tp" + std::to_string(tp) + "_" + std::to_string(staging);
      ConvertStats stats = convert(c, dst, spec, nullptr, opt);
      EXPECT_EQ(stats.bytesWritten, uint64_t(10 * 7 * 4 + 3 * 5 * 11 * 2 + 8));
      for (auto& [k, ref] : named)
        EXPECT_TRUE(sameArr(test::assemble(dst, k), ref)) << k << " " << dst;
    }
  }
}

TEST(ReshardTest, ThreadsWriteIdenticalFiles) {
  std::vector<std::pair<std::string, Arr>> named;
  for (int i = 0; i < 12; ++i)
    named.push_back({"blocks." + std::to_string(i) + ".attn.qkv.weight",
                     randomArr(st::DType::F32, {48, 16}, uint64_t(i))});
  const std::string dir = tempDir();
  test::saveArrs(dir + "/src", named, 4);
  Checkpoint c = Checkpoint::open(dir + "/src");
  TargetSpec spec;
  spec.tp = 3;
  // More threads than files (several write one file) and fewer (each drains its file, then
  // helps with another: Note [Threads and files]).
  ConvertOptions one, two, four;
  two.threads = 2;
  four.threads = 4;
  convert(c, dir + "/a", spec, nullptr, one);
  convert(c, dir + "/b", spec, nullptr, four);
  convert(c, dir + "/c", spec, nullptr, two);
  for (int f = 0; f < 3; ++f) {
    const std::string name = "/model-0000" + std::to_string(f) + "-of-00003.safetensors";
    const auto ref = test::readFileBytes(dir + "/a" + name);
    EXPECT_GT(ref.size(), 1000u);
    EXPECT_EQ(ref, test::readFileBytes(dir + "/b" + name));
    EXPECT_EQ(ref, test::readFileBytes(dir + "/c" + name));
  }
  EXPECT_EQ(test::readFileBytes(dir + "/a/" + std::string(kMetadataFile)),
            test::readFileBytes(dir + "/c/" + std::string(kMetadataFile)));
}

// Metadata only: a key of `shape` split into `parts` along `axis` (byte ranges made up).
KeyInfo tiled(const std::string& name, const Dims& shape, int axis, int parts) {
  KeyInfo k;
  k.key = name;
  k.shape = shape;
  k.splitAxis = axis;
  uint64_t at = 0;
  for (int p = 0; p < parts; ++p) {
    ShardInfo s;
    s.offset.assign(shape.size(), 0);
    s.shape = shape;
    splitRange(shape[size_t(axis)], parts, p, s.offset[size_t(axis)], s.shape[size_t(axis)]);
    s.file = uint32_t(p);
    s.begin = at;
    s.end = at + st::byteCount(s.shape, k.dtype, name);
    at = s.end;
    k.shards.push_back(s);
  }
  return k;
}

TEST(ReshardTest, IntervalJoinFindsExactlyTheOverlappingShards) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    Dims shape = {int64_t(rng() % 40 + 1), int64_t(rng() % 40 + 1)};
    int sAxis = int(rng() % 2), tAxis = int(rng() % 2);
    int sParts = int(rng() % std::min<int64_t>(shape[size_t(sAxis)], 9) + 1);
    int tp = int(rng() % 9 + 2);
    Metadata m;
    for (int f = 0; f < sParts; ++f) m.files.push_back(std::string("f").append(std::to_string(f)));
    m.keys.push_back(tiled("k", shape, sAxis, sParts));
    TargetSpec spec;
    spec.tp = tp;
    spec.axis = [tAxis](const std::string&, const Dims&) { return tAxis; };
    Plan plan = makePlan(m, nullptr, spec);
    uint64_t bytes = 0;
    Dims off, sh;
    for (const auto& ts : plan.shards) {
      plan.shardBox(ts, off, sh);
      std::set<uint32_t> got, want;
      for (uint32_t i = 0; i < ts.numItems; ++i) got.insert(plan.items[ts.firstItem + i].shard);
      for (uint32_t s = 0; s < m.keys[0].shards.size(); ++s) {
        const ShardInfo& si = m.keys[0].shards[s];
        bool hit = true;
        for (size_t a = 0; a < 2; ++a)
          hit = hit && si.offset[a] < off[a] + sh[a] && off[a] < si.offset[a] + si.shape[a];
        if (hit) want.insert(s);
      }
      EXPECT_EQ(got, want) << "trial " << trial;
      bytes += ts.bytes;
    }
    EXPECT_EQ(plan.bytesRead, bytes);
    EXPECT_EQ(plan.bytesWritten, uint64_t(shape[0] * shape[1] * 4));
  }
}

TEST(ReshardTest, ASafetensorsFileIsACheckpoint) {
  const std::string dir = tempDir();
  Arr a = randomArr(st::DType::F32, {6, 4}, 1);
  {
    st::Writer w(dir + "/one.safetensors", {{"x.attn.qkv.weight", st::DType::F32, {6, 4}}});
    w.write(0, 0, a.bytes.data(), a.bytes.size());
  }
  Checkpoint c = Checkpoint::open(dir + "/one.safetensors");
  ASSERT_EQ(c.metadata().keys.size(), 1u);
  TargetSpec spec;
  spec.tp = 2;
  convert(c, dir + "/out", spec, nullptr);
  EXPECT_EQ(Checkpoint::open(dir + "/out").metadata().keys[0].shards.size(), 2u);
  EXPECT_TRUE(sameArr(test::assemble(dir + "/out", "x.attn.qkv.weight"), a));
}

// A few keys of several dtypes, saved at tp 2 with their MD5s recorded.
std::string savedWithDigests(const std::string& dir) {
  std::vector<std::pair<std::string, Arr>> arrs = {
      {"a.weight", randomArr(st::DType::F32, {6, 4}, 1)},
      {"b.weight", randomArr(st::DType::BF16, {5, 3}, 2)},
      {"c", randomArr(st::DType::I64, {7}, 3)}};
  std::vector<HostTensor> ts;
  for (auto& [name, a] : arrs) ts.push_back({name, a.dtype, a.shape, a.bytes.data()});
  TargetSpec spec;
  spec.tp = 2;
  ConvertOptions opt;
  opt.fileDigests = true;
  saveTensors(dir, ts, spec, "", opt);
  return dir;
}

// Note [Checkpoint file digests]: a conversion read a source whose file had changed since it was
// saved without a word, and with fileDigests (keel ckpt convert --md5) gave the copy new digests
// that vouched for the damage. It checks the source's digests first, before making anything.
TEST(ReshardTest, ConvertChecksTheSourcesDigestsBeforeWritingAnything) {
  const std::string dir = tempDir();
  savedWithDigests(dir + "/src");
  TargetSpec spec;
  spec.tp = 1;
  const ConvertStats good = convert(Checkpoint::open(dir + "/src"), dir + "/good", spec, nullptr);
  EXPECT_EQ(good.verifiedFiles, 2u);
  const std::string file = dir + "/src/model-00001-of-00002.safetensors";
  std::string bytes = readFileBytes(file);
  bytes[bytes.size() - 3] ^= 0x01;
  writeFile(file, bytes);
  ConvertOptions opt;
  opt.fileDigests = true;
  opt.threads = 2;
  try {
    convert(Checkpoint::open(dir + "/src"), dir + "/out/cv", spec, nullptr, opt);
    FAIL() << "converted a damaged source";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file + ": its MD5 is "), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/out")) << "nothing is made, the folder above DST included";
  // Asked not to check, it converts what is there.
  opt.verifySource = false;
  const ConvertStats unchecked =
      convert(Checkpoint::open(dir + "/src"), dir + "/out/cv", spec, nullptr, opt);
  EXPECT_EQ(unchecked.verifiedFiles, 0u);
}

// Note [Outputs left as found]: a conversion or a saveTensors that stops part way (here through
// ConvertOptions::stop, as keel ckpt convert's Ctrl-C does) removes what it wrote: a folder it
// made goes with the folders above it that it made, a folder that was there empty is emptied.
TEST(ReshardTest, AStoppedWriteLeavesTheFolderAsItFoundIt) {
  const std::string dir = tempDir();
  savedWithDigests(dir + "/src");
  const Checkpoint src = Checkpoint::open(dir + "/src");
  TargetSpec spec;
  spec.tp = 3;
  int shards = 0;
  ConvertOptions opt;
  opt.fileDigests = true;
  opt.progress = [&](uint64_t, uint64_t) { ++shards; };
  opt.stop = [&] { return shards >= 2; };  // after two target shards are written
  EXPECT_THROW(convert(src, dir + "/new/deeper/cv", spec, nullptr, opt), Error);
  EXPECT_EQ(shards, 2);
  EXPECT_FALSE(fs::exists(dir + "/new"));
  fs::create_directories(dir + "/empty");
  shards = 0;
  EXPECT_THROW(convert(src, dir + "/empty", spec, nullptr, opt), Error);
  EXPECT_TRUE(fs::is_directory(dir + "/empty"));
  EXPECT_TRUE(fs::is_empty(dir + "/empty"));
  // The same through saveTensors; and the folder takes the write again once it is not stopped.
  std::vector<float> w(24, 1.0f), b(6, 2.0f);
  std::vector<HostTensor> ts = {{"w.weight", st::DType::F32, {6, 4}, w.data()},
                                {"b", st::DType::F32, {6}, b.data()}};
  shards = 0;
  EXPECT_THROW(saveTensors(dir + "/empty", ts, spec, "{\"step\": 1}", opt), Error);
  EXPECT_TRUE(fs::is_empty(dir + "/empty"));
  EXPECT_THROW(saveTensors(dir + "/made/st", ts, spec, "", opt), Error);
  EXPECT_FALSE(fs::exists(dir + "/made"));
  opt.stop = nullptr;
  saveTensors(dir + "/empty", ts, spec, "{\"step\": 1}", opt);
  EXPECT_EQ(Checkpoint::open(dir + "/empty").metadata().trainState, "{\"step\":1}");
}

// saveTensors checked trainStateJson only after writing the shards (a raw JSON library message,
// and a folder left with a shard and keel-checkpoint.json.tmp), and a repeated key or one named
// __metadata__ left an empty folder that a retry then refused. Each is named before anything is
// made.
TEST(ReshardTest, SaveTensorsChecksItsArgumentsFirst) {
  const std::string dir = tempDir();
  std::vector<float> a(12, 1.0f), b(12, 2.0f);
  const std::vector<HostTensor> one = {{"a", st::DType::F32, {3, 4}, a.data()}};
  auto refused = [&](const std::string& sub, const std::vector<HostTensor>& ts,
                     const std::string& state, const std::string& want) {
    SCOPED_TRACE(sub);
    try {
      saveTensors(dir + "/" + sub, ts, {}, state);
      ADD_FAILURE() << "saved";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), want);
    }
    EXPECT_FALSE(fs::exists(dir + "/" + sub));
  };
  refused("s5", one, "{not json",
          "saveTensors: trainStateJson is not valid JSON (line 1, column 3: syntax error while "
          "parsing object key - invalid literal; last read: '{no'; expected string literal)");
  refused("s5b", one, "[1, 2]", "saveTensors: trainStateJson must be a JSON object, got array");
  refused("s2", {one[0], {"a", st::DType::F32, {3, 4}, b.data()}}, "",
          "saveTensors: tensors: the key 'a' is given twice");
  refused("s7", {one[0], {"__metadata__", st::DType::F32, {3, 4}, b.data()}}, "",
          "saveTensors: tensors: the key '__metadata__' is reserved (safetensors keeps its "
          "metadata under that name)");
  // A folder that holds something is refused and kept as it is.
  fs::create_directories(dir + "/precious");
  writeFile(dir + "/precious/notes.txt", "keep");
  EXPECT_THROW(saveTensors(dir + "/precious", one, {}), Error);
  EXPECT_EQ(readFileBytes(dir + "/precious/notes.txt"), "keep");
  saveTensors(dir + "/s5", one, {}, "{\"note\": \"fine\"}");
  EXPECT_TRUE(fs::exists(dir + "/s5/keel-checkpoint.json"));
}

// A plain file that is not a safetensors file (notes.txt) said "safetensors header length
// 752779967576960878 exceeds the file"; it is named as a file, not a checkpoint, as --resume
// names it. A damaged file called .safetensors still gets the safetensors reader's reason.
TEST(ReshardTest, APlainFileIsNotACheckpoint) {
  const std::string dir = tempDir();
  writeFile(dir + "/notes", "notadir\n");
  try {
    Checkpoint::open(dir + "/notes");
    FAIL() << "opened";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir +
                  "/notes is a file, not a checkpoint (a step-* folder, a --ckpt-dir holding "
                  "them, or a .safetensors file)");
  }
  writeFile(dir + "/x.safetensors", "notadir\n");
  try {
    Checkpoint::open(dir + "/x.safetensors");
    FAIL() << "opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the file"), std::string::npos) << e.what();
  }
  // A safetensors file by another name is still one.
  savedWithDigests(dir + "/ck");
  fs::copy_file(dir + "/ck/model-00000-of-00002.safetensors", dir + "/weights.bin");
  EXPECT_EQ(Checkpoint::open(dir + "/weights.bin").metadata().files.size(), 1u);
  try {
    resolveCheckpoint(dir + "/notes");
    FAIL() << "resolved";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              dir +
                  "/notes is a file, not a checkpoint (a step-* folder, or a --ckpt-dir "
                  "holding them)");
  }
}

TEST(ReshardTest, LoadChecksKeysShapesAndCastsFloats) {
  const std::string dir = tempDir();
  Arr a = randomArr(st::DType::BF16, {4, 4}, 1), b = randomArr(st::DType::F32, {3}, 2);
  std::vector<std::pair<std::string, Arr>> named = {{"a", a}, {"b", b}};
  test::saveArrs(dir + "/c", named, 2, 0);
  Checkpoint c = Checkpoint::open(dir + "/c");
  std::vector<float> fa(16), fb(3);
  std::vector<HostTensor> t = {{"a", st::DType::F32, {4, 4}, fa.data()},
                               {"b", st::DType::F32, {3}, fb.data()}};
  loadTensors(c, nullptr, t);
  Arr got;
  got.dtype = st::DType::F32;
  got.shape = {4, 4};
  got.bytes.assign(reinterpret_cast<uint8_t*>(fa.data()),
                   reinterpret_cast<uint8_t*>(fa.data()) + 64);
  EXPECT_TRUE(sameArr(got, test::castArr(a, st::DType::F32)));
  std::vector<HostTensor> wrongShape = {{"a", st::DType::F32, {2, 8}, fa.data()},
                                        {"b", st::DType::F32, {3}, fb.data()}};
  EXPECT_EQ(errorOf([&] { loadTensors(c, nullptr, wrongShape); }),
            dir + "/c: key 'a' has shape [4, 4] in the checkpoint but the target expects [2, 8]");
  std::vector<HostTensor> missing = {{"a", st::DType::F32, {4, 4}, fa.data()},
                                     {"b", st::DType::F32, {3}, fb.data()},
                                     {"zz", st::DType::F32, {1}, fb.data()}};
  // "(after the rules)" only where there are rules (a resume without any said it).
  EXPECT_EQ(errorOf([&] { loadTensors(c, nullptr, missing); }),
            dir + "/c: the checkpoint has no key 'zz'");
  const aoa::Program rename = aoa::parse("a -> a\nb -> b\n", "r.aoa");
  EXPECT_EQ(errorOf([&] { loadTensors(c, &rename, missing); }),
            dir + "/c: the checkpoint has no key 'zz' (after the rules)");
  std::vector<HostTensor> partial = {{"a", st::DType::F32, {4, 4}, fa.data()}};
  // Without rules (a resume) the hint names where rules are given.
  EXPECT_EQ(errorOf([&] { loadTensors(c, nullptr, partial); }),
            dir +
                "/c: checkpoint key 'b' matches nothing in the target (drop it with 'key -> _': "
                "keel ckpt convert --aoa RULES writes a checkpoint without it)");
  aoa::Program keepA = aoa::parse("a -> a\n", "r.aoa");
  EXPECT_EQ(errorOf([&] { loadTensors(c, &keepA, partial); }),
            dir + "/c: checkpoint key 'b' matches nothing in the target (drop it with 'key -> _')");
  aoa::Program drop = aoa::parse("b -> _\n", "r.aoa");
  EXPECT_NO_THROW(loadTensors(c, &drop, partial));
  std::vector<HostTensor> intoInt = {{"a", st::DType::I64, {4, 4}, fa.data()},
                                     {"b", st::DType::F32, {3}, fb.data()}};
  EXPECT_EQ(errorOf([&] { loadTensors(c, nullptr, intoInt); }),
            dir + "/c: key 'a' is BF16 in the checkpoint but the target is I64");
}

// ---- hostile metadata --------------------------------------------------------------------------

class HostileMetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = tempDir();
    Arr a = randomArr(st::DType::F32, {4, 6}, 1);
    std::vector<std::pair<std::string, Arr>> named = {{"a", a}};
    test::saveArrs(dir, named, 2, 0);
    meta = nlohmann::json::parse(test::readFileBytes(dir + "/" + kMetadataFile));
  }
  std::string openWith(const nlohmann::json& j) {
    test::writeFile(dir + "/" + kMetadataFile, j.dump());
    return errorOf([&] { Checkpoint::open(dir); });
  }
  std::string dir;
  nlohmann::json meta;
};

TEST_F(HostileMetadataTest, DisagreesWithTheShards) {
  auto j = meta;
  j["keys"]["a"]["dtype"] = "BF16";
  // The dtype the count comes from is named (a dtype changed to BF16 read as a shape error).
  EXPECT_NE(openWith(j).find(" of BF16 (24 bytes) but byte_range holds 48 bytes"),
            std::string::npos)
      << openWith(j);
  j = meta;
  j["keys"]["a"]["dtype"] = "I32";
  EXPECT_NE(openWith(j).find("metadata says I32, model-00000-of-00002.safetensors says F32"),
            std::string::npos)
      << openWith(j);
  j = meta;
  j["keys"]["a"]["shards"][0]["byte_range"][0] =
      j["keys"]["a"]["shards"][0]["byte_range"][0].get<uint64_t>() + 4;
  j["keys"]["a"]["shards"][0]["byte_range"][1] =
      j["keys"]["a"]["shards"][0]["byte_range"][1].get<uint64_t>() + 4;
  EXPECT_NE(openWith(j).find("but model-00000-of-00002.safetensors stores it at"),
            std::string::npos)
      << openWith(j);
  j = meta;
  j["keys"]["b"] = j["keys"]["a"];
  EXPECT_NE(openWith(j).find("holds no tensor 'b'"), std::string::npos) << openWith(j);
}

TEST_F(HostileMetadataTest, BadTilingsAndFields) {
  auto j = meta;
  j["keys"]["a"]["shards"][1]["offset"] = {1, 0};
  EXPECT_NE(openWith(j).find("overlap"), std::string::npos) << openWith(j);
  j = meta;
  j["keys"]["a"]["shards"].erase(1);
  EXPECT_NE(openWith(j).find("do not cover the global shape [4, 6] (missing shards)"),
            std::string::npos)
      << openWith(j);
  j = meta;
  j["keys"]["a"]["shards"][1]["offset"] = {3, 0};
  EXPECT_NE(openWith(j).find("leaves the global shape"), std::string::npos) << openWith(j);
  j = meta;
  j["keys"]["a"]["shards"][1]["file"] = 7;
  EXPECT_NE(openWith(j).find("shard file index 7 but there are 2 files"), std::string::npos);
  j = meta;
  j["files"][0] = "../../etc/passwd";
  EXPECT_NE(openWith(j).find("must be a plain name"), std::string::npos);
  j = meta;
  j["format"] = "other";
  EXPECT_NE(openWith(j).find("not a Keel checkpoint"), std::string::npos);
  j = meta;
  j["keys"]["a"]["shape"] = {4, -6};
  EXPECT_NE(openWith(j).find("must be non-negative"), std::string::npos);
  test::writeFile(dir + "/" + kMetadataFile, "{ not json");
  EXPECT_NE(errorOf([&] { Checkpoint::open(dir); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(errorOf([&] { Checkpoint::open(dir + "/nope"); }).find("no such checkpoint"),
            std::string::npos);
}

// Keys keep the order the metadata file names them in (the JSON reader's map would sort them;
// ordered_json read them in quadratic time: Note [Linear headers]), through a write and a read,
// and a key named twice is refused instead of the last one silently kept.
TEST(MetadataTest, KeysKeepTheFileOrderAndAreNamedOnce) {
  auto key = [](const std::string& name) {
    return "\"" + name +
           R"(":{"dtype":"F32","shape":[0],"shards":[{"file":0,"offset":[0],"shape":[0],)"
           R"("byte_range":[8,8]}]})";
  };
  const std::string head = R"({"format":"keel-flexcheckpoint","version":1,"files":["f"],"keys":{)";
  Metadata m = metadataFromJson(head + key("z") + "," + key("b") + "," + key("y") + "}}", "m");
  std::vector<std::string> names;
  for (const auto& k : m.keys) names.push_back(k.key);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "b", "y"}));
  names.clear();
  for (const auto& k : metadataFromJson(metadataToJson(m), "m2").keys) names.push_back(k.key);
  EXPECT_EQ(names, (std::vector<std::string>{"z", "b", "y"}));
  EXPECT_EQ(errorOf([&] {
              metadataFromJson(head + key("z") + "," + key("b") + "," + key("z") + "}}", "m");
            }),
            "m: key 'z' is named twice");
}

TEST_F(HostileMetadataTest, ATruncatedShardFile) {
  const std::string f = dir + "/model-00001-of-00002.safetensors";
  std::string bytes = test::readFileBytes(f);
  test::writeFile(f, bytes.substr(0, bytes.size() - 5));
  // A copy cut short is said to be one, with what the header needs.
  const std::string e = errorOf([&] { Checkpoint::open(dir); });
  EXPECT_NE(e.find("outside the data buffer"), std::string::npos) << e;
  EXPECT_NE(e.find(" bytes: the file is truncated (its tensors need "), std::string::npos) << e;
  EXPECT_NE(e.find(" bytes of data; an incomplete copy?) or its header damaged"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace keel::ckpt
