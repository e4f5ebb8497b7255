// The cuda backend's kernel table (kernels.h's list, one row per op, checked complete at compile
// time like the cpu backends') and the run-time parameters each call records.
#include <cublas_v2.h>

#include "dist/collective_kernels.h"
#include "flashmask_plan.h"
#include "keel/flashmask.h"
#include "kernels.h"
#include "runtime.h"

namespace keel::cuda {

std::string paramsDevice(const KernelCtx& c) {
  return deviceParams(c);
}

// matmul: the cuBLAS version and whether float32 may use TF32 tensor cores.
std::string paramsBlas(const KernelCtx& c) {
  static const std::string lib = [] {
    int v = 0;
    cublasGetProperty(MAJOR_VERSION, &v);
    int mi = 0, pa = 0;
    cublasGetProperty(MINOR_VERSION, &mi);
    cublasGetProperty(PATCH_LEVEL, &pa);
    return "cuBLAS " + std::to_string(v) + "." + std::to_string(mi) + "." + std::to_string(pa);
  }();
  return lib + (allowTf32() ? ", TF32 allowed" : ", TF32 off") + ", " + deviceParams(c);
}

// flashmask_attention (+ backward): the tile shape the cuda kernels run for q's head dim and
// dtype (flashmask_plan.h), FMA tiles, and the device.
std::string flashmaskParams(const KernelCtx& c, const Tensor& q, bool backward) {
  const keel::flashmask::TileShape t =
      fmplan::tileShape(q.dim() == 4 ? q.size(3) : 1, q.dtype(), backward);
  return "tiles " + std::to_string(t.rows) + "x" + std::to_string(t.cols) + ", " + deviceParams(c);
}
std::string paramsFlashmask(const KernelCtx& c) {
  return flashmaskParams(c, c.inputs[0], false);  // q, k, v[, startend_row_indices]
}
std::string paramsFlashmaskBackward(const KernelCtx& c) {
  return flashmaskParams(c, c.inputs[1], true);  // grad, q, k, v, out, lse, grad_lse[, indices]
}

std::string paramsCollective(const KernelCtx& c) {
  return "staged through the host, " + keel::detail::collectiveParams(c);
}

namespace {
using keel::detail::KernelRow;
constexpr KernelRow kTable[] = {
#define KEEL_X_ROW(op, fn, dtypes, var, params) {OpId::op, fn, dtypes, var, params},
    KEEL_CUDA_KERNELS(KEEL_X_ROW)
#undef KEEL_X_ROW
};
static_assert(keel::detail::KernelTableCovers<keel::detail::firstBadRow(kTable)>::ok);
}  // namespace

void registerKernels(Registry& r) {
  keel::detail::registerKernelTable(r, Backend::Cuda, kTable);
}

}  // namespace keel::cuda
