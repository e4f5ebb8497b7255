// The op registry: built-in ops from one definition table, kernels from each backend's table.
#include "keel/registry.h"

#include <mutex>

namespace keel {

Registry::Registry() = default;

Registry& Registry::get() {
  static Registry* r = [] {
    auto* reg = new Registry();  // lives for the process: ops may be dispatched during exit
    detail::registerBuiltinOpDefs(*reg);
    KEEL_CHECK(reg->size() == kNumBuiltinOps, "built-in op table has ", reg->size(),
               " entries, op_ids.h lists ", kNumBuiltinOps);
    detail::registerCpuRefKernels(*reg);
    detail::registerCpuKernels(*reg);
    return reg;
  }();
  return *r;
}

int Registry::add(OpDef def) {
  KEEL_CHECK(!def.name.empty(), "cannot register an op without a name");
  KEEL_CHECK(find(def.name) == nullptr, "op '", def.name, "' is already registered");
  KEEL_CHECK(def.infer || def.view, "op '", def.name, "' needs shape inference or a view rule");
  def.id = int(ops_.size());
  ops_.push_back(std::make_unique<OpDef>(std::move(def)));
  return ops_.back()->id;
}

void Registry::setKernel(int opId, Backend backend, KernelFn fn, DTypeMask dtypes,
                         std::string variant, KernelParamsFn params) {
  KEEL_CHECK(opId >= 0 && opId < size(), "setKernel: no op with id ", opId);
  ops_[size_t(opId)]->kernels[int(backend)] = KernelEntry{fn, dtypes, std::move(variant), params};
}

const OpDef& Registry::op(int id) const {
  KEEL_CHECK(id >= 0 && id < size(), "no op with id ", id);
  return *ops_[size_t(id)];
}

const OpDef* Registry::find(std::string_view name) const {
  for (auto& o : ops_)
    if (o->name == name) return o.get();
  return nullptr;
}

}  // namespace keel
