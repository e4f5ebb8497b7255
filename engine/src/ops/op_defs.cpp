// The built-in op table: every op of op_ids.h gets exactly one entry (inputs, inference that
// validates, view rule, backward rule), filled by its family's file (ops/<family>.cpp); kernels
// live in the backends. Also the helpers the families share (op_defs_util.h).
#include <iterator>
#include <numeric>

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
void requireFloatMatrix(std::string_view op, const Tensor& t, std::string_view what,
                        std::string_view layout) {
  requireFloat(op, t, what);
  KEEL_CHECK(t.dim() == 2, "op '", op, "': ", what, " must be [", layout, "], got ",
             shapeStr(t.shape()));
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

Metas inferGradLike(const OpDef& def, Inputs in) {
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

Tensor zeroScalar(const Tensor& like) {
  return fill({}, 0.0, like.dtype(), like.device());
}

// ---------------------------------------------------------------- the table
// Names come from op_ids.h so the table and the enum cannot disagree.
OpTable::OpTable() : defs_(size_t(kNumBuiltinOps)) {
  const char* names[] = {
#define KEEL_X_NAME(e, n) n,
      KEEL_BUILTIN_OPS(KEEL_X_NAME)
#undef KEEL_X_NAME
  };
  static_assert(std::size(names) == size_t(kNumBuiltinOps));
  for (size_t i = 0; i < defs_.size(); ++i) defs_[i].name = names[i];
}

void registerBuiltinOpDefs(Registry& r) {
  OpTable t;
  defineElementwiseOps(t);
  defineReduceOps(t);
  defineMatmulOps(t);
  defineNnOps(t);
  defineAttentionOps(t);
  defineShapeOps(t);
  defineIndexOps(t);
  defineFactoryOps(t);
  defineOptimOps(t);
  defineCollectiveOps(t);
  for (size_t i = 0; i < t.defs().size(); ++i) {
    OpDef& d = t.defs()[i];
    KEEL_CHECK(d.infer || d.view, "built-in op '", d.name, "' has no definition");
    KEEL_CHECK(!d.doc.family.empty(), "built-in op '", d.name, "' has no doc (docs/ops.md)");
    KEEL_CHECK(bool(d.view) == isViewOp(OpId(i)), "built-in op '", d.name, "' ",
               d.view ? "has a view rule but is not" : "has no view rule but is",
               " listed in kViewOps (op_ids.h)");
    int id = r.add(std::move(d));
    KEEL_CHECK(id == int(i), "built-in op registered out of order at id ", i);
  }
}

}  // namespace keel::detail
