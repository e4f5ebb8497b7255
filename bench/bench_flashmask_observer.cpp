// What a flashmask_attention forward call costs with no observer, with a do-nothing observer
// (which, like every observer by default, gets the op's mask description), with one that declines
// descriptions, and with the capture recorder (graph only, into a null writer). Wall time per call.
//   keel_bench --benchmark_filter=FlashMaskObserver
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "flashmask/flashmask_geometry.h"
#include "keel/flashmask.h"
#include "keel/observer.h"
#include "keel/ops.h"
#if __has_include("keel/capture/recorder.h")
#include "keel/capture/recorder.h"
#define KEEL_BENCH_HAVE_CAPTURE 1
#endif

namespace {

using namespace keel;
namespace fmk = keel::flashmask;

class NoopObserver : public Observer {};

// Sees every op but asks for no op descriptions (Note [Op descriptions] in keel/observer.h).
class NoDescriptionObserver : public Observer {
 public:
  bool wantsOpDescriptions() const override { return false; }
};

#ifdef KEEL_BENCH_HAVE_CAPTURE
class NullWriter : public storage::Writer {
 public:
  void writeStep(const storage::StepRecord&) override {}
  void writeOp(const storage::OpRecord&) override {}
  void writeStack(const storage::StackRecord&) override {}
  void writeLog(const storage::LogRecord&) override {}
  void writeMem(const storage::MemRecord&) override {}
  void writeDump(const storage::DumpRecord&) override {}
  void setRunStatus(const std::string&) override {}
  void addDropped(const std::string&, int64_t) override {}
  void commit() override {}
  void close() override {}
};
#endif

Tensor rnd(const Shape& s, uint64_t seed) {
  return ops::uniform(s, -1.0, 1.0, seed, 0, DType::Float32, Device(Backend::Cpu));
}

enum Mode { kNone, kNoop, kNoDescription, kCapture, kModes };
const char* const kModeNames[kModes] = {"none_us", "noop_us", "noop_nodesc_us", "capture_us"};

// gpt-mini's attention (B 16, 4 heads of 32, causal) at T = range(0). range(1) = 0: the causal
// diagonal alone, as gpt-mini passes it (no index tensor); 1: a causal-document mask per row
// (int32 [16, 1, T, 1] indices, documents of T/4, T/4 and T/2). Rounds of calls in each mode,
// interleaved so the shared machine's drift hits all of them; the counters are the medians of the
// per-call times of each mode, "describe_us" the time of the mask description alone (Note
// [FlashMask op attributes]), which only observers that want it pay for, and "describe_pct" that
// time as a share of a call with no observer.
void BM_FlashMaskObserver(benchmark::State& st) {
  const int64_t b = 16, t = st.range(0), h = 4, d = 32;
  const bool docs = st.range(1) != 0;
  Tensor q = rnd({b, t, h, d}, 1), k = rnd({b, t, h, d}, 2), v = rnd({b, t, h, d}, 3);
  fmk::Mask m;
  if (docs) {
    m = fmk::causalDocumentRows(std::vector<std::vector<int64_t>>(size_t(b), {t / 4, t / 4, t / 2}),
                                Device(Backend::Cpu));
  } else {
    m.causal = true;
    m.kind = fmk::MaskKind::Causal;
  }
  NoGradGuard ng;
  const int perRound = t <= 128 ? 40 : 2, rounds = t <= 128 ? 15 : 8;
  std::vector<double> perCall[kModes], describe;
  auto timeCalls = [&](std::vector<double>& out) {
    for (int i = 0; i < perRound; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      auto r = ops::flashmaskAttention(q, k, v, m);
      benchmark::DoNotOptimize(r.first.data<float>());
      out.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  Attrs base;  // what ops::flashmaskAttention passes (the kernels' attributes and the kind)
  base.set("causal", m.causal)
      .set("window_size", int64_t(-1))
      .set("dropout", 0.0)
      .set("scale", 0.0)
      .set("seed", int64_t(0))
      .set("offset", int64_t(0))
      .set("mask", fmk::maskKindName(m.kind));
  timeCalls(perCall[kNone]);  // warm-up
  perCall[kNone].clear();
  for (auto _ : st) {
    for (int r = 0; r < rounds; ++r) {
      timeCalls(perCall[kNone]);
      {
        auto obs = std::make_shared<NoopObserver>();
        addObserver(obs);
        timeCalls(perCall[kNoop]);
        removeObserver(obs);
      }
      {
        auto obs = std::make_shared<NoDescriptionObserver>();
        addObserver(obs);
        timeCalls(perCall[kNoDescription]);
        removeObserver(obs);
      }
#ifdef KEEL_BENCH_HAVE_CAPTURE
      {
        capture::CaptureOptions o;  // graph only: no stacks, hashes or statistics
        o.logs = false;
        capture::Recorder rec(std::make_unique<NullWriter>(), o);
        timeCalls(perCall[kCapture]);
        rec.finish();
      }
#endif
      for (int i = 0; i < perRound; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        Attrs a = base;
        detail::flashmask::describeMask(a, q, k, m.startendRowIndices);
        benchmark::DoNotOptimize(a.items().data());
        describe.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
  }
  for (int mode = 0; mode < kModes; ++mode)
    if (!perCall[mode].empty()) st.counters[kModeNames[mode]] = bench::median(perCall[mode]);
  st.counters["describe_us"] = bench::median(describe);
  st.counters["describe_pct"] = 100.0 * bench::median(describe) / bench::median(perCall[kNone]);
  st.SetLabel(std::string("T=") + std::to_string(t) + (docs ? " causal_document" : " causal"));
}
BENCHMARK(BM_FlashMaskObserver)
    ->ArgsProduct({{64, 1024}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
