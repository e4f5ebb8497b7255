// Op definitions, optimizer updates: sgd_step and adamw_step write into their inputs (parameter
// and state tensors, which must be contiguous) and return nothing; not differentiable.
#include "op_defs_util.h"

namespace keel::detail {

void defineOptimOps(OpTable& t) {
  t.family("Optimizer updates");
  t.doc(OpId::SgdStep, "param, grad, momentum_buf", "lr, momentum, weight_decay, nesterov", "",
        "g' = g + wd·p; b = m·b + g'; p −= lr·(nesterov ? g' + m·b : b); momentum 0 leaves b "
        "unused");
  t.doc(OpId::AdamwStep, "param, grad, m, v", "lr, beta1, beta2, eps, weight_decay, step (1-based)",
        "",
        "p −= lr·wd·p; m = β1m + (1−β1)g; v = β2v + (1−β2)g²; p −= lr·(m/(1−β1^t)) / "
        "(√(v/(1−β2^t)) + eps)");
  for (OpId id : {OpId::SgdStep, OpId::AdamwStep}) {
    OpDef& o = t.at(id, id == OpId::SgdStep ? 3 : 4);
    o.mutatesInputs = true;
    o.readOnlyInputs = 1u << 1;  // the gradient is read, never written
    o.infer = [](const OpDef& op, Inputs in, const Attrs&) {
      requireSameDtype(op.name, in);
      requireFloat(op.name, in[0], "param");
      for (size_t i = 1; i < in.size(); ++i)
        KEEL_CHECK(in[i].shape() == in[0].shape(), "op '", op.name, "': input ", i, " ",
                   shapeStr(in[i].shape()), " does not match param ", shapeStr(in[0].shape()));
      for (size_t i = 0; i < in.size(); ++i)
        if (i != 1)
          KEEL_CHECK(in[i].isContiguous(), "op '", op.name, "': state tensor ", i,
                     " must be contiguous");
      return Metas{};
    };
  }
}

}  // namespace keel::detail
