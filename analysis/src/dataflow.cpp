// buildDataflow: see dataflow.h. Linear in tensors: one ProducerIndex over the step, one lookup
// per input.
#include "keel/analysis/dataflow.h"

#include "keel/storage/producers.h"

namespace keel::analysis {

Dataflow buildDataflow(std::span<const storage::OpRecord> ops) {
  Dataflow d;
  d.producers.resize(ops.size());
  const storage::ProducerIndex index(ops);
  for (size_t i = 0; i < ops.size(); ++i)
    for (const storage::TensorRecord& t : ops[i].tensors) {
      if (t.role != storage::Role::Input) continue;
      if (const auto p = index.find(t, ops[i].seq)) d.producers[i].push_back(uint32_t(*p));
    }
  return d;
}

}  // namespace keel::analysis
