// Op definitions, indexing, sorting and selection: index_select, index_add, gather, scatter_add,
// topk, argsort, where, masked_fill, and cast. Each op's inference and backward rule; kernels
// (which check every index against its extent) live in the backends.
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

void checkIndexRankForDim(const OpDef& def, const Tensor& x, const Tensor& idx, int64_t dim) {
  KEEL_CHECK(idx.dim() == x.dim(), "op '", def.name, "': index ", shapeStr(idx.shape()),
             " must have the rank of input ", shapeStr(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim)
      KEEL_CHECK(idx.size(d) <= x.size(d), "op '", def.name, "': index ", shapeStr(idx.shape()),
                 " is larger than input ", shapeStr(x.shape()), " in dim ", d);
}

void defineIndexSelectAdd(OpTable& t) {
  OpDef& o = t.at(OpId::IndexSelect, 2);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireIndex(op.name, in[1], "index");
    KEEL_CHECK(in[1].dim() == 1, "op '", op.name, "': index must be 1-D, got ",
               shapeStr(in[1].shape()));
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    Shape s = in[0].shape();
    s[size_t(d)] = in[1].size(0);
    return one(s, in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& x = c.inputs[0];
    return {indexAdd(zerosLike(x), c.attrs.getInt("dim"), c.inputs[1], c.gradOutputs[0]), Tensor()};
  };

  OpDef& ia = t.at(OpId::IndexAdd, 3);
  ia.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireIndex(op.name, in[1], "index");
    KEEL_CHECK(in[1].dim() == 1, "op '", op.name, "': index must be 1-D, got ",
               shapeStr(in[1].shape()));
    KEEL_CHECK(in[0].dtype() == in[2].dtype(), "op '", op.name, "': dtype mismatch, input ",
               dtypeName(in[0].dtype()), " vs source ", dtypeName(in[2].dtype()));
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    Shape expect = in[0].shape();
    expect[size_t(d)] = in[1].size(0);
    KEEL_CHECK(in[2].shape() == expect, "op '", op.name, "': source ", shapeStr(in[2].shape()),
               " must be ", shapeStr(expect), " for input ", shapeStr(in[0].shape()), " and index ",
               shapeStr(in[1].shape()));
    return one(in[0].shape(), in[0].dtype());
  };
  ia.backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& g = c.gradOutputs[0];
    return {g, Tensor(),
            c.needsGrad[2] ? indexSelect(g, c.attrs.getInt("dim"), c.inputs[1]) : Tensor()};
  };
}

void defineGatherScatter(OpTable& t) {
  OpDef& o = t.at(OpId::Gather, 2);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireIndex(op.name, in[1], "index");
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    checkIndexRankForDim(op, in[0], in[1], d);
    return one(in[1].shape(), in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {
        scatterAdd(zerosLike(c.inputs[0]), c.attrs.getInt("dim"), c.inputs[1], c.gradOutputs[0]),
        Tensor()};
  };

  OpDef& s = t.at(OpId::ScatterAdd, 3);
  s.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireIndex(op.name, in[1], "index");
    KEEL_CHECK(in[0].dtype() == in[2].dtype(), "op '", op.name, "': dtype mismatch, input ",
               dtypeName(in[0].dtype()), " vs source ", dtypeName(in[2].dtype()));
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    checkIndexRankForDim(op, in[0], in[1], d);
    KEEL_CHECK(in[1].shape() == in[2].shape(), "op '", op.name, "': index ",
               shapeStr(in[1].shape()), " and source ", shapeStr(in[2].shape()), " differ");
    return one(in[0].shape(), in[0].dtype());
  };
  s.backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& g = c.gradOutputs[0];
    return {g, Tensor(), c.needsGrad[2] ? gather(g, c.attrs.getInt("dim"), c.inputs[1]) : Tensor()};
  };
}

void defineSorts(OpTable& t) {
  OpDef& o = t.at(OpId::Topk, 1);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    int64_t k = a.getInt("k");
    KEEL_CHECK(k >= 0 && k <= in[0].size(d), "op '", op.name, "': k = ", k,
               " out of range for dim ", d, " of ", shapeStr(in[0].shape()));
    Shape s = in[0].shape();
    s[size_t(d)] = k;
    return Metas{{s, in[0].dtype()}, {s, DType::Int64}};
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {
        scatterAdd(zerosLike(c.inputs[0]), c.attrs.getInt("dim"), c.outputs[1], c.gradOutputs[0])};
  };
  t.at(OpId::Argsort, 1).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': input must have rank >= 1");
    normDim(a.getInt("dim"), in[0].dim(), op.name);
    return one(in[0].shape(), DType::Int64);
  };
}

void defineSelection(OpTable& t) {
  OpDef& o = t.at(OpId::Where, 3);
  o.infer = [](const OpDef& op, Inputs in, const Attrs&) {
    KEEL_CHECK(in[0].dtype() == DType::Bool, "op '", op.name, "': condition must be bool, got ",
               dtypeName(in[0].dtype()));
    KEEL_CHECK(in[1].dtype() == in[2].dtype(), "op '", op.name, "': dtype mismatch, ",
               dtypeName(in[1].dtype()), " vs ", dtypeName(in[2].dtype()));
    Shape s = broadcastShapes(broadcastShapes(in[0].shape(), in[1].shape(), op.name), in[2].shape(),
                              op.name);
    return one(s, in[1].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &cond = c.inputs[0];
    Tensor z = zeroScalar(g);
    return {Tensor(), c.needsGrad[1] ? sumTo(where(cond, g, z), c.inputs[1].shape()) : Tensor(),
            c.needsGrad[2] ? sumTo(where(cond, z, g), c.inputs[2].shape()) : Tensor()};
  };

  OpDef& m = t.at(OpId::MaskedFill, 2);
  m.infer = [](const OpDef& op, Inputs in, const Attrs&) {
    KEEL_CHECK(in[1].dtype() == DType::Bool, "op '", op.name, "': mask must be bool, got ",
               dtypeName(in[1].dtype()));
    Shape s = broadcastShapes(in[0].shape(), in[1].shape(), op.name);
    KEEL_CHECK(s == in[0].shape(), "op '", op.name, "': mask ", shapeStr(in[1].shape()),
               " does not broadcast to input ", shapeStr(in[0].shape()));
    return one(in[0].shape(), in[0].dtype());
  };
  m.backward = [](const BackwardCtx& c) -> Grads {
    return {maskedFill(c.gradOutputs[0], c.inputs[1], 0.0), Tensor()};
  };

  OpDef& k = t.at(OpId::Cast, 1);
  k.infer = [](const OpDef&, Inputs in, const Attrs& a) {
    return one(in[0].shape(), parseDType(a.getString("dtype")));
  };
  k.backward = [](const BackwardCtx& c) -> Grads {
    return {cast(c.gradOutputs[0], c.inputs[0].dtype())};
  };
}

}  // namespace

void defineIndexOps(OpTable& t) {
  t.family("Indexing, sorting, selection");
  t.doc(OpId::IndexSelect, "x, index (1-D)", "dim", "x with dim = len(index)");
  t.doc(OpId::IndexAdd, "x, index (1-D), src", "dim", "x + src added at the index rows");
  t.doc(OpId::Gather, "x, index (same rank)", "dim", "shape of index",
        "out[..i..] = x[..index[..i..]..] along dim");
  t.doc(OpId::ScatterAdd, "x, index, src (index and src same shape)", "dim", "like x",
        "out = x; out[..index..] += src");
  t.doc(OpId::Topk, "x", "k, dim, largest", "values, indices (int64)",
        "sorted; ties: lower index first");
  t.doc(OpId::Argsort, "x", "dim, descending", "int64", "stable");
  t.doc(OpId::Where, "cond (bool), a, b", "", "broadcast of all three, dtype of a",
        "dispatch dtype: the condition's");
  t.doc(OpId::MaskedFill, "x, mask (bool, broadcast to x)", "value", "like x");
  t.doc(OpId::Cast, "x", "dtype (name)", "converted", "float→int truncates; →bool is x≠0");

  defineIndexSelectAdd(t);
  defineGatherScatter(t);
  defineSorts(t);
  defineSelection(t);
}

}  // namespace keel::detail
