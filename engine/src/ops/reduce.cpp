// Op definitions, reductions: sum and mean over a dim list, max and argmax along one dim. Each
// op's inference and backward rule; kernels live in the backends.
#include <algorithm>

#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

// The gradient of a reduction over dims0, expanded back to x's shape.
Tensor expandBack(const Tensor& g, const Tensor& x, const std::vector<int64_t>& dims0,
                  bool keepdim) {
  Shape keep = reducedShape(x.shape(), dims0, true, "sum");
  Tensor gk = keepdim ? g : reshape(g, keep);
  return contiguous(expand(gk, x.shape()));
}

}  // namespace

void defineReduceOps(OpTable& t) {
  t.family("Reductions");
  t.doc(OpId::Sum, "x", "dims (int list, empty = all), keepdim", "reduced", "fixed order");
  t.doc(OpId::Mean, "x", "dims (int list, empty = all), keepdim", "reduced", "fixed order");
  t.doc(OpId::Max, "x", "dim, keepdim", "reduced values", "the first max takes the gradient");
  t.doc(OpId::Argmax, "x", "dim, keepdim", "reduced, int64", "the first index of the max");

  for (OpId id : {OpId::Sum, OpId::Mean})
    t.at(id, 1).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
      return one(reducedShape(in[0].shape(), a.getInts("dims"), a.getBool("keepdim"), op.name),
                 in[0].dtype());
    };
  t.at(OpId::Sum, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {expandBack(c.gradOutputs[0], c.inputs[0], c.attrs.getInts("dims"),
                       c.attrs.getBool("keepdim"))};
  };
  t.at(OpId::Mean, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& x = c.inputs[0];
    int64_t count = x.numel() / std::max<int64_t>(1, c.outputs[0].numel());
    return {mulScalar(
        expandBack(c.gradOutputs[0], x, c.attrs.getInts("dims"), c.attrs.getBool("keepdim")),
        1.0 / double(std::max<int64_t>(count, 1)))};
  };
  for (OpId id : {OpId::Max, OpId::Argmax})
    t.at(id, 1).infer = [id](const OpDef& op, Inputs in, const Attrs& a) {
      KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': needs a tensor of rank >= 1");
      int64_t dim = normDim(a.getInt("dim"), in[0].dim(), op.name);
      KEEL_CHECK(in[0].size(dim) > 0, "op '", op.name, "': dim ", dim, " of shape ",
                 shapeStr(in[0].shape()), " is empty");
      return one(reducedShape(in[0].shape(), {dim}, a.getBool("keepdim"), op.name),
                 id == OpId::Max ? in[0].dtype() : DType::Int64);
    };
  t.at(OpId::Max, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& x = c.inputs[0];
    int64_t dim = c.attrs.getInt("dim");
    Tensor idx = argmax(x, dim, true);
    Tensor g = c.attrs.getBool("keepdim") ? c.gradOutputs[0] : unsqueeze(c.gradOutputs[0], dim);
    return {scatterAdd(zerosLike(x), dim, idx, g)};
  };
}

}  // namespace keel::detail
