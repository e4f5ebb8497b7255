// The built-in op list, one line per op: X(EnumName, "registry_name"). The op definitions fill
// one entry per op (checked at start-up); each backend's kernel table must cover every op but the
// views exactly once (checked at compile time). User ops get ids from kNumBuiltinOps on.
#pragma once

// clang-format off
#define KEEL_BUILTIN_OPS(X)                              \
  /* elementwise, broadcasting */                        \
  X(Add, "add")                                          \
  X(Sub, "sub")                                          \
  X(Mul, "mul")                                          \
  X(Div, "div")                                          \
  X(Pow, "pow")                                          \
  X(Maximum, "maximum")                                  \
  X(Minimum, "minimum")                                  \
  X(Eq, "eq")                                            \
  X(Lt, "lt")                                            \
  X(Gt, "gt")                                            \
  /* unary */                                            \
  X(Neg, "neg")                                          \
  X(Exp, "exp")                                          \
  X(Log, "log")                                          \
  X(Sqrt, "sqrt")                                        \
  X(Rsqrt, "rsqrt")                                      \
  X(Tanh, "tanh")                                        \
  X(Sigmoid, "sigmoid")                                  \
  X(Relu, "relu")                                        \
  X(Gelu, "gelu")                                        \
  X(Silu, "silu")                                        \
  X(Abs, "abs")                                          \
  X(GeluBackward, "gelu_backward")                       \
  X(SiluBackward, "silu_backward")                       \
  /* with a scalar attribute */                          \
  X(AddScalar, "add_scalar")                             \
  X(MulScalar, "mul_scalar")                             \
  X(PowScalar, "pow_scalar")                             \
  /* reductions */                                       \
  X(Sum, "sum")                                          \
  X(Mean, "mean")                                        \
  X(Max, "max")                                          \
  X(Argmax, "argmax")                                    \
  /* linear algebra */                                   \
  X(Matmul, "matmul")                                    \
  /* neural-network ops and their fused backward ops */  \
  X(Softmax, "softmax")                                  \
  X(SoftmaxBackward, "softmax_backward")                 \
  X(LogSoftmax, "log_softmax")                           \
  X(LogSoftmaxBackward, "log_softmax_backward")          \
  X(LayerNorm, "layer_norm")                             \
  X(LayerNormBackward, "layer_norm_backward")            \
  X(RmsNorm, "rms_norm")                                 \
  X(RmsNormBackward, "rms_norm_backward")                \
  X(Embedding, "embedding")                              \
  X(EmbeddingBackward, "embedding_backward")             \
  X(CrossEntropy, "cross_entropy")                       \
  X(CrossEntropyBackward, "cross_entropy_backward")      \
  X(Dropout, "dropout")                                  \
  X(Rope, "rope")                                        \
  X(FlashmaskAttention, "flashmask_attention")           \
  X(FlashmaskAttentionBackward, "flashmask_attention_backward") \
  /* shapes and views */                                 \
  X(Reshape, "reshape")                                  \
  X(View, "view")                                        \
  X(Transpose, "transpose")                              \
  X(Permute, "permute")                                  \
  X(Slice, "slice")                                      \
  X(SliceBackward, "slice_backward")                     \
  X(Expand, "expand")                                    \
  X(Concat, "concat")                                    \
  X(Split, "split")                                      \
  X(Contiguous, "contiguous")                            \
  X(CopyTo, "copy_to")                                   \
  /* indexing, sorting, selection */                     \
  X(IndexSelect, "index_select")                         \
  X(IndexAdd, "index_add")                               \
  X(Gather, "gather")                                    \
  X(ScatterAdd, "scatter_add")                           \
  X(Topk, "topk")                                        \
  X(Argsort, "argsort")                                  \
  X(Where, "where")                                      \
  X(MaskedFill, "masked_fill")                           \
  X(Cast, "cast")                                        \
  /* factories (no inputs) */                            \
  X(Fill, "fill")                                        \
  X(Uniform, "uniform")                                  \
  X(Normal, "normal")                                    \
  X(Arange, "arange")                                    \
  /* optimizer updates (in place) */                     \
  X(SgdStep, "sgd_step")                                 \
  X(AdamwStep, "adamw_step")                             \
  /* collectives across the ranks of a group (keel/dist.h) */ \
  X(AllReduce, "all_reduce")                             \
  X(CopyToGroup, "copy_to_group")                        \
  X(AllGather, "all_gather")                             \
  X(ReduceScatter, "reduce_scatter")                     \
  X(Broadcast, "broadcast")                              \
  X(AllToAll, "all_to_all")
// clang-format on

namespace keel {

enum class OpId : int {
#define KEEL_X_ENUM(e, n) e,
  KEEL_BUILTIN_OPS(KEEL_X_ENUM)
#undef KEEL_X_ENUM
};

inline constexpr int kNumBuiltinOps = 0
#define KEEL_X_COUNT(e, n) +1
    KEEL_BUILTIN_OPS(KEEL_X_COUNT)
#undef KEEL_X_COUNT
    ;

// The ops whose outputs are views of their input's buffer: a view rule, no kernels.
inline constexpr OpId kViewOps[] = {OpId::Reshape, OpId::View,   OpId::Transpose, OpId::Permute,
                                    OpId::Slice,   OpId::Expand, OpId::Split};
constexpr bool isViewOp(OpId id) {
  for (OpId v : kViewOps)
    if (v == id) return true;
  return false;
}

}  // namespace keel
