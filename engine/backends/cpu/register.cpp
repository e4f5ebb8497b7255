// The optimized cpu backend's kernel table: one row per built-in op except the seven view ops.
// A missing row fails the build (static_assert on the count); a duplicated row fails start-up.
#include <iterator>

#include "kernels.h"

namespace keel::detail {
namespace {

using namespace keel::cpu;

struct Entry {
  OpId op;
  KernelFn fn;
  DTypeMask dtypes;
};

constexpr DTypeMask kF = kFloatTypes, kFI = kFloatTypes | kIntTypes, kAll = kAllTypes;

constexpr Entry kTable[] = {
    {OpId::Add, kAdd, kFI},
    {OpId::Sub, kSub, kFI},
    {OpId::Mul, kMul, kFI},
    {OpId::Div, kDiv, kF},
    {OpId::Pow, kPow, kF},
    {OpId::Maximum, kMaximum, kFI},
    {OpId::Minimum, kMinimum, kFI},
    {OpId::Eq, kEq, kAll},
    {OpId::Lt, kLt, kFI},
    {OpId::Gt, kGt, kFI},
    {OpId::Neg, kNeg, kFI},
    {OpId::Exp, kExp, kF},
    {OpId::Log, kLog, kF},
    {OpId::Sqrt, kSqrt, kF},
    {OpId::Rsqrt, kRsqrt, kF},
    {OpId::Tanh, kTanh, kF},
    {OpId::Sigmoid, kSigmoid, kF},
    {OpId::Relu, kRelu, kFI},
    {OpId::Gelu, kGelu, kF},
    {OpId::Silu, kSilu, kF},
    {OpId::Abs, kAbs, kFI},
    {OpId::GeluBackward, kGeluBackward, kF},
    {OpId::SiluBackward, kSiluBackward, kF},
    {OpId::AddScalar, kAddScalar, kFI},
    {OpId::MulScalar, kMulScalar, kFI},
    {OpId::PowScalar, kPowScalar, kF},
    {OpId::Sum, kSum, kFI},
    {OpId::Mean, kMean, kF},
    {OpId::Max, kMax, kFI},
    {OpId::Argmax, kArgmax, kFI},
    {OpId::Matmul, kMatmul, kF},
    {OpId::Softmax, kSoftmax, kF},
    {OpId::SoftmaxBackward, kSoftmaxBackward, kF},
    {OpId::LogSoftmax, kLogSoftmax, kF},
    {OpId::LogSoftmaxBackward, kLogSoftmaxBackward, kF},
    {OpId::LayerNorm, kLayerNorm, kF},
    {OpId::LayerNormBackward, kLayerNormBackward, kF},
    {OpId::RmsNorm, kRmsNorm, kF},
    {OpId::RmsNormBackward, kRmsNormBackward, kF},
    {OpId::Embedding, kEmbedding, kF},
    {OpId::EmbeddingBackward, kEmbeddingBackward, kF},
    {OpId::CrossEntropy, kCrossEntropy, kF},
    {OpId::CrossEntropyBackward, kCrossEntropyBackward, kF},
    {OpId::Dropout, kDropout, kF},
    {OpId::FlashmaskAttention, kFlashmaskAttention, kF},
    {OpId::FlashmaskAttentionBackward, kFlashmaskAttentionBackward, kF},
    {OpId::SliceBackward, kSliceBackward, kAll},
    {OpId::Concat, kConcat, kAll},
    {OpId::Contiguous, kContiguous, kAll},
    {OpId::CopyTo, kCopyTo, kAll},
    {OpId::IndexSelect, kIndexSelect, kAll},
    {OpId::IndexAdd, kIndexAdd, kFI},
    {OpId::Gather, kGather, kAll},
    {OpId::ScatterAdd, kScatterAdd, kFI},
    {OpId::Topk, kTopk, kFI},
    {OpId::Argsort, kArgsort, kFI},
    {OpId::Where, kWhere, kAll},  // dispatch dtype is the bool condition's
    {OpId::MaskedFill, kMaskedFill, kAll},
    {OpId::Cast, kCast, kAll},
    {OpId::Fill, kFill, kAll},
    {OpId::Uniform, kUniform, kF},
    {OpId::Normal, kNormal, kF},
    {OpId::Arange, kArange, kFI},
    {OpId::SgdStep, kSgdStep, kF},
    {OpId::AdamwStep, kAdamwStep, kF},
};
// Every op but the seven views (reshape, view, transpose, permute, slice, expand, split).
static_assert(std::size(kTable) == size_t(kNumBuiltinOps) - 7, "cpu: an op has no kernel");

}  // namespace

void registerCpuKernels(Registry& r) {
  std::vector<bool> seen(size_t(kNumBuiltinOps), false);
  for (const Entry& e : kTable) {
    KEEL_CHECK(!seen[size_t(e.op)], "cpu: op '", r.op(e.op).name, "' registered twice");
    seen[size_t(e.op)] = true;
    r.setKernel(int(e.op), Backend::Cpu, e.fn, e.dtypes);
  }
}

}  // namespace keel::detail
