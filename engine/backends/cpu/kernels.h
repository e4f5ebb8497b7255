// The optimized cpu backend's kernels, one line each: X(OpId, kernel, dtypes, variant, params).
// The list declares every kernel (below) and is register.cpp's table; each kernel is defined in
// the file its group names and follows KernelFn: contiguous fresh outputs, inputs of any layout.
// variant: what decides the kernel's bits, in Note [Kernel variant vocabulary]'s words
// (kernel_table.h; variant::k* are the strings cpu-ref shares); params: the register.cpp function
// that reports one call's run-time parameters (ISA, threads, BLAS, tiles).
#pragma once
#include "keel/registry.h"

namespace keel::cpu {

inline constexpr DTypeMask kF = kFloatTypes, kFI = kFloatTypes | kIntTypes, kAll = kAllTypes;

// clang-format off
#define KEEL_CPU_KERNELS(X) \
  /* elementwise.cpp */ \
  X(Add, kAdd, kFI, variant::kCorrectlyRounded, paramsThreads) \
  X(Sub, kSub, kFI, variant::kCorrectlyRounded, paramsThreads) \
  X(Mul, kMul, kFI, variant::kCorrectlyRounded, paramsThreads) \
  X(Div, kDiv, kF, variant::kCorrectlyRounded, paramsThreads) \
  X(Pow, kPow, kF, "libm powf in float32", paramsThreads) \
  X(Maximum, kMaximum, kFI, variant::kSelect, paramsThreads) \
  X(Minimum, kMinimum, kFI, variant::kSelect, paramsThreads) \
  X(Eq, kEq, kAll, variant::kCompare, paramsThreads) \
  X(Lt, kLt, kFI, variant::kCompare, paramsThreads) \
  X(Gt, kGt, kFI, variant::kCompare, paramsThreads) \
  X(Neg, kNeg, kFI, variant::kExactElementwise, paramsThreads) \
  X(Exp, kExp, kF, "Cephes exp polynomial in float32 (vec_math)", paramsVecMath) \
  X(Log, kLog, kF, "libm logf in float32", paramsThreads) \
  X(Sqrt, kSqrt, kF, variant::kCorrectlyRounded, paramsThreads) \
  X(Rsqrt, kRsqrt, kF, "1/sqrt in float32, two roundings", paramsThreads) \
  X(Tanh, kTanh, kF, "Cephes tanh polynomial, 1-2/(exp(2x)+1) in float32 (vec_math)", paramsVecMath) \
  X(Sigmoid, kSigmoid, kF, "1/(1+exp(-x)), Cephes exp in float32 (vec_math)", paramsVecMath) \
  X(Relu, kRelu, kFI, variant::kSelect, paramsThreads) \
  X(Gelu, kGelu, kF, "erfc polynomial (Numerical Recipes) in float32 (vec_math)", paramsVecMath) \
  X(Silu, kSilu, kF, "x/(1+exp(-x)), Cephes exp in float32 (vec_math)", paramsVecMath) \
  X(Abs, kAbs, kFI, variant::kExactElementwise, paramsThreads) \
  X(GeluBackward, kGeluBackward, kF, "erfc and Cephes exp polynomials in float32 (vec_math)", paramsVecMath) \
  X(SiluBackward, kSiluBackward, kF, "sigmoid by Cephes exp in float32 (vec_math)", paramsVecMath) \
  X(AddScalar, kAddScalar, kFI, variant::kFloat64Once, paramsThreads) \
  X(MulScalar, kMulScalar, kFI, variant::kFloat64Once, paramsThreads) \
  X(PowScalar, kPowScalar, kF, "float64: x*x, x*x*x, sqrt, 1/x for 2, 3, 0.5, -1, else libm pow; rounded once", paramsThreads) \
  X(Where, kWhere, kAll, variant::kSelect, paramsThreads) /* dispatch dtype is the bool condition's */ \
  X(MaskedFill, kMaskedFill, kAll, variant::kSelect, paramsThreads) \
  X(Cast, kCast, kAll, variant::kCast, paramsThreads) \
  X(Dropout, kDropout, kF, variant::kDropout, paramsThreads) \
  X(Fill, kFill, kAll, variant::kFill, paramsThreads) \
  X(Uniform, kUniform, kF, variant::kUniform, paramsThreads) \
  X(Normal, kNormal, kF, variant::kNormal, paramsThreads) \
  X(Arange, kArange, kFI, variant::kArange, paramsThreads) \
  /* reduce.cpp */ \
  X(Sum, kSum, kFI, "float64, 8 strided lanes per 1024 block, blocks in order (columns: 4096-row blocks)", paramsThreads) \
  X(Mean, kMean, kF, "float64, 8 strided lanes per 1024 block, blocks in order (columns: 4096-row blocks), / n", paramsThreads) \
  X(Max, kMax, kFI, variant::kFirstMax, paramsThreads) \
  X(Argmax, kArgmax, kFI, variant::kFirstMax, paramsThreads) \
  /* matmul.cpp */ \
  X(Matmul, kMatmul, kF, "OpenBLAS sgemm, float32 accumulation, BLAS order", paramsBlas) \
  /* nn.cpp */ \
  X(Softmax, kSoftmax, kF, "Cephes exp in float32 (vec_math), float64 sum in 8 lanes, times 1/sum", paramsVecMath) \
  X(SoftmaxBackward, kSoftmaxBackward, kF, "float32 products, float64 dot in 8 lanes", paramsThreads) \
  X(LogSoftmax, kLogSoftmax, kF, "Cephes exp in float32 (vec_math), float64 sum in 8 lanes, x - lse in float64", paramsVecMath) \
  X(LogSoftmaxBackward, kLogSoftmaxBackward, kF, "Cephes exp in float32 (vec_math), float64 sum in 8 lanes", paramsVecMath) \
  X(LayerNorm, kLayerNorm, kF, "float64 mean and variance in 8 lanes (squares in float32), normalized in float32", paramsThreads) \
  X(LayerNormBackward, kLayerNormBackward, kF, "float32 terms, float64 row sums in 8 lanes, dw and db over 64 row chunks", paramsThreads) \
  X(RmsNorm, kRmsNorm, kF, "float64 mean square in 8 lanes (squares in float32), scaled in float32", paramsThreads) \
  X(RmsNormBackward, kRmsNormBackward, kF, "float32 terms, float64 row sums in 8 lanes, dw over 64 row chunks", paramsThreads) \
  X(Embedding, kEmbedding, kF, variant::kGather, paramsThreads) \
  X(EmbeddingBackward, kEmbeddingBackward, kF, variant::kIndexOrderSum, paramsThreads) \
  X(CrossEntropy, kCrossEntropy, kF, "Cephes exp in float32 (vec_math), float64 log-sum-exp in 8 lanes", paramsVecMath) \
  X(CrossEntropyBackward, kCrossEntropyBackward, kF, "Cephes exp in float32 (vec_math), float64 sum in 8 lanes and scaling", paramsVecMath) \
  X(Rope, kRope, kF, "cos, sin in float64 rounded to float32, rotation in float32", paramsThreads) \
  /* flashmask.cpp */ \
  X(FlashmaskAttention, kFlashmaskAttention, kF, "tiled online softmax (FlashAttention-2), OpenBLAS sgemm tiles, Cephes exp, float32", paramsFlashmask) \
  X(FlashmaskAttentionBackward, kFlashmaskAttentionBackward, kF, "tiled recompute, OpenBLAS sgemm tiles, Cephes exp, float32, dQ over <= 8 key groups", paramsFlashmaskBackward) \
  /* index.cpp */ \
  X(IndexSelect, kIndexSelect, kAll, variant::kGather, paramsThreads) \
  X(IndexAdd, kIndexAdd, kFI, "float32 accumulation in index order", paramsThreads) \
  X(Gather, kGather, kAll, variant::kGather, paramsThreads) \
  X(ScatterAdd, kScatterAdd, kFI, "float32 accumulation in index order", paramsThreads) \
  X(Topk, kTopk, kFI, variant::kStableSort, paramsThreads) \
  X(Argsort, kArgsort, kFI, variant::kStableSort, paramsThreads) \
  /* copy.cpp */ \
  X(SliceBackward, kSliceBackward, kAll, variant::kCopy, paramsThreads) \
  X(Concat, kConcat, kAll, variant::kCopy, paramsThreads) \
  X(Contiguous, kContiguous, kAll, variant::kCopy, paramsThreads) \
  X(CopyTo, kCopyTo, kAll, variant::kCopy, paramsThreads) \
  /* optim.cpp */ \
  X(SgdStep, kSgdStep, kF, "elementwise in float32", paramsThreads) \
  X(AdamwStep, kAdamwStep, kF, "float32, reciprocal bias corrections", paramsThreads) \
  /* collective.cpp */ \
  X(AllReduce, kAllReduce, kAll, "MPI_Allreduce in the dtype (16-bit floats in float32), MPI's order", paramsCollective) \
  X(CopyToGroup, kCopyToGroup, kAll, variant::kCopy, paramsCollective) \
  X(AllGather, kAllGather, kAll, variant::kGatherRanks, paramsCollective) \
  X(ReduceScatter, kReduceScatter, kAll, "MPI_Reduce_scatter_block in the dtype, MPI's order", paramsCollective) \
  X(Broadcast, kBroadcast, kAll, variant::kBroadcast, paramsCollective) \
  X(AllToAll, kAllToAll, kAll, variant::kAllToAll, paramsCollective)
// clang-format on

#define KEEL_X_DECLARE(op, fn, dtypes, var, params) void fn(const KernelCtx& c);
KEEL_CPU_KERNELS(KEEL_X_DECLARE)
#undef KEEL_X_DECLARE

}  // namespace keel::cpu
