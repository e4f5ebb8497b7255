// The CUDA backend's host runtime: one context per device (its compute stream, cuBLAS handles,
// the allocator, the deferred-error word), error checking, and the op's device for a kernel.
// Host C++ (no kernels): included by the .cpp and .cu files of engine/backends/cuda.
// Invariant: every kernel of an op is enqueued on its device's one compute stream, so work is
// ordered as the ops were dispatched and a freed buffer's memory is reused only by later work.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "keel/registry.h"

namespace keel::cuda {

// Throws keel::Error "CUDA error in WHAT on cuda:N: MESSAGE (code)" for anything but success;
// an out-of-memory adds the device allocator's summary.
void check(cudaError_t e, const char* what, int device);
void checkBlas(cublasStatus_t s, const char* what, int device);

struct DeviceCtx {
  int index = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;  // on `stream`, TF32 off unless allowTf32()
  cublasLtHandle_t blasLt = nullptr;
  void* blasWorkspace = nullptr;    // cuBLAS(Lt) workspace (plain cudaMalloc, kBlasWorkspace)
  int* errorWord = nullptr;         // Note [Deferred device errors]: 0, or the first error's code
  long long* errorValue = nullptr;  // the offending value (an index), beside the code
  int smCount = 0;
  int major = 0, minor = 0;  // compute capability
  std::string name;          // "NVIDIA H200"
};
inline constexpr size_t kBlasWorkspace = size_t(32) << 20;

// The context of cuda:N, created on first use; makes N the calling thread's current device.
DeviceCtx& deviceCtx(int device);
// The context of an op's device (its first output's, else its first input's), made current.
DeviceCtx& deviceCtx(const KernelCtx& c);
// After a launch: a launch error (bad configuration, no kernel image for this GPU) as
// keel::Error naming the op and its input shapes.
void checkLaunch(const KernelCtx& c, const char* kernel);
// Records which op was enqueued last on the device, for messages of asynchronous errors.
void noteOp(const KernelCtx& c);

// Note [Deferred device errors]: a kernel that finds bad input it cannot report synchronously (an
// index out of range) stores a code in its device's error word (the first one wins, atomicCAS)
// and skips the element; the host reads the word whenever it waits for the device (copies to the
// host, item(), synchronize) and raises keel::Error for it. Codes:
enum class DeviceError : int { None = 0, IndexOutOfRange = 1 };
// Code with the op id folded in: code + 16 * (op id + 1) (so the message can name the op).
constexpr int errorCode(DeviceError e, int opId) {
  return int(e) + 16 * (opId + 1);
}
// Waits for the stream and raises a pending deferred error (clearing it).
void synchronize(int device);
// Copies bytes between host and cuda:N memory (or within it) after the work queued on its stream,
// through pinned staging buffers; returns once the bytes are in place (a synchronisation point).
void copyBytes(int device, void* dst, bool dstOnDevice, const void* src, bool srcOnDevice,
               size_t bytes);

// Run-time switches recorded with each kernel's parameters (Note [Kernel identity]).
bool allowTf32();         // KEEL_CUDA_TF32=1: float32 matmuls may use TF32 tensor cores
bool nondeterministic();  // KEEL_CUDA_NONDETERMINISTIC=1: atomics allowed where faster

// "NVIDIA H200, sm_90, 132 SMs, stream-ordered" — the device part of every kernel's parameters.
std::string deviceParams(const KernelCtx& c);

}  // namespace keel::cuda
