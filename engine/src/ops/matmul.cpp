// Op definition of matmul: batched, broadcasting, either operand transposed by attribute. Its
// inference and backward rule (itself four matmuls); kernels live in the backends.
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

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

}  // namespace

void defineMatmulOps(OpTable& t) {
  t.family("Linear algebra");
  t.doc(OpId::Matmul, "a, b", "trans_a, trans_b (bool)", "[...batch, M, N]",
        "a is [...,M,K] ([...,K,M] if trans_a), b is [...,K,N] ([...,N,K] if trans_b); both rank "
        "≥ 2; batch dims broadcast");
  OpDef& o = t.at(OpId::Matmul, 2);
  o.infer = [](const OpDef& op, Inputs in, const Attrs& a) {
    requireSameDtype(op.name, in);
    return one(matmulShape(op, in[0], in[1], a.getBool("trans_a"), a.getBool("trans_b")),
               in[0].dtype());
  };
  o.backward = [](const BackwardCtx& c) -> Grads {
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

}  // namespace keel::detail
