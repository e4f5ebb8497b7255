// The cpu backend's collective kernels: keel/dist.h through MPI (dist/collective_kernels.cpp holds
// the one implementation both host backends share).
#include "dist/collective_kernels.h"
#include "kernels.h"

namespace keel::cpu {

void kAllReduce(const KernelCtx& c) {
  detail::collectiveKernel(OpId::AllReduce, c, false);
}
void kCopyToGroup(const KernelCtx& c) {
  detail::collectiveKernel(OpId::CopyToGroup, c, false);
}
void kAllGather(const KernelCtx& c) {
  detail::collectiveKernel(OpId::AllGather, c, false);
}
void kReduceScatter(const KernelCtx& c) {
  detail::collectiveKernel(OpId::ReduceScatter, c, false);
}
void kBroadcast(const KernelCtx& c) {
  detail::collectiveKernel(OpId::Broadcast, c, false);
}
void kAllToAll(const KernelCtx& c) {
  detail::collectiveKernel(OpId::AllToAll, c, false);
}

}  // namespace keel::cpu
