// The cuda backend's kernels, one line each: X(OpId, kernel, dtypes, variant, params), as the cpu
// backend's list (backends/cpu/kernels.h): the list declares every kernel and is register.cpp's
// table. Each kernel is defined in the file its group names, follows KernelFn (contiguous fresh
// outputs on the op's device, inputs of any layout on the same device) and only enqueues work on
// its device's stream (runtime.h); nothing waits for the device. The dtypes are the cpu backend's.
// Variants (Note [Kernel variant vocabulary]): "float32" is the compute type for float32 and the
// 16-bit floats (float64 for float64), as on cpu; every reduction's order is fixed by the shape
// (Note [cuda reduction order]), so two runs give the same bits.
#pragma once
#include "keel/registry.h"
#include "kernel_table.h"

namespace keel::cuda {

inline constexpr DTypeMask kF = kFloatTypes, kFI = kFloatTypes | kIntTypes, kAll = kAllTypes;
namespace variant = keel::detail::variant;

// Parameters of one call (register.cpp): the device, and what else decides the kernel's plan.
std::string paramsDevice(const KernelCtx& c);
std::string paramsBlas(const KernelCtx& c);
std::string paramsFlashmask(const KernelCtx& c);
std::string paramsFlashmaskBackward(const KernelCtx& c);
std::string paramsCollective(const KernelCtx& c);

// clang-format off
#define KEEL_CUDA_KERNELS(X) \
  /* elementwise.cu */ \
  X(Add, kAdd, kFI, variant::kCorrectlyRounded, paramsDevice) \
  X(Sub, kSub, kFI, variant::kCorrectlyRounded, paramsDevice) \
  X(Mul, kMul, kFI, variant::kCorrectlyRounded, paramsDevice) \
  X(Div, kDiv, kF, variant::kCorrectlyRounded, paramsDevice) \
  X(Pow, kPow, kF, "CUDA powf in float32", paramsDevice) \
  X(Maximum, kMaximum, kFI, variant::kSelect, paramsDevice) \
  X(Minimum, kMinimum, kFI, variant::kSelect, paramsDevice) \
  X(Eq, kEq, kAll, variant::kCompare, paramsDevice) \
  X(Lt, kLt, kFI, variant::kCompare, paramsDevice) \
  X(Gt, kGt, kFI, variant::kCompare, paramsDevice) \
  X(Neg, kNeg, kFI, variant::kExactElementwise, paramsDevice) \
  X(Exp, kExp, kF, "CUDA expf in float32", paramsDevice) \
  X(Log, kLog, kF, "CUDA logf in float32", paramsDevice) \
  X(Sqrt, kSqrt, kF, variant::kCorrectlyRounded, paramsDevice) \
  X(Rsqrt, kRsqrt, kF, "1/sqrt in float32, two roundings", paramsDevice) \
  X(Tanh, kTanh, kF, "CUDA tanhf in float32", paramsDevice) \
  X(Sigmoid, kSigmoid, kF, "1/(1+expf(-x)), CUDA expf in float32", paramsDevice) \
  X(Relu, kRelu, kFI, variant::kSelect, paramsDevice) \
  X(Gelu, kGelu, kF, "CUDA erfcf in float32", paramsDevice) \
  X(Silu, kSilu, kF, "x/(1+expf(-x)), CUDA expf in float32", paramsDevice) \
  X(Abs, kAbs, kFI, variant::kExactElementwise, paramsDevice) \
  X(GeluBackward, kGeluBackward, kF, "CUDA erfcf and expf in float32", paramsDevice) \
  X(SiluBackward, kSiluBackward, kF, "sigmoid by CUDA expf in float32", paramsDevice) \
  X(AddScalar, kAddScalar, kFI, variant::kFloat64Once, paramsDevice) \
  X(MulScalar, kMulScalar, kFI, variant::kFloat64Once, paramsDevice) \
  X(PowScalar, kPowScalar, kF, "float64: x, x*x, x*x*x, sqrt, 1/x, 1 for 1, 2, 3, 0.5, -1, 0, else CUDA pow; rounded once", paramsDevice) \
  X(Where, kWhere, kAll, variant::kSelect, paramsDevice) /* dispatch dtype is the bool condition's */ \
  X(MaskedFill, kMaskedFill, kAll, variant::kSelect, paramsDevice) \
  /* copy.cu */ \
  X(Cast, kCast, kAll, variant::kCast, paramsDevice) \
  X(Fill, kFill, kAll, variant::kFill, paramsDevice) \
  X(Arange, kArange, kFI, variant::kArange, paramsDevice) \
  X(SliceBackward, kSliceBackward, kAll, variant::kCopy, paramsDevice) \
  X(Concat, kConcat, kAll, variant::kCopy, paramsDevice) \
  X(Contiguous, kContiguous, kAll, variant::kCopy, paramsDevice) \
  X(CopyTo, kCopyTo, kAll, variant::kCopy, paramsDevice) \
  /* random.cu */ \
  X(Dropout, kDropout, kF, variant::kDropout, paramsDevice) \
  X(Uniform, kUniform, kF, variant::kUniform, paramsDevice) \
  X(Normal, kNormal, kF, "Philox4x32-10 Box-Muller in float64 (correctly rounded double-double log and cos), rounded once", paramsDevice) \
  /* reduce.cu */ \
  X(Sum, kSum, kFI, "float64 (integers: wrapping int64), block tree or in order per output, fixed chunks added in order (Note [cuda reduction order])", paramsDevice) \
  X(Mean, kMean, kF, "float64, block tree or in order per output, fixed chunks added in order (Note [cuda reduction order]), / n", paramsDevice) \
  X(Max, kMax, kFI, variant::kFirstMax, paramsDevice) \
  X(Argmax, kArgmax, kFI, variant::kFirstMax, paramsDevice) \
  /* matmul.cu */ \
  X(Matmul, kMatmul, kF, "cuBLAS gemm, float32 accumulation for float32 and 16-bit (TF32 off unless allowed), float64 for float64, cuBLAS order", paramsBlas) \
  /* nn.cu */ \
  X(Softmax, kSoftmax, kF, "CUDA expf in float32, float64 row sum in a fixed tree, times 1/sum", paramsDevice) \
  X(SoftmaxBackward, kSoftmaxBackward, kF, "float32 products, float64 dot in a fixed tree", paramsDevice) \
  X(LogSoftmax, kLogSoftmax, kF, "CUDA expf in float32, float64 sum in a fixed tree, x - lse in float64", paramsDevice) \
  X(LogSoftmaxBackward, kLogSoftmaxBackward, kF, "CUDA expf in float32, float64 sum in a fixed tree", paramsDevice) \
  X(LayerNorm, kLayerNorm, kF, "float64 mean and variance in a fixed tree (squares in float32), normalized in float32", paramsDevice) \
  X(LayerNormBackward, kLayerNormBackward, kF, "float32 terms, float64 row sums in a fixed tree, dw and db over 64-row chunks in order", paramsDevice) \
  X(RmsNorm, kRmsNorm, kF, "float64 mean square in a fixed tree (squares in float32), scaled in float32", paramsDevice) \
  X(RmsNormBackward, kRmsNormBackward, kF, "float32 terms, float64 row sums in a fixed tree, dw over 64-row chunks in order", paramsDevice) \
  X(Embedding, kEmbedding, kF, variant::kGather, paramsDevice) \
  X(EmbeddingBackward, kEmbeddingBackward, kF, variant::kIndexOrderSum, paramsDevice) \
  X(CrossEntropy, kCrossEntropy, kF, "CUDA expf in float32, float64 log-sum-exp in a fixed tree", paramsDevice) \
  X(CrossEntropyBackward, kCrossEntropyBackward, kF, "CUDA expf in float32, float64 sum in a fixed tree and scaling", paramsDevice) \
  X(Rope, kRope, kF, "cos, sin in float64 rounded to float32, rotation in float32", paramsDevice) \
  /* flashmask.cu */ \
  X(FlashmaskAttention, kFlashmaskAttention, kF, "tiled online softmax (FlashAttention-2), FMA tiles (no tensor cores), float32 accumulation, CUDA expf", paramsFlashmask) \
  X(FlashmaskAttentionBackward, kFlashmaskAttentionBackward, kF, "tiled recompute, FMA tiles, float32 accumulation, float64 rowsum(dO*O), CUDA expf, dK dV per key tile and dQ per query tile (no atomics)", paramsFlashmaskBackward) \
  /* index.cu */ \
  X(IndexSelect, kIndexSelect, kAll, variant::kGather, paramsDevice) \
  X(IndexAdd, kIndexAdd, kFI, "float32 accumulation in index order", paramsDevice) \
  X(Gather, kGather, kAll, variant::kGather, paramsDevice) \
  X(ScatterAdd, kScatterAdd, kFI, "float32 accumulation in index order", paramsDevice) \
  X(Topk, kTopk, kFI, variant::kStableSort, paramsDevice) \
  X(Argsort, kArgsort, kFI, variant::kStableSort, paramsDevice) \
  /* optim.cu */ \
  X(SgdStep, kSgdStep, kF, "elementwise in float32", paramsDevice) \
  X(AdamwStep, kAdamwStep, kF, "float32, reciprocal bias corrections", paramsDevice) \
  /* collective.cpp */ \
  X(AllReduce, kAllReduce, kAll, "staged through the host: MPI_Allreduce in the dtype (16-bit floats in float32), MPI's order", paramsCollective) \
  X(CopyToGroup, kCopyToGroup, kAll, variant::kCopy, paramsCollective) \
  X(AllGather, kAllGather, kAll, variant::kGatherRanks, paramsCollective) \
  X(ReduceScatter, kReduceScatter, kAll, "staged through the host: MPI_Reduce_scatter_block in the dtype, MPI's order", paramsCollective) \
  X(Broadcast, kBroadcast, kAll, variant::kBroadcast, paramsCollective) \
  X(AllToAll, kAllToAll, kAll, variant::kAllToAll, paramsCollective)
// clang-format on

#define KEEL_X_DECLARE(op, fn, dtypes, var, params) void fn(const KernelCtx& c);
KEEL_CUDA_KERNELS(KEEL_X_DECLARE)
#undef KEEL_X_DECLARE

}  // namespace keel::cuda
