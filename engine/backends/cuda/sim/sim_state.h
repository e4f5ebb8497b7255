// The CUDA simulator's shared state between its launches (kernel.cpp) and its runtime
// (runtime.cpp): the lock that makes the simulated device run one thing at a time, and the error
// a later cudaGetLastError (or synchronisation) reports.
#pragma once
#include <mutex>
#include <string>

#include "cuda_runtime.h"

namespace sim {

std::recursive_mutex& deviceMutex();
// Sets the calling thread's last error (returned by cudaGetLastError) and returns e.
cudaError_t setError(cudaError_t e);
// A failed launch: its error, and a message that cudaGetErrorString adds for it (and stderr shows).
void setLaunchError(cudaError_t e, const std::string& message);

// KEEL_CUDA_SIM_GUARD=1, the simulator's slow careful mode: every cudaMalloc'd block ends against
// a PROT_NONE page (the backend then gives every buffer its own block), and every thread's stack
// starts as 0xFF bytes, so a past-the-end access faults and an uninitialised local reads as NaN.
bool guarded();

}  // namespace sim
