// Declarations of every kernel of the optimized cpu backend; register.cpp puts them in its one
// table. Each kernel follows KernelFn: contiguous fresh outputs, inputs of any layout.
#pragma once
#include "keel/registry.h"

namespace keel::cpu {

// elementwise.cpp
void kAdd(const KernelCtx& c);
void kSub(const KernelCtx& c);
void kMul(const KernelCtx& c);
void kDiv(const KernelCtx& c);
void kPow(const KernelCtx& c);
void kMaximum(const KernelCtx& c);
void kMinimum(const KernelCtx& c);
void kEq(const KernelCtx& c);
void kLt(const KernelCtx& c);
void kGt(const KernelCtx& c);
void kNeg(const KernelCtx& c);
void kExp(const KernelCtx& c);
void kLog(const KernelCtx& c);
void kSqrt(const KernelCtx& c);
void kRsqrt(const KernelCtx& c);
void kTanh(const KernelCtx& c);
void kSigmoid(const KernelCtx& c);
void kRelu(const KernelCtx& c);
void kGelu(const KernelCtx& c);
void kSilu(const KernelCtx& c);
void kAbs(const KernelCtx& c);
void kGeluBackward(const KernelCtx& c);
void kSiluBackward(const KernelCtx& c);
void kAddScalar(const KernelCtx& c);
void kMulScalar(const KernelCtx& c);
void kPowScalar(const KernelCtx& c);
void kWhere(const KernelCtx& c);
void kMaskedFill(const KernelCtx& c);
void kCast(const KernelCtx& c);
void kDropout(const KernelCtx& c);
void kFill(const KernelCtx& c);
void kUniform(const KernelCtx& c);
void kNormal(const KernelCtx& c);
void kArange(const KernelCtx& c);

// reduce.cpp
void kSum(const KernelCtx& c);
void kMean(const KernelCtx& c);
void kMax(const KernelCtx& c);
void kArgmax(const KernelCtx& c);

// matmul.cpp
void kMatmul(const KernelCtx& c);

// nn.cpp
void kSoftmax(const KernelCtx& c);
void kSoftmaxBackward(const KernelCtx& c);
void kLogSoftmax(const KernelCtx& c);
void kLogSoftmaxBackward(const KernelCtx& c);
void kLayerNorm(const KernelCtx& c);
void kLayerNormBackward(const KernelCtx& c);
void kRmsNorm(const KernelCtx& c);
void kRmsNormBackward(const KernelCtx& c);
void kEmbedding(const KernelCtx& c);
void kEmbeddingBackward(const KernelCtx& c);
void kCrossEntropy(const KernelCtx& c);
void kCrossEntropyBackward(const KernelCtx& c);

// flashmask.cpp
void kFlashmaskAttention(const KernelCtx& c);
void kFlashmaskAttentionBackward(const KernelCtx& c);

// index.cpp
void kIndexSelect(const KernelCtx& c);
void kIndexAdd(const KernelCtx& c);
void kGather(const KernelCtx& c);
void kScatterAdd(const KernelCtx& c);
void kTopk(const KernelCtx& c);
void kArgsort(const KernelCtx& c);

// copy.cpp
void kSliceBackward(const KernelCtx& c);
void kConcat(const KernelCtx& c);
void kContiguous(const KernelCtx& c);
void kCopyTo(const KernelCtx& c);

// optim.cpp
void kSgdStep(const KernelCtx& c);
void kAdamwStep(const KernelCtx& c);

}  // namespace keel::cpu
