// The cuda backend's collective kernels, staged through the host: inputs copied to host tensors,
// the host backends' implementation (dist/collective_kernels.cpp: keel/dist.h over MPI) run on
// them, results copied back. Correct across ranks and devices, not fast: NCCL over the device
// buffers is the later path (issue 18). Every copy waits for the device (Note [cuda copy_to]).
#include <vector>

#include "dist/collective_kernels.h"
#include "keel/tensor.h"
#include "kernels.h"
#include "runtime.h"

namespace keel::cuda {
namespace {

void staged(OpId op, const KernelCtx& c) {
  if (c.op.mutatesInputs)  // refused before any rank communicates
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (!(i < 32 && (c.op.readOnlyInputs >> i) & 1u))
        KEEL_CHECK(c.inputs[i].isContiguous(), "op '", c.op.name,
                   "': an in-place collective on cuda needs a contiguous input");
  std::vector<Tensor> in, out;
  // hostCopy, not ops::contiguous on the device: a kernel dispatches no op (observers would see
  // one nested in the collective, which a host run does not have).
  for (const Tensor& t : c.inputs) in.push_back(hostCopy(t));
  for (const Tensor& t : c.outputs)
    out.push_back(makeTensor(t.shape(), t.dtype(), Device(Backend::Cpu)));
  const KernelCtx host{c.op, in, out, c.attrs};
  keel::detail::collectiveKernel(op, host, false);
  for (size_t i = 0; i < out.size(); ++i)
    copyBytes(c.outputs[i].device().index, c.outputs[i].data(), true, out[i].data(), false,
              out[i].nbytes());
  if (c.op.mutatesInputs)  // in-place collectives write their inputs back
    for (size_t i = 0; i < in.size(); ++i)
      if (!(i < 32 && (c.op.readOnlyInputs >> i) & 1u))
        copyBytes(c.inputs[i].device().index, c.inputs[i].data(), true, in[i].data(), false,
                  in[i].nbytes());
}

}  // namespace

void kAllReduce(const KernelCtx& c) {
  staged(OpId::AllReduce, c);
}
void kCopyToGroup(const KernelCtx& c) {
  staged(OpId::CopyToGroup, c);
}
void kAllGather(const KernelCtx& c) {
  staged(OpId::AllGather, c);
}
void kReduceScatter(const KernelCtx& c) {
  staged(OpId::ReduceScatter, c);
}
void kBroadcast(const KernelCtx& c) {
  staged(OpId::Broadcast, c);
}
void kAllToAll(const KernelCtx& c) {
  staged(OpId::AllToAll, c);
}

}  // namespace keel::cuda
