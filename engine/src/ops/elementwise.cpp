// Op definitions, elementwise family: broadcasting binary ops and comparisons, unary ops with
// their fused gelu/silu backward ops, and the ops with a scalar attribute. Each op's inference
// and backward rule; kernels live in the backends.
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

Metas inferBroadcast(const OpDef& def, Inputs in, bool toBool) {
  requireSameDtype(def.name, in);
  return one(broadcastShapes(in[0].shape(), in[1].shape(), def.name),
             toBool ? DType::Bool : in[0].dtype());
}

Grads minmaxBack(const BackwardCtx& c, bool isMax) {
  const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1];
  Tensor bWins = isMax ? gt(b, a) : lt(b, a);  // ties go to a
  Tensor z = zeroScalar(g);
  return {c.needsGrad[0] ? sumTo(where(bWins, z, g), a.shape()) : Tensor(),
          c.needsGrad[1] ? sumTo(where(bWins, g, z), b.shape()) : Tensor()};
}

}  // namespace

void defineElementwiseOps(OpTable& t) {
  t.family("Elementwise");
  const char* bc = "broadcast(a, b), dtype of a";
  t.doc(OpId::Add, "a, b", "", bc);
  t.doc(OpId::Sub, "a, b", "", bc);
  t.doc(OpId::Mul, "a, b", "", bc);
  t.doc(OpId::Div, "a, b", "", bc, "no int division");
  t.doc(OpId::Pow, "a, b", "", bc, "a^b");
  t.doc(OpId::Maximum, "a, b", "", bc, "on ties the gradient goes to a");
  t.doc(OpId::Minimum, "a, b", "", bc, "on ties the gradient goes to a");
  t.doc(OpId::Eq, "a, b", "", "broadcast(a, b), bool");
  t.doc(OpId::Lt, "a, b", "", "broadcast(a, b), bool");
  t.doc(OpId::Gt, "a, b", "", "broadcast(a, b), bool");
  for (OpId id : {OpId::Neg, OpId::Exp, OpId::Log, OpId::Sqrt, OpId::Rsqrt, OpId::Tanh,
                  OpId::Sigmoid, OpId::Relu, OpId::Abs})
    t.doc(id, "x", "", "like x");
  t.doc(OpId::Gelu, "x", "", "like x", "the exact erf form 0.5·x·(1+erf(x/√2))");
  t.doc(OpId::Silu, "x", "", "like x", "x·sigmoid(x)");
  t.doc(OpId::GeluBackward, "grad, x", "", "like x", "grad · d/dx gelu(x)");
  t.doc(OpId::SiluBackward, "grad, x", "", "like x", "grad · d/dx silu(x)");
  t.doc(OpId::AddScalar, "x", "scalar (double)", "like x", "int: scalar truncated toward zero");
  t.doc(OpId::MulScalar, "x", "scalar (double)", "like x", "int: scalar truncated toward zero");
  t.doc(OpId::PowScalar, "x", "exponent (double)", "like x");

  // ---- binary, broadcasting
  for (OpId id :
       {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Pow, OpId::Maximum, OpId::Minimum})
    t.at(id, 2).infer = [](const OpDef& op, Inputs in, const Attrs&) {
      return inferBroadcast(op, in, false);
    };
  for (OpId id : {OpId::Eq, OpId::Lt, OpId::Gt})
    t.at(id, 2).infer = [](const OpDef& op, Inputs in, const Attrs&) {
      return inferBroadcast(op, in, true);
    };
  t.at(OpId::Add, 2).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& g = c.gradOutputs[0];
    return {sumTo(g, c.inputs[0].shape()), sumTo(g, c.inputs[1].shape())};
  };
  t.at(OpId::Sub, 2).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& g = c.gradOutputs[0];
    return {sumTo(g, c.inputs[0].shape()),
            c.needsGrad[1] ? sumTo(neg(g), c.inputs[1].shape()) : Tensor()};
  };
  t.at(OpId::Mul, 2).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1];
    return {c.needsGrad[0] ? sumTo(g * b, a.shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(g * a, b.shape()) : Tensor()};
  };
  t.at(OpId::Div, 2).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &b = c.inputs[1], &out = c.outputs[0];
    return {c.needsGrad[0] ? sumTo(g / b, c.inputs[0].shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(neg(g * out / b), b.shape()) : Tensor()};
  };
  t.at(OpId::Pow, 2).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &a = c.inputs[0], &b = c.inputs[1], &out = c.outputs[0];
    return {c.needsGrad[0] ? sumTo(g * b * pow(a, addScalar(b, -1.0)), a.shape()) : Tensor(),
            c.needsGrad[1] ? sumTo(g * out * log(a), b.shape()) : Tensor()};
  };
  t.at(OpId::Maximum, 2).backward = [](const BackwardCtx& c) { return minmaxBack(c, true); };
  t.at(OpId::Minimum, 2).backward = [](const BackwardCtx& c) { return minmaxBack(c, false); };

  // ---- unary, and the ops with a scalar attribute
  for (OpId id : {OpId::Neg, OpId::Exp, OpId::Log, OpId::Sqrt, OpId::Rsqrt, OpId::Tanh,
                  OpId::Sigmoid, OpId::Relu, OpId::Gelu, OpId::Silu, OpId::Abs, OpId::AddScalar,
                  OpId::MulScalar, OpId::PowScalar})
    t.at(id, 1).infer = [](const OpDef&, Inputs in, const Attrs&) { return inferUnary(in); };
  for (OpId id : {OpId::GeluBackward, OpId::SiluBackward})
    t.at(id, 2).infer = [](const OpDef& op, Inputs in, const Attrs&) {
      return inferGradLike(op, in);
    };
  t.at(OpId::Neg, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {neg(c.gradOutputs[0])};
  };
  t.at(OpId::Exp, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {c.gradOutputs[0] * c.outputs[0]};
  };
  t.at(OpId::Log, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {c.gradOutputs[0] / c.inputs[0]};
  };
  t.at(OpId::Sqrt, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {mulScalar(c.gradOutputs[0] / c.outputs[0], 0.5)};
  };
  t.at(OpId::Rsqrt, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& y = c.outputs[0];
    return {mulScalar(c.gradOutputs[0] * y * y * y, -0.5)};
  };
  t.at(OpId::Tanh, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& y = c.outputs[0];
    return {c.gradOutputs[0] * addScalar(neg(y * y), 1.0)};
  };
  t.at(OpId::Sigmoid, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor& y = c.outputs[0];
    return {c.gradOutputs[0] * y * addScalar(neg(y), 1.0)};
  };
  t.at(OpId::Relu, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &x = c.inputs[0];
    return {where(gt(x, zeroScalar(x)), g, zeroScalar(g))};
  };
  t.at(OpId::Gelu, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::GeluBackward, {c.gradOutputs[0], c.inputs[0]})};
  };
  t.at(OpId::Silu, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {dispatch1(OpId::SiluBackward, {c.gradOutputs[0], c.inputs[0]})};
  };
  t.at(OpId::Abs, 1).backward = [](const BackwardCtx& c) -> Grads {
    const Tensor &g = c.gradOutputs[0], &x = c.inputs[0];
    return {where(lt(x, zeroScalar(x)), neg(g), g)};
  };
  t.at(OpId::AddScalar, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {c.gradOutputs[0]};
  };
  t.at(OpId::MulScalar, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {mulScalar(c.gradOutputs[0], c.attrs.getDouble("scalar"))};
  };
  t.at(OpId::PowScalar, 1).backward = [](const BackwardCtx& c) -> Grads {
    double e = c.attrs.getDouble("exponent");
    return {mulScalar(c.gradOutputs[0] * powScalar(c.inputs[0], e - 1.0), e)};
  };
}

}  // namespace keel::detail
