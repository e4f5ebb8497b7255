// Registers the optimized cpu backend: its kernel table is the one list in kernels.h, checked at
// compile time to cover every op but the views exactly once, each with a variant (kernel_table.h),
// and the functions that report one call's run-time parameters (Note [Kernel identity]).
#include <cblas.h>

#include <string>

#include "cpu_util.h"
#include "dist/collective_kernels.h"
#include "keel/flashmask.h"
#include "kernel_table.h"
#include "kernels.h"

namespace keel::detail {
namespace {

// The instruction set this backend was compiled for (engine/CMakeLists.txt: -march=x86-64-v2,
// none in sanitizer builds); the vec_math loops add a clone picked at load time.
constexpr const char* kIsa =
#if defined(__x86_64__)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
    "x86-64-v4";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
    "x86-64-v3";
#elif defined(__SSE4_2__) && defined(__POPCNT__)
    "x86-64-v2";
#else
    "x86-64";
#endif
#elif defined(__aarch64__)
    "aarch64";
#else
    "generic";
#endif

// "OpenBLAS 0.3.21 Haswell": the library's name and version (the first two words of its
// configuration) and the kernel set it picked for this CPU (Note [OpenBLAS core type]).
const std::string& blasName() {
  static const std::string name = [] {
    std::string config = openblas_get_config() ? openblas_get_config() : "OpenBLAS";
    size_t end = config.find(' ');
    if (end != std::string::npos) end = config.find(' ', end + 1);
    std::string s = config.substr(0, end);
    const char* core = openblas_get_corename();
    if (core && *core) s += std::string(" ") + core;
    return s;
  }();
  return name;
}

// "up to 8 threads": the thread pool's size, the most threads a call's parallelFor uses (the
// results do not depend on it: Note [cpu determinism]).
std::string upToThreads() {
  const int n = numThreads();
  return "up to " + std::to_string(n) + (n == 1 ? " thread" : " threads");
}

// Parameters of every cpu kernel: the ISA and the threads.
std::string paramsThreads(const KernelCtx&) {
  return std::string(kIsa) + ", " + upToThreads();
}

// Kernels whose float32 loops are vec_math's: which clone runs.
std::string paramsVecMath(const KernelCtx&) {
  static const std::string isa = std::string(kIsa) + ", vec_math " + cpu::vecMathClone() + ", ";
  return isa + upToThreads();
}

// matmul: OpenBLAS, its core type and its own threads (it splits a product over M and N).
std::string paramsBlas(const KernelCtx&) {
  const int blas = openblas_get_num_threads();
  return blasName() + ", " + std::to_string(blas) +
         (blas == 1 ? " BLAS thread, " : " BLAS threads, ") + kIsa + ", " + upToThreads();
}

// flashmask_attention (+ backward): the tile shape for the head dim of q (Note [FlashMask tile
// shape]; every tile product runs on one BLAS thread), OpenBLAS and vec_math.
std::string flashmaskParams(const Tensor& q) {
  static const std::string rest =
      ", " + blasName() + ", " + kIsa + ", vec_math " + cpu::vecMathClone() + ", ";
  const keel::flashmask::TileShape ts = keel::flashmask::tileShape(q.dim() == 4 ? q.size(3) : 1);
  return "tiles " + std::to_string(ts.rows) + "x" + std::to_string(ts.cols) + rest + upToThreads();
}
std::string paramsFlashmask(const KernelCtx& c) {
  return flashmaskParams(c.inputs[0]);  // q, k, v[, startend_row_indices]
}
std::string paramsFlashmaskBackward(const KernelCtx& c) {
  return flashmaskParams(c.inputs[1]);  // grad, q, k, v, out, lse, grad_lse[, indices]
}

// Collectives: the MPI library and the group (dist/collective_kernels.h).
std::string paramsCollective(const KernelCtx& c) {
  return collectiveParams(c);
}

constexpr KernelRow kTable[] = {
#define KEEL_X_ROW(op, fn, dtypes, var, params) {OpId::op, cpu::fn, cpu::dtypes, var, params},
    KEEL_CPU_KERNELS(KEEL_X_ROW)
#undef KEEL_X_ROW
};
static_assert(KernelTableCovers<firstBadRow(kTable)>::ok);

}  // namespace

void registerCpuKernels(Registry& r) {
  registerKernelTable(r, Backend::Cpu, kTable);
}

}  // namespace keel::detail
