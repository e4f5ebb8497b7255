// CudaVmmAllocator: the shared VMM bookkeeping (alloc/vmm_core.h) over CUDA virtual memory.
// Invariants: every driver call goes through the Driver table, filled from the runtime's driver
// entry points (libcuda is never linked); chunk handles exist exactly while `handles_[i].live`.
// See Note [CUDA VMM].
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "alloc/vmm_core.h"
#include "keel/cuda_allocator.h"

namespace keel {

// Note [CUDA VMM]: the device's address range is reserved once with cuMemAddressReserve (aligned
// to the chunk size) and divided into slots of one chunk, as on the CPU (Note [VMM remap]). A
// physical chunk is one cuMemCreate allocation (pinned device memory on this device, of the
// device's recommended granularity, at least 2 MiB); mapping is cuMemMap + cuMemSetAccess
// (read-write for this device), unmapping cuMemUnmap (the handle keeps the chunk's memory, so a
// remapped chunk is the same memory at new addresses: no byte is copied), releasing cuMemRelease.
// Unmapping is not ordered with kernels, so the allocator calls cudaDeviceSynchronize before it
// unmaps chunks or copies live blocks; the fast path (best fit in mapped space) makes no CUDA call
// besides keeping the device current. A cuMemCreate that fails with CUDA_ERROR_OUT_OF_MEMORY makes
// the request fail with the usual out-of-memory keel::Error and memory summary, like the limit.
// The driver functions are looked up through cudaGetDriverEntryPoint[ByVersion] with the ABI of
// CUDA 12.0 (the cudaTypedefs.h prototypes below), so the program links only the CUDA runtime.

namespace {

constexpr unsigned kDriverAbi = 12000;

// The driver functions the allocator uses.
struct Driver {
  PFN_cuGetErrorString_v6000 getErrorString = nullptr;
  PFN_cuDeviceGet_v2000 deviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 memGetAllocationGranularity = nullptr;
  PFN_cuMemAddressReserve_v10020 memAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 memAddressFree = nullptr;
  PFN_cuMemCreate_v10020 memCreate = nullptr;
  PFN_cuMemRelease_v10020 memRelease = nullptr;
  PFN_cuMemMap_v10020 memMap = nullptr;
  PFN_cuMemUnmap_v10020 memUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 memSetAccess = nullptr;

  template <class F>
  static void load(F& fn, const char* symbol) {
    void* p = nullptr;
    bool found = false;
#if CUDART_VERSION >= 12000
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbi, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &q);
#endif
    found = e == cudaSuccess && q == cudaDriverEntryPointSuccess && p;
#else
    cudaError_t e = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault);
    found = e == cudaSuccess && p;
#endif
    if (!found) {
      cudaGetLastError();
      throw Error(detail::concat("no CUDA device: the driver does not provide ", symbol, " (",
                                 cudaGetErrorString(e), ")"));
    }
    fn = reinterpret_cast<F>(p);
  }

  void loadAll() {
    load(getErrorString, "cuGetErrorString");
    load(deviceGet, "cuDeviceGet");
    load(deviceGetAttribute, "cuDeviceGetAttribute");
    load(memGetAllocationGranularity, "cuMemGetAllocationGranularity");
    load(memAddressReserve, "cuMemAddressReserve");
    load(memAddressFree, "cuMemAddressFree");
    load(memCreate, "cuMemCreate");
    load(memRelease, "cuMemRelease");
    load(memMap, "cuMemMap");
    load(memUnmap, "cuMemUnmap");
    load(memSetAccess, "cuMemSetAccess");
  }

  // Throws keel::Error "cuda-vmm allocator: cuMemMap failed: <driver message>" unless r is 0.
  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* msg = nullptr;
    if (!getErrorString || getErrorString(r, &msg) != CUDA_SUCCESS || !msg) msg = "unknown error";
    throw Error(detail::concat("cuda-vmm allocator: ", what, " failed: ", msg, " (", int(r), ")"));
  }
};

void checkRuntime(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(detail::concat("cuda-vmm allocator: ", what, " failed: ", cudaGetErrorString(e)));
}

// Makes `device` current for the calling thread while alive (driver calls need its context).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != device && cudaSetDevice(device) == cudaSuccess)
      prev_ = cur;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

struct CudaVmmAllocator::Impl final : alloc::VmmChunkOps {
  struct Handle {
    CUmemGenericAllocationHandle h = 0;
    bool live = false;
  };
  Driver drv;
  int device = 0;
  size_t chunk = 0, reserve = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  CUdeviceptr base = 0;
  std::vector<Handle> handles;  // by chunk index
  std::unique_ptr<alloc::VmmCore> core;

  explicit Impl(CudaVmmAllocatorOptions& o);
  ~Impl() override;

  bool create(int64_t phys) override {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = drv.memCreate(&h, chunk, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
    drv.check(r, "cuMemCreate");
    if (size_t(phys) >= handles.size()) handles.resize(size_t(phys) + 1);
    handles[size_t(phys)] = {h, true};
    return true;
  }
  // Each chunk is its own cuMemMap; one cuMemSetAccess covers the run (as PyTorch's expandable
  // segments do). On failure the chunks mapped so far are unmapped again.
  void map(uintptr_t addr, int64_t phys, size_t n) override {
    auto undo = [&](size_t mapped) {
      for (size_t i = 0; i < mapped; ++i) drv.memUnmap(CUdeviceptr(addr + i * chunk), chunk);
    };
    for (size_t i = 0; i < n; ++i) {
      CUresult r =
          drv.memMap(CUdeviceptr(addr + i * chunk), chunk, 0, handles.at(size_t(phys) + i).h, 0);
      if (r != CUDA_SUCCESS) undo(i);
      drv.check(r, "cuMemMap");
    }
    CUresult r = drv.memSetAccess(CUdeviceptr(addr), n * chunk, &access, 1);
    if (r != CUDA_SUCCESS) undo(n);
    drv.check(r, "cuMemSetAccess");
  }
  void unmap(uintptr_t addr) override {
    drv.check(drv.memUnmap(CUdeviceptr(addr), chunk), "cuMemUnmap");
  }
  void release(int64_t phys) override {
    Handle& h = handles.at(size_t(phys));
    h.live = false;
    drv.check(drv.memRelease(h.h), "cuMemRelease");
  }
  void copy(uintptr_t to, uintptr_t from, size_t bytes) override {
    checkRuntime(cudaMemcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), bytes,
                            cudaMemcpyDeviceToDevice),
                 "cudaMemcpy");
    checkRuntime(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void sync() override { checkRuntime(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
};

CudaVmmAllocator::Impl::Impl(CudaVmmAllocatorOptions& o) : device(o.device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    throw Error(detail::concat("no CUDA device: ", cudaGetErrorString(e), " (cudaGetDeviceCount)"));
  }
  if (device < 0 || device >= count)
    throw Error(detail::concat("no CUDA device: cuda:", device, " requested, ", count,
                               count == 1 ? " device present" : " devices present"));
  drv.loadAll();
  DeviceGuard guard(device);
  checkRuntime(cudaSetDevice(device), "cudaSetDevice");
  checkRuntime(cudaFree(nullptr), "creating the device's context");
  CUdevice dev = 0;
  drv.check(drv.deviceGet(&dev, device), "cuDeviceGet");
  int vmm = 0;
  drv.check(
      drv.deviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
      "cuDeviceGetAttribute");
  if (!vmm)
    throw Error(detail::concat("no CUDA device: cuda:", device,
                               " does not support virtual memory management"));

  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t minimum = 0, recommended = 0;
  drv.check(drv.memGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity");
  drv.check(
      drv.memGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      "cuMemGetAllocationGranularity");
  minimum = std::max<size_t>(minimum, 1);
  chunk =
      o.chunk ? o.chunk : alloc::roundUp(std::max<size_t>(recommended, size_t(2) << 20), minimum);
  KEEL_CHECK(chunk % minimum == 0 && o.round > 0 && o.round <= chunk, o.name,
             " allocator: the chunk size ", chunk,
             " must be a multiple of the device's allocation granularity ", minimum);
  size_t freeBytes = 0, totalBytes = 0;
  checkRuntime(cudaMemGetInfo(&freeBytes, &totalBytes), "cudaMemGetInfo");
  reserve = alloc::roundUp(std::max(o.reserve ? o.reserve : 2 * totalBytes, chunk), chunk);
  drv.check(drv.memAddressReserve(&base, reserve, chunk, 0, 0), "cuMemAddressReserve");
  o.chunk = chunk;
  o.reserve = reserve;
  core = std::make_unique<alloc::VmmCore>(o, uintptr_t(base), *this, Device(Backend::Cuda, device));
}

CudaVmmAllocator::Impl::~Impl() {
  // Errors are ignored: the process may be tearing the CUDA runtime down already.
  DeviceGuard guard(device);
  cudaDeviceSynchronize();
  if (core) core->forEachMapped([&](uintptr_t addr, int64_t) { drv.memUnmap(addr, chunk); });
  for (Handle& h : handles)
    if (h.live) drv.memRelease(h.h);
  if (base) drv.memAddressFree(base, reserve);
  cudaGetLastError();
}

CudaVmmAllocator::CudaVmmAllocator(CudaVmmAllocatorOptions o) : impl_(std::make_unique<Impl>(o)) {}
CudaVmmAllocator::~CudaVmmAllocator() = default;

void* CudaVmmAllocator::allocate(size_t bytes) {
  DeviceGuard guard(impl_->device);
  return impl_->core->allocate(bytes);
}
void CudaVmmAllocator::deallocate(void* ptr, size_t) {
  impl_->core->deallocate(ptr);
}
std::string CudaVmmAllocator::name() const {
  return impl_->core->name();
}
size_t CudaVmmAllocator::allocatedBytes() const {
  return impl_->core->allocatedBytes();
}
size_t CudaVmmAllocator::reservedBytes() const {
  return impl_->core->reservedBytes();
}
AllocatorStats CudaVmmAllocator::stats() const {
  return impl_->core->stats();
}
void CudaVmmAllocator::emptyCache() {
  DeviceGuard guard(impl_->device);
  impl_->core->emptyCache();
}
void CudaVmmAllocator::resetPeaks() {
  impl_->core->resetPeaks();
}
MemorySnapshot CudaVmmAllocator::snapshot() const {
  return impl_->core->snapshot();
}
void CudaVmmAllocator::setLimit(size_t bytes) {
  impl_->core->setLimit(bytes);
}
uintptr_t CudaVmmAllocator::base() const {
  return uintptr_t(impl_->base);
}
size_t CudaVmmAllocator::chunkBytes() const {
  return impl_->chunk;
}
int CudaVmmAllocator::device() const {
  return impl_->device;
}

}  // namespace keel
