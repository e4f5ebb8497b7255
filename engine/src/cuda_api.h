// The interface between libkeel_engine and the CUDA backend plugin (libkeel_cuda.so), which the
// engine loads at run time (Note [CUDA backend plugin] in core/cuda_backend.cpp). One C entry
// point returns this table; its version is checked so a stale plugin is refused, not called.
// Functions may throw keel::Error (both sides are C++ built together).
#pragma once
#include <cstddef>
#include <cstdint>

namespace keel {
class Allocator;
class Registry;
}  // namespace keel

namespace keel::detail {

inline constexpr uint32_t kCudaApiVersion = 1;

struct CudaApi {
  uint32_t version = kCudaApiVersion;
  // Number of CUDA devices the runtime sees; 0 without a device or a driver (never throws).
  int (*deviceCount)() = nullptr;
  // Why there is no usable device, in a phrase ("no CUDA-capable device is detected"); empty
  // when deviceCount() > 0.
  const char* (*unavailableReason)() = nullptr;
  // Fills the cuda column of the op table (no device needed).
  void (*registerKernels)(Registry&) = nullptr;
  // The allocator for new buffers on cuda:N (created on first use: the device VMM allocator,
  // whatever KEEL_ALLOCATOR says). Throws keel::Error naming the device when it is not usable.
  Allocator* (*allocator)(int device) = nullptr;
  // Copies bytes between host and device memory (either side may be the device's), ordered after
  // all work queued on cuda:N's stream; returns once the bytes are in place.
  void (*copy)(int device, void* dst, bool dstOnDevice, const void* src, bool srcOnDevice,
               size_t bytes) = nullptr;
  // Waits for cuda:N's stream; raises the first error a kernel reported since the last wait
  // (Note [Deferred device errors]).
  void (*synchronize)(int device) = nullptr;
};

}  // namespace keel::detail

// The plugin's one exported symbol.
extern "C" const keel::detail::CudaApi* keelCudaApi();
