// FlashMask attention on `cpu`: each benchmark measures one of issue 6's ratios inside one process
// (both sides timed back to back, best of several repetitions, so the shared machine's noise hits
// both) and reports it as a counter next to its goal. Wall-clock time; float32; B = 1.
//   keel_bench --benchmark_filter=FlashMask
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>

#include "keel/flashmask.h"
#include "keel/ops.h"
#include "keel/train.h"

namespace {

using namespace keel;
namespace fmk = keel::flashmask;
using Clock = std::chrono::steady_clock;

// Best wall time of fn over at least `reps` runs and `minSecs` seconds (after one warm-up).
double bestTime(const std::function<void()>& fn, int reps = 3, double minSecs = 0.3) {
  fn();
  double best = 1e30, total = 0;
  for (int i = 0; i < reps || total < minSecs; ++i) {
    auto t0 = Clock::now();
    fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
    if (i > 50) break;
  }
  return best;
}

Tensor rnd(const Shape& s, uint64_t seed) {
  return ops::uniform(s, -1.0, 1.0, seed, 0, DType::Float32, Device(Backend::Cpu));
}

struct Qkv {
  Tensor q, k, v;
  Qkv(int64_t n, int64_t h, int64_t d)
      : q(rnd({1, n, h, d}, 1)), k(rnd({1, n, h, d}, 2)), v(rnd({1, n, h, d}, 3)) {}
};

double forwardTime(const Qkv& x, const fmk::Mask* m) {
  NoGradGuard ng;
  Tensor idx = m ? m->startendRowIndices : Tensor();
  bool causal = m && m->causal;
  return bestTime([&] { ops::flashmaskAttention(x.q, x.k, x.v, idx, causal); });
}

fmk::Mask maskFor(const std::string& kind, int64_t n) {
  if (kind == "full") return fmk::full(n);
  if (kind == "causal") return fmk::causal(n);
  if (kind == "sliding_window") return fmk::slidingWindow(n, n / 16);
  if (kind == "causal_document") return fmk::causalDocument({n / 4, n / 8, n / 2, n / 8});
  if (kind == "document") return fmk::document({n / 4, n / 8, n / 2, n / 8});
  if (kind == "shared_question") return fmk::sharedQuestion(n / 8, {n / 4, n / 4, n / 4, n / 8});
  if (kind == "global_sliding_window") return fmk::globalSlidingWindow(n, n / 32, n / 16);
  if (kind == "causal_blockwise") return fmk::causalBlockwise({n / 4, n / 4, n / 4, n / 4});
  if (kind == "prefix_lm_document") return fmk::prefixLmDocument({n / 2, n / 2}, {n / 8, n / 8});
  if (kind == "prefix_lm_causal") return fmk::prefixLmCausal(n, n / 4);
  if (kind == "qk_sparse") return fmk::qkSparse(n, {{n / 8, n / 2, n / 2, n}});
  return fmk::randomEviction(n, 7, 4);
}

// One timed iteration in milliseconds: each benchmark repeats and takes the best itself (bestTime).
void oneShot(benchmark::internal::Benchmark* b) {
  b->Iterations(1)->Unit(benchmark::kMillisecond);
}

// Reports two times in milliseconds and the ratio a / b against its goal (at most goalLe).
void reportRatio(benchmark::State& st, const char* aMs, double a, const char* bMs, double b,
                 double goalLe) {
  st.counters[aMs] = a * 1e3;
  st.counters[bMs] = b * 1e3;
  st.counters["ratio"] = a / b;
  st.counters["goal_le"] = goalLe;
}

// ---- full mask vs no mask argument (goal <= 1.05)
void BM_FlashMask_FullVsNoMask(benchmark::State& st) {
  const int64_t n = st.range(0), d = st.range(1);
  Qkv x(n, 2, d);
  fmk::Mask full = fmk::full(n);
  double tFull = 0, tNone = 0;
  for (auto _ : st) {
    tNone = forwardTime(x, nullptr);
    tFull = forwardTime(x, &full);
  }
  reportRatio(st, "t_full_ms", tFull, "t_nomask_ms", tNone, 1.05);
}
BENCHMARK(BM_FlashMask_FullVsNoMask)->Args({2048, 64})->Apply(oneShot);

// ---- sparsity proportionality at N = 4096: T_mask / T_full <= 1.5 (1 - rho) + 0.02; causal <=
// 0.55
void BM_FlashMask_Sparsity(benchmark::State& st) {
  static const char* const kinds[] = {"causal_document", "document", "shared_question",
                                      "sliding_window", "causal"};
  const std::string kind = kinds[st.range(0)];
  const int64_t n = 4096, d = st.range(1);
  Qkv x(n, 1, d);
  fmk::Mask full = fmk::full(n), m = maskFor(kind, n);
  double tFull = 0, tMask = 0;
  for (auto _ : st) {
    tFull = forwardTime(x, &full);
    tMask = forwardTime(x, &m);
  }
  const double rho = fmk::countTiles(m.startendRowIndices, m.causal, n, n, -1, fmk::tileShape(d))
                         .skippedFraction();
  const double ratio = tMask / tFull;
  const double goal = kind == "causal" ? 0.55 : 1.5 * (1 - rho) + 0.02;
  st.SetLabel(kind);
  st.counters["rho"] = rho;
  st.counters["ratio"] = ratio;
  st.counters["goal_le"] = goal;
  st.counters["met"] = ratio <= goal;
}
BENCHMARK(BM_FlashMask_Sparsity)->ArgsProduct({{0, 1, 2, 3, 4}, {64, 128}})->Apply(oneShot);

// ---- backward / forward (goal <= 3.0), causal-document mask
void BM_FlashMask_BackwardVsForward(benchmark::State& st) {
  const int64_t n = st.range(0), d = st.range(1);
  fmk::Mask m = maskFor("causal_document", n);
  Tensor q = rnd({1, n, 2, d}, 1), k = rnd({1, n, 2, d}, 2), v = rnd({1, n, 2, d}, 3);
  Attrs a;
  a.set("causal", true);
  std::vector<Tensor> o;
  {
    NoGradGuard ng;
    o = dispatch(OpId::FlashmaskAttention, {q, k, v, m.startendRowIndices}, a);
  }
  Tensor g = rnd({1, n, 2, d}, 4), gl = ops::fill({1, 2, n}, 0.0);
  double tf = 0, tb = 0;
  for (auto _ : st) {
    NoGradGuard ng;
    tf = bestTime([&] { dispatch(OpId::FlashmaskAttention, {q, k, v, m.startendRowIndices}, a); });
    tb = bestTime([&] {
      dispatch(OpId::FlashmaskAttentionBackward, {g, q, k, v, o[0], o[1], gl, m.startendRowIndices},
               a);
    });
  }
  reportRatio(st, "t_bwd_ms", tb, "t_fwd_ms", tf, 3.0);
}
BENCHMARK(BM_FlashMask_BackwardVsForward)->Args({2048, 64})->Apply(oneShot);

// ---- two threads vs one on a skewed causal-document mask (goal >= 1.8), one head
void BM_FlashMask_TwoThreadsVsOne(benchmark::State& st) {
  const int64_t n = 4096, d = 64;
  Qkv x(n, 1, d);
  // One long document then many short ones: the long one's tiles dominate.
  std::vector<int64_t> docs{3072};
  for (int i = 0; i < 16; ++i) docs.push_back(64);
  fmk::Mask m = fmk::causalDocument(docs);
  const int before = cpuThreads();
  double t1 = 0, t2 = 0;
  for (auto _ : st) {
    setCpuThreads(1);
    t1 = forwardTime(x, &m);
    setCpuThreads(2);
    t2 = forwardTime(x, &m);
  }
  setCpuThreads(before);
  st.counters["t_1thread_ms"] = t1 * 1e3;
  st.counters["t_2threads_ms"] = t2 * 1e3;
  st.counters["speedup"] = t1 / t2;
  st.counters["goal_ge"] = 1.8;
}
BENCHMARK(BM_FlashMask_TwoThreadsVsOne)->Apply(oneShot);

// ---- full-mask forward GFLOP/s vs cblas_sgemm at the Q·K^T shape (goal >= 0.5), one thread each
void BM_FlashMask_VsSgemm(benchmark::State& st) {
  const int64_t n = st.range(0), d = st.range(1);
  Qkv x(n, 1, d);
  fmk::Mask full = fmk::full(n);
  std::vector<float> a(size_t(n * d), 0.01f), b(size_t(n * d), 0.02f), c(size_t(n * n));
  const int before = cpuThreads();
  double tf = 0, tg = 0;
  for (auto _ : st) {
    setCpuThreads(1);
    openblas_set_num_threads(1);
    tf = forwardTime(x, &full);
    tg = bestTime([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(d), 1.0f, a.data(),
                  int(d), b.data(), int(d), 0.0f, c.data(), int(n));
    });
  }
  setCpuThreads(before);
  openblas_set_num_threads(before);
  const double attnFlops = 4.0 * double(n) * double(n) * double(d);  // two products
  const double gemmFlops = 2.0 * double(n) * double(n) * double(d);
  st.counters["attn_gflops"] = attnFlops / tf * 1e-9;
  st.counters["sgemm_gflops"] = gemmFlops / tg * 1e-9;
  st.counters["ratio"] = (attnFlops / tf) / (gemmFlops / tg);
  st.counters["goal_ge"] = 0.5;
}
BENCHMARK(BM_FlashMask_VsSgemm)->Args({4096, 64})->Args({4096, 128})->Apply(oneShot);

// ---- against attention over a dense N x N mask (ops: matmul, masked_fill, softmax, matmul)
Tensor denseAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                      double scale) {
  Tensor qh = ops::permute(q, {0, 2, 1, 3}), kh = ops::permute(k, {0, 2, 1, 3});
  Tensor s = ops::mulScalar(ops::matmul(qh, kh, false, true), scale);
  Tensor p = ops::softmax(ops::maskedFill(s, mask, -1e30), -1);
  return ops::permute(ops::matmul(p, ops::permute(v, {0, 2, 1, 3})), {0, 2, 1, 3});
}

Tensor denseMask(const fmk::Mask& m, int64_t n) {
  std::vector<uint8_t> vis = fmk::denseVisibility(m.startendRowIndices, m.causal, n, n, -1);
  std::vector<int32_t> masked(vis.size());
  for (size_t i = 0; i < vis.size(); ++i) masked[i] = vis[i] ? 0 : 1;
  return Tensor::fromVector<int32_t>(masked, {1, 1, n, n}, DType::Bool, Device(Backend::Cpu));
}

void BM_FlashMask_VsDenseMask(benchmark::State& st) {
  const std::string kind = fmk::maskKindName(fmk::MaskKind(st.range(0)));
  const int64_t n = 4096, d = 64;
  Qkv x(n, 1, d);
  fmk::Mask m = maskFor(kind, n);
  Tensor dm = denseMask(m, n);
  double tf = 0, td = 0;
  for (auto _ : st) {
    tf = forwardTime(x, &m);
    NoGradGuard ng;
    td = bestTime([&] { denseAttention(x.q, x.k, x.v, dm, 1.0 / 8.0); }, 2, 0.0);
  }
  st.SetLabel(kind);
  st.counters["t_flashmask_ms"] = tf * 1e3;
  st.counters["t_dense_ms"] = td * 1e3;
  st.counters["speedup"] = td / tf;
}
BENCHMARK(BM_FlashMask_VsDenseMask)->DenseRange(0, 11)->Apply(oneShot);

// ---- peak memory (resident high-water mark growth over the call, forward + backward) as N doubles
int64_t readKb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size()));
  return 0;
}
int64_t peakGrowthKb(const std::function<void()>& fn) {
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
  const int64_t before = readKb("VmRSS:");
  fn();
  return readKb("VmHWM:") - before;
}

void BM_FlashMask_PeakMemory(benchmark::State& st) {
  const int64_t n = st.range(0), d = 64;
  const bool dense = st.range(1) != 0;
  int64_t kb = 0;
  for (auto _ : st) {
    Qkv x(n, 1, d);
    fmk::Mask m = maskFor("causal_document", n);
    x.q.setRequiresGrad(true);
    x.k.setRequiresGrad(true);
    x.v.setRequiresGrad(true);
    Tensor w = rnd({1, n, 1, d}, 9);
    Tensor dm = dense ? denseMask(m, n) : Tensor();
    kb = peakGrowthKb([&] {
      Tensor o = dense ? denseAttention(x.q, x.k, x.v, dm, 0.125)
                       : ops::flashmaskAttention(x.q, x.k, x.v, m.startendRowIndices, true).first;
      ops::sum(ops::mul(o, w)).backward();
    });
  }
  st.SetLabel(dense ? "dense_mask" : "flashmask");
  st.counters["peak_growth_MiB"] = double(kb) / 1024.0;
}
BENCHMARK(BM_FlashMask_PeakMemory)
    ->ArgsProduct({{1024, 2048, 4096, 8192}, {0}})
    ->ArgsProduct({{1024, 2048, 4096}, {1}})
    ->Apply(oneShot);

}  // namespace
