// The engine's side of the CUDA backend plugin (Note [CUDA backend plugin] in
// core/cuda_backend.cpp): the loaded table, or why there is none.
#pragma once
#include "cuda_api.h"
#include "keel/device.h"
#include "keel/tensor.h"

namespace keel::detail {

// The plugin's table once loaded (kernels registered); null when this build has no CUDA backend
// or it cannot be loaded (loadCudaBackend() says why). Loads on the first call; thread-safe.
const CudaApi* cudaApi();
// The table for a cuda:N device that must be usable: throws keel::Error "device 'cuda:N' is not
// available: ..." (no backend, no device, N out of range).
const CudaApi& cudaApiFor(Device d);

}  // namespace keel::detail
