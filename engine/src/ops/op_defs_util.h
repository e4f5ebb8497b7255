// What the built-in op definitions share: the table each family file fills with its ops' rules and
// docs (one define*Ops per file, called by op_defs.cpp), inference shorthands, and gradient
// helpers such as sumTo (reduces a broadcast gradient back to an input's shape).
#pragma once
#include <optional>
#include <span>
#include <vector>

#include "keel/ops.h"
#include "keel/registry.h"
#include "shape_util.h"

namespace keel::detail {

using Inputs = std::span<const Tensor>;
using Metas = std::vector<TensorMeta>;
using Grads = std::vector<Tensor>;  // what a backward rule returns

// The built-in op table while the family files fill it: one entry per OpId, named from op_ids.h.
class OpTable {
 public:
  OpTable();
  // The entry of `id`, its input count set (-1: variadic).
  OpDef& at(OpId id, int numInputs) {
    OpDef& o = defs_[size_t(id)];
    o.numInputs = numInputs;
    return o;
  }
  // The family (a table of docs/ops.md) the following doc() calls list their ops under.
  void family(std::string name) { family_ = std::move(name); }
  // What docs/ops.md says of `id` (keel/registry.h: OpDoc).
  void doc(OpId id, std::string inputs, std::string attributes, std::string outputs,
           std::string notes = "") {
    defs_[size_t(id)].doc = OpDoc{std::move(inputs), std::move(attributes), std::move(outputs),
                                  std::move(notes), family_};
  }
  std::vector<OpDef>& defs() { return defs_; }

 private:
  std::vector<OpDef> defs_;
  std::string family_;
};

// One per family file (ops/<family>.cpp).
void defineElementwiseOps(OpTable& t);  // binary, comparisons, unary, with a scalar
void defineReduceOps(OpTable& t);       // sum, mean, max, argmax
void defineMatmulOps(OpTable& t);
void defineNnOps(OpTable& t);          // softmax, norms, embedding, cross entropy, dropout
void defineAttentionOps(OpTable& t);   // flashmask_attention
void defineShapeOps(OpTable& t);       // views, concat, contiguous, copy_to
void defineIndexOps(OpTable& t);       // indexing, sorting, selection, cast
void defineFactoryOps(OpTable& t);     // fill, uniform, normal, arange
void defineOptimOps(OpTable& t);       // sgd_step, adamw_step
void defineCollectiveOps(OpTable& t);  // all_reduce, copy_to_group, all_gather, ... (keel/dist.h)

inline Metas one(Shape s, DType d) {
  return {TensorMeta{std::move(s), d}};
}
// Like input 0.
inline Metas inferUnary(Inputs in) {
  return one(in[0].shape(), in[0].dtype());
}
// (grad, x) -> like x; grad must match x.
Metas inferGradLike(const OpDef& def, Inputs in);

// Checks that every input has the dtype of input 0.
void requireSameDtype(std::string_view op, Inputs in);
void requireFloat(std::string_view op, const Tensor& t, std::string_view what);
void requireIndex(std::string_view op, const Tensor& t, std::string_view what);
// A float 2-D input; else "op 'OP': WHAT must be [LAYOUT], got SHAPE" (layout: "N, C").
void requireFloatMatrix(std::string_view op, const Tensor& t, std::string_view what,
                        std::string_view layout);
// The shape of s reduced over dims (empty: all), keeping size-1 dims if keepdim.
Shape reducedShape(const Shape& s, std::vector<int64_t> dims, bool keepdim, std::string_view op);
// Sums g over broadcast dims so it has `shape`.
Tensor sumTo(const Tensor& g, const Shape& shape);
// Strides that view (shape, strides) as newShape without copying, if any exist.
std::optional<Shape> viewStrides(const Shape& shape, const Shape& strides, const Shape& newShape);
// Resolves one -1 in a requested shape against numel.
Shape inferShape(std::string_view op, const Shape& from, const std::vector<int64_t>& to);
Tensor zerosLike(const Tensor& t);
Tensor zeroScalar(const Tensor& like);  // a 0-d zero of like's dtype and device

}  // namespace keel::detail
