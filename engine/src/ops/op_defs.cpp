// The built-in op table: for each op its inputs, shape inference (which validates shapes, dtypes
// and attributes), view rule where it is a view, and backward rule. Kernels live in the backends.
// Invariant: every op in op_ids.h has exactly one entry here (checked at start-up).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "flashmask/flashmask_geometry.h"
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

// ---------------------------------------------------------------- helpers
void requireSameDtype(std::string_view op, Inputs in) {
  for (size_t i = 1; i < in.size(); ++i)
    KEEL_CHECK(in[i].dtype() == in[0].dtype(), "op '", op, "': dtype mismatch, input 0 is ",
               dtypeName(in[0].dtype()), " ", shapeStr(in[0].shape()), " but input ", i, " is ",
               dtypeName(in[i].dtype()), " ", shapeStr(in[i].shape()));
}
void requireFloat(std::string_view op, const Tensor& t, std::string_view what) {
  KEEL_CHECK(isFloating(t.dtype()), "op '", op, "': ", what,
             " must be a floating-point tensor, got ", dtypeName(t.dtype()), " ",
             shapeStr(t.shape()));
}
void requireIndex(std::string_view op, const Tensor& t, std::string_view what) {
  KEEL_CHECK(isIntegral(t.dtype()), "op '", op, "': ", what, " must be int32 or int64, got ",
             dtypeName(t.dtype()), " ", shapeStr(t.shape()));
}

Tensor zerosLike(const Tensor& t) {
  return fill(t.shape(), 0.0, t.dtype(), t.device());
}

Tensor sumTo(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  size_t lead = size_t(g.dim()) - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < lead; ++i) dims.push_back(int64_t(i));
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && g.shape()[lead + i] != 1) dims.push_back(int64_t(lead + i));
  if (dims.empty()) return reshape(g, shape);
  return reshape(sum(g, dims, true), shape);
}

std::optional<Shape> viewStrides(const Shape& shape, const Shape& strides, const Shape& newShape) {
  if (shapeNumel(shape) == 0 || shape.empty()) return contiguousStrides(newShape);
  Shape out(newShape.size());
  int64_t viewD = int64_t(newShape.size()) - 1;
  int64_t base = strides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  // Walk the old dims from the back in chunks that are contiguous among themselves; each chunk
  // must map onto a run of new dims with the same element count.
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    tensorNumel *= shape[size_t(d)];
    bool chunkEnds =
        d == 0 || (shape[size_t(d - 1)] != 1 && strides[size_t(d - 1)] != tensorNumel * base);
    if (!chunkEnds) continue;
    while (viewD >= 0 && (viewNumel < tensorNumel || newShape[size_t(viewD)] == 1)) {
      out[size_t(viewD)] = viewNumel * base;
      viewNumel *= newShape[size_t(viewD)];
      --viewD;
    }
    if (viewNumel != tensorNumel) return std::nullopt;
    if (d > 0) {
      base = strides[size_t(d - 1)];
      tensorNumel = 1;
      viewNumel = 1;
    }
  }
  if (viewD != -1) return std::nullopt;
  return out;
}

Shape inferShape(std::string_view op, const Shape& from, const std::vector<int64_t>& to) {
  Shape s(to.begin(), to.end());
  int64_t known = 1, neg = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      KEEL_CHECK(neg < 0, "op '", op, "': more than one -1 in shape ", shapeStr(s));
      neg = int64_t(i);
    } else {
      KEEL_CHECK(s[i] >= 0, "op '", op, "': negative extent in shape ", shapeStr(s));
      known *= s[i];
    }
  }
  int64_t n = shapeNumel(from);
  if (neg >= 0) {
    KEEL_CHECK(known != 0 && n % known == 0, "op '", op, "': cannot reshape ", shapeStr(from), " (",
               n, " elements) to ", shapeStr(s));
    s[size_t(neg)] = n / known;
  }
  KEEL_CHECK(shapeNumel(s) == n, "op '", op, "': cannot reshape ", shapeStr(from), " (", n,
             " elements) to ", shapeStr(s), " (", shapeNumel(s), " elements)");
  return s;
}

namespace {

// ---------------------------------------------------------------- inference
Metas inferBroadcast(const OpDef& def, Inputs in, bool toBool) {
  requireSameDtype(def.name, in);
  return one(broadcastShapes(in[0].shape(), in[1].shape(), def.name),
             toBool ? DType::Bool : in[0].dtype());
}

Metas inferUnary(Inputs in) {
  return one(in[0].shape(), in[0].dtype());
}

Metas inferGradLike(const OpDef& def, Inputs in) {  // (grad, x) -> like x
  requireSameDtype(def.name, in);
  KEEL_CHECK(in[0].shape() == in[1].shape(), "op '", def.name, "': grad ", shapeStr(in[0].shape()),
             " and input ", shapeStr(in[1].shape()), " differ in shape");
  return one(in[1].shape(), in[1].dtype());
}

Shape reducedShape(const Shape& s, std::vector<int64_t> dims, bool keepdim, std::string_view op) {
  int64_t r = int64_t(s.size());
  if (dims.empty()) {
    dims.resize(size_t(r));
    std::iota(dims.begin(), dims.end(), 0);
  }
  std::vector<bool> red(size_t(r), false);
  for (int64_t d : dims) {
    int64_t n = normDim(d, r, op);
    KEEL_CHECK(!red[size_t(n)], "op '", op, "': dim ", d, " listed twice");
    red[size_t(n)] = true;
  }
  Shape out;
  for (int64_t i = 0; i < r; ++i) {
    if (!red[size_t(i)])
      out.push_back(s[size_t(i)]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Shape matmulShape(const OpDef& def, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  KEEL_CHECK(a.dim() >= 2 && b.dim() >= 2, "op '", def.name, "': operands need rank >= 2, got ",
             shapeStr(a.shape()), " and ", shapeStr(b.shape()));
  int64_t m = ta ? a.size(-1) : a.size(-2), ka = ta ? a.size(-2) : a.size(-1);
  int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
  KEEL_CHECK(ka == kb, "op '", def.name, "': inner dimensions differ: ", shapeStr(a.shape()),
             (ta ? "^T" : ""), " x ", shapeStr(b.shape()), (tb ? "^T" : ""), " (", ka, " vs ", kb,
             ")");
  Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape out = broadcastShapes(ba, bb, def.name);
  out.push_back(m);
  out.push_back(n);
  return out;
}

void requireLastDim(const OpDef& def, const Tensor& x, const Tensor& w, std::string_view what) {
  KEEL_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1), "op '", def.name, "': ", what,
             " ", shapeStr(w.shape()), " does not match the last dim of input ",
             shapeStr(x.shape()));
}

void checkIndexRankForDim(const OpDef& def, const Tensor& x, const Tensor& idx, int64_t dim) {
  KEEL_CHECK(idx.dim() == x.dim(), "op '", def.name, "': index ", shapeStr(idx.shape()),
             " must have the rank of input ", shapeStr(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim)
      KEEL_CHECK(idx.size(d) <= x.size(d), "op '", def.name, "': index ", shapeStr(idx.shape()),
                 " is larger than input ", shapeStr(x.shape()), " in dim ", d);
}

Shape factoryShape(const Attrs& a) {
  const auto& s = a.getInts("shape");
  for (int64_t d : s) KEEL_CHECK(d >= 0, "factory: negative extent in shape ", shapeStr(s));
  return Shape(s.begin(), s.end());
}

// ---------------------------------------------------------------- attention
// The log-sum-exp output of flashmask_attention: float64 for float64 inputs, else float32.
DType lseDtype(DType t) {
  return t == DType::Float64 ? DType::Float64 : DType::Float32;
}

// q [B, Sq, H, D], k and v [B, Sk, Hk, D], H a multiple of Hk; attributes causal, window_size,
// dropout, scale, seed, offset, skip_tiles in range.
void checkAttention(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                    const Attrs& a) {
  requireFloat(op, q, "q");
  KEEL_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "op '", op,
             "': q, k and v must share a dtype, got ", dtypeName(q.dtype()), ", ",
             dtypeName(k.dtype()), ", ", dtypeName(v.dtype()));
  KEEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "op '", op,
             "': q must be [B, Sq, H, D] and k, v [B, Sk, Hk, D], got q ", shapeStr(q.shape()),
             ", k ", shapeStr(k.shape()), ", v ", shapeStr(v.shape()));
  KEEL_CHECK(k.shape() == v.shape(), "op '", op, "': k ", shapeStr(k.shape()), " and v ",
             shapeStr(v.shape()), " differ");
  KEEL_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "op '", op, "': q ",
             shapeStr(q.shape()), " and k ", shapeStr(k.shape()), " differ in batch or head dim");
  KEEL_CHECK(k.size(2) >= 1 && q.size(2) % k.size(2) == 0, "op '", op, "': q heads (", q.size(2),
             ") must be a multiple of k/v heads (", k.size(2), ")");
  KEEL_CHECK(q.size(3) >= 1, "op '", op, "': head dim must be >= 1");
  const int64_t w = a.getInt("window_size", -1);
  KEEL_CHECK(w == -1 || w >= 1, "op '", op, "': window_size must be -1 (off) or >= 1, got ", w);
  const double p = a.getDouble("dropout", 0.0);
  KEEL_CHECK(p >= 0.0 && p < 1.0, "op '", op, "': dropout must be in [0, 1), got ", p);
  const double s = a.getDouble("scale", 0.0);
  KEEL_CHECK(s >= 0.0 && std::isfinite(s), "op '", op,
             "': scale must be finite and >= 0 (0: 1/sqrt(D)), got ", s);
}

// ---------------------------------------------------------------- views
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

// ---------------------------------------------------------------- backward helpers
Tensor zeroScalar(const Tensor& like) {
  return fill({}, 0.0, like.dtype(), like.device());
}

Tensor expandBack(const Tensor& g, const Tensor& x, const std::vector<int64_t>& dims0,
                  bool keepdim) {
  Shape keep = reducedShape(x.shape(), dims0, true, "sum");
  Tensor gk = keepdim ? g : reshape(g, keep);
  return contiguous(expand(gk, x.shape()));
}

// The table lives for the process: rules capture references to their own entries (for names).
std::vector<OpDef>& builtinDefs() {
  static std::vector<OpDef>& d = *new std::vector<OpDef>(size_t(kNumBuiltinOps));
  auto at = [&](OpId id, int nin) -> OpDef& {
    OpDef& o = d[size_t(id)];
    o.numInputs = nin;
    return o;
  };
  // Names come from op_ids.h so the table and the enum cannot disagree.
  {
    const char* names[] = {
#define KEEL_X_NAME(e, n) n,
        KEEL_BUILTIN_OPS(KEEL_X_NAME)
#undef KEEL_X_NAME
    };
    static_assert(std::size(names) == size_t(kNumBuiltinOps));
    for (size_t i = 0; i < d.size(); ++i) d[i].name = names[i];
  }

  // ---- binary elementwise
  for (OpId id :
       {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Pow, OpId::Maximum, OpId::Minimum}) {
    OpDef& o = at(id, 2);
    o.infer = [&o](Inputs in, const Attrs&) { return inferBroadcast(o, in, false); };
  }
  for (OpId id : {OpId::Eq, OpId::Lt, OpId::Gt}) {
    OpDef& o = at(id, 2);
    o.infer = [&o](Inputs in, const Attrs&) { return inferBroadcast(o, in, true); };
  }
  at(OpId::Add, 2).backward = [](const BackwardCtx& c) -> std::vector<Tensor> {
    const Tensor& g = c.gradOutputs[0];
    return {sumTo(g, c.inputs[0].shape()), sumTo(g, c.inputs[1].shape())};
  };
  at(OpId::Sub, 2).backward = [](const BackwardCtx& c) -> std::vector<Tensor> {
    const Tensor& g = c.gradOutputs[0];
    return {sumTo(g, c.inputs[0].shape()),
            c.needsGrad[1] ? sumTo(neg(g), c.inputs[1].shape()) : Tensor()};
  };
  at(OpId::Mul, 2).backward = [](const BackwardCtx& c) -> std::vector<Tensor> {
    const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1];
    return {c.needsGrad[0] ? sumTo(g * b, a.shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(g * a, b.shape()) : Tensor()};
  };
  at(OpId::Div, 2).backward = [](const BackwardCtx& c) -> std::vector<Tensor> {
    const Tensor &g = c.gradOutputs[0], &b = c.inputs[1], &out = c.outputs[0];
    return {c.needsGrad[0] ? sumTo(g / b, c.inputs[0].shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(neg(g * out / b), b.shape()) : Tensor()};
  };
  at(OpId::Pow, 2).backward = [](const BackwardCtx& c) -> std::vector<Tensor> {
    const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1], &out = c.outputs[0];
    return {c.needsGrad[0] ? sumTo(g * b * pow(a, addScalar(b, -1.0)), a.shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(g * out * log(a), b.shape()) : Tensor()};
  };
  auto minmaxBack = [](const BackwardCtx& c, bool isMax) -> std::vector<Tensor> {
    const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1];
    Tensor bWins = isMax ? gt(b, a) : lt(b, a);  // ties go to a
    Tensor z = zeroScalar(g);
    return {c.needsGrad[0] ? sumTo(where(bWins, z, g), a.shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(where(bWins, g, z), b.shape()) : Tensor()};
  };
  at(OpId::Maximum, 2).backward = [minmaxBack](const BackwardCtx& c) {
    return minmaxBack(c, true);
  };
  at(OpId::Minimum, 2).backward = [minmaxBack](const BackwardCtx& c) {
    return minmaxBack(c, false);
  };

  // ---- unary
  for (OpId id : {OpId::Neg, OpId::Exp, OpId::Log, OpId::Sqrt, OpId::Rsqrt, OpId::Tanh,
                  OpId::Sigmoid, OpId::Relu, OpId::Gelu, OpId::Silu, OpId::Abs, OpId::AddScalar,
                  OpId::MulScalar, OpId::PowScalar})
    at(id, 1).infer = [](Inputs in, const Attrs&) { return inferUnary(in); };
  for (OpId id : {OpId::GeluBackward, OpId::SiluBackward}) {
    OpDef& o = at(id, 2);
    o.infer = [&o](Inputs in, const Attrs&) { return inferGradLike(o, in); };
  }
  using BF = std::vector<Tensor>;
  at(OpId::Neg, 1).backward = [](const BackwardCtx& c) -> BF { return {neg(c.gradOutputs[0])}; };
  at(OpId::Exp, 1).backward = [](const BackwardCtx& c) -> BF {
    return {c.gradOutputs[0] * c.outputs[0]};
  };
  at(OpId::Log, 1).backward = [](const BackwardCtx& c) -> BF {
    return {c.gradOutputs[0] / c.inputs[0]};
  };
  at(OpId::Sqrt, 1).backward = [](const BackwardCtx& c) -> BF {
    return {mulScalar(c.gradOutputs[0] / c.outputs[0], 0.5)};
  };
  at(OpId::Rsqrt, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor& y = c.outputs[0];
    return {mulScalar(c.gradOutputs[0] * y * y * y, -0.5)};
  };
  at(OpId::Tanh, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor& y = c.outputs[0];
    return {c.gradOutputs[0] * addScalar(neg(y * y), 1.0)};
  };
  at(OpId::Sigmoid, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor& y = c.outputs[0];
    return {c.gradOutputs[0] * y * addScalar(neg(y), 1.0)};
  };
  at(OpId::Relu, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor &g = c.gradOutputs[0], &x = c.inputs[0];
    return {where(gt(x, zeroScalar(x)), g, zeroScalar(g))};
  };
  at(OpId::Gelu, 1).backward = [](const BackwardCtx& c) -> BF {
    return {dispatch1(OpId::GeluBackward, {c.gradOutputs[0], c.inputs[0]})};
  };
  at(OpId::Silu, 1).backward = [](const BackwardCtx& c) -> BF {
    return {dispatch1(OpId::SiluBackward, {c.gradOutputs[0], c.inputs[0]})};
  };
  at(OpId::Abs, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor &g = c.gradOutputs[0], &x = c.inputs[0];
    return {where(lt(x, zeroScalar(x)), neg(g), g)};
  };
  at(OpId::AddScalar, 1).backward = [](const BackwardCtx& c) -> BF { return {c.gradOutputs[0]}; };
  at(OpId::MulScalar, 1).backward = [](const BackwardCtx& c) -> BF {
    return {mulScalar(c.gradOutputs[0], c.attrs.getDouble("scalar"))};
  };
  at(OpId::PowScalar, 1).backward = [](const BackwardCtx& c) -> BF {
    double e = c.attrs.getDouble("exponent");
    return {mulScalar(c.gradOutputs[0] * powScalar(c.inputs[0], e - 1.0), e)};
  };

  // ---- reductions
  for (OpId id : {OpId::Sum, OpId::Mean}) {
    OpDef& o = at(id, 1);
    o.infer = [&o](Inputs in, const Attrs& a) {
      return one(reducedShape(in[0].shape(), a.getInts("dims"), a.getBool("keepdim"), o.name),
                 in[0].dtype());
    };
  }
  at(OpId::Sum, 1).backward = [](const BackwardCtx& c) -> BF {
    return {expandBack(c.gradOutputs[0], c.inputs[0], c.attrs.getInts("dims"),
                       c.attrs.getBool("keepdim"))};
  };
  at(OpId::Mean, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor& x = c.inputs[0];
    int64_t count = x.numel() / std::max<int64_t>(1, c.outputs[0].numel());
    return {mulScalar(
        expandBack(c.gradOutputs[0], x, c.attrs.getInts("dims"), c.attrs.getBool("keepdim")),
        1.0 / double(std::max<int64_t>(count, 1)))};
  };
  for (OpId id : {OpId::Max, OpId::Argmax}) {
    OpDef& o = at(id, 1);
    o.infer = [&o, id](Inputs in, const Attrs& a) {
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': needs a tensor of rank >= 1");
      int64_t dim = normDim(a.getInt("dim"), in[0].dim(), o.name);
      KEEL_CHECK(in[0].size(dim) > 0, "op '", o.name, "': dim ", dim, " of shape ",
                 shapeStr(in[0].shape()), " is empty");
      return one(reducedShape(in[0].shape(), {dim}, a.getBool("keepdim"), o.name),
                 id == OpId::Max ? in[0].dtype() : DType::Int64);
    };
  }
  at(OpId::Max, 1).backward = [](const BackwardCtx& c) -> BF {
    const Tensor& x = c.inputs[0];
    int64_t dim = c.attrs.getInt("dim");
    Tensor idx = argmax(x, dim, true);
    Tensor g = c.attrs.getBool("keepdim") ? c.gradOutputs[0] : unsqueeze(c.gradOutputs[0], dim);
    return {scatterAdd(zerosLike(x), dim, idx, g)};
  };

  // ---- matmul
  {
    OpDef& o = at(OpId::Matmul, 2);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireSameDtype(o.name, in);
      return one(matmulShape(o, in[0], in[1], a.getBool("trans_a"), a.getBool("trans_b")),
                 in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1];
      bool ta = c.attrs.getBool("trans_a"), tb = c.attrs.getBool("trans_b");
      Tensor ga, gb;
      if (c.needsGrad[0]) {
        if (!ta)
          ga = matmul(g, b, false, !tb);
        else
          ga = matmul(b, g, tb, true);
        ga = sumTo(ga, a.shape());
      }
      if (c.needsGrad[1]) {
        if (!tb)
          gb = matmul(a, g, !ta, false);
        else
          gb = matmul(g, a, true, ta);
        gb = sumTo(gb, b.shape());
      }
      return {ga, gb};
    };
  }

  // ---- softmax family
  for (OpId id : {OpId::Softmax, OpId::LogSoftmax}) {
    OpDef& o = at(id, 1);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireFloat(o.name, in[0], "input");
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': needs a tensor of rank >= 1");
      normDim(a.getInt("dim"), in[0].dim(), o.name);
      return inferUnary(in);
    };
  }
  for (OpId id : {OpId::SoftmaxBackward, OpId::LogSoftmaxBackward}) {
    OpDef& o = at(id, 2);
    o.infer = [&o](Inputs in, const Attrs& a) {
      normDim(a.getInt("dim"), in[1].dim(), o.name);
      return inferGradLike(o, in);
    };
  }
  at(OpId::Softmax, 1).backward = [](const BackwardCtx& c) -> BF {
    return {dispatch1(OpId::SoftmaxBackward, {c.gradOutputs[0], c.outputs[0]}, c.attrs)};
  };
  at(OpId::LogSoftmax, 1).backward = [](const BackwardCtx& c) -> BF {
    return {dispatch1(OpId::LogSoftmaxBackward, {c.gradOutputs[0], c.outputs[0]}, c.attrs)};
  };

  // ---- norms
  {
    OpDef& o = at(OpId::LayerNorm, 3);
    o.infer = [&o](Inputs in, const Attrs&) {
      requireSameDtype(o.name, in);
      requireFloat(o.name, in[0], "input");
      requireLastDim(o, in[0], in[1], "weight");
      requireLastDim(o, in[0], in[2], "bias");
      return inferUnary(in);
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return dispatch(OpId::LayerNormBackward, {c.gradOutputs[0], c.inputs[0], c.inputs[1]},
                      c.attrs);
    };
    OpDef& b = at(OpId::LayerNormBackward, 3);
    b.infer = [&b](Inputs in, const Attrs&) {
      requireSameDtype(b.name, in);
      KEEL_CHECK(in[0].shape() == in[1].shape(), "op '", b.name, "': grad ",
                 shapeStr(in[0].shape()), " and input ", shapeStr(in[1].shape()), " differ");
      requireLastDim(b, in[1], in[2], "weight");
      return Metas{{in[1].shape(), in[1].dtype()},
                   {in[2].shape(), in[2].dtype()},
                   {in[2].shape(), in[2].dtype()}};
    };
  }
  {
    OpDef& o = at(OpId::RmsNorm, 2);
    o.infer = [&o](Inputs in, const Attrs&) {
      requireSameDtype(o.name, in);
      requireFloat(o.name, in[0], "input");
      requireLastDim(o, in[0], in[1], "weight");
      return inferUnary(in);
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return dispatch(OpId::RmsNormBackward, {c.gradOutputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
    };
    OpDef& b = at(OpId::RmsNormBackward, 3);
    b.infer = [&b](Inputs in, const Attrs&) {
      requireSameDtype(b.name, in);
      KEEL_CHECK(in[0].shape() == in[1].shape(), "op '", b.name, "': grad ",
                 shapeStr(in[0].shape()), " and input ", shapeStr(in[1].shape()), " differ");
      requireLastDim(b, in[1], in[2], "weight");
      return Metas{{in[1].shape(), in[1].dtype()}, {in[2].shape(), in[2].dtype()}};
    };
  }

  // ---- embedding, cross entropy, dropout
  {
    OpDef& o = at(OpId::Embedding, 2);
    o.infer = [&o](Inputs in, const Attrs&) {
      requireFloat(o.name, in[0], "weight");
      KEEL_CHECK(in[0].dim() == 2, "op '", o.name, "': weight must be [V, D], got ",
                 shapeStr(in[0].shape()));
      requireIndex(o.name, in[1], "indices");
      Shape s = in[1].shape();
      s.push_back(in[0].size(1));
      return one(s, in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {dispatch1(OpId::EmbeddingBackward, {c.gradOutputs[0], c.inputs[1]},
                        Attrs().set("num_weights", c.inputs[0].size(0))),
              Tensor()};
    };
    OpDef& b = at(OpId::EmbeddingBackward, 2);
    b.infer = [&b](Inputs in, const Attrs& a) {
      requireFloat(b.name, in[0], "grad");
      requireIndex(b.name, in[1], "indices");
      Shape expect = in[1].shape();
      expect.push_back(in[0].dim() > 0 ? in[0].size(-1) : 0);
      KEEL_CHECK(in[0].shape() == expect, "op '", b.name, "': grad ", shapeStr(in[0].shape()),
                 " does not match indices ", shapeStr(in[1].shape()));
      int64_t v = a.getInt("num_weights");
      KEEL_CHECK(v > 0, "op '", b.name, "': num_weights must be positive");
      return one({v, in[0].size(-1)}, in[0].dtype());
    };
  }
  {
    OpDef& o = at(OpId::CrossEntropy, 2);
    o.infer = [&o](Inputs in, const Attrs&) {
      requireFloat(o.name, in[0], "logits");
      KEEL_CHECK(in[0].dim() == 2, "op '", o.name, "': logits must be [N, C], got ",
                 shapeStr(in[0].shape()));
      requireIndex(o.name, in[1], "targets");
      KEEL_CHECK(in[1].dim() == 1 && in[1].size(0) == in[0].size(0), "op '", o.name, "': targets ",
                 shapeStr(in[1].shape()), " do not match logits ", shapeStr(in[0].shape()),
                 " (expected [", in[0].size(0), "])");
      return one({}, in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {dispatch1(OpId::CrossEntropyBackward, {c.gradOutputs[0], c.inputs[0], c.inputs[1]},
                        c.attrs),
              Tensor()};
    };
    OpDef& b = at(OpId::CrossEntropyBackward, 3);
    b.infer = [&b](Inputs in, const Attrs&) {
      KEEL_CHECK(in[0].numel() == 1 && in[0].dtype() == in[1].dtype(), "op '", b.name,
                 "': grad must be a scalar of the logits' dtype");
      KEEL_CHECK(in[1].dim() == 2 && in[2].dim() == 1 && in[2].size(0) == in[1].size(0), "op '",
                 b.name, "': logits ", shapeStr(in[1].shape()), " and targets ",
                 shapeStr(in[2].shape()), " do not match");
      requireIndex(b.name, in[2], "targets");
      return one(in[1].shape(), in[1].dtype());
    };
  }
  {
    OpDef& o = at(OpId::Dropout, 1);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireFloat(o.name, in[0], "input");
      double p = a.getDouble("p");
      KEEL_CHECK(p >= 0.0 && p < 1.0, "op '", o.name, "': p must be in [0, 1), got ", p);
      return inferUnary(in);
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {dispatch1(OpId::Dropout, {c.gradOutputs[0]}, c.attrs)};
    };
  }

  // ---- flashmask attention. See Note [FlashMask geometry] (flashmask/flashmask_geometry.h).
  {
    OpDef& o = at(OpId::FlashmaskAttention, -1);  // q, k, v [, startend_row_indices]
    o.infer = [&o](Inputs in, const Attrs& a) {
      KEEL_CHECK(in.size() == 3 || in.size() == 4, "op '", o.name,
                 "' expects q, k, v and optionally startend_row_indices, got ", in.size(),
                 " inputs");
      checkAttention(o.name, in[0], in[1], in[2], a);
      if (in.size() == 4)
        flashmask::validateIndices(o.name, in[3], in[0].shape(), in[1].shape(),
                                   a.getBool("causal", false));
      const Shape& q = in[0].shape();
      return Metas{{q, in[0].dtype()}, {{q[0], q[2], q[1]}, lseDtype(in[0].dtype())}};
    };
    // For observers only: see Note [FlashMask op attributes].
    o.describe = [](Inputs in, Attrs& a) {
      flashmask::describeMask(a, in[0], in[1], in.size() == 4 ? in[3] : Tensor());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      const Tensor &q = c.inputs[0], &out = c.outputs[0], &lse = c.outputs[1];
      Tensor g = c.gradOutputs[0].defined() ? c.gradOutputs[0] : zerosLike(out);
      Tensor glse = c.gradOutputs.size() > 1 && c.gradOutputs[1].defined() ? c.gradOutputs[1]
                                                                           : zerosLike(lse);
      std::vector<Tensor> in{g, q, c.inputs[1], c.inputs[2], out, lse, glse};
      if (c.inputs.size() == 4) in.push_back(c.inputs[3]);
      BF r = dispatch(OpId::FlashmaskAttentionBackward, in, c.attrs);
      if (c.inputs.size() == 4) r.push_back(Tensor());
      return r;
    };
    // grad_out, q, k, v, out, lse, grad_lse [, startend_row_indices] -> dq, dk, dv
    OpDef& b = at(OpId::FlashmaskAttentionBackward, -1);
    b.infer = [&b](Inputs in, const Attrs& a) {
      KEEL_CHECK(in.size() == 7 || in.size() == 8, "op '", b.name,
                 "' expects grad_out, q, k, v, out, lse, grad_lse and optionally "
                 "startend_row_indices, got ",
                 in.size(), " inputs");
      checkAttention(b.name, in[1], in[2], in[3], a);
      const Shape& q = in[1].shape();
      for (int i : {0, 4})
        KEEL_CHECK(in[size_t(i)].shape() == q && in[size_t(i)].dtype() == in[1].dtype(), "op '",
                   b.name, "': ", i == 0 ? "grad_out " : "out ", shapeStr(in[size_t(i)].shape()),
                   " ", dtypeName(in[size_t(i)].dtype()), " does not match q ", shapeStr(q), " ",
                   dtypeName(in[1].dtype()));
      const Shape ls{q[0], q[2], q[1]};
      for (int i : {5, 6})
        KEEL_CHECK(in[size_t(i)].shape() == ls && in[size_t(i)].dtype() == lseDtype(in[1].dtype()),
                   "op '", b.name, "': ", i == 5 ? "lse " : "grad_lse ",
                   shapeStr(in[size_t(i)].shape()), " ", dtypeName(in[size_t(i)].dtype()),
                   " must be ", shapeStr(ls), " ", dtypeName(lseDtype(in[1].dtype())));
      if (in.size() == 8)
        flashmask::validateIndices(b.name, in[7], q, in[2].shape(), a.getBool("causal", false));
      return Metas{
          {q, in[1].dtype()}, {in[2].shape(), in[2].dtype()}, {in[3].shape(), in[3].dtype()}};
    };
    b.describe = [](Inputs in, Attrs& a) {
      flashmask::describeMask(a, in[1], in[2], in.size() == 8 ? in[7] : Tensor());
    };
  }

  // ---- views
  {
    OpDef& o = at(OpId::Reshape, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      return {viewAs(o, in[0], inferShape(o.name, in[0].shape(), a.getInts("shape")), true)};
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {reshape(c.gradOutputs[0], c.inputs[0].shape())};
    };
    OpDef& v = at(OpId::View, 1);
    v.view = [&v](Inputs in, const Attrs& a) -> BF {
      return {viewAs(v, in[0], inferShape(v.name, in[0].shape(), a.getInts("shape")), false)};
    };
    v.backward = o.backward;
  }
  {
    OpDef& o = at(OpId::Transpose, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      const Tensor& x = in[0];
      int64_t d0 = normDim(a.getInt("dim0"), x.dim(), o.name);
      int64_t d1 = normDim(a.getInt("dim1"), x.dim(), o.name);
      Shape s = x.shape(), st = x.strides();
      std::swap(s[size_t(d0)], s[size_t(d1)]);
      std::swap(st[size_t(d0)], st[size_t(d1)]);
      return {Tensor::makeView(x, s, st, x.offset())};
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {transpose(c.gradOutputs[0], c.attrs.getInt("dim0"), c.attrs.getInt("dim1"))};
    };
  }
  {
    OpDef& o = at(OpId::Permute, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      const Tensor& x = in[0];
      auto p = checkPermutation(o, x, a.getInts("dims"));
      Shape s, st;
      for (int64_t d : p) {
        s.push_back(x.shape()[size_t(d)]);
        st.push_back(x.strides()[size_t(d)]);
      }
      return {Tensor::makeView(x, s, st, x.offset())};
    };
    o.backward = [&o](const BackwardCtx& c) -> BF {
      auto p = checkPermutation(o, c.inputs[0], c.attrs.getInts("dims"));
      std::vector<int64_t> inv(p.size());
      for (size_t i = 0; i < p.size(); ++i) inv[size_t(p[i])] = int64_t(i);
      return {permute(c.gradOutputs[0], inv)};
    };
  }
  {
    OpDef& o = at(OpId::Slice, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      return {sliceView(o, in[0], a.getInt("dim"), a.getInt("start"), a.getInt("end"),
                        a.getInt("step", 1))};
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      Attrs a = c.attrs;
      a.set("shape", std::vector<int64_t>(c.inputs[0].shape()));
      return {dispatch1(OpId::SliceBackward, {c.gradOutputs[0]}, a)};
    };
    OpDef& b = at(OpId::SliceBackward, 1);
    b.infer = [&b](Inputs in, const Attrs& a) {
      Shape s(a.getInts("shape").begin(), a.getInts("shape").end());
      KEEL_CHECK(!s.empty(), "op '", b.name, "': shape must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), int64_t(s.size()), b.name);
      auto [s0, len] = sliceBounds(s[size_t(d)], a.getInt("start"), a.getInt("end"),
                                   a.getInt("step", 1), b.name);
      (void)s0;
      Shape expect = s;
      expect[size_t(d)] = len;
      KEEL_CHECK(in[0].shape() == expect, "op '", b.name, "': grad ", shapeStr(in[0].shape()),
                 " does not match the slice ", shapeStr(expect));
      return one(s, in[0].dtype());
    };
  }
  {
    OpDef& o = at(OpId::Expand, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      const Tensor& x = in[0];
      const auto& req = a.getInts("shape");
      KEEL_CHECK(int64_t(req.size()) >= x.dim(), "op '", o.name, "': cannot expand ",
                 shapeStr(x.shape()), " to fewer dims ", shapeStr(req));
      size_t lead = req.size() - size_t(x.dim());
      Shape s(req.size()), st(req.size(), 0);
      for (size_t i = 0; i < req.size(); ++i) {
        if (i < lead) {
          KEEL_CHECK(req[i] >= 0, "op '", o.name, "': bad target shape ", shapeStr(req));
          s[i] = req[i];
          continue;
        }
        int64_t xs = x.shape()[i - lead];
        int64_t want = req[i] == -1 ? xs : req[i];
        KEEL_CHECK(want == xs || xs == 1, "op '", o.name, "': cannot expand ", shapeStr(x.shape()),
                   " to ", shapeStr(req));
        s[i] = want;
        st[i] = (xs == 1 && want != 1) ? 0 : x.strides()[i - lead];
      }
      return {Tensor::makeView(x, s, st, x.offset())};
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {sumTo(c.gradOutputs[0], c.inputs[0].shape())};
    };
  }
  {
    OpDef& o = at(OpId::Concat, -1);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireSameDtype(o.name, in);
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': cannot concatenate scalars");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), o.name);
      Shape s = in[0].shape();
      for (size_t i = 1; i < in.size(); ++i) {
        bool ok = in[i].dim() == in[0].dim();
        for (int64_t k = 0; ok && k < in[0].dim(); ++k)
          ok = k == d || in[i].size(k) == in[0].size(k);
        KEEL_CHECK(ok, "op '", o.name, "': input ", i, " ", shapeStr(in[i].shape()),
                   " does not match input 0 ", shapeStr(in[0].shape()), " outside dim ", d);
        s[size_t(d)] += in[i].size(d);
      }
      return one(s, in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      int64_t d = normDim(c.attrs.getInt("dim"), c.inputs[0].dim(), "concat");
      BF out;
      int64_t off = 0;
      for (size_t i = 0; i < c.inputs.size(); ++i) {
        int64_t n = c.inputs[i].size(d);
        out.push_back(c.needsGrad[i] ? slice(c.gradOutputs[0], d, off, off + n) : Tensor());
        off += n;
      }
      return out;
    };
  }
  {
    OpDef& o = at(OpId::Split, 1);
    o.view = [&o](Inputs in, const Attrs& a) -> BF {
      const Tensor& x = in[0];
      KEEL_CHECK(x.dim() > 0, "op '", o.name, "': cannot split a scalar");
      int64_t d = normDim(a.getInt("dim"), x.dim(), o.name);
      const auto& sizes = a.getInts("sizes");
      int64_t total = 0;
      for (int64_t s : sizes) {
        KEEL_CHECK(s >= 0, "op '", o.name, "': negative size in ", shapeStr(sizes));
        total += s;
      }
      KEEL_CHECK(total == x.size(d), "op '", o.name, "': sizes ", shapeStr(sizes), " sum to ",
                 total, ", not to dim ", d, " of ", shapeStr(x.shape()));
      BF out;
      int64_t off = 0;
      for (int64_t s : sizes) {
        out.push_back(sliceView(o, x, d, off, off + s, 1));
        off += s;
      }
      return out;
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      int64_t d = normDim(c.attrs.getInt("dim"), c.inputs[0].dim(), "split");
      BF parts;
      for (size_t i = 0; i < c.gradOutputs.size(); ++i)
        parts.push_back(c.gradOutputs[i].defined() ? c.gradOutputs[i] : zerosLike(c.outputs[i]));
      return {ops::concat(parts, d)};
    };
  }
  {
    OpDef& o = at(OpId::Contiguous, 1);
    o.infer = [](Inputs in, const Attrs&) { return inferUnary(in); };
    o.backward = [](const BackwardCtx& c) -> BF { return {c.gradOutputs[0]}; };
    OpDef& t = at(OpId::CopyTo, 1);
    t.infer = [](Inputs in, const Attrs&) { return inferUnary(in); };
    t.backward = [](const BackwardCtx& c) -> BF {
      return {copyTo(c.gradOutputs[0], c.inputs[0].device())};
    };
  }

  // ---- indexing
  {
    OpDef& o = at(OpId::IndexSelect, 2);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireIndex(o.name, in[1], "index");
      KEEL_CHECK(in[1].dim() == 1, "op '", o.name, "': index must be 1-D, got ",
                 shapeStr(in[1].shape()));
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': input must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), o.name);
      Shape s = in[0].shape();
      s[size_t(d)] = in[1].size(0);
      return one(s, in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      const Tensor& x = c.inputs[0];
      return {indexAdd(zerosLike(x), c.attrs.getInt("dim"), c.inputs[1], c.gradOutputs[0]),
              Tensor()};
    };
    OpDef& ia = at(OpId::IndexAdd, 3);
    ia.infer = [&ia](Inputs in, const Attrs& a) {
      requireIndex(ia.name, in[1], "index");
      KEEL_CHECK(in[1].dim() == 1, "op '", ia.name, "': index must be 1-D, got ",
                 shapeStr(in[1].shape()));
      KEEL_CHECK(in[0].dtype() == in[2].dtype(), "op '", ia.name, "': dtype mismatch, input ",
                 dtypeName(in[0].dtype()), " vs source ", dtypeName(in[2].dtype()));
      KEEL_CHECK(in[0].dim() > 0, "op '", ia.name, "': input must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), ia.name);
      Shape expect = in[0].shape();
      expect[size_t(d)] = in[1].size(0);
      KEEL_CHECK(in[2].shape() == expect, "op '", ia.name, "': source ", shapeStr(in[2].shape()),
                 " must be ", shapeStr(expect), " for input ", shapeStr(in[0].shape()),
                 " and index ", shapeStr(in[1].shape()));
      return one(in[0].shape(), in[0].dtype());
    };
    ia.backward = [](const BackwardCtx& c) -> BF {
      const Tensor& g = c.gradOutputs[0];
      return {g, Tensor(),
              c.needsGrad[2] ? indexSelect(g, c.attrs.getInt("dim"), c.inputs[1]) : Tensor()};
    };
  }
  {
    OpDef& o = at(OpId::Gather, 2);
    o.infer = [&o](Inputs in, const Attrs& a) {
      requireIndex(o.name, in[1], "index");
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': input must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), o.name);
      checkIndexRankForDim(o, in[0], in[1], d);
      return one(in[1].shape(), in[0].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {
          scatterAdd(zerosLike(c.inputs[0]), c.attrs.getInt("dim"), c.inputs[1], c.gradOutputs[0]),
          Tensor()};
    };
    OpDef& s = at(OpId::ScatterAdd, 3);
    s.infer = [&s](Inputs in, const Attrs& a) {
      requireIndex(s.name, in[1], "index");
      KEEL_CHECK(in[0].dtype() == in[2].dtype(), "op '", s.name, "': dtype mismatch, input ",
                 dtypeName(in[0].dtype()), " vs source ", dtypeName(in[2].dtype()));
      KEEL_CHECK(in[0].dim() > 0, "op '", s.name, "': input must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), s.name);
      checkIndexRankForDim(s, in[0], in[1], d);
      KEEL_CHECK(in[1].shape() == in[2].shape(), "op '", s.name, "': index ",
                 shapeStr(in[1].shape()), " and source ", shapeStr(in[2].shape()), " differ");
      return one(in[0].shape(), in[0].dtype());
    };
    s.backward = [](const BackwardCtx& c) -> BF {
      const Tensor& g = c.gradOutputs[0];
      return {g, Tensor(),
              c.needsGrad[2] ? gather(g, c.attrs.getInt("dim"), c.inputs[1]) : Tensor()};
    };
  }
  {
    OpDef& o = at(OpId::Topk, 1);
    o.infer = [&o](Inputs in, const Attrs& a) {
      KEEL_CHECK(in[0].dim() > 0, "op '", o.name, "': input must have rank >= 1");
      int64_t d = normDim(a.getInt("dim"), in[0].dim(), o.name);
      int64_t k = a.getInt("k");
      KEEL_CHECK(k >= 0 && k <= in[0].size(d), "op '", o.name, "': k = ", k,
                 " out of range for dim ", d, " of ", shapeStr(in[0].shape()));
      Shape s = in[0].shape();
      s[size_t(d)] = k;
      return Metas{{s, in[0].dtype()}, {s, DType::Int64}};
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      return {scatterAdd(zerosLike(c.inputs[0]), c.attrs.getInt("dim"), c.outputs[1],
                         c.gradOutputs[0])};
    };
    OpDef& s = at(OpId::Argsort, 1);
    s.infer = [&s](Inputs in, const Attrs& a) {
      KEEL_CHECK(in[0].dim() > 0, "op '", s.name, "': input must have rank >= 1");
      normDim(a.getInt("dim"), in[0].dim(), s.name);
      return one(in[0].shape(), DType::Int64);
    };
  }
  {
    OpDef& o = at(OpId::Where, 3);
    o.infer = [&o](Inputs in, const Attrs&) {
      KEEL_CHECK(in[0].dtype() == DType::Bool, "op '", o.name, "': condition must be bool, got ",
                 dtypeName(in[0].dtype()));
      KEEL_CHECK(in[1].dtype() == in[2].dtype(), "op '", o.name, "': dtype mismatch, ",
                 dtypeName(in[1].dtype()), " vs ", dtypeName(in[2].dtype()));
      Shape s = broadcastShapes(broadcastShapes(in[0].shape(), in[1].shape(), o.name),
                                in[2].shape(), o.name);
      return one(s, in[1].dtype());
    };
    o.backward = [](const BackwardCtx& c) -> BF {
      const Tensor &g = c.gradOutputs[0], &cond = c.inputs[0];
      Tensor z = zeroScalar(g);
      return {Tensor(), c.needsGrad[1] ? sumTo(where(cond, g, z), c.inputs[1].shape()) : Tensor(),
              c.needsGrad[2] ? sumTo(where(cond, z, g), c.inputs[2].shape()) : Tensor()};
    };
    OpDef& m = at(OpId::MaskedFill, 2);
    m.infer = [&m](Inputs in, const Attrs&) {
      KEEL_CHECK(in[1].dtype() == DType::Bool, "op '", m.name, "': mask must be bool, got ",
                 dtypeName(in[1].dtype()));
      Shape s = broadcastShapes(in[0].shape(), in[1].shape(), m.name);
      KEEL_CHECK(s == in[0].shape(), "op '", m.name, "': mask ", shapeStr(in[1].shape()),
                 " does not broadcast to input ", shapeStr(in[0].shape()));
      return one(in[0].shape(), in[0].dtype());
    };
    m.backward = [](const BackwardCtx& c) -> BF {
      return {maskedFill(c.gradOutputs[0], c.inputs[1], 0.0), Tensor()};
    };
    OpDef& k = at(OpId::Cast, 1);
    k.infer = [](Inputs in, const Attrs& a) {
      return one(in[0].shape(), parseDType(a.getString("dtype")));
    };
    k.backward = [](const BackwardCtx& c) -> BF {
      return {cast(c.gradOutputs[0], c.inputs[0].dtype())};
    };
  }

  // ---- factories
  for (OpId id : {OpId::Fill, OpId::Uniform, OpId::Normal, OpId::Arange}) {
    OpDef& o = at(id, 0);
    o.infer = [&o, id](Inputs, const Attrs& a) {
      DType t = parseDType(a.getString("dtype"));
      if (id == OpId::Uniform || id == OpId::Normal)
        KEEL_CHECK(isFloating(t), "op '", o.name, "': dtype must be floating, got ", dtypeName(t));
      if (id == OpId::Arange)
        KEEL_CHECK(a.getInts("shape").size() == 1, "op '", o.name, "': shape must be [n]");
      return one(factoryShape(a), t);
    };
  }

  // ---- optimizer updates
  for (OpId id : {OpId::SgdStep, OpId::AdamwStep}) {
    OpDef& o = at(id, id == OpId::SgdStep ? 3 : 4);
    o.mutatesInputs = true;
    o.infer = [&o](Inputs in, const Attrs&) {
      requireSameDtype(o.name, in);
      requireFloat(o.name, in[0], "param");
      for (size_t i = 1; i < in.size(); ++i)
        KEEL_CHECK(in[i].shape() == in[0].shape(), "op '", o.name, "': input ", i, " ",
                   shapeStr(in[i].shape()), " does not match param ", shapeStr(in[0].shape()));
      for (size_t i = 0; i < in.size(); ++i)
        if (i != 1)
          KEEL_CHECK(in[i].isContiguous(), "op '", o.name, "': state tensor ", i,
                     " must be contiguous");
      return Metas{};
    };
  }
  return d;
}

}  // namespace

void registerBuiltinOpDefs(Registry& r) {
  const auto& defs = builtinDefs();
  for (size_t i = 0; i < defs.size(); ++i) {
    const OpDef& d = defs[i];
    KEEL_CHECK(d.infer || d.view, "built-in op '", d.name, "' has no definition");
    int id = r.add(d);
    KEEL_CHECK(id == int(i), "built-in op '", d.name, "' registered out of order");
  }
}

}  // namespace keel::detail
