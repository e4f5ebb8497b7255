// Op definitions, neural-network family: softmax and log_softmax, layer_norm and rms_norm,
// embedding, cross_entropy, dropout, rope, each with its fused backward op where it has one. Each
// op's inference and backward rule; kernels live in the backends.
#include <cmath>

#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

void requireLastDim(const OpDef& def, const Tensor& x, const Tensor& w, std::string_view what) {
  KEEL_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1), "op '", def.name, "': ", what,
             " ", shapeStr(w.shape()), " does not match the last dim of input ",
             shapeStr(x.shape()));
}

void defineSoftmax(OpTable& t) {
  for (OpId id : {OpId::Softmax, OpId::LogSoftmax})
    t.at(id, 1).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
      requireFloat(op.name, in[0], "input");
      KEEL_CHECK(in[0].dim() > 0, "op '", op.name, "': needs a tensor of rank >= 1");
      normDim(a.getInt("dim"), in[0].dim(), op.name);
      return inferUnary(in);
    };
  for (OpId id : {OpId::SoftmaxBackward, OpId::LogSoftmaxBackward})
    t.at(id, 2).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
      normDim(a.getInt("dim"), in[1].dim(), op.name);
      return inferGradLike(op, in);
    };
  t.at(OpId::Softmax, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::SoftmaxBackward, {c.gradOutputs[0], c.outputs[0]}, c.attrs)};
  };
  t.at(OpId::LogSoftmax, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::LogSoftmaxBackward, {c.gradOutputs[0], c.outputs[0]}, c.attrs)};
  };
}

// layer_norm (x, weight, bias) and rms_norm (x, weight): the same checks and backward wiring;
// the backward (grad, x, weight) returns dx and one gradient per parameter.
void defineNorm(OpTable& t, OpId fwd, OpId bwd, bool bias) {
  OpDef& f = t.at(fwd, bias ? 3 : 2);
  f.infer = [bias](const OpDef& op, Inputs in, const Attrs&) {
    requireSameDtype(op.name, in);
    requireFloat(op.name, in[0], "input");
    requireLastDim(op, in[0], in[1], "weight");
    if (bias) requireLastDim(op, in[0], in[2], "bias");
    return inferUnary(in);
  };
  f.backward = [bwd](const BackwardCtx& c) -> Grads {
    return dispatch(bwd, {c.gradOutputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
  };
  t.at(bwd, 3).infer = [bias](const OpDef& op, Inputs in, const Attrs&) {
    requireSameDtype(op.name, in);
    KEEL_CHECK(in[0].shape() == in[1].shape(), "op '", op.name, "': grad ", shapeStr(in[0].shape()),
               " and input ", shapeStr(in[1].shape()), " differ");
    requireLastDim(op, in[1], in[2], "weight");
    Metas m{{in[1].shape(), in[1].dtype()}, {in[2].shape(), in[2].dtype()}};
    if (bias) m.push_back({in[2].shape(), in[2].dtype()});
    return m;
  };
}

void defineNorms(OpTable& t) {
  defineNorm(t, OpId::LayerNorm, OpId::LayerNormBackward, true);
  defineNorm(t, OpId::RmsNorm, OpId::RmsNormBackward, false);
}

void defineEmbedding(OpTable& t) {
  OpDef& o = t.at(OpId::Embedding, 2);
  o.infer = [](const OpDef& op, Inputs in, const Attrs&) {
    requireFloatMatrix(op.name, in[0], "weight", "V, D");
    requireIndex(op.name, in[1], "indices");
    Shape s = in[1].shape();
    s.push_back(in[0].size(1));
    return one(s, in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::EmbeddingBackward, {c.gradOutputs[0], c.inputs[1]},
                      Attrs().set("num_weights", c.inputs[0].size(0))),
            Tensor()};
  };
  t.at(OpId::EmbeddingBackward, 2).infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireFloat(op.name, in[0], "grad");
    requireIndex(op.name, in[1], "indices");
    Shape expect = in[1].shape();
    expect.push_back(in[0].dim() > 0 ? in[0].size(-1) : 0);
    KEEL_CHECK(in[0].shape() == expect, "op '", op.name, "': grad ", shapeStr(in[0].shape()),
               " does not match indices ", shapeStr(in[1].shape()));
    int64_t v = a.getInt("num_weights");
    KEEL_CHECK(v > 0, "op '", op.name, "': num_weights must be positive");
    return one({v, in[0].size(-1)}, in[0].dtype());
  };
}

void defineCrossEntropy(OpTable& t) {
  OpDef& o = t.at(OpId::CrossEntropy, 2);
  o.infer = [](const OpDef& op, Inputs in, const Attrs&) {
    requireFloatMatrix(op.name, in[0], "logits", "N, C");
    requireIndex(op.name, in[1], "targets");
    KEEL_CHECK(in[1].dim() == 1 && in[1].size(0) == in[0].size(0), "op '", op.name, "': targets ",
               shapeStr(in[1].shape()), " do not match logits ", shapeStr(in[0].shape()),
               " (expected [", in[0].size(0), "])");
    return one({}, in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::CrossEntropyBackward, {c.gradOutputs[0], c.inputs[0], c.inputs[1]},
                      c.attrs),
            Tensor()};
  };
  t.at(OpId::CrossEntropyBackward, 3).infer = [](const OpDef& op, Inputs in, const Attrs&) {
    KEEL_CHECK(in[0].numel() == 1 && in[0].dtype() == in[1].dtype(), "op '", op.name,
               "': grad must be a scalar of the logits' dtype");
    KEEL_CHECK(in[1].dim() == 2 && in[2].dim() == 1 && in[2].size(0) == in[1].size(0), "op '",
               op.name, "': logits ", shapeStr(in[1].shape()), " and targets ",
               shapeStr(in[2].shape()), " do not match");
    requireIndex(op.name, in[2], "targets");
    return one(in[1].shape(), in[1].dtype());
  };
}

void defineDropout(OpTable& t) {
  OpDef& o = t.at(OpId::Dropout, 1);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireFloat(op.name, in[0], "input");
    double p = a.getDouble("p");
    KEEL_CHECK(p >= 0.0 && p < 1.0, "op '", op.name, "': p must be in [0, 1), got ", p);
    return inferUnary(in);
  };
  // The same mask (seed, offset) scales the gradient.
  o.backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::Dropout, {c.gradOutputs[0]}, c.attrs)};
  };
}

// See docs/ops.md, "Rotary position embedding": a rotation per (position, pair), so the gradient
// is the same rotation turned back (rope with inverse flipped).
void defineRope(OpTable& t) {
  OpDef& o = t.at(OpId::Rope, 1);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireFloat(op.name, in[0], "input");
    KEEL_CHECK(in[0].dim() == 4 && in[0].size(3) % 2 == 0, "op '", op.name,
               "': input must be [B, T, H, D] with D even, got ", shapeStr(in[0].shape()));
    const double base = a.getDouble("base", 10000.0);
    KEEL_CHECK(base > 0.0 && std::isfinite(base), "op '", op.name,
               "': base must be finite and > 0, got ", base);
    return inferUnary(in);
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
    Attrs back = c.attrs;
    back.set("inverse", !c.attrs.getBool("inverse", false));
    return {dispatch1(OpId::Rope, {c.gradOutputs[0]}, back)};
  };
}

}  // namespace

void defineNnOps(OpTable& t) {
  t.family("Neural-network ops");
  t.doc(OpId::Softmax, "x", "dim", "like x", "max-subtracted");
  t.doc(OpId::SoftmaxBackward, "grad, y", "dim", "like y", "y·(g − Σ g·y)");
  t.doc(OpId::LogSoftmax, "x", "dim", "like x", "max-subtracted");
  t.doc(OpId::LogSoftmaxBackward, "grad, y", "dim", "like y", "g − exp(y)·Σ g");
  t.doc(OpId::LayerNorm, "x, weight, bias", "eps", "like x",
        "over the last dim; weight, bias are [D]; biased variance");
  t.doc(OpId::LayerNormBackward, "grad, x, weight", "eps", "dx, dweight, dbias",
        "dweight/dbias summed over all rows");
  t.doc(OpId::RmsNorm, "x, weight", "eps", "like x", "x · rsqrt(mean(x²) + eps) · weight");
  t.doc(OpId::RmsNormBackward, "grad, x, weight", "eps", "dx, dweight");
  t.doc(OpId::Embedding, "weight [V, D], indices (any shape)", "", "[...indices, D]");
  t.doc(OpId::EmbeddingBackward, "grad [..., D], indices", "num_weights (V)", "[V, D]",
        "sums rows with equal index");
  t.doc(OpId::CrossEntropy, "logits [N, C], targets int64 [N]", "ignore_index", "scalar",
        "mean over non-ignored targets; 0 if none");
  t.doc(OpId::CrossEntropyBackward, "grad (scalar), logits, targets", "ignore_index", "like logits",
        "(softmax − onehot)·grad / count");
  t.doc(OpId::Dropout, "x", "p, seed, offset", "like x",
        "keep iff philoxUniform(seed, offset, i) ≥ p (i = row-major element index); kept values "
        "× 1/(1−p)");
  t.doc(OpId::Rope, "x [B, T, H, D], D even", "base (10000), inverse (false)", "like x",
        "rotary position embedding, rotate-half pairs (i, i + D/2) turned by "
        "±t·base^(−2i/D), see [below](#rotary-position-embedding)");
  defineSoftmax(t);
  defineNorms(t);
  defineEmbedding(t);
  defineCrossEntropy(t);
  defineDropout(t);
  defineRope(t);
}

}  // namespace keel::detail
