// matmul on the cuda backend: cuBLAS cublasGemmStridedBatchedEx on the device's stream, batch dims
// broadcast (stride 0). Operands are passed in place whenever their last two dims are row- or
// column-contiguous (a transposed layout becomes an op flag); only other layouts are copied.
// Invariants: float32 accumulation for float32/float16/bfloat16 (one rounding of the 16-bit
// output), float64 for float64; TF32 only when allowTf32(); deterministic (Note [cuda matmul]).
#include <algorithm>
#include <climits>
#include <string>

#include "cuda_util.cuh"
#include "kernels.h"
#include "matmul_layout.h"

namespace keel::cuda {
namespace {

// Note [cuda matmul]
// Keel's tensors are row-major; cuBLAS is column-major. A row-major [r, c] matrix with row stride
// ld is, to cuBLAS, its transpose: a column-major [c, r] matrix with leading dimension ld. So the
// row-major product C = op(A) op(B) (C [m, n], ldc = n) is the column-major product
// C^T = op(B)^T op(A)^T: one call gemm(opB, opA, n, m, k, B, ldb, A, lda, C, n) with the operands
// swapped and each keeping the transpose flag it has in row-major terms (as the cpu backend's
// CblasRowMajor call). An operand stored "column-major" (its last dim strided, the one before it
// unit-stride: a transposed view) flips that flag instead of being copied.
//
// The batch: the output is contiguous, so its batch is one linear run. Each operand's batch
// strides (0 where it broadcasts) are split into a prefix looped on the host and the longest
// suffix on which both operands advance by one fixed stride per batch (stride 0 included), which
// is one cublasGemmStridedBatchedEx call. The common cases (equal batches, a shared weight) are
// one call. When B is shared by the whole batch and A's rows run on through the batch, the batch
// is folded into M (one gemm with M = batch * m), as on cpu.
//
// Numerics and determinism: the handle's math mode is CUBLAS_DEFAULT_MATH (no TF32) with
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (split-K partial sums stay in float32 for the
// 16-bit outputs), CUBLAS_TF32_TENSOR_OP_MATH instead of the default for float32 when
// allowTf32(); the compute type is
// CUBLAS_COMPUTE_32F (CUBLAS_COMPUTE_32F_FAST_TF32 under allowTf32()) for float32, float16 and
// bfloat16 storage, CUBLAS_COMPUTE_64F for float64. Atomics are off (CUBLAS_ATOMICS_NOT_ALLOWED)
// and the handle gets its own workspace on its one stream, the conditions under which cuBLAS
// documents bit-wise reproducible results for a given library version, GPU model and SM count.
// The summation order within each dot product is cuBLAS's (the chosen kernel's tiling).

using detail::MatLayout;
constexpr auto classify = detail::classifyMatrix;  // engine/src/matmul_layout.h

// A contiguous copy of t on its device, enqueued on the stream.
Tensor contiguousCopy(const KernelCtx& c, const Tensor& t, cudaStream_t stream) {
  Tensor out = makeTensor(t.shape(), t.dtype(), t.device());
  copyStrided(c, stream, out.data(), geomOf(out), t.data(), geomOf(t), t.numel(),
              dtypeSize(t.dtype()));
  return out;
}

// One operand as cuBLAS takes it: its device address, the effective row-major transpose flag and
// leading dimension of its trailing matrix, and its strides along the output's batch dims.
struct Operand {
  const char* data = nullptr;
  MatLayout mat;
  bool trans = false;
  Shape batchStrides;  // in elements, aligned to the output batch; 0 = broadcast
  Tensor copy;         // owns a contiguous copy when the layout needed one
};

Operand makeOperand(const KernelCtx& c, const Tensor& t, const Shape& batch, bool transFlag,
                    cudaStream_t stream) {
  Operand op;
  const size_t r = size_t(t.dim());
  const int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  Shape st = t.strides();
  op.data = static_cast<const char*>(t.data());
  op.mat = classify(rows, cols, st[r - 2], st[r - 1]);
  if (!op.mat.ok) {
    op.copy = contiguousCopy(c, t, stream);
    op.data = static_cast<const char*>(op.copy.data());
    st = contiguousStrides(t.shape());
    op.mat = classify(rows, cols, st[r - 2], st[r - 1]);
  }
  op.trans = transFlag != op.mat.colMajor;
  op.batchStrides.assign(batch.size(), 0);
  const size_t lead = batch.size() - (r - 2);
  for (size_t i = 0; i + 2 < r; ++i) op.batchStrides[lead + i] = t.shape()[i] == 1 ? 0 : st[i];
  return op;
}

struct BlasTypes {
  cudaDataType_t storage;
  cublasComputeType_t compute;
  bool doubleScalars;  // alpha/beta as double (CUBLAS_COMPUTE_64F), else float
};

BlasTypes blasTypes(const KernelCtx& c, DType t, bool tf32) {
  switch (t) {
    case DType::Float32:
      return {CUDA_R_32F, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, false};
    case DType::Float64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, true};
    case DType::Float16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, false};
    case DType::BFloat16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false};
    default:
      KEEL_CHECK(false, "op '", c.op.name, "': no cuda kernel for dtype ", dtypeName(t));
  }
  return {};
}

std::string describe(const KernelCtx& c, const char* call, bool ta, bool tb) {
  return std::string(call) + " for op '" + c.op.name + "' " + shapeStr(c.inputs[0].shape()) +
         (ta ? "^T" : "") + " x " + shapeStr(c.inputs[1].shape()) + (tb ? "^T" : "") + " (" +
         std::string(dtypeName(c.inputs[0].dtype())) + ")";
}

void checkFitsInt(const KernelCtx& c, int64_t v, const char* what) {
  KEEL_CHECK(v <= INT_MAX, "op '", c.op.name, "': ", what, " ", v,
             " exceeds cuBLAS's int range for ", shapeStr(c.inputs[0].shape()), " x ",
             shapeStr(c.inputs[1].shape()));
}

}  // namespace

void kMatmul(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1], &out = c.outputs[0];
  const bool ta = c.attrs.getBool("trans_a"), tb = c.attrs.getBool("trans_b");
  KEEL_CHECK(a.dim() >= 2 && b.dim() >= 2 && out.dim() >= 2, "op '", c.op.name,
             "': operands must have rank >= 2");
  KEEL_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "op '", c.op.name,
             "': dtypes differ");
  DeviceCtx& ctx = deviceCtx(c);
  const Shape& os = out.shape();
  const size_t r = os.size();
  const Shape batch(os.begin(), os.end() - 2);
  const int64_t m = os[r - 2], n = os[r - 1];
  const int64_t k = ta ? a.size(-2) : a.size(-1);
  const int64_t nb = shapeNumel(batch);
  if (out.numel() == 0) return;
  if (k == 0) {  // empty sum: zeros (all-zero bits are 0.0 in every float dtype)
    check(cudaMemsetAsync(out.data(), 0, out.nbytes(), ctx.stream), "matmul (k = 0) memset",
          ctx.index);
    return;
  }

  const bool tf32 = allowTf32() && a.dtype() == DType::Float32;
  const BlasTypes types = blasTypes(c, a.dtype(), tf32);
  const size_t elem = dtypeSize(a.dtype());
  Operand A = makeOperand(c, a, batch, ta, ctx.stream);
  Operand B = makeOperand(c, b, batch, tb, ctx.stream);

  // Handle state (Note [cuda matmul]); cheap host-side settings, made on every call since the
  // handle is shared by the device's ops.
  auto blas = [&](cublasStatus_t s, const char* call) {
    if (s != CUBLAS_STATUS_SUCCESS) checkBlas(s, describe(c, call, ta, tb).c_str(), ctx.index);
  };
  blas(cublasSetStream(ctx.blas, ctx.stream), "cublasSetStream");
  if (ctx.blasWorkspace)
    blas(cublasSetWorkspace(ctx.blas, ctx.blasWorkspace, kBlasWorkspace), "cublasSetWorkspace");
  const int mathMode = (tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                       CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  blas(cublasSetMathMode(ctx.blas, cublasMath_t(mathMode)), "cublasSetMathMode");
  blas(cublasSetAtomicsMode(ctx.blas, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  blas(cublasSetPointerMode(ctx.blas, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");

  const float oneF = 1.0f, zeroF = 0.0f;
  const double oneD = 1.0, zeroD = 0.0;
  const void* alpha = types.doubleScalars ? static_cast<const void*>(&oneD) : &oneF;
  const void* beta = types.doubleScalars ? static_cast<const void*>(&zeroD) : &zeroF;
  checkFitsInt(c, n, "N");
  checkFitsInt(c, k, "K");
  checkFitsInt(c, A.mat.ld, "leading dimension");
  checkFitsInt(c, B.mat.ld, "leading dimension");

  // Row-major C[rows, n] (+ p * strideC) = op(A) op(B) as the column-major C^T = op(B)^T op(A)^T.
  auto gemm = [&](int64_t rows, const char* pa, int64_t strideA, const char* pb, int64_t strideB,
                  char* pc, int64_t strideC, int64_t count) {
    checkFitsInt(c, rows, "M");
    checkFitsInt(c, count, "batch count");
    blas(cublasGemmStridedBatchedEx(
             ctx.blas, B.trans ? CUBLAS_OP_T : CUBLAS_OP_N, A.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
             int(n), int(rows), int(k), alpha, pb, types.storage, int(B.mat.ld), (long long)strideB,
             pa, types.storage, int(A.mat.ld), (long long)strideA, beta, pc, types.storage, int(n),
             (long long)strideC, int(count), types.compute, CUBLAS_GEMM_DEFAULT),
         "cublasGemmStridedBatchedEx");
  };
  char* pc = static_cast<char*>(out.data());

  // Drop the size-1 batch dims (both operands' strides there are 0 and do not matter).
  Shape bd, sa, sb;
  for (size_t d = 0; d < batch.size(); ++d)
    if (batch[d] != 1) {
      bd.push_back(batch[d]);
      sa.push_back(A.batchStrides[d]);
      sb.push_back(B.batchStrides[d]);
    }
  const size_t nd = bd.size();

  // Fold the batch into M when B is shared and A's rows run on through the batch.
  if (nd > 0 && !A.trans && m * nb <= INT_MAX &&
      std::all_of(sb.begin(), sb.end(), [](int64_t s) { return s == 0; })) {
    bool fold = true;
    int64_t expect = m * A.mat.ld;
    for (size_t d = nd; d-- > 0;) {
      if (sa[d] != expect) fold = false;
      expect *= bd[d];
    }
    if (fold) {
      gemm(nb * m, A.data, 0, B.data, 0, pc, 0, 1);
      return;
    }
  }

  // The longest suffix of batch dims along which both operands (and the contiguous output)
  // advance by a fixed stride: one strided-batched call; the prefix is looped here.
  size_t split = nd;  // dims [split, nd) form the suffix
  int64_t count = 1;
  int64_t strideA = 0, strideB = 0;
  if (nd > 0) {
    split = nd - 1;
    count = bd[nd - 1];
    strideA = sa[nd - 1];
    strideB = sb[nd - 1];
    while (split > 0 && sa[split - 1] == strideA * count && sb[split - 1] == strideB * count) {
      --split;
      count *= bd[split];
    }
  }
  const int64_t strideC = m * n;
  int64_t outer = 1;
  for (size_t d = 0; d < split; ++d) outer *= bd[d];
  for (int64_t p = 0; p < outer; ++p) {
    int64_t oa = 0, ob = 0, rem = p;
    for (size_t d = split; d-- > 0;) {
      const int64_t i = rem % bd[d];
      rem /= bd[d];
      oa += i * sa[d];
      ob += i * sb[d];
    }
    gemm(m, A.data + oa * int64_t(elem), strideA, B.data + ob * int64_t(elem), strideB,
         pc + p * count * strideC * int64_t(elem), strideC, count);
  }
}

}  // namespace keel::cuda
