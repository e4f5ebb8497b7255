// Capture tests: tensor hashes against hand-built byte strings (docs/capture.md), statistics,
// options JSON, recorded graph edges against the engine's real dataflow, the verbose guard,
// back-pressure and writer failures — all through an in-memory fake storage::Writer.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "keel/capture/alloc_trace_io.h"
#include "keel/capture/hash.h"
#include "keel/capture/md5_multi.h"
#include "keel/capture/options.h"
#include "keel/capture/recorder.h"
#include "keel/dispatch.h"
#include "keel/log.h"
#include "keel/ops.h"
#include "keel/registry.h"
#include "keel/storage/reader.h"
#include "keel/storage/writer.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel::capture {
namespace {

using storage::Role;

std::string md5Hex(const std::string& bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), out, &len, EVP_md5(), nullptr);
  return toHex(out, len);
}
void le64(std::string& s, int64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
}
template <typename T>
void raw(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}

// ---- in-memory writer ----
struct Store {
  std::mutex mu;
  std::vector<storage::OpRecord> ops;
  std::vector<storage::StepRecord> steps;
  std::vector<storage::StackRecord> stacks;
  std::vector<storage::LogRecord> logs;
  std::vector<storage::MemRecord> mems;
  std::vector<storage::DumpRecord> dumps;
  std::map<std::string, int64_t> dropped;
  std::string status;
  int commits = 0;
  bool closed = false;
};

class FakeWriter : public storage::Writer {
 public:
  explicit FakeWriter(std::shared_ptr<Store> s, int opDelayUs = 0, int failAfterOps = -1)
      : s_(std::move(s)), delayUs_(opDelayUs), failAfter_(failAfterOps) {}
  void writeStep(const storage::StepRecord& r) override { lock()->steps.push_back(r); }
  void writeOp(const storage::OpRecord& r) override {
    if (failAfter_ >= 0 && opsSeen_++ >= failAfter_)
      throw storage::StorageError("run.db: database or disk is full");
    if (delayUs_) std::this_thread::sleep_for(std::chrono::microseconds(delayUs_));
    lock()->ops.push_back(r);
  }
  void writeStack(const storage::StackRecord& r) override { lock()->stacks.push_back(r); }
  void writeLog(const storage::LogRecord& r) override { lock()->logs.push_back(r); }
  void writeMem(const storage::MemRecord& r) override { lock()->mems.push_back(r); }
  void writeDump(const storage::DumpRecord& r) override { lock()->dumps.push_back(r); }
  void setRunStatus(const std::string& st) override { lock()->status = st; }
  void addDropped(const std::string& kind, int64_t n) override { lock()->dropped[kind] += n; }
  void commit() override { ++lock()->commits; }
  void close() override { lock()->closed = true; }

 private:
  struct Locked {
    std::unique_lock<std::mutex> lk;
    Store* s;
    Store* operator->() { return s; }
  };
  Locked lock() { return Locked{std::unique_lock<std::mutex>(s_->mu), s_.get()}; }
  std::shared_ptr<Store> s_;
  int delayUs_;
  int failAfter_;
  int opsSeen_ = 0;
};

// What the engine actually ran, straight from the observer seam.
struct Truth : Observer {
  struct Op {
    uint64_t seq, forwardSeq;
    std::string name;
    Phase phase;
    std::vector<std::pair<uint64_t, uint64_t>> in, out;
  };
  std::vector<Op> ops;
  void onOpBegin(const OpEvent& e) override {
    Op o{e.seq, e.forwardSeq, e.op->name, e.phase, {}, {}};
    for (auto& t : e.inputs) o.in.push_back({t.id(), t.version()});
    ops.push_back(o);
  }
  void onOpEnd(const OpEvent& e) override {
    for (auto& o : ops)
      if (o.seq == e.seq)
        for (auto& t : e.outputs) o.out.push_back({t.id(), t.version()});
  }
};

Tensor f32(const std::vector<double>& v, const Shape& s) {
  return test::fromDoubles(v, s, DType::Float32, Device(Backend::Cpu));
}

// ---- hashing ----

TEST(CaptureHash, Md5EqualsDigestOfDocumentedByteString) {
  Tensor t = f32({1.5, -2, 0, 3.25, 1e-3, 7}, {2, 3});
  std::string bytes;
  for (float v : {1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, 7.0f}) raw(bytes, v);
  bytes += "float32";
  bytes.push_back('\0');
  le64(bytes, 2);
  le64(bytes, 2);
  le64(bytes, 3);
  EXPECT_EQ(tensorMd5(t), md5Hex(bytes));

  Tensor i = test::fromInts({5, -1, 1LL << 40}, {3}, DType::Int64, Device(Backend::Cpu));
  std::string ib;
  for (int64_t v : {int64_t(5), int64_t(-1), int64_t(1) << 40}) raw(ib, v);
  ib += "int64";
  ib.push_back('\0');
  le64(ib, 1);
  le64(ib, 3);
  EXPECT_EQ(tensorMd5(i), md5Hex(ib));

  Tensor s = test::fromDoubles({2.5}, {}, DType::Float64, Device(Backend::Cpu));
  std::string sb;
  raw(sb, 2.5);
  sb += "float64";
  sb.push_back('\0');
  le64(sb, 0);
  EXPECT_EQ(tensorMd5(s), md5Hex(sb));
}

TEST(CaptureHash, ReshapeSharesTheElementStreamButNotTheDigest) {
  Tensor x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = ops::reshape(x, {3, 2});
  Md5Stream ex = md5Elements(x);
  EXPECT_EQ(ex.finish(hashTrailer(DType::Float32, {3, 2})), tensorMd5(r));
  EXPECT_EQ(ex.finish(hashTrailer(DType::Float32, {2, 3})), tensorMd5(x));
  EXPECT_NE(tensorMd5(r), tensorMd5(x));
}

TEST(CaptureHash, ViewAndContiguousCopyHashEqual) {
  Tensor x = test::randNormal({3, 5}, DType::Float32, Device(Backend::Cpu), 7);
  Tensor v = ops::transpose(x, 0, 1);
  ASSERT_FALSE(v.isContiguous());
  Tensor c = v.contiguous();
  ASSERT_TRUE(c.isContiguous());
  EXPECT_EQ(tensorMd5(v), tensorMd5(c));
  EXPECT_EQ(tensorMd5Rounded(v, 4), tensorMd5Rounded(c, 4));
  EXPECT_EQ(tensorStats(v).mean, tensorStats(c).mean);
  EXPECT_EQ(contiguousBytes(v), contiguousBytes(c));
  Tensor sl = ops::slice(x, 1, 1, 5, 2);  // strided inner dimension
  EXPECT_EQ(tensorMd5(sl), tensorMd5(sl.contiguous()));
  EXPECT_NE(tensorMd5(v), tensorMd5(x));  // transposed values differ in order and shape
}

TEST(CaptureHash, SameValuesDifferentShapeHashDifferently) {
  std::vector<double> v{1, 2, 3, 4, 5, 6};
  std::string a = tensorMd5(f32(v, {2, 3})), b = tensorMd5(f32(v, {3, 2})),
              c = tensorMd5(f32(v, {6})), d = tensorMd5(f32(v, {1, 6}));
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(c, d);
  EXPECT_NE(tensorMd5(test::fromDoubles(v, {6}, DType::Float64, Device(Backend::Cpu))), c);
}

TEST(CaptureHash, RoundedMd5IgnoresDigitsPastN) {
  Tensor a = test::fromDoubles({1.0000001, 2.5, -3.33333331}, {3}, DType::Float64, Device());
  Tensor b = test::fromDoubles({1.0000002, 2.5, -3.33333332}, {3}, DType::Float64, Device());
  EXPECT_NE(tensorMd5(a), tensorMd5(b));
  EXPECT_EQ(tensorMd5Rounded(a, 6), tensorMd5Rounded(b, 6));
  EXPECT_NE(tensorMd5Rounded(a, 9), tensorMd5Rounded(b, 9));

  const double inf = std::numeric_limits<double>::infinity();
  Tensor c = test::fromDoubles({1, 2.5, std::nan(""), inf, -inf, -0.0, 123456, -0.0012345, 9.996},
                               {9}, DType::Float64, Device());
  // (m, e): the value is m x 10^(e - 2) with |m| < 1000, m rounded half to even.
  std::string bytes;
  auto code = [&](int64_t m, int32_t e) {
    raw(bytes, m);
    raw(bytes, e);
  };
  code(100, 0);               // 1
  code(250, 0);               // 2.5
  code(0, kRoundedSpecial);   // NaN
  code(1, kRoundedSpecial);   // +inf
  code(-1, kRoundedSpecial);  // -inf
  code(0, 0);                 // -0
  code(123, 5);               // 123456 -> 1.23e5
  code(-123, -3);             // -0.0012345 -> -1.23e-3 (1.2345 rounds to 1.23)
  code(100, 1);               // 9.996 -> 10.0 (the carry moves the exponent)
  bytes += "float64";
  bytes.push_back('\0');
  le64(bytes, 1);
  le64(bytes, 9);
  EXPECT_EQ(tensorMd5Rounded(c, 3), md5Hex(bytes));
}

TEST(CaptureHash, StatsExactWithNanInfAndZeros) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor t = test::fromDoubles({1, -2, 0, -0.0, std::nan(""), inf, -inf, 3}, {2, 4}, DType::Float64,
                               Device());
  storage::TensorStats s = tensorStats(t);
  EXPECT_EQ(s.nanCount, 1);
  EXPECT_EQ(s.infCount, 2);
  EXPECT_EQ(s.zeroCount, 2);
  EXPECT_DOUBLE_EQ(s.min, -2);
  EXPECT_DOUBLE_EQ(s.max, 3);
  EXPECT_DOUBLE_EQ(s.absMax, 3);
  EXPECT_DOUBLE_EQ(s.mean, 0.4);  // (1 - 2 + 0 + 0 + 3) / 5
  // population variance: (0.36 + 5.76 + 0.16 + 0.16 + 6.76) / 5 = 2.64
  EXPECT_NEAR(s.std, std::sqrt(2.64), 1e-15);

  storage::TensorStats none = tensorStats(test::fromDoubles({std::nan("")}, {1}));
  EXPECT_TRUE(std::isnan(none.mean));
  EXPECT_EQ(none.nanCount, 1);
}

// The float32 path (AVX2 where the CPU has it) and the generic float64 path assign element i to
// the same lane and do the same operations, so the same values give the same bits, in any layout.
TEST(CaptureHash, StatsSameBitsForFloat32AndFloat64AndViews) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v;
  for (int i = 0; i < 1003; ++i) v.push_back(double(float(std::sin(i * 0.37) * (1 + i % 17))));
  v[5] = std::nan("");
  v[100] = inf;
  v[101] = -inf;
  v[300] = 0;
  v[301] = -0.0;
  Tensor f = test::fromDoubles(v, {17, 59}, DType::Float32, Device(Backend::Cpu));
  Tensor d = test::fromDoubles(v, {17, 59}, DType::Float64, Device(Backend::Cpu));
  auto same = [](const storage::TensorStats& a, const storage::TensorStats& b) {
    EXPECT_EQ(a.min, b.min);
    EXPECT_EQ(a.max, b.max);
    EXPECT_EQ(a.mean, b.mean);
    EXPECT_EQ(a.std, b.std);
    EXPECT_EQ(a.absMax, b.absMax);
    EXPECT_EQ(a.nanCount, b.nanCount);
    EXPECT_EQ(a.infCount, b.infCount);
    EXPECT_EQ(a.zeroCount, b.zeroCount);
  };
  storage::TensorStats sf = tensorStats(f);
  same(sf, tensorStats(d));
  EXPECT_EQ(sf.nanCount, 1);
  EXPECT_EQ(sf.infCount, 2);
  EXPECT_EQ(sf.zeroCount, 3);  // v[0] = sin(0) = 0, v[300], v[301]
  Tensor t = ops::transpose(f, 0, 1);
  same(tensorStats(t), tensorStats(t.contiguous()));
  Tensor sl = ops::slice(f, 1, 3, 50, 1);  // rows of 47: chunks that do not start on lane 0
  same(tensorStats(sl), tensorStats(sl.contiguous()));
}

TEST(CaptureOptions, JsonRoundTripAndErrors) {
  CaptureOptions o;
  o.stacks = true;
  o.md5 = true;
  o.roundedMd5 = 5;
  o.dumps = true;
  o.dumpFilter.ops = {"matmul"};
  o.dumpFilter.scope = "blocks.1";
  o.filter.stepMin = 2;
  o.filter.stepMax = 3;
  o.queueCapacity = 8;
  o.dropPolicy = DropPolicy::Drop;
  o.onError = ErrorPolicy::Throw;
  EXPECT_EQ(CaptureOptions::fromJson(o.toJson()), o);
  EXPECT_EQ(CaptureOptions::fromJson("{}"), CaptureOptions{});
  EXPECT_THROW(CaptureOptions::fromJson(R"({"md6": true})"), Error);
  EXPECT_THROW(CaptureOptions::fromJson(R"({"drop_policy": "sometimes"})"), Error);
  EXPECT_THROW(CaptureOptions::fromJson(R"({"md5": 3})"), Error);
  EXPECT_THROW(CaptureOptions::fromJson("not json"), Error);
  // Found by fuzz_config: a number that is not a whole one below 2^63 is refused in words (-1e30
  // was cast to an integer, which C++ leaves undefined; 2^64 - 1 read as -1; rounded_md5 2^32 + 5
  // as 5).
  auto refused = [](const std::string& json) {
    try {
      CaptureOptions::fromJson(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused(R"({"queue_capacity": -1e30})"),
            "capture options: 'queue_capacity' must be a whole number below 2^63, got -1e+30");
  EXPECT_EQ(refused(R"({"filter": {"step_max": 18446744073709551615}})"),
            "capture options: 'filter.step_max' must be a whole number below 2^63, got "
            "18446744073709551615");
  EXPECT_EQ(refused(R"({"commit_every": "8"})"),
            "capture options: 'commit_every' must be a whole number below 2^63, got a string");
  EXPECT_EQ(refused(R"({"rounded_md5": 4294967301})"),
            "capture options: rounded_md5 must be 0..17");
  EXPECT_EQ(refused(R"({"hash_lanes": 8.0})"),
            "capture options: 'hash_lanes' must be a whole number below 2^63, got 8.0");
  EXPECT_TRUE(o.filter.matches("add", "", 2));
  EXPECT_FALSE(o.filter.matches("add", "", 4));
  EXPECT_TRUE(o.dumpFilter.matches("matmul", "blocks.1.attn", 9));
  EXPECT_FALSE(o.dumpFilter.matches("matmul", "blocks.10", 9));
}

// A damaged recording naming one Buffer in two live allocations (found by fuzz_recording): the
// replay trace frees the first block before the second is allocated, so no id is live twice, and
// the first block's address no longer names it.
TEST(AllocTraceFromRecording, ABufferAllocatedTwiceWhileLiveIsFreedFirst) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) /
                            ("keel_trace_twice_" + std::to_string(::getpid()) + ".db"))
                               .string();
  std::filesystem::remove(path);
  {
    auto w = storage::Writer::create(path, storage::RunInfo{});
    w->writeStep({1, 0, 1, 0.5});
    auto event = [&](MemEventKind kind, uint64_t address, uint64_t bytes) {
      storage::MemRecord m;
      m.kind = kind;
      m.device = "cpu";
      m.address = address;
      m.bytes = bytes;
      m.step = 1;
      m.bufferId = 5;
      w->writeMem(m);
    };
    event(MemEventKind::Alloc, 4096, 64);
    event(MemEventKind::Alloc, 8192, 32);  // Buffer 5 again, still live at 4096
    event(MemEventKind::Free, 4096, 64);   // no longer names a live block: skipped
    event(MemEventKind::Free, 8192, 32);
    w->close();
  }
  const AllocTrace t = allocTraceFromRecording(storage::Recording::open(path));
  std::string events;
  for (const TraceEvent& e : t.events)
    events += std::string(e.kind == TraceEvent::Alloc  ? " a"
                          : e.kind == TraceEvent::Free ? " f"
                                                       : " s") +
              std::to_string(e.id) +
              (e.kind == TraceEvent::Alloc ? ":" + std::to_string(e.bytes) : "");
  EXPECT_EQ(events, " s1 a5:64 f5 a5:32 f5");
  std::filesystem::remove(path);
  // A real recording: initialisation before the first marker, one marker per training step
  // (keel memory replay said '4 steps' of a 3-step run, keel memory trace '3 steps').
  const std::string real = path + ".steps.db";
  std::filesystem::remove(real);
  {
    auto w = storage::Writer::create(real, storage::RunInfo{});
    uint64_t address = 4096;
    for (int64_t st : {0, 0, 1, 2, 3}) {
      storage::MemRecord m;
      m.kind = MemEventKind::Alloc;
      m.device = "cpu";
      m.address = address += 64;
      m.bytes = 16;
      m.step = st;
      w->writeMem(m);
    }
    w->close();
  }
  EXPECT_EQ(allocTraceFromRecording(storage::Recording::open(real)).steps(), 3u);
  std::filesystem::remove(real);
}

// ---- recording ----

TEST(CaptureRecorder, GraphEdgesMatchEngineDataflow) {
  auto store = std::make_shared<Store>();
  auto truth = std::make_shared<Truth>();
  CaptureOptions opt;
  opt.md5 = true;
  opt.stats = true;
  {
    Tensor x = test::randNormal({4, 3}, DType::Float32, Device(Backend::Cpu), 1);
    Tensor w = test::randNormal({3, 2}, DType::Float32, Device(Backend::Cpu), 2);
    x.setRequiresGrad();
    w.setRequiresGrad();
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    addObserver(truth);
    Tensor y = ops::matmul(ops::relu(x), w);
    Tensor loss = ops::sum(y);
    loss.backward();
    removeObserver(truth);
    rec.finish();
    EXPECT_EQ(rec.status(), RecorderStatus::Finished);
  }
  EXPECT_EQ(store->status, "finished");
  EXPECT_TRUE(store->closed);
  ASSERT_EQ(store->ops.size(), truth->ops.size());

  std::map<std::pair<uint64_t, uint64_t>, uint64_t> trueProducer, recProducer;
  for (auto& o : truth->ops)
    for (auto& k : o.out) trueProducer[k] = o.seq;
  for (auto& o : store->ops)
    for (auto& t : o.tensors)
      if (t.role == Role::Output) {
        auto [it, fresh] = recProducer.emplace(std::make_pair(t.tensorId, t.version), o.seq);
        EXPECT_TRUE(fresh) << "tensor " << t.tensorId << " v" << t.version << " produced twice";
      }
  std::map<uint64_t, const storage::OpRecord*> bySeq;
  for (auto& o : store->ops) bySeq[o.seq] = &o;
  int edges = 0;
  for (size_t i = 0; i < truth->ops.size(); ++i) {
    const auto& t = truth->ops[i];
    const auto& r = store->ops[i];
    EXPECT_EQ(r.seq, t.seq);
    EXPECT_EQ(r.name, t.name);
    EXPECT_EQ(r.phase, t.phase);
    EXPECT_EQ(r.forwardSeq, t.forwardSeq);
    std::vector<std::pair<uint64_t, uint64_t>> in;
    for (auto& tr : r.tensors)
      if (tr.role == Role::Input) {
        in.push_back({tr.tensorId, tr.version});
        EXPECT_EQ(tr.md5.size(), 32u);
      }
    EXPECT_EQ(in, t.in) << r.name;
    for (auto& k : in) {
      auto tp = trueProducer.find(k);
      auto rp = recProducer.find(k);
      ASSERT_EQ(tp == trueProducer.end(), rp == recProducer.end()) << r.name;
      if (tp != trueProducer.end()) {
        EXPECT_EQ(rp->second, tp->second) << r.name << " input has the wrong producer";
        ++edges;
      }
    }
  }
  EXPECT_GE(edges, 4);

  // Backward ops link to the forward op they differentiate.
  uint64_t matmulSeq = 0, reluSeq = 0;
  for (auto& o : store->ops) {
    if (o.phase == Phase::Forward && o.name == "matmul") matmulSeq = o.seq;
    if (o.phase == Phase::Forward && o.name == "relu") reluSeq = o.seq;
  }
  ASSERT_NE(matmulSeq, 0u);
  ASSERT_NE(reluSeq, 0u);
  bool sawMatmulGrad = false, sawReluGrad = false;
  for (auto& o : store->ops) {
    if (o.phase != Phase::Backward || o.forwardSeq == 0) continue;
    ASSERT_TRUE(bySeq.count(o.forwardSeq));
    EXPECT_EQ(bySeq[o.forwardSeq]->phase, keel::Phase::Forward);
    EXPECT_LT(o.forwardSeq, o.seq);
    sawMatmulGrad = sawMatmulGrad || o.forwardSeq == matmulSeq;
    sawReluGrad = sawReluGrad || o.forwardSeq == reluSeq;
  }
  EXPECT_TRUE(sawMatmulGrad);
  EXPECT_TRUE(sawReluGrad);
}

TEST(CaptureRecorder, StacksAllocatorDumpsAndFilters) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.stacks = true;
  opt.allocator = true;
  opt.dumps = true;
  opt.dumpFilter.ops = {"relu"};
  opt.filter.ops = {"relu", "add_scalar", "mul_scalar"};
  {
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    Tensor x = f32({-1, 2, -3, 4}, {2, 2});
    Tensor y = ops::relu(x);
    Tensor z = ops::addScalar(ops::mulScalar(y, 2.0), 1.0);
    (void)z;
  }
  ASSERT_FALSE(store->ops.empty());
  for (auto& o : store->ops) {
    EXPECT_TRUE(o.name == "relu" || o.name == "add_scalar" || o.name == "mul_scalar") << o.name;
    EXPECT_GE(o.stackId, 1);
  }
  ASSERT_FALSE(store->stacks.empty());
  bool sawTestFrame = false;
  for (auto& s : store->stacks) {
    ASSERT_FALSE(s.frames.empty());
    EXPECT_EQ(s.frames[0].function.rfind("keel::capture::", 0), std::string::npos)
        << "capture frames must be skipped: " << s.frames[0].function;
    for (auto& f : s.frames)
      sawTestFrame =
          sawTestFrame || f.function.find("StacksAllocatorDumpsAndFilters") != std::string::npos;
  }
  EXPECT_TRUE(sawTestFrame) << "the test body should appear in a symbolized stack";
  ASSERT_EQ(store->dumps.size(), 1u);
  EXPECT_EQ(store->dumps[0].codec, "zstd");
  EXPECT_EQ(store->dumps[0].rawBytes, 16);
  EXPECT_FALSE(store->mems.empty());
}

// An op whose kernel or shape check throws is recorded (inputs, stack) with an Error log line
// carrying the message; the error still reaches the caller unchanged.
TEST(CaptureRecorder, FailingOpIsRecordedWithItsErrorAndStack) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.stacks = true;
  opt.md5 = true;
  {
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor b = f32({1, 2, 3, 4}, {2, 2});
    try {
      ops::matmul(a, b);
      ADD_FAILURE() << "matmul of [2,3] and [2,2] did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
    }
  }
  ASSERT_FALSE(store->ops.empty());
  const storage::OpRecord& op = store->ops.back();
  EXPECT_EQ(op.name, "matmul");
  ASSERT_EQ(op.tensors.size(), 2u);  // both inputs, no outputs
  EXPECT_EQ(op.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(op.tensors[0].md5, tensorMd5(f32({1, 2, 3, 4, 5, 6}, {2, 3})));
  EXPECT_GE(op.stackId, 1);
  bool sawError = false;
  for (const auto& l : store->logs)
    if (l.level == storage::LogLevel::Error && l.opSeq == op.seq) {
      sawError = true;
      EXPECT_EQ(l.message.rfind("op matmul failed: ", 0), 0u) << l.message;
    }
  EXPECT_TRUE(sawError);
}

// flush() returns only once everything captured so far was committed.
TEST(CaptureRecorder, FlushCommitsEverythingCapturedSoFar) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.commitIntervalMs = 60'000;  // no timed commits: only flush() can commit
  opt.commitEvery = 1'000'000;
  Recorder rec(std::make_unique<FakeWriter>(store, /*opDelayUs=*/200), opt);
  Tensor x = f32({1, 2, 3, 4}, {2, 2});
  for (int i = 0; i < 50; ++i) x = ops::addScalar(x, 1.0);
  rec.flush();
  {
    std::lock_guard<std::mutex> lk(store->mu);
    EXPECT_EQ(store->ops.size(), 50u);
    EXPECT_GE(store->commits, 1);
  }
  rec.finish();
  rec.flush();  // after finish: returns at once
}

std::vector<storage::LogRecord> verboseLines(const Store& s) {
  std::vector<storage::LogRecord> v;
  for (auto& l : s.logs)
    if (l.level == storage::LogLevel::Verbose) v.push_back(l);
  return v;
}

TEST(CaptureVerbose, GuardTurnsVerboseOnInsideOneScopeOnly) {
  auto store = std::make_shared<Store>();
  std::map<uint64_t, std::string> scopeOfSeq;
  {
    Recorder rec(std::make_unique<FakeWriter>(store), CaptureOptions{});
    VerboseGuard g(std::vector<VerboseRule>{{"blocks.3.attn", std::nullopt}});
    Tensor x = f32({1, 2}, {2});
    {
      ScopeGuard a("blocks.3.attn");
      ops::relu(x);
      ScopeGuard b("proj");
      ops::neg(x);
    }
    {
      ScopeGuard a("blocks.3.mlp");
      ops::relu(x);
    }
    {
      ScopeGuard a("blocks.30.attn");
      ops::relu(x);
    }
    log(LogLevel::Info, "data", "outside any op");
  }
  for (auto& o : store->ops) scopeOfSeq[o.seq] = o.scope;
  auto lines = verboseLines(*store);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].scope, "blocks.3.attn");
  EXPECT_EQ(lines[0].message.rfind("relu(", 0), 0u) << lines[0].message;
  EXPECT_NE(lines[0].message.find("[2] float32"), std::string::npos) << lines[0].message;
  EXPECT_EQ(scopeOfSeq.at(lines[0].opSeq), "blocks.3.attn");
  EXPECT_EQ(lines[1].scope, "blocks.3.attn.proj");
  EXPECT_EQ(scopeOfSeq.at(lines[1].opSeq), "blocks.3.attn.proj");
  EXPECT_EQ(lines[1].message.rfind("neg(", 0), 0u);
  // An ordinary line outside ops carries the last op's seq.
  ASSERT_FALSE(store->logs.empty());
  EXPECT_EQ(store->logs.back().message, "outside any op");
  EXPECT_EQ(store->logs.back().opSeq, store->ops.back().seq);
  EXPECT_FALSE(verboseEnabled("blocks.3.attn", Phase::Forward));  // guard gone
}

TEST(CaptureVerbose, GuardBackwardOnlyInsideBlock) {
  auto store = std::make_shared<Store>();
  {
    Recorder rec(std::make_unique<FakeWriter>(store), CaptureOptions{});
    VerboseGuard g("blocks.1:backward");
    Tensor x = f32({1, -2, 3}, {3});
    x.setRequiresGrad();
    Tensor h;
    {
      ScopeGuard a("blocks.1");
      h = ops::relu(ops::mulScalar(x, 3.0));
    }
    Tensor loss;
    {
      ScopeGuard a("blocks.2");
      loss = ops::sum(ops::tanh(h));
    }
    loss.backward();
  }
  std::map<uint64_t, const storage::OpRecord*> bySeq;
  int backwardInBlock1 = 0;
  for (auto& o : store->ops) {
    bySeq[o.seq] = &o;
    if (o.phase == Phase::Backward && o.scope.rfind("blocks.1", 0) == 0) ++backwardInBlock1;
  }
  auto lines = verboseLines(*store);
  ASSERT_GT(backwardInBlock1, 0);
  EXPECT_EQ(int(lines.size()), backwardInBlock1);
  for (auto& l : lines) {
    ASSERT_TRUE(bySeq.count(l.opSeq));
    EXPECT_EQ(bySeq[l.opSeq]->phase, keel::Phase::Backward);
    EXPECT_EQ(bySeq[l.opSeq]->scope, "blocks.1");
    EXPECT_EQ(l.message.rfind(bySeq[l.opSeq]->name + "(", 0), 0u) << l.message;
  }
}

TEST(CaptureVerbose, RuleParsingAndEnvironment) {
  auto r = parseVerboseRules("blocks.3.attn, blocks.1:backward,*:forward,,:optimizer");
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0], (VerboseRule{"blocks.3.attn", std::nullopt}));
  EXPECT_EQ(r[1], (VerboseRule{"blocks.1", Phase::Backward}));
  EXPECT_EQ(r[2], (VerboseRule{"", Phase::Forward}));
  EXPECT_EQ(r[3], (VerboseRule{"", Phase::Optimizer}));
  EXPECT_THROW(parseVerboseRules("blocks.1:sideways"), Error);
  EXPECT_TRUE(ruleMatches(r[1], "blocks.1.mlp", Phase::Backward));
  EXPECT_FALSE(ruleMatches(r[1], "blocks.10", Phase::Backward));
  EXPECT_FALSE(ruleMatches(r[1], "blocks.1", Phase::Forward));
  EXPECT_EQ(parseLogLevelSetting("debug"), LogLevel::Debug);
  EXPECT_EQ(parseLogLevelSetting(" warning "), LogLevel::Warn);
  EXPECT_EQ(parseLogLevelSetting("0"), LogLevel::Error);
  EXPECT_EQ(parseLogLevelSetting("4"), LogLevel::Verbose);
  EXPECT_THROW(parseLogLevelSetting("5"), Error);
  EXPECT_THROW(parseLogLevelSetting("loud"), Error);

  EXPECT_FALSE(keel::detail::verboseActive());
  ::setenv("KEEL_VERBOSE", "blocks.3.attn,blocks.1:backward", 1);
  ::setenv("KEEL_LOG_LEVEL", "error", 1);
  EXPECT_TRUE(readLogEnv());
  EXPECT_EQ(globalVerboseRules().size(), 2u);
  EXPECT_EQ(logEchoLevel(), LogLevel::Error);
  EXPECT_TRUE(verboseEnabled("blocks.3.attn.q", Phase::Forward));
  EXPECT_TRUE(verboseEnabled("blocks.1", Phase::Backward));
  EXPECT_FALSE(verboseEnabled("blocks.1", Phase::Forward));
  EXPECT_FALSE(verboseEnabled("blocks.2", Phase::Backward));
  ::setenv("KEEL_VERBOSE", "x:bogus", 1);
  EXPECT_FALSE(readLogEnv());  // reported and ignored
  ::unsetenv("KEEL_VERBOSE");
  ::unsetenv("KEEL_LOG_LEVEL");
  setLogEchoLevel(LogLevel::Warn);
  EXPECT_TRUE(readLogEnv());
  EXPECT_FALSE(keel::detail::verboseActive());
}

// ---- back-pressure and errors ----

int64_t runOps(int n) {
  Tensor x = f32({1, 2, 3, 4}, {4});
  uint64_t first = lastOpSeq();
  for (int i = 0; i < n; ++i) x = ops::addScalar(x, 1.0);
  return int64_t(lastOpSeq() - first);
}

// Runs `ops` ops through a queue of 8 to a writer that takes writeDelayUs per op; returns the ops
// run and the recorder's counts once it has finished.
std::pair<int64_t, RecorderCounts> runThroughSlowWriter(std::shared_ptr<Store> store,
                                                        CaptureOptions opt, int writeDelayUs,
                                                        int ops) {
  opt.queueCapacity = 8;
  Recorder rec(std::make_unique<FakeWriter>(std::move(store), writeDelayUs), opt);
  const int64_t n = runOps(ops);
  rec.finish();
  return {n, rec.counts()};
}

TEST(CaptureQueue, BlockPolicyDropsNothingWithASlowWriter) {
  auto store = std::make_shared<Store>();
  const auto [n, c] = runThroughSlowWriter(store, CaptureOptions{}, 100, 200);
  EXPECT_EQ(int64_t(store->ops.size()), n);
  EXPECT_EQ(c.ops, n);
  EXPECT_EQ(c.droppedOps, 0);
  EXPECT_TRUE(store->dropped.empty());
}

TEST(CaptureQueue, DropPolicyCountsExactly) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.dropPolicy = DropPolicy::Drop;
  const auto [n, c] = runThroughSlowWriter(store, opt, 200, 300);
  EXPECT_GT(c.droppedOps, 0);
  EXPECT_EQ(int64_t(store->ops.size()) + c.droppedOps, n);
  EXPECT_EQ(store->dropped["op"], c.droppedOps);
  EXPECT_EQ(store->status, "finished");
}

TEST(CaptureErrors, WriterFailureStopsRecordingWithAClearError) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.queueCapacity = 4;
  Recorder rec(std::make_unique<FakeWriter>(store, 0, 5), opt);
  EXPECT_NO_THROW(runOps(100));
  rec.finish();
  EXPECT_EQ(rec.status(), RecorderStatus::Failed);
  EXPECT_NE(rec.error().find("disk is full"), std::string::npos) << rec.error();
  EXPECT_EQ(store->ops.size(), 5u);
  EXPECT_EQ(store->status.rfind("failed: ", 0), 0u) << store->status;
  EXPECT_NE(store->status.find("disk is full"), std::string::npos);
}

TEST(CaptureErrors, ThrowPolicyThrowsOnceToTheEngine) {
  auto store = std::make_shared<Store>();
  CaptureOptions opt;
  opt.onError = ErrorPolicy::Throw;
  Recorder rec(std::make_unique<FakeWriter>(store, 0, 3), opt);
  std::string caught;
  for (int i = 0; i < 2000 && caught.empty(); ++i) {
    try {
      runOps(10);
    } catch (const Error& e) {
      caught = e.what();
    }
    if (caught.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_NE(caught.find("capture: recording failed"), std::string::npos) << caught;
  EXPECT_NE(caught.find("disk is full"), std::string::npos) << caught;
  EXPECT_NO_THROW(runOps(10));  // once only; recording has stopped
  EXPECT_TRUE(rec.failed());
}

// ---- hashing off the engine thread (Note [Hashing off the engine thread]) ----

CaptureOptions hashOptions(bool hashThread) {
  CaptureOptions o;
  o.md5 = true;
  o.stats = true;
  o.hashThread = hashThread;
  return o;
}

// The recorded output `index` of the op named `name` (the first such op).
const storage::TensorRecord* recordedOutput(const Store& s, const std::string& name, int index) {
  for (const auto& op : s.ops)
    if (op.name == name)
      for (const auto& t : op.tensors)
        if (t.role == Role::Output && t.index == index) return &t;
  return nullptr;
}

// An op's output written in place right after the op (by an optimizer step, by a host copy): the
// recorded MD5 and statistics are of what the op produced, not of the bytes after the write.
TEST(CaptureHashThread, InPlaceWritesRightAfterAnOpDoNotChangeItsRecord) {
  std::vector<double> v;
  for (int i = 0; i < 4096; ++i) v.push_back(std::sin(i * 0.1));
  const Tensor x = f32(v, {64, 64});
  const Tensor ref = ops::mulScalar(x, 2.0);  // what mul_scalar produces, hashed here directly
  const std::string refMd5 = tensorMd5(ref);
  const storage::TensorStats refStats = tensorStats(ref);
  // With allocator events the jobs hold their buffers weakly (Note [Weakly held buffers]).
  for (int lanes : {0, 1, 8, 16, 32, 48})
    for (bool allocator : {false, true}) {
      if (lanes != 0 && !md5LanesSupported(lanes)) continue;
      auto store = std::make_shared<Store>();
      CaptureOptions opt = hashOptions(true);
      opt.hashLanes = lanes;
      opt.allocator = allocator;
      {
        Recorder rec(std::make_unique<FakeWriter>(store), opt);
        Tensor y = ops::mulScalar(x, 2.0);
        Tensor z = ops::addScalar(x, 1.0);  // a second op, so the first is not alone in a batch
        Tensor g = Tensor::full({64, 64}, 1.0, DType::Float32, Device(Backend::Cpu));
        Tensor mom = Tensor::zeros({64, 64}, DType::Float32, Device(Backend::Cpu));
        ops::sgdStep(y, g, mom, 0.5, 0.0, 0.0, false);  // y -= 0.5, in place, at once
        copyFromHost(z, v.data(), DType::Float64, int64_t(v.size()));  // z overwritten from host
        rec.finish();
        ASSERT_EQ(rec.status(), RecorderStatus::Finished) << rec.error();
      }
      const storage::TensorRecord* mul = recordedOutput(*store, "mul_scalar", 0);
      ASSERT_NE(mul, nullptr);
      EXPECT_EQ(mul->md5, refMd5) << "lanes " << lanes;
      EXPECT_EQ(mul->stats.mean, refStats.mean);
      EXPECT_EQ(mul->stats.std, refStats.std);
      const storage::TensorRecord* add = recordedOutput(*store, "add_scalar", 0);
      ASSERT_NE(add, nullptr);
      EXPECT_EQ(add->md5, tensorMd5(ops::addScalar(x, 1.0))) << "lanes " << lanes;
      // sgd_step's input 0 is y as read (the mul's bytes), its output 0 y after the step.
      const storage::OpRecord* sgd = nullptr;
      for (const auto& op : store->ops)
        if (op.name == "sgd_step") sgd = &op;
      ASSERT_NE(sgd, nullptr);
      EXPECT_EQ(sgd->tensors[0].md5, refMd5);
      EXPECT_EQ(recordedOutput(*store, "sgd_step", 0)->md5, tensorMd5(ops::addScalar(ref, -0.5)));
    }
}

// Note [Weakly held buffers]: while allocator events are recorded, a tensor the program drops is
// freed then (its elements copied for the hashing), not when the hashing thread gets to it. Its
// checksums are still of what the op produced, and every free is in the recording, those of the
// buffers the hashing held at the end included.
TEST(CaptureHashThread, WithAllocatorEventsADroppedTensorIsFreedWhenDropped) {
  std::vector<double> v;
  for (int i = 0; i < 65536; ++i) v.push_back(std::cos(i * 0.01));
  const Tensor x = f32(v, {256, 256});
  const Tensor ref = ops::mulScalar(x, 2.0);
  const std::string trailer = hashTrailer(DType::Float32, ref.shape());
  const std::string refMd5 = tensorMd5(ref),
                    refRounded = md5RoundedElements(ref, 3).finish(trailer);
  const Allocator& alloc = allocatorFor(x.device());
  auto store = std::make_shared<Store>();
  CaptureOptions opt = hashOptions(true);
  opt.allocator = true;
  opt.roundedMd5 = 3;
  int freedAtOnce = 0;
  std::vector<uint64_t> buffers;
  {
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    for (int i = 0; i < 20; ++i) {
      Tensor y = ops::mulScalar(x, 2.0);
      buffers.push_back(y.buffer()->id());
      const size_t before = alloc.allocatedBytes();
      y = Tensor();
      // Unless the hashing thread had already taken it (it waits to batch: rarely).
      freedAtOnce += alloc.allocatedBytes() < before;
    }
    rec.finish();
    ASSERT_EQ(rec.status(), RecorderStatus::Finished) << rec.error();
  }
  EXPECT_GT(freedAtOnce, 10);
  int outputs = 0;
  for (const auto& op : store->ops)
    for (const auto& t : op.tensors)
      if (op.name == "mul_scalar" && t.role == Role::Output) {
        EXPECT_EQ(t.md5, refMd5);
        EXPECT_EQ(t.md5Rounded, refRounded);
        ++outputs;
      }
  EXPECT_EQ(outputs, 20);
  for (uint64_t id : buffers) {
    int frees = 0;
    for (const auto& m : store->mems) frees += m.bufferId == id && m.kind == MemEventKind::Free;
    EXPECT_EQ(frees, 1) << "buffer " << id;
  }
}

// Every tensor record of two gpt-tiny training steps is the same, bit for bit, whether hashed on
// the hashing thread (at every lane width this CPU runs) or in the op's callback through OpenSSL.
TEST(CaptureHashThread, SameChecksumsAndStatisticsAsHashingInTheCallback) {
  auto record = [](CaptureOptions opt) {
    auto store = std::make_shared<Store>();
    GptConfig cfg = loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json");
    auto data = std::make_shared<const data::TextDataset>(
        std::string(200, 'a') + "the quick brown fox jumps over the lazy dog. ", "inline");
    Trainer trainer(cfg, Device("cpu"), 1, data, 2);
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    trainer.run(2);
    rec.finish();
    EXPECT_EQ(rec.status(), RecorderStatus::Finished) << rec.error();
    return std::make_pair(store, rec.counts());
  };
  const auto [ref, refCounts] = record(hashOptions(false));
  ASSERT_GT(ref->ops.size(), 100u);
  for (int lanes : {0, 1, 8, 16, 32, 48}) {
    if (lanes != 0 && !md5LanesSupported(lanes)) continue;
    CaptureOptions opt = hashOptions(true);
    opt.hashLanes = lanes;
    const auto [got, counts] = record(opt);
    EXPECT_GT(counts.hashedTensors, 100);
    ASSERT_EQ(got->ops.size(), ref->ops.size()) << "lanes " << lanes;
    int64_t compared = 0;
    for (size_t i = 0; i < ref->ops.size(); ++i) {
      const auto& a = ref->ops[i].tensors;
      const auto& b = got->ops[i].tensors;
      ASSERT_EQ(a.size(), b.size()) << ref->ops[i].name;
      for (size_t k = 0; k < a.size(); ++k) {
        ASSERT_EQ(a[k].md5, b[k].md5) << "op " << i << " " << ref->ops[i].name << " tensor " << k;
        ASSERT_EQ(a[k].hasStats, b[k].hasStats);
        EXPECT_EQ(std::memcmp(&a[k].stats, &b[k].stats, sizeof a[k].stats), 0)
            << "op " << i << " " << ref->ops[i].name << " tensor " << k;
        compared += !a[k].md5.empty();
      }
    }
    EXPECT_GT(compared, 500);
  }
}

// A step range: the recorder pauses outside it (Note [Paused observers]) and records exactly the
// ops of the steps inside, with the same checksums as a recording of every step.
TEST(CaptureHashThread, AStepRangeRecordsItsStepsAsAFullRecordingDoes) {
  auto record = [](CaptureOptions opt) {
    auto store = std::make_shared<Store>();
    GptConfig cfg = loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json");
    auto data = std::make_shared<const data::TextDataset>(
        std::string(200, 'a') + "the quick brown fox jumps over the lazy dog. ", "inline");
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    Trainer trainer(cfg, Device("cpu"), 1, data, 4);
    trainer.run(4);
    rec.finish();
    EXPECT_EQ(rec.status(), RecorderStatus::Finished) << rec.error();
    return store;
  };
  const auto all = record(hashOptions(true));
  CaptureOptions ranged = hashOptions(true);
  ranged.filter.stepMin = 2;
  ranged.filter.stepMax = 3;
  const auto some = record(ranged);
  std::vector<const storage::OpRecord*> want;
  for (const auto& op : all->ops)
    if (op.step == 2 || op.step == 3) want.push_back(&op);
  ASSERT_GT(want.size(), 100u);
  ASSERT_EQ(some->ops.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(some->ops[i].name, want[i]->name);
    ASSERT_EQ(some->ops[i].tensors.size(), want[i]->tensors.size());
    for (size_t k = 0; k < want[i]->tensors.size(); ++k)
      EXPECT_EQ(some->ops[i].tensors[k].md5, want[i]->tensors[k].md5)
          << some->ops[i].name << " tensor " << k;
  }
  EXPECT_EQ(some->steps.size(), all->steps.size());  // every step's row, recorded or not
  EXPECT_FALSE(keel::detail::hasObservers());        // the finished recorder left nothing behind
}

// A backlog of one byte: with the block policy every tensor still gets its checksum (the engine
// hashes the queue itself); with drop, the tensors recorded without one are exactly those counted.
TEST(CaptureHashThread, FullBacklogBlocksOrDropsAsDocumented) {
  auto run = [](DropPolicy policy) {
    auto store = std::make_shared<Store>();
    CaptureOptions opt = hashOptions(true);
    opt.hashBacklogBytes = 1;
    opt.dropPolicy = policy;
    std::vector<double> v(4096, 0.25);
    Recorder rec(std::make_unique<FakeWriter>(store), opt);
    Tensor x = f32(v, {4096});
    for (int i = 0; i < 300; ++i) x = ops::addScalar(x, 1.0);
    rec.finish();
    return std::make_pair(store, rec.counts());
  };
  {
    const auto [store, c] = run(DropPolicy::Block);
    EXPECT_EQ(c.droppedHashes, 0);
    EXPECT_EQ(store->dropped.count("hash"), 0u);
    int64_t tensors = 0;
    for (const auto& op : store->ops)
      for (const auto& t : op.tensors) {
        EXPECT_EQ(t.md5.size(), 32u) << op.name;
        EXPECT_TRUE(t.hasStats);
        ++tensors;
      }
    EXPECT_GE(tensors, 600);
    EXPECT_GT(c.hashedByEngine, 0);  // the engine hashed when the backlog was full
  }
  {
    const auto [store, c] = run(DropPolicy::Drop);
    int64_t missing = 0;
    for (const auto& op : store->ops)
      for (const auto& t : op.tensors) missing += t.md5.empty();
    EXPECT_GT(c.droppedHashes, 0);
    EXPECT_EQ(missing, c.droppedHashes);
    EXPECT_EQ(store->dropped["hash"], c.droppedHashes);
    EXPECT_EQ(store->status, "finished");
  }
}

TEST(CaptureHashThread, LaneCountsAreCheckedAsTheyAreRead) {
  for (int lanes : {0, 1, 8, 16, 32, 48})
    EXPECT_EQ(CaptureOptions::fromJson("{\"hash_lanes\": " + std::to_string(lanes) + "}").hashLanes,
              lanes);
  for (const char* bad : {"4", "-1", "64", "\"16\""})
    EXPECT_THROW(CaptureOptions::fromJson(std::string("{\"hash_lanes\": ") + bad + "}"), Error)
        << bad;
  EXPECT_THROW(CaptureOptions::fromJson("{\"hash_backlog_bytes\": 0}"), Error);
  // A count this CPU cannot run is refused when the recorder starts, naming it.
  for (int lanes : {8, 16, 32, 48}) {
    if (md5LanesSupported(lanes)) continue;
    CaptureOptions opt = hashOptions(true);
    opt.hashLanes = lanes;
    try {
      Recorder rec(std::make_unique<FakeWriter>(std::make_shared<Store>()), opt);
      ADD_FAILURE() << lanes << " lanes accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(lanes) + " MD5 lanes"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace keel::capture
