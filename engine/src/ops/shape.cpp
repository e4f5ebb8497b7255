// Op definitions, shapes and views: reshape, view, transpose, permute, slice, expand and split
// build views over their input's buffer (view rules, no kernels); slice_backward, concat,
// contiguous and copy_to are computed. Each op's rules; kernels live in the backends.
#include <algorithm>

#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

Tensor viewAs(const OpDef& def, const Tensor& x, const Shape& s, bool allowCopy) {
  if (auto st = viewStrides(x.shape(), x.strides(), s))
    return Tensor::makeView(x, s, *st, x.offset());
  KEEL_CHECK(allowCopy, "op '", def.name, "': a tensor of shape ", shapeStr(x.shape()),
             " and strides ", shapeStr(x.strides()), " cannot be viewed as ", shapeStr(s),
             " without a copy; use reshape");
  NoGradGuard ng;
  Tensor c = contiguous(x);
  return Tensor::makeView(c, s, contiguousStrides(s), c.offset());
}

std::vector<int64_t> checkPermutation(const OpDef& def, const Tensor& x,
                                      const std::vector<int64_t>& dims) {
  KEEL_CHECK(int64_t(dims.size()) == x.dim(), "op '", def.name, "': ", dims.size(),
             " dims for a tensor of shape ", shapeStr(x.shape()));
  std::vector<int64_t> p;
  std::vector<bool> seen(dims.size(), false);
  for (int64_t d : dims) {
    int64_t n = normDim(d, x.dim(), def.name);
    KEEL_CHECK(!seen[size_t(n)], "op '", def.name, "': dims ", shapeStr(dims),
               " are not a permutation");
    seen[size_t(n)] = true;
    p.push_back(n);
  }
  return p;
}

Tensor sliceView(const OpDef& def, const Tensor& x, int64_t dim, int64_t start, int64_t end,
                 int64_t step) {
  KEEL_CHECK(x.dim() > 0, "op '", def.name, "': cannot slice a scalar");
  int64_t d = normDim(dim, x.dim(), def.name);
  auto [s0, len] = sliceBounds(x.size(d), start, end, step, def.name);
  Shape shape = x.shape(), strides = x.strides();
  int64_t off = x.offset() + s0 * strides[size_t(d)];
  shape[size_t(d)] = len;
  strides[size_t(d)] *= step;
  return Tensor::makeView(x, shape, strides, off);
}

void defineReshapes(OpTable& t) {
  auto reshapeBack = [](const BackwardCtx& c) -> Grads {
    return {reshape(c.gradOutputs[0], c.inputs[0].shape())};
  };
  OpDef& o = t.at(OpId::Reshape, 1);
  o.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    return {viewAs(op, in[0], inferShape(op.name, in[0].shape(), a.getInts("shape")), true)};
  };
  o.backward = reshapeBack;
  OpDef& v = t.at(OpId::View, 1);
  v.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    return {viewAs(op, in[0], inferShape(op.name, in[0].shape(), a.getInts("shape")), false)};
  };
  v.backward = reshapeBack;
}

void definePermutes(OpTable& t) {
  OpDef& o = t.at(OpId::Transpose, 1);
  o.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    const Tensor& x = in[0];
    int64_t d0 = normDim(a.getInt("dim0"), x.dim(), op.name);
    int64_t d1 = normDim(a.getInt("dim1"), x.dim(), op.name);
    Shape s = x.shape(), st = x.strides();
    std::swap(s[size_t(d0)], s[size_t(d1)]);
    std::swap(st[size_t(d0)], st[size_t(d1)]);
    return {Tensor::makeView(x, s, st, x.offset())};
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {transpose(c.gradOutputs[0], c.attrs.getInt("dim0"), c.attrs.getInt("dim1"))};
  };

  OpDef& p = t.at(OpId::Permute, 1);
  p.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    const Tensor& x = in[0];
    auto perm = checkPermutation(op, x, a.getInts("dims"));
    Shape s, st;
    for (int64_t d : perm) {
      s.push_back(x.shape()[size_t(d)]);
      st.push_back(x.strides()[size_t(d)]);
    }
    return {Tensor::makeView(x, s, st, x.offset())};
  };
  p.backward = [](const BackwardCtx& c) -> Grads {
    auto perm = checkPermutation(c.op, c.inputs[0], c.attrs.getInts("dims"));
    std::vector<int64_t> inv(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inv[size_t(perm[i])] = int64_t(i);
    return {permute(c.gradOutputs[0], inv)};
  };
}

void defineSlices(OpTable& t) {
  OpDef& o = t.at(OpId::Slice, 1);
  o.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    return {sliceView(op, in[0], a.getInt("dim"), a.getInt("start"), a.getInt("end"),
                      a.getInt("step", 1))};
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    Attrs a = c.attrs;
    a.set("shape", std::vector<int64_t>(c.inputs[0].shape()));
    return {dispatch1(OpId::SliceBackward, {c.gradOutputs[0]}, a)};
  };
  t.at(OpId::SliceBackward, 1).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    Shape s(a.getInts("shape").begin(), a.getInts("shape").end());
    KEEL_CHECK(!s.empty(), "op '", op.name, "': shape must have rank >= 1");
    int64_t d = normDim(a.getInt("dim"), int64_t(s.size()), op.name);
    auto [s0, len] =
        sliceBounds(s[size_t(d)], a.getInt("start"), a.getInt("end"), a.getInt("step", 1), op.name);
    (void)s0;
    Shape expect = s;
    expect[size_t(d)] = len;
    KEEL_CHECK(in[0].shape() == expect, "op '", op.name, "': grad ", shapeStr(in[0].shape()),
               " does not match the slice ", shapeStr(expect));
    return one(s, in[0].dtype());
  };
}

void defineExpand(OpTable& t) {
  OpDef& o = t.at(OpId::Expand, 1);
  o.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    const Tensor& x = in[0];
    const auto& req = a.getInts("shape");
    KEEL_CHECK(int64_t(req.size()) >= x.dim(), "op '", op.name, "': cannot expand ",
               shapeStr(x.shape()), " to fewer dims ", shapeStr(req));
    size_t lead = req.size() - size_t(x.dim());
    Shape s(req.size()), st(req.size(), 0);
    for (size_t i = 0; i < req.size(); ++i) {
      if (i < lead) {
        KEEL_CHECK(req[i] >= 0, "op '", op.name, "': bad target shape ", shapeStr(req));
        s[i] = req[i];
        continue;
      }
      int64_t xs = x.shape()[i - lead];
      int64_t want = req[i] == -1 ? xs : req[i];
      KEEL_CHECK(want == xs || xs == 1, "op '", op.name, "': cannot expand ", shapeStr(x.shape()),
                 " to ", shapeStr(req));
      s[i] = want;
      st[i] = (xs == 1 && want != 1) ? 0 : x.strides()[i - lead];
    }
    return {Tensor::makeView(x, s, st, x.offset())};
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {sumTo(c.gradOutputs[0], c.inputs[0].shape())};
  };
}

void defineConcatSplit(OpTable& t) {
  OpDef& o = t.at(OpId::Concat, -1);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireSameDtype(op.name, in);
    KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': cannot concatenate scalars");
    int64_t d = normDim(a.getInt("dim"), in[0].dim(), op.name);
    Shape s = in[0].shape();
    for (size_t i = 1; i < in.size(); ++i) {
      bool ok = in[i].dim() == in[0].dim();
      for (int64_t k = 0; ok && k < in[0].dim(); ++k) ok = k == d || in[i].size(k) == in[0].size(k);
      KEEL_CHECK(ok, "op '", op.name, "': input ", i, " ", shapeStr(in[i].shape()),
                 " does not match input 0 ", shapeStr(in[0].shape()), " outside dim ", d);
      s[size_t(d)] += in[i].size(d);
    }
    return one(s, in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    int64_t d = normDim(c.attrs.getInt("dim"), c.inputs[0].dim(), "concat");
    Grads out;
    int64_t off = 0;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      int64_t n = c.inputs[i].size(d);
      out.push_back(c.needsGrad[i] ? slice(c.gradOutputs[0], d, off, off + n) : Tensor());
      off += n;
    }
    return out;
  };

  OpDef& s = t.at(OpId::Split, 1);
  s.view = [](const OpDef& op, Inputs in, const Attrs& a) -> Grads {
    const Tensor& x = in[0];
    KEEL_CHECK(x.dim() > 0, "op '", op.name, "': cannot split a scalar");
    int64_t d = normDim(a.getInt("dim"), x.dim(), op.name);
    const auto& sizes = a.getInts("sizes");
    int64_t total = 0;
    for (int64_t n : sizes) {
      KEEL_CHECK(n >= 0, "op '", op.name, "': negative size in ", shapeStr(sizes));
      total += n;
    }
    KEEL_CHECK(total == x.size(d), "op '", op.name, "': sizes ", shapeStr(sizes), " sum to ", total,
               ", not to dim ", d, " of ", shapeStr(x.shape()));
    Grads out;
    int64_t off = 0;
    for (int64_t n : sizes) {
      out.push_back(sliceView(op, x, d, off, off + n, 1));
      off += n;
    }
    return out;
  };
  s.backward = [](const BackwardCtx& c) -> Grads {
    int64_t d = normDim(c.attrs.getInt("dim"), c.inputs[0].dim(), "split");
    Grads parts;
    for (size_t i = 0; i < c.gradOutputs.size(); ++i)
      parts.push_back(c.gradOutputs[i].defined() ? c.gradOutputs[i] : zerosLike(c.outputs[i]));
    return {ops::concat(parts, d)};
  };
}

void defineCopies(OpTable& t) {
  OpDef& o = t.at(OpId::Contiguous, 1);
  o.infer = [](const OpDef&, Inputs in, const Attrs&) { return inferUnary(in); };
  o.backward = [](const BackwardCtx& c) -> Grads { return {c.gradOutputs[0]}; };
  OpDef& to = t.at(OpId::CopyTo, 1);
  to.infer = [](const OpDef&, Inputs in, const Attrs&) { return inferUnary(in); };
  to.backward = [](const BackwardCtx& c) -> Grads {
    return {copyTo(c.gradOutputs[0], c.inputs[0].device())};
  };
}

}  // namespace

void defineShapeOps(OpTable& t) {
  t.family("Shapes and views");
  t.doc(OpId::Reshape, "x", "shape (one −1 allowed)", "view if possible, else a copy");
  t.doc(OpId::View, "x", "shape", "view", "error if the strides do not allow it");
  t.doc(OpId::Transpose, "x", "dim0, dim1", "view");
  t.doc(OpId::Permute, "x", "dims", "view");
  t.doc(OpId::Slice, "x", "dim, start, end, step (> 0)", "view",
        "start/end clamped like Python; negative counts from the end");
  t.doc(OpId::SliceBackward, "grad", "shape, dim, start, end, step", "zeros(shape)",
        "grad at the slice");
  t.doc(OpId::Expand, "x", "shape (−1 keeps)", "view (stride 0)");
  t.doc(OpId::Concat, "x0..xn", "dim", "joined", "shapes equal except along dim");
  t.doc(OpId::Split, "x", "sizes, dim", "views", "sizes sum to the extent");
  t.doc(OpId::Contiguous, "x", "", "copy, contiguous");
  t.doc(OpId::CopyTo, "x", "device", "copy on the device");

  defineReshapes(t);
  definePermutes(t);
  defineSlices(t);
  defineExpand(t);
  defineConcatSplit(t);
  defineCopies(t);
}

}  // namespace keel::detail
