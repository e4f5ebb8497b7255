// The VMM allocator on a CUDA device: the CPU VmmAllocator's algorithm (keel/allocator.h) over
// device memory reserved with cuMemAddressReserve and backed by cuMemCreate chunks.
// Built only when the CUDA toolkit is found (library keel_engine_cuda, which defines
// KEEL_HAVE_CUDA for its users). Driver functions come through the CUDA runtime's entry points;
// nothing links against libcuda. See Note [CUDA VMM] and Note [VMM remap].
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "keel/allocator.h"

namespace keel {

struct CudaVmmAllocatorOptions : VmmAllocatorOptions {
  CudaVmmAllocatorOptions() {
    reserve = 0;  // 0: twice the device's memory, so remap windows always find free addresses
    chunk = 0;    // 0: the device's recommended granularity, at least 2 MiB
    name = "cuda-vmm";
  }
  int device = 0;  // the device ordinal (cuda:N)
};

// Device memory from one CUDA device (the same algorithm and statistics as VmmAllocator: best fit
// over the mapped space, defragmentation by remapping chunks no live block touches, compaction of
// Buffers at safe points). Pointers it returns are device addresses. Chunks are unmapped or data
// copied only after cudaDeviceSynchronize, since unmapping is not stream-ordered; freed blocks are
// reused at once, so work on other streams must be ordered by the caller (as with any caching
// allocator without stream tracking). The constructor raises keel::Error "no CUDA device: ..."
// when there is no usable device or driver.
class CudaVmmAllocator final : public Allocator {
 public:
  explicit CudaVmmAllocator(CudaVmmAllocatorOptions o = {});
  ~CudaVmmAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  std::string name() const override;
  size_t allocatedBytes() const override;
  size_t reservedBytes() const override;
  AllocatorStats stats() const override;
  // Unmaps every chunk no live block touches and releases it (cuMemRelease).
  void emptyCache() override;
  void resetPeaks() override;
  MemorySnapshot snapshot() const override;
  void setLimit(size_t bytes);
  uintptr_t base() const;     // start of the reservation (a device address)
  size_t chunkBytes() const;  // the chunk size in use
  int device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Number of CUDA devices the runtime sees; 0 when there is no device or no driver (never throws).
int cudaDeviceCount();

}  // namespace keel
