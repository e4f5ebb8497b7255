// The CUDA simulator's runtime (Note [CUDA simulator] in kernel.cpp): the runtime and driver API
// calls of engine/backends/cuda on the CPU, cuBLAS's strided-batched gemm, CUB's pair sorts and
// the half conversions. Device memory is host memory, checked: a copy, a memset or a gemm that
// touches bytes outside every live device allocation fails as on a GPU (an invalid value or an
// execution failure) instead of reading the host's memory. The simulated device has a memory
// limit (KEEL_CUDA_SIM_MEMORY bytes, 8 GiB without it), so out-of-memory paths run too.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "cub/device/device_radix_sort.cuh"
#include "cublasLt.h"
#include "cublas_v2.h"
#include "cudaTypedefs.h"
#include "cuda_runtime.h"
#include "keel/base/dtype.h"
#include "sim_state.h"

namespace sim {
namespace {

thread_local cudaError_t t_lastError = cudaSuccess;
thread_local int t_device = 0;
std::string g_launchMessage;          // the last failed launch's message
cudaError_t g_pending = cudaSuccess;  // a launch failure, reported at the next synchronisation

size_t envSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  return end && *end == 0 && x > 0 ? size_t(x) : fallback;
}

int deviceCount() {
  static const int n = int(std::clamp<size_t>(envSize("KEEL_CUDA_SIM_DEVICES", 1), 1, 8));
  return n;
}

// Device memory: live ranges (cudaMalloc'd blocks and mapped VMM chunks) and the bytes held.
struct Memory {
  size_t limit = envSize("KEEL_CUDA_SIM_MEMORY", size_t(8) << 30);
  size_t used = 0;
  std::map<uintptr_t, size_t> ranges;   // start -> bytes: addressable device memory
  std::map<uintptr_t, size_t> mallocs;  // cudaMalloc'd blocks (counted in `used`)
  std::map<uintptr_t, std::pair<uintptr_t, size_t>> guardMaps;  // guarded block -> its mapping
};

Memory& mem() {
  static Memory m;
  return m;
}

// True if [p, p + bytes) lies inside one live device range.
bool onDevice(const void* p, size_t bytes) {
  if (bytes == 0) return true;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const Memory& m = mem();
  auto it = m.ranges.upper_bound(a);
  if (it == m.ranges.begin()) return false;
  --it;
  // Adjacent mapped chunks of one VMM range are separate entries: walk on through them.
  uintptr_t end = it->first + it->second;
  if (a < it->first || a >= end) return false;
  while (a + bytes > end) {
    auto next = m.ranges.find(end);
    if (next == m.ranges.end()) return false;
    end = next->first + next->second;
  }
  return true;
}

struct Stream {
  int device = 0;
};
struct Event {
  std::chrono::steady_clock::time_point t{};
  bool recorded = false;
};

cudaError_t reportPending() {
  if (g_pending == cudaSuccess) return cudaSuccess;
  const cudaError_t e = g_pending;
  g_pending = cudaSuccess;
  return setError(e);
}

}  // namespace

std::recursive_mutex& deviceMutex() {
  static std::recursive_mutex m;
  return m;
}

// KEEL_CUDA_SIM_GUARD=1 (sim_state.h).
bool guarded() {
  static const bool g = [] {
    const char* v = std::getenv("KEEL_CUDA_SIM_GUARD");
    const bool on = v && std::string(v) == "1";
    if (on) std::fprintf(stderr, "keel cuda simulator: device blocks end against guard pages\n");
    return on;
  }();
  return g;
}

cudaError_t setError(cudaError_t e) {
  if (e != cudaSuccess) t_lastError = e;
  return e;
}

void setLaunchError(cudaError_t e, const std::string& message) {
  g_launchMessage = message;
  std::fprintf(stderr, "keel cuda simulator: %s\n", message.c_str());
  setError(e);
  if (e == cudaErrorLaunchFailure) g_pending = e;
}

}  // namespace sim

using sim::setError;
using Lock = std::lock_guard<std::recursive_mutex>;

// ---------------------------------------------------------------- devices and errors
cudaError_t cudaGetDeviceCount(int* count) {
  *count = sim::deviceCount();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= sim::deviceCount()) return setError(cudaErrorInvalidDevice);
  sim::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = sim::t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device < 0 || device >= sim::deviceCount()) return setError(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "Keel CUDA simulator (CPU)");
  p->totalGlobalMem = sim::mem().limit;
  p->sharedMemPerBlock = 48 << 10;
  p->sharedMemPerBlockOptin = 232448;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->multiProcessorCount = 4;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  Lock l(sim::deviceMutex());
  return sim::reportPending();
}
cudaError_t cudaDeviceReset() {
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = sim::t_lastError;
  sim::t_lastError = cudaSuccess;
  if (e == cudaErrorLaunchFailure) {
    Lock l(sim::deviceMutex());
    sim::g_pending = cudaSuccess;  // reported once
  }
  return e;
}
cudaError_t cudaPeekAtLastError() {
  return sim::t_lastError;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  thread_local std::string s;
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      s = "invalid argument";
      break;
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      s = "invalid configuration argument";
      break;
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress:
      s = "an illegal memory access was encountered";
      break;
    case cudaErrorLaunchFailure:
      s = "unspecified launch failure";
      break;
    default:
      return "unknown error";
  }
  Lock l(sim::deviceMutex());
  if (!sim::g_launchMessage.empty()) s += " (simulator: " + sim::g_launchMessage + ")";
  return s.c_str();
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// ---------------------------------------------------------------- memory
cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock l(sim::deviceMutex());
  sim::Memory& m = sim::mem();
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + 255) / 256 * 256;
  if (rounded > m.limit - std::min(m.used, m.limit)) return setError(cudaErrorMemoryAllocation);
  void* q = nullptr;
  if (sim::guarded()) {
    // The block ends at most 255 bytes before a PROT_NONE page (cudaMalloc's 256-byte alignment).
    const size_t page = size_t(sysconf(_SC_PAGESIZE)), span = (rounded + page - 1) / page * page;
    void* r =
        mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return setError(cudaErrorMemoryAllocation);
    mprotect(static_cast<char*>(r) + span, page, PROT_NONE);
    q = static_cast<char*>(r) + (span - rounded) + (rounded - bytes) / 256 * 256;
    m.guardMaps[reinterpret_cast<uintptr_t>(q)] = {reinterpret_cast<uintptr_t>(r), span + page};
  } else {
    q = std::aligned_alloc(256, rounded);
  }
  if (!q) return setError(cudaErrorMemoryAllocation);
  std::memset(q, 0xff, rounded);  // fresh device memory reads as NaN (or -1) until written
  m.used += rounded;
  m.mallocs[reinterpret_cast<uintptr_t>(q)] = rounded;
  m.ranges[reinterpret_cast<uintptr_t>(q)] = bytes;  // checked to the byte asked for
  *p = q;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  Lock l(sim::deviceMutex());
  if (!p) return cudaSuccess;
  sim::Memory& m = sim::mem();
  auto it = m.mallocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.mallocs.end()) return setError(cudaErrorInvalidDevicePointer);
  m.used -= it->second;
  m.ranges.erase(it->first);
  m.mallocs.erase(it);
  if (auto g = m.guardMaps.find(reinterpret_cast<uintptr_t>(p)); g != m.guardMaps.end()) {
    munmap(reinterpret_cast<void*>(g->second.first), g->second.second);
    m.guardMaps.erase(g);
  } else {
    std::free(p);
  }
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::malloc(std::max<size_t>(bytes, 1));
  return *p ? cudaSuccess : setError(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  return cudaHostAlloc(p, bytes, 0);
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Lock l(sim::deviceMutex());
  const sim::Memory& m = sim::mem();
  *total = m.limit;
  *free = m.limit - std::min(m.used, m.limit);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Lock l(sim::deviceMutex());
  if (cudaError_t e = sim::reportPending(); e != cudaSuccess) return e;
  const bool dstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool srcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) {
    // Either side may be device memory: whatever is not must still be memory of this process.
  } else if ((dstDev && !sim::onDevice(dst, bytes)) || (srcDev && !sim::onDevice(src, bytes))) {
    sim::setLaunchError(cudaErrorInvalidValue, "cudaMemcpy of " + std::to_string(bytes) +
                                                   " bytes outside the device's live allocations");
    return cudaErrorInvalidValue;
  }
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice,
                                size_t bytes, cudaStream_t) {
  if (dstDevice < 0 || dstDevice >= sim::deviceCount() || srcDevice < 0 ||
      srcDevice >= sim::deviceCount())
    return setError(cudaErrorInvalidDevice);
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  Lock l(sim::deviceMutex());
  if (!sim::onDevice(p, bytes)) {
    sim::setLaunchError(cudaErrorInvalidValue, "cudaMemset of " + std::to_string(bytes) +
                                                   " bytes outside the device's live allocations");
    return cudaErrorInvalidValue;
  }
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}

// ---------------------------------------------------------------- streams and events
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new sim::Stream{sim::t_device});
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<sim::Stream*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  Lock l(sim::deviceMutex());
  return sim::reportPending();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  return e ? cudaSuccess : setError(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new sim::Event);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<sim::Event*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  auto* ev = reinterpret_cast<sim::Event*>(e);
  ev->t = std::chrono::steady_clock::now();
  ev->recorded = true;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  Lock l(sim::deviceMutex());
  return sim::reportPending();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e ? cudaSuccess : setError(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto *a = reinterpret_cast<sim::Event*>(start), *b = reinterpret_cast<sim::Event*>(end);
  if (!a || !b || !a->recorded || !b->recorded) return setError(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

// ---------------------------------------------------------------- driver: virtual memory
namespace sim {
namespace {

constexpr size_t kGranularity = size_t(2) << 20;

// A cuMemCreate'd chunk: its memory is the device's until it is released and no longer mapped.
struct Physical {
  int fd = -1;
  size_t bytes = 0;
  int mappings = 0;
  bool released = false;
};
std::map<CUmemGenericAllocationHandle, Physical>& physicals() {
  static std::map<CUmemGenericAllocationHandle, Physical> p;
  return p;
}
std::map<uintptr_t, CUmemGenericAllocationHandle>& mappedFrom() {  // mapped range -> its chunk
  static std::map<uintptr_t, CUmemGenericAllocationHandle> m;
  return m;
}
std::map<uintptr_t, size_t>& reservations() {
  static std::map<uintptr_t, size_t> r;
  return r;
}
CUmemGenericAllocationHandle g_nextHandle = 1;

bool validLocation(const CUmemLocation& l) {
  return l.type == CU_MEM_LOCATION_TYPE_DEVICE && l.id >= 0 && l.id < deviceCount();
}

CUresult cuGetErrorString(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS:
      *s = "no error";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *s = "invalid argument";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *s = "out of memory";
      break;
    case CUDA_ERROR_INVALID_DEVICE:
      *s = "invalid device ordinal";
      break;
    case CUDA_ERROR_INVALID_HANDLE:
      *s = "invalid resource handle";
      break;
    default:
      *s = "unknown error";
      break;
  }
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (d < 0 || d >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  if (a != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) return CUDA_ERROR_INVALID_VALUE;
  *v = 1;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* p,
                                       CUmemAllocationGranularity_flags) {
  if (!p || p->type != CU_MEM_ALLOCATION_TYPE_PINNED || !validLocation(p->location))
    return CUDA_ERROR_INVALID_VALUE;
  *g = kGranularity;
  return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t align, CUdeviceptr,
                             unsigned long long) {
  if (size == 0 || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  align = std::max(align, kGranularity);
  void* p =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (a + align - 1) / align * align;
  if (aligned > a) munmap(p, aligned - a);
  if (a + size + align > aligned + size)
    munmap(reinterpret_cast<void*>(aligned + size), a + size + align - aligned - size);
  Lock l(deviceMutex());
  reservations()[aligned] = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  Lock l(deviceMutex());
  auto it = reservations().find(uintptr_t(ptr));
  if (it == reservations().end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  for (auto r = mem().ranges.lower_bound(uintptr_t(ptr));
       r != mem().ranges.end() && r->first < uintptr_t(ptr) + size;)
    r = mem().ranges.erase(r);
  munmap(reinterpret_cast<void*>(ptr), size);
  reservations().erase(it);
  return CUDA_SUCCESS;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* p,
                     unsigned long long) {
  if (!p || p->type != CU_MEM_ALLOCATION_TYPE_PINNED || !validLocation(p->location) || size == 0 ||
      size % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  Lock l(deviceMutex());
  Memory& m = mem();
  if (size > m.limit - std::min(m.used, m.limit)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("keel-cuda-sim", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, off_t(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // Fresh device memory reads as NaN (or -1) until written: a kernel that reads what nothing
  // wrote shows in its results instead of reading zeros by luck.
  void* fill = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fill == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::memset(fill, 0xff, size);
  munmap(fill, size);
  m.used += size;
  *h = g_nextHandle++;
  physicals()[*h] = {fd, size};
  return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  Lock l(deviceMutex());
  auto it = physicals().find(h);
  if (it == physicals().end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second.released) return CUDA_ERROR_INVALID_HANDLE;
  close(it->second.fd);  // mappings keep the memory until they are unmapped
  it->second.released = true;
  if (it->second.mappings == 0) {
    mem().used -= it->second.bytes;
    physicals().erase(it);
  }
  return CUDA_SUCCESS;
}
bool inReservation(uintptr_t a, size_t size) {
  auto it = reservations().upper_bound(a);
  if (it == reservations().begin()) return false;
  --it;
  return a >= it->first && a + size <= it->first + it->second;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long) {
  Lock l(deviceMutex());
  auto it = physicals().find(h);
  if (it == physicals().end() || it->second.released) return CUDA_ERROR_INVALID_HANDLE;
  // The driver maps whole allocations: offset 0 (CUDA's documented requirement).
  if (size == 0 || size % kGranularity || ptr % kGranularity || offset != 0 ||
      size > it->second.bytes || !inReservation(uintptr_t(ptr), size))
    return CUDA_ERROR_INVALID_VALUE;
  if (auto r = mem().ranges.lower_bound(uintptr_t(ptr));
      (r != mem().ranges.end() && r->first < uintptr_t(ptr) + size) ||
      (r != mem().ranges.begin() && std::prev(r)->first + std::prev(r)->second > uintptr_t(ptr)))
    return CUDA_ERROR_INVALID_VALUE;  // overlaps a mapping
  // Mapped without access until cuMemSetAccess, as the driver does.
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                 it->second.fd, off_t(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  mem().ranges[uintptr_t(ptr)] = size;
  mappedFrom()[uintptr_t(ptr)] = h;
  ++it->second.mappings;
  return CUDA_SUCCESS;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  Lock l(deviceMutex());
  auto it = mem().ranges.find(uintptr_t(ptr));
  if (it == mem().ranges.end() || it->second != size || !inReservation(uintptr_t(ptr), size))
    return CUDA_ERROR_INVALID_VALUE;
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  mem().ranges.erase(it);
  if (auto m = mappedFrom().find(uintptr_t(ptr)); m != mappedFrom().end()) {
    auto ph = physicals().find(m->second);
    if (ph != physicals().end() && --ph->second.mappings == 0 && ph->second.released) {
      mem().used -= ph->second.bytes;  // released earlier: the memory goes back now
      physicals().erase(ph);
    }
    mappedFrom().erase(m);
  }
  return CUDA_SUCCESS;
}
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (!desc || count != 1 || !validLocation(desc->location)) return CUDA_ERROR_INVALID_VALUE;
  Lock l(deviceMutex());
  if (!onDevice(reinterpret_cast<const void*>(ptr), size)) return CUDA_ERROR_INVALID_VALUE;
  const int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                     : PROT_NONE;
  return mprotect(reinterpret_cast<void*>(ptr), size, prot) == 0 ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_INVALID_VALUE;
}

struct Entry {
  const char* name;
  void* fn;
};
const Entry kDriver[] = {
    {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
    {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
    {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
    {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
    {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
    {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
    {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
    {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
    {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
    {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
    {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
};

}  // namespace
}  // namespace sim

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long,
                                    cudaDriverEntryPointQueryResult* status) {
  for (const sim::Entry& e : sim::kDriver)
    if (std::strcmp(e.name, symbol) == 0) {
      *fn = e.fn;
      if (status) *status = cudaDriverEntryPointSuccess;
      return cudaSuccess;
    }
  *fn = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPoint(symbol, fn, flags, status);
}

// ---------------------------------------------------------------- half
// The host's conversions (keel/base/dtype.h: nearest even, overflow to infinity), except that a
// NaN becomes the canonical 0x7fff, as __float2half gives on a GPU.
float keelSimHalfToFloat(unsigned short h) {
  return keel::Half::toFloat(h);
}
unsigned short keelSimFloatToHalf(float f) {
  return std::isnan(f) ? uint16_t(0x7fff) : keel::Half::fromFloat(f);
}

// ---------------------------------------------------------------- cuBLAS
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointers = CUBLAS_POINTER_MODE_HOST;
};
struct cublasLtContext {};

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* w, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  Lock l(sim::deviceMutex());
  return bytes == 0 || sim::onDevice(w, bytes) ? CUBLAS_STATUS_SUCCESS
                                               : CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t h, cublasAtomicsMode_t) {
  return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->pointers = mode;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  *value = type == MAJOR_VERSION ? 13 : 0;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}
cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

size_t typeSize(cudaDataType_t t) {
  return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2;
}
double readElem(const void* base, cudaDataType_t t, int64_t i) {
  switch (t) {
    case CUDA_R_64F:
      return static_cast<const double*>(base)[i];
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_16F:
      return keelSimHalfToFloat(static_cast<const uint16_t*>(base)[i]);
    default: {
      keel::BFloat16 b;
      b.bits = static_cast<const uint16_t*>(base)[i];
      return float(b);
    }
  }
}
void writeElem(void* base, cudaDataType_t t, int64_t i, double v) {
  switch (t) {
    case CUDA_R_64F:
      static_cast<double*>(base)[i] = v;
      break;
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = float(v);
      break;
    case CUDA_R_16F:
      static_cast<uint16_t*>(base)[i] = keelSimFloatToHalf(float(v));
      break;
    default:  // the host's rounding (keel/base/dtype.h): nearest even, NaN stays NaN
      static_cast<uint16_t*>(base)[i] = keel::BFloat16::fromFloat(float(v));
  }
}
float toTf32(float f) {  // 10 mantissa bits, nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;
  u += 0xfffu + ((u >> 13) & 1u);
  u &= 0xffffe000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// Elements an operand stored column-major with `rows` x `cols`, leading dim ld spans, per batch.
bool operandOnDevice(const void* p, cudaDataType_t t, int rows, int cols, int ld, long long stride,
                     int batch) {
  if (rows == 0 || cols == 0 || batch == 0) return true;
  const long long last = (long long)(cols - 1) * ld + rows;  // elements of one matrix
  long long lo = 0, hi = last;
  if (batch > 1) {
    lo = std::min(0LL, stride * (batch - 1));
    hi = std::max(last, stride * (batch - 1) + last);
  }
  const auto* b = static_cast<const char*>(p) + lo * (long long)typeSize(t);
  return sim::onDevice(b, size_t(hi - lo) * typeSize(t));
}

template <class Acc>
void gemm(bool ta, bool tb, int m, int n, int k, Acc alpha, const void* A, int lda, long long sA,
          const void* B, int ldb, long long sB, Acc beta, void* C, int ldc, long long sC, int batch,
          cudaDataType_t type, bool tf32) {
  std::vector<Acc> a(size_t(m) * size_t(k));
  std::vector<Acc> acc(static_cast<size_t>(m));
  for (int p = 0; p < batch; ++p) {
    // op(A) as m x k, column-major, read once per batch.
    for (int l = 0; l < k; ++l)
      for (int i = 0; i < m; ++i) {
        const int64_t idx = p * sA + (ta ? int64_t(i) * lda + l : int64_t(l) * lda + i);
        Acc v = Acc(readElem(A, type, idx));
        if constexpr (std::is_same_v<Acc, float>)
          if (tf32) v = toTf32(v);
        a[size_t(l) * size_t(m) + size_t(i)] = v;
      }
    for (int j = 0; j < n; ++j) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int l = 0; l < k; ++l) {  // each dot product summed in order of l
        const int64_t idx = p * sB + (tb ? int64_t(l) * ldb + j : int64_t(j) * ldb + l);
        Acc bv = Acc(readElem(B, type, idx));
        if constexpr (std::is_same_v<Acc, float>)
          if (tf32) bv = toTf32(bv);
        const Acc* col = &a[size_t(l) * size_t(m)];
        for (int i = 0; i < m; ++i) acc[size_t(i)] += col[i] * bv;
      }
      for (int i = 0; i < m; ++i) {
        const int64_t idx = p * sC + int64_t(j) * ldc + i;
        Acc r = alpha * acc[size_t(i)];
        if (beta != Acc(0)) r += beta * Acc(readElem(C, type, idx));  // beta == 0: C not read
        writeElem(C, type, idx, double(r));
      }
    }
  }
}

}  // namespace

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t Atype,
                                          int lda, long long strideA, const void* B,
                                          cudaDataType_t Btype, int ldb, long long strideB,
                                          const void* beta, void* C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (transa == CUBLAS_OP_C || transb == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (m < 0 || n < 0 || k < 0 || batchCount < 0 || lda < std::max(1, ta ? k : m) ||
      ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m) || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (Atype != Btype || Atype != Ctype) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool f64 = computeType == CUBLAS_COMPUTE_64F;
  if (f64 != (Atype == CUDA_R_64F) ||
      (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype != CUDA_R_32F) ||
      (!f64 && computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (h->pointers != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
  Lock l(sim::deviceMutex());
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  if (!operandOnDevice(A, Atype, ta ? k : m, ta ? m : k, lda, strideA, batchCount) ||
      !operandOnDevice(B, Btype, tb ? n : k, tb ? k : n, ldb, strideB, batchCount) ||
      !operandOnDevice(C, Ctype, m, n, ldc, strideC, batchCount)) {
    sim::setLaunchError(cudaErrorIllegalAddress,
                        "cublasGemmStridedBatchedEx reads or writes outside the device's live "
                        "allocations (m " +
                            std::to_string(m) + ", n " + std::to_string(n) + ", k " +
                            std::to_string(k) + ")");
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const bool tf32 =
      computeType == CUBLAS_COMPUTE_32F_FAST_TF32 || (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
  if (f64)
    gemm<double>(ta, tb, m, n, k, *static_cast<const double*>(alpha), A, lda, strideA, B, ldb,
                 strideB, *static_cast<const double*>(beta), C, ldc, strideC, batchCount, Atype,
                 false);
  else
    gemm<float>(ta, tb, m, n, k, *static_cast<const float*>(alpha), A, lda, strideA, B, ldb,
                strideB, *static_cast<const float*>(beta), C, ldc, strideC, batchCount, Atype,
                tf32 && Atype == CUDA_R_32F);
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------- CUB sorts
cudaError_t keelSimSortPairsU64(void* temp, size_t& bytes, const uint64_t* keysIn,
                                uint64_t* keysOut, const int64_t* valuesIn, int64_t* valuesOut,
                                int64_t n, int beginBit, int endBit, const int64_t* segBegin,
                                const int64_t* segEnd, int64_t segments) {
  const size_t need = size_t(std::max<int64_t>(n, 0)) * 16 + 256;
  if (!temp) {
    bytes = need;
    return cudaSuccess;
  }
  Lock l(sim::deviceMutex());
  if (bytes < need || n < 0 || beginBit < 0 || endBit > 64 || beginBit > endBit)
    return setError(cudaErrorInvalidValue);
  if (n == 0) return cudaSuccess;
  const size_t nb = size_t(n) * 8;
  if (!sim::onDevice(temp, bytes) || !sim::onDevice(keysIn, nb) || !sim::onDevice(keysOut, nb) ||
      !sim::onDevice(valuesIn, nb) || !sim::onDevice(valuesOut, nb)) {
    sim::setLaunchError(cudaErrorIllegalAddress,
                        "a CUB sort reads or writes outside the device's live allocations");
    return cudaErrorIllegalAddress;
  }
  const int width = endBit - beginBit;  // 0: every key equal, the input copied (stable)
  const uint64_t mask = width == 64 ? ~uint64_t(0) : ((uint64_t(1) << width) - 1);
  auto sortRange = [&](int64_t b, int64_t e) {
    std::vector<int64_t> order(size_t(e - b));
    std::iota(order.begin(), order.end(), b);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return ((keysIn[x] >> beginBit) & mask) < ((keysIn[y] >> beginBit) & mask);
    });
    std::vector<uint64_t> k(order.size());
    std::vector<int64_t> v(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      k[i] = keysIn[order[i]];
      v[i] = valuesIn[order[i]];
    }
    std::copy(k.begin(), k.end(), keysOut + b);
    std::copy(v.begin(), v.end(), valuesOut + b);
  };
  if (!segBegin) {
    sortRange(0, n);
    return cudaSuccess;
  }
  // Items outside every segment are left as the outputs held them (CUB neither reads nor writes
  // them); a segment with end <= begin is empty.
  if (!sim::onDevice(segBegin, size_t(segments) * 8) ||
      !sim::onDevice(segEnd, size_t(segments) * 8))
    return setError(cudaErrorIllegalAddress);
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t b = segBegin[s], e = segEnd[s];
    if (e <= b) continue;
    if (b < 0 || e > n) return setError(cudaErrorInvalidValue);
    sortRange(b, e);
  }
  return cudaSuccess;
}

void keelSimSetMemoryLimit(size_t bytes) {
  Lock l(sim::deviceMutex());
  sim::mem().limit = bytes;
}
size_t keelSimMemoryUsed() {
  Lock l(sim::deviceMutex());
  return sim::mem().used;
}
