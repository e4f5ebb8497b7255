// The collective ops' kernels, one implementation shared by the host backends (cpu and cpu-ref
// register it, each under its own variant): inputs made contiguous, then keel/dist.h's collective.
// cpu-ref's all_reduce and reduce_scatter reduce in rank order in float64 (Note [Reference
// all-reduce]); everything else moves bytes and is exact on both.
#pragma once
#include <string>

#include "keel/op_ids.h"
#include "keel/registry.h"

namespace keel::detail {

void collectiveKernel(OpId op, const KernelCtx& c, bool reference);
// Run-time parameters of a collective call: the MPI library and the group's size.
std::string collectiveParams(const KernelCtx& c);

}  // namespace keel::detail
