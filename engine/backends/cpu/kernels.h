// The optimized cpu backend's kernels, one line each: X(OpId, kernel, dtypes). The list declares
// every kernel (below) and is register.cpp's table; each kernel is defined in the file its group
// names and follows KernelFn: contiguous fresh outputs, inputs of any layout.
#pragma once
#include "keel/registry.h"

namespace keel::cpu {

inline constexpr DTypeMask kF = kFloatTypes, kFI = kFloatTypes | kIntTypes, kAll = kAllTypes;

// clang-format off
#define KEEL_CPU_KERNELS(X)                                                        \
  /* elementwise.cpp */                                                            \
  X(Add, kAdd, kFI)                                                                \
  X(Sub, kSub, kFI)                                                                \
  X(Mul, kMul, kFI)                                                                \
  X(Div, kDiv, kF)                                                                 \
  X(Pow, kPow, kF)                                                                 \
  X(Maximum, kMaximum, kFI)                                                        \
  X(Minimum, kMinimum, kFI)                                                        \
  X(Eq, kEq, kAll)                                                                 \
  X(Lt, kLt, kFI)                                                                  \
  X(Gt, kGt, kFI)                                                                  \
  X(Neg, kNeg, kFI)                                                                \
  X(Exp, kExp, kF)                                                                 \
  X(Log, kLog, kF)                                                                 \
  X(Sqrt, kSqrt, kF)                                                               \
  X(Rsqrt, kRsqrt, kF)                                                             \
  X(Tanh, kTanh, kF)                                                               \
  X(Sigmoid, kSigmoid, kF)                                                         \
  X(Relu, kRelu, kFI)                                                              \
  X(Gelu, kGelu, kF)                                                               \
  X(Silu, kSilu, kF)                                                               \
  X(Abs, kAbs, kFI)                                                                \
  X(GeluBackward, kGeluBackward, kF)                                               \
  X(SiluBackward, kSiluBackward, kF)                                               \
  X(AddScalar, kAddScalar, kFI)                                                    \
  X(MulScalar, kMulScalar, kFI)                                                    \
  X(PowScalar, kPowScalar, kF)                                                     \
  X(Where, kWhere, kAll) /* dispatch dtype is the bool condition's */              \
  X(MaskedFill, kMaskedFill, kAll)                                                 \
  X(Cast, kCast, kAll)                                                             \
  X(Dropout, kDropout, kF)                                                         \
  X(Fill, kFill, kAll)                                                             \
  X(Uniform, kUniform, kF)                                                         \
  X(Normal, kNormal, kF)                                                           \
  X(Arange, kArange, kFI)                                                          \
  /* reduce.cpp */                                                                 \
  X(Sum, kSum, kFI)                                                                \
  X(Mean, kMean, kF)                                                               \
  X(Max, kMax, kFI)                                                                \
  X(Argmax, kArgmax, kFI)                                                          \
  /* matmul.cpp */                                                                 \
  X(Matmul, kMatmul, kF)                                                           \
  /* nn.cpp */                                                                     \
  X(Softmax, kSoftmax, kF)                                                         \
  X(SoftmaxBackward, kSoftmaxBackward, kF)                                         \
  X(LogSoftmax, kLogSoftmax, kF)                                                   \
  X(LogSoftmaxBackward, kLogSoftmaxBackward, kF)                                   \
  X(LayerNorm, kLayerNorm, kF)                                                     \
  X(LayerNormBackward, kLayerNormBackward, kF)                                     \
  X(RmsNorm, kRmsNorm, kF)                                                         \
  X(RmsNormBackward, kRmsNormBackward, kF)                                         \
  X(Embedding, kEmbedding, kF)                                                     \
  X(EmbeddingBackward, kEmbeddingBackward, kF)                                     \
  X(CrossEntropy, kCrossEntropy, kF)                                               \
  X(CrossEntropyBackward, kCrossEntropyBackward, kF)                               \
  X(Rope, kRope, kF)                                                               \
  /* flashmask.cpp */                                                              \
  X(FlashmaskAttention, kFlashmaskAttention, kF)                                   \
  X(FlashmaskAttentionBackward, kFlashmaskAttentionBackward, kF)                   \
  /* index.cpp */                                                                  \
  X(IndexSelect, kIndexSelect, kAll)                                               \
  X(IndexAdd, kIndexAdd, kFI)                                                      \
  X(Gather, kGather, kAll)                                                         \
  X(ScatterAdd, kScatterAdd, kFI)                                                  \
  X(Topk, kTopk, kFI)                                                              \
  X(Argsort, kArgsort, kFI)                                                        \
  /* copy.cpp */                                                                   \
  X(SliceBackward, kSliceBackward, kAll)                                           \
  X(Concat, kConcat, kAll)                                                         \
  X(Contiguous, kContiguous, kAll)                                                 \
  X(CopyTo, kCopyTo, kAll)                                                         \
  /* optim.cpp */                                                                  \
  X(SgdStep, kSgdStep, kF)                                                         \
  X(AdamwStep, kAdamwStep, kF)
// clang-format on

#define KEEL_X_DECLARE(op, fn, dtypes) void fn(const KernelCtx& c);
KEEL_CPU_KERNELS(KEEL_X_DECLARE)
#undef KEEL_X_DECLARE

}  // namespace keel::cpu
