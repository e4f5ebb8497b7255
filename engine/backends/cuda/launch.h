// Launch configurations of the cuda kernels: plain arithmetic, no CUDA headers, so the host tests
// (tests/engine/gpu_plan_test.cpp) check them on machines without a GPU. Invariant: every plan
// covers its whole problem — grid-stride loops take what the grid does not.
#pragma once
#include <algorithm>
#include <cstdint>

namespace keel::cuda {

// Elementwise kernels: blocks of `threads`, each thread looping with the grid's stride; at most
// kMaxBlocks blocks (enough to fill an H200's 132 SMs many times over; more only adds scheduling).
inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 132 * 32;

struct Launch1D {
  unsigned blocks = 1;
  unsigned threads = kThreads;
};
constexpr Launch1D launch1D(int64_t n, int threads = kThreads) {
  const int64_t blocks = std::clamp<int64_t>((n + threads - 1) / threads, 1, kMaxBlocks);
  return {unsigned(blocks), unsigned(threads)};
}

// Row kernels (softmax, norms, cross-entropy, reductions over the last dim): one block per row,
// threads a multiple of the warp (32) covering the row at most once, 32 to 1024. Rows beyond the
// grid's first dimension loop (grid-stride over rows).
struct RowLaunch {
  unsigned blocks = 1;
  unsigned threads = 32;
};
constexpr RowLaunch rowLaunch(int64_t rows, int64_t cols) {
  int64_t t = 32;
  while (t < cols && t < 1024) t *= 2;
  return {unsigned(std::clamp<int64_t>(rows, 1, 65535)), unsigned(t)};
}

// Reductions of a tensor viewed as [outer, n, inner] over n (Note [cuda reduction order] in
// reduce.cu): one thread per (outer, inner) output when inner is wide, else one block per output.
// The order of every sum is fixed by the plan, which depends only on the shape, never on the
// device or timing: two runs give the same bits.
struct ReducePlan {
  bool blockPerOutput = false;  // true: a block's threads split n, combined in a fixed tree
  unsigned blocks = 1;
  unsigned threads = kThreads;
};
constexpr ReducePlan reducePlan(int64_t outer, int64_t n, int64_t inner) {
  const int64_t outputs = std::max<int64_t>(outer * inner, 1);
  if (inner == 1 && n >= 64) {
    const RowLaunch r = rowLaunch(outputs, n);
    return {true, r.blocks, r.threads};
  }
  const Launch1D l = launch1D(outputs);
  return {false, l.blocks, l.threads};
}

}  // namespace keel::cuda
