// CUDA backend entry point. This build registers no CUDA kernels yet (the CUDA backend is its own
// issue); cuda:N tensors therefore fail with a clear "device is not available" error.
#include "keel/registry.h"

namespace keel::detail {
void registerCudaKernels(Registry&) {}
}  // namespace keel::detail
