// keel_bench_cuda: the CUDA backend's figures (issue 17), each a ratio measured inside one process
// on the same device, same inputs, back to back: matmul against a direct cuBLAS call, FlashMask
// attention's TFLOP/s counted on the tiles it does not skip, and the skipped share against the
// mask's sparsity. Times are device time by CUDA events around a batch of calls on Keel's stream
// (best of 5 batches after a warm-up). Without a CUDA device every benchmark reports an error row.
//   keel_bench_cuda [--benchmark_filter=Matmul|FlashMask] [--benchmark_format=json]
// PyTorch's FlexAttention and SDPA figures come from bench/torch_flashmask.py; scripts/gpu-check
// runs both and writes the report.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <string>

#include "flashmask_plan.h"
#include "keel/dispatch.h"
#include "keel/flashmask.h"
#include "keel/ops.h"
#include "runtime.h"

namespace {

using namespace keel;
namespace fmk = keel::flashmask;
const Device kCuda{Backend::Cuda, 0};

bool haveDevice(benchmark::State& st) {
  if (cudaDevices() > 0) return true;
  st.SkipWithError("no CUDA device");
  return false;
}

// Seconds per call of fn on `stream`: events around `reps` calls, best of 5 batches.
double deviceTime(cudaStream_t stream, int reps, const std::function<void()>& fn) {
  fn();
  cuda::synchronize(0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int batch = 0; batch < 5; ++batch) {
    cudaEventRecord(a, stream);
    for (int i = 0; i < reps; ++i) fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(best) / 1e3 / reps;
}

// ---------------------------------------------------------------- matmul vs direct cuBLAS
void matmulBench(benchmark::State& st, DType dt, int64_t m, int64_t k, int64_t n) {
  if (!haveDevice(st)) return;
  NoGradGuard ng;
  Tensor a = ops::uniform({m, k}, -1, 1, 1, 0, dt, kCuda);
  Tensor b = ops::uniform({k, n}, -1, 1, 2, 0, dt, kCuda);
  Tensor c = ops::matmul(a, b);
  cuda::DeviceCtx& ctx = cuda::deviceCtx(0);
  const cudaDataType_t t = dt == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1, zero = 0;
  // The same product as one cublasGemmEx (row-major C = A B as column-major C^T = B^T A^T).
  auto direct = [&] {
    cublasGemmEx(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b.data(), t,
                 int(n), a.data(), t, int(k), &zero, c.data(), t, int(n), CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  const int reps = m * n * k > (int64_t(1) << 30) ? 10 : 200;
  double keelS = 0, blasS = 0;
  for (auto _ : st) {
    keelS = deviceTime(ctx.stream, reps, [&] { ops::matmul(a, b); });
    blasS = deviceTime(ctx.stream, reps, direct);
    st.SetIterationTime(keelS);
  }
  const double flops = 2.0 * double(m) * double(n) * double(k);
  st.counters["keel_TFLOPs"] = flops / keelS / 1e12;
  st.counters["cublas_TFLOPs"] = flops / blasS / 1e12;
  st.counters["ratio"] = blasS / keelS;  // goal >= 0.95
}

// ---------------------------------------------------------------- FlashMask
fmk::Mask maskFor(const std::string& kind, int64_t s) {
  if (kind == "causal") return fmk::causal(s, kCuda);
  if (kind == "sliding_window") return fmk::slidingWindow(s, s / 8, kCuda);
  if (kind == "causal_document") {
    std::vector<int64_t> docs(8, s / 8);
    docs.back() += s - 8 * (s / 8);
    return fmk::causalDocument(docs, kCuda);
  }
  if (kind == "shared_question") {
    const int64_t q = s / 4, a = (s - q) / 3;
    return fmk::sharedQuestion(q, {a, a, s - q - 2 * a}, kCuda);
  }
  return fmk::globalSlidingWindow(s, s / 64, s / 8, kCuda);  // global_sliding_window
}

void flashmaskBench(benchmark::State& st, const std::string& kind, int64_t s, int64_t d,
                    bool backward) {
  if (!haveDevice(st)) return;
  const int64_t h = 2048 / d;  // model width 2048: 32 heads of 64 or 16 of 128
  const DType dt = DType::BFloat16;
  Tensor q = ops::uniform({1, s, h, d}, -1, 1, 1, 0, dt, kCuda);
  Tensor k = ops::uniform({1, s, h, d}, -1, 1, 2, 0, dt, kCuda);
  Tensor v = ops::uniform({1, s, h, d}, -1, 1, 3, 0, dt, kCuda);
  fmk::Mask mask = maskFor(kind, s);
  cuda::DeviceCtx& ctx = cuda::deviceCtx(0);
  Tensor dout = ops::uniform({1, s, h, d}, -1, 1, 4, 0, dt, kCuda);
  auto run = [&] {
    if (!backward) {
      NoGradGuard ng;
      ops::flashmaskAttention(q, k, v, mask.startendRowIndices, mask.causal);
      return;
    }
    Tensor qq = q.detach().setRequiresGrad(), kk = k.detach().setRequiresGrad(),
           vv = v.detach().setRequiresGrad();
    ops::flashmaskAttention(qq, kk, vv, mask.startendRowIndices, mask.causal).first.backward(dout);
  };
  double secs = 0;
  for (auto _ : st) {
    secs = deviceTime(ctx.stream, 3, run);
    st.SetIterationTime(secs);
  }
  // FLOPs on the tiles the kernel computes (partial + unmasked): 4 Br Bc d per tile forward (QK^T
  // and PV), 2.5x that for forward + backward (the recomputed QK^T, dV, dP, dS Q, dS K).
  Tensor hostIdx = mask.startendRowIndices.to(Device(Backend::Cpu));
  const fmk::TileCounts tc = cuda::fmplan::countTiles(hostIdx, mask.causal, s, s, -1, d, dt);
  const fmk::TileShape ts = cuda::fmplan::tileShape(d, dt);
  const double tileFlops = 4.0 * double(ts.rows * ts.cols) * double(d) * double(h);
  const double flops = double(tc.partial + tc.unmasked) * tileFlops * (backward ? 3.5 : 1.0);
  st.counters["TFLOPs"] = flops / secs / 1e12;
  st.counters["skipped_share"] = tc.skippedFraction();
  // The mask's sparsity from its dense form at 8k (the masks scale with S: the same fractions).
  const int64_t ds = std::min<int64_t>(s, 8192);
  const fmk::Mask small = maskFor(kind, ds);
  const std::vector<uint8_t> dense = fmk::denseVisibility(
      small.startendRowIndices.to(Device(Backend::Cpu)), small.causal, ds, ds, -1);
  int64_t visible = 0;
  for (uint8_t x : dense) visible += x;
  st.counters["mask_sparsity"] = 1.0 - double(visible) / double(dense.size());
}

void registerAll() {
  struct Mm {
    const char* name;
    int64_t m, k, n;
  };
  // gpt-mini (configs/gpt-mini.json): batch 16 x seq 64 tokens, d_model 128, d_ff 384.
  const Mm shapes[] = {{"4096^3", 4096, 4096, 4096},
                       {"gpt-mini_qkv", 1024, 128, 384},
                       {"gpt-mini_ff_up", 1024, 128, 384},
                       {"gpt-mini_ff_down", 1024, 384, 128},
                       {"gpt-mini_head", 1024, 128, 256}};
  for (DType dt : {DType::Float32, DType::BFloat16})
    for (const Mm& s : shapes)
      benchmark::RegisterBenchmark(
          ("Matmul/" + std::string(dtypeName(dt)) + "/" + s.name).c_str(),
          [dt, s](benchmark::State& st) { matmulBench(st, dt, s.m, s.k, s.n); })
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
  for (bool bwd : {false, true})
    for (int64_t d : {64, 128})
      for (int64_t s : {8192, 32768})
        for (const char* kind : {"causal", "sliding_window", "causal_document", "shared_question",
                                 "global_sliding_window"})
          benchmark::RegisterBenchmark(
              ("FlashMask/" + std::string(bwd ? "fwd_bwd" : "fwd") + "/d" + std::to_string(d) +
               "/s" + std::to_string(s) + "/" + kind)
                  .c_str(),
              [kind, s, d, bwd](benchmark::State& st) { flashmaskBench(st, kind, s, d, bwd); })
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
