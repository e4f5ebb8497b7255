// Op definitions, factories (no inputs): fill, uniform, normal, arange. The shape, dtype and
// device come from attributes; uniform and normal draw from the Philox stream (seed, offset).
#include "op_defs_util.h"

namespace keel::detail {

namespace {

Shape factoryShape(const Attrs& a) {
  const auto& s = a.getInts("shape");
  for (int64_t d : s) KEEL_CHECK(d >= 0, "factory: negative extent in shape ", shapeStr(s));
  return Shape(s.begin(), s.end());
}

}  // namespace

void defineFactoryOps(OpTable& t) {
  t.family("Factories");
  t.doc(OpId::Fill, "", "shape, dtype, device, value", "");
  t.doc(OpId::Uniform, "", "shape, dtype, device, low, high, seed, offset", "",
        "low + (high−low)·philoxUniform(seed, offset, i)");
  t.doc(OpId::Normal, "", "shape, dtype, device, mean, std, seed, offset", "",
        "mean + std·philoxNormal(seed, offset, i)");
  t.doc(OpId::Arange, "", "shape ([n]), dtype, device", "0..n−1");
  for (OpId id : {OpId::Fill, OpId::Uniform, OpId::Normal, OpId::Arange})
    t.at(id, 0).infer = [id](const OpDef& op, Inputs, const Attrs& a) {
      DType d = parseDType(a.getString("dtype"));
      if (id == OpId::Uniform || id == OpId::Normal)
        KEEL_CHECK(isFloating(d), "op '", op.name, "': dtype must be floating, got ", dtypeName(d));
      if (id == OpId::Arange)
        KEEL_CHECK(a.getInts("shape").size() == 1, "op '", op.name, "': shape must be [n]");
      return one(factoryShape(a), d);
    };
}

}  // namespace keel::detail
