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

}  // namespace sim
