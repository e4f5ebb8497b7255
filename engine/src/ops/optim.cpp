// Op definitions, optimizer updates: sgd_step and adamw_step write into their inputs (parameter
// and state tensors, which must be contiguous) and return nothing; not differentiable.
#include "op_defs_util.h"

namespace keel::detail {

void defineOptimOps(OpTable& t) {
  for (OpId id : {OpId::SgdStep, OpId::AdamwStep}) {
    OpDef& o = t.at(id, id == OpId::SgdStep ? 3 : 4);
    o.mutatesInputs = true;
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
