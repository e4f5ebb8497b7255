// The CUDA backend's host runtime (runtime.h) and the plugin's entry point (keelCudaApi, the table
// libkeel_engine loads: Note [CUDA backend plugin]). One context per device, created on first use
// and kept for the process; copies between host and device go through pinned staging buffers.
#include "runtime.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_api.h"
#include "keel/allocator.h"
#include "keel/cuda_allocator.h"
#include "keel/error.h"
#include "keel/registry.h"

namespace keel::cuda {

void registerKernels(Registry& r);  // register.cpp

namespace {

struct Devices {
  int count = 0;
  std::string reason;  // why count is 0
};
const Devices& devices() {
  static const Devices d = [] {
    Devices r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      cudaGetLastError();
      r.count = 0;
      r.reason = cudaGetErrorString(e);
    } else if (r.count == 0) {
      r.reason = "the CUDA runtime found no device";
    }
    return r;
  }();
  return d;
}

bool envFlag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// What a context holds besides DeviceCtx: the allocator, pinned staging, the last op's name.
struct DeviceState {
  DeviceCtx ctx;
  std::unique_ptr<Allocator> allocator;
  std::array<void*, 2> staging = {nullptr, nullptr};  // pinned host buffers of kStaging bytes
  std::array<cudaEvent_t, 2> stagingDone = {nullptr, nullptr};
  // The op whose kernels were enqueued last (messages of async errors); written by whichever
  // thread dispatches, read by whichever waits. OpDefs live as long as the registry.
  std::atomic<const OpDef*> lastOp{nullptr};
  std::mutex copyMu;  // one staged copy at a time per device
};
constexpr size_t kStaging = size_t(4) << 20;

// Contexts by device, created under g_mu and never destroyed: left to the process's end, since
// buffers that outlive static destruction (or threads still running) free into their allocators,
// and the CUDA runtime may be gone by then.
std::mutex g_mu;
std::vector<std::unique_ptr<DeviceState>>& g_devices =
    *new std::vector<std::unique_ptr<DeviceState>>;
// The allocator of each device once created, for check()'s out-of-memory summary: check() runs
// with and without g_mu held, so it reads these instead of g_devices.
constexpr int kMaxDevices = 64;
std::array<std::atomic<Allocator*>, kMaxDevices> g_allocatorOf{};

std::string lastOpName(const DeviceState& s) {
  const OpDef* op = s.lastOp.load(std::memory_order_relaxed);
  return op ? op->name : std::string();
}

// Contexts once created, read without the lock: every kernel launch looks its device up.
std::array<std::atomic<DeviceState*>, kMaxDevices> g_created{};
// The device this thread last made current through state() (cudaSetDevice costs a driver call;
// code that changes the current device elsewhere restores it: DeviceGuard, kCopyTo).
thread_local int t_current = -1;

DeviceState& state(int device) {
  const Devices& ds = devices();
  KEEL_CHECK(device >= 0 && device < ds.count && device < kMaxDevices, "device 'cuda:", device,
             "' is not available: ",
             ds.count == 0 ? "no CUDA device (" + ds.reason + ")"
                           : detail::concat(ds.count, " CUDA device(s)"));
  if (t_current != device) {
    check(cudaSetDevice(device), "cudaSetDevice", device);
    t_current = device;
  }
  if (DeviceState* made = g_created[size_t(device)].load(std::memory_order_acquire)) return *made;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_devices.size() < size_t(ds.count)) g_devices.resize(size_t(ds.count));
  std::unique_ptr<DeviceState>& s = g_devices[size_t(device)];
  if (s) return *s;
  auto st = std::make_unique<DeviceState>();
  DeviceCtx& c = st->ctx;
  c.index = device;
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties", device);
  c.name = p.name;
  c.smCount = p.multiProcessorCount;
  c.major = p.major;
  c.minor = p.minor;
  check(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate", device);
  checkBlas(cublasCreate(&c.blas), "cublasCreate", device);
  checkBlas(cublasSetStream(c.blas, c.stream), "cublasSetStream", device);
  check(cudaMalloc(&c.blasWorkspace, kBlasWorkspace), "cudaMalloc (cuBLAS workspace)", device);
  checkBlas(cublasSetWorkspace(c.blas, c.blasWorkspace, kBlasWorkspace), "cublasSetWorkspace",
            device);
  // TF32 off unless asked for; reduced-precision reductions off for 16-bit gemms (accumulation
  // stays float32 as the variant says).
  checkBlas(
      cublasSetMathMode(
          c.blas, cublasMath_t((allowTf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      "cublasSetMathMode", device);
  checkBlas(cublasLtCreate(&c.blasLt), "cublasLtCreate", device);
  void* words = nullptr;
  check(cudaMalloc(&words, 16), "cudaMalloc (error word)", device);
  // On the op stream: a non-blocking stream is not ordered after the legacy default stream.
  check(cudaMemsetAsync(words, 0, 16, c.stream), "cudaMemsetAsync", device);
  c.errorWord = static_cast<int*>(words);
  c.errorValue = reinterpret_cast<long long*>(static_cast<char*>(words) + 8);
  for (int i = 0; i < 2; ++i) {
    check(cudaHostAlloc(&st->staging[size_t(i)], kStaging, cudaHostAllocDefault),
          "cudaHostAlloc (staging)", device);
    check(cudaEventCreateWithFlags(&st->stagingDone[size_t(i)], cudaEventDisableTiming),
          "cudaEventCreate", device);
  }
  s = std::move(st);
  g_created[size_t(device)].store(s.get(), std::memory_order_release);
  return *s;
}

// Raises the deferred error of the device, if any (Note [Deferred device errors]); the stream
// has been synchronized.
void raiseDeferred(DeviceState& s) {
  int code[4] = {0, 0, 0, 0};  // word, pad, value (8 bytes)
  check(cudaMemcpy(code, s.ctx.errorWord, 16, cudaMemcpyDeviceToHost), "reading the error word",
        s.ctx.index);
  if (code[0] == 0) return;
  long long value = 0;
  std::memcpy(&value, &code[2], 8);
  // Cleared on the op stream, so no later kernel's report can be cleared by it.
  check(cudaMemsetAsync(s.ctx.errorWord, 0, 16, s.ctx.stream), "cudaMemsetAsync", s.ctx.index);
  const int kind = code[0] % 16, opId = code[0] / 16 - 1;
  const Registry& reg = Registry::get();
  const std::string op =
      opId >= 0 && opId < reg.size() ? reg.op(opId).name : std::string("(unknown op)");
  if (kind == int(DeviceError::IndexOutOfRange))
    throw Error(detail::concat("op '", op, "' on cuda:", s.ctx.index, ": index ", value,
                               " is out of range (found by the kernel, reported when the host "
                               "next waited for the device)"));
  throw Error(detail::concat("op '", op, "' on cuda:", s.ctx.index, ": device error ", kind));
}

void syncState(DeviceState& s) {
  const cudaError_t e = cudaStreamSynchronize(s.ctx.stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const std::string op = lastOpName(s);
    throw Error(detail::concat("CUDA error on cuda:", s.ctx.index,
                               op.empty() ? std::string() : " after op '" + op + "'", ": ",
                               cudaGetErrorString(e), " (", int(e), ")"));
  }
  raiseDeferred(s);
}

void copyStaged(DeviceState& s, char* dst, bool dstDev, const char* src, bool srcDev,
                size_t bytes) {
  const int dev = s.ctx.index;
  cudaStream_t st = s.ctx.stream;
  if (dstDev && srcDev) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync", dev);
    syncState(s);
    return;
  }
  if (!dstDev && !srcDev) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::lock_guard<std::mutex> lk(s.copyMu);
  const size_t chunks = (bytes + kStaging - 1) / kStaging;
  if (srcDev) {
    // Device to host: chunk i lands in staging[i % 2]; the host copies it out while chunk i + 1
    // is in flight.
    auto enqueue = [&](size_t i) {
      const size_t off = i * kStaging, n = std::min(kStaging, bytes - off);
      check(cudaMemcpyAsync(s.staging[i % 2], src + off, n, cudaMemcpyDeviceToHost, st),
            "cudaMemcpyAsync (device to host)", dev);
      check(cudaEventRecord(s.stagingDone[i % 2], st), "cudaEventRecord", dev);
    };
    if (chunks > 0) enqueue(0);
    for (size_t i = 0; i < chunks; ++i) {
      if (i + 1 < chunks) enqueue(i + 1);
      const cudaError_t e = cudaEventSynchronize(s.stagingDone[i % 2]);
      if (e != cudaSuccess) {
        syncState(s);  // names the op that failed
        check(e, "cudaEventSynchronize", dev);
      }
      const size_t off = i * kStaging, n = std::min(kStaging, bytes - off);
      std::memcpy(dst + off, s.staging[i % 2], n);
    }
  } else {
    // Host to device: the host fills staging[i % 2] once the copy that last used it is done (also
    // one of an earlier call that threw before its final wait; an unrecorded event is complete).
    for (size_t i = 0; i < chunks; ++i) {
      const size_t off = i * kStaging, n = std::min(kStaging, bytes - off);
      check(cudaEventSynchronize(s.stagingDone[i % 2]), "cudaEventSynchronize", dev);
      std::memcpy(s.staging[i % 2], src + off, n);
      check(cudaMemcpyAsync(dst + off, s.staging[i % 2], n, cudaMemcpyHostToDevice, st),
            "cudaMemcpyAsync (host to device)", dev);
      check(cudaEventRecord(s.stagingDone[i % 2], st), "cudaEventRecord", dev);
    }
  }
  syncState(s);
}

// ---------------------------------------------------------------- the plugin's table
int apiDeviceCount() {
  return devices().count;
}
const char* apiUnavailableReason() {
  return devices().reason.c_str();
}
#if KEEL_CUDA_SIM
// On the CUDA simulator with KEEL_CUDA_SIM_GUARD=1: one cudaMalloc per buffer, which the simulator
// then places against a guard page (Note [CUDA simulator]), so a kernel that reads or writes past
// a buffer's end faults at once instead of touching its neighbour in a shared segment.
class GuardedAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::concat("cuda-guarded: out of memory allocating ", bytes, " bytes"));
    }
    allocated_ += bytes;
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    cudaFree(p);
    allocated_ -= bytes;
  }
  std::string name() const override { return "cuda-guarded"; }
  size_t allocatedBytes() const override { return allocated_; }
  size_t reservedBytes() const override { return allocated_; }

 private:
  std::atomic<size_t> allocated_{0};
};
#endif

Allocator* apiAllocator(int device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lk(g_mu);
#if KEEL_CUDA_SIM
  // Careful mode takes precedence over --alloc and KEEL_ALLOCATOR.
  if (const char* g = std::getenv("KEEL_CUDA_SIM_GUARD");
      !s.allocator && g && std::string(g) == "1")
    s.allocator = std::make_unique<GuardedAllocator>();
#endif
  if (!s.allocator) {
    // Note [cuda allocators]: the device VMM allocator by default; where the run asks for the
    // caching allocator (--alloc caching, the config's "allocator", KEEL_ALLOCATOR), the same
    // caching allocator as the host's over cudaMalloc'd segments, so the two compare on the
    // device as on the host. cudaFree waits for the device, so releasing a segment never races a
    // kernel still using it. Chosen once per device, when its first buffer is allocated.
    if (defaultAllocatorKind() == AllocatorKind::Caching) {
      CachingAllocatorOptions o;
      o.name = "cuda-caching";
      o.device = Device(Backend::Cuda, device);
      // On `device`, the calling thread's current device restored after (t_current stays true).
      auto onDevice = [device](auto&& f) {
        int prev = -1;
        cudaGetDevice(&prev);
        if (prev != device) cudaSetDevice(device);
        f();
        if (prev >= 0 && prev != device) cudaSetDevice(prev);
      };
      o.mapSegment = [onDevice](size_t bytes) -> void* {
        void* p = nullptr;
        onDevice([&] {
          if (cudaMalloc(&p, bytes) != cudaSuccess) {
            cudaGetLastError();  // out of memory: the allocator's own error follows
            p = nullptr;
          }
        });
        return p;
      };
      o.unmapSegment = [onDevice](void* p, size_t) { onDevice([&] { cudaFree(p); }); };
      s.allocator = std::make_unique<CachingAllocator>(std::move(o));
    } else {
      CudaVmmAllocatorOptions o;
      o.device = device;
      s.allocator = std::make_unique<CudaVmmAllocator>(o);
    }
  }
  if (device < kMaxDevices) g_allocatorOf[size_t(device)].store(s.allocator.get());
  return s.allocator.get();
}
void apiSynchronize(int device) {
  syncState(state(device));
}

}  // namespace

void check(cudaError_t e, const char* what, int device) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clears a sticky-free error so the next call starts clean
  std::string extra;
  if (e == cudaErrorMemoryAllocation && device >= 0 && device < kMaxDevices)
    if (const Allocator* a = g_allocatorOf[size_t(device)].load())
      extra = "; " + memorySummary(a->stats());
  throw Error(detail::concat("CUDA error in ", what, " on cuda:", device, ": ",
                             cudaGetErrorString(e), " (", int(e), ")", extra));
}

void checkBlas(cublasStatus_t s, const char* what, int device) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw Error(detail::concat("cuBLAS error in ", what, " on cuda:", device, ": ",
                             cublasGetStatusString(s), " (", int(s), ")"));
}

DeviceCtx& deviceCtx(int device) {
  return state(device).ctx;
}

namespace {
const Tensor* cudaTensorOf(const KernelCtx& c) {
  for (const Tensor& t : c.outputs)
    if (t.defined() && !t.device().isHost()) return &t;
  for (const Tensor& t : c.inputs)
    if (t.defined() && !t.device().isHost()) return &t;
  return nullptr;
}
}  // namespace

DeviceCtx& deviceCtx(const KernelCtx& c) {
  const Tensor* t = cudaTensorOf(c);
  KEEL_CHECK(t, "op '", c.op.name, "': the cuda kernel was given no cuda tensor");
  DeviceState& s = state(t->device().index);
  s.lastOp.store(&c.op, std::memory_order_relaxed);
  return s.ctx;
}

void noteOp(const KernelCtx& c) {
  if (const Tensor* t = cudaTensorOf(c))
    state(t->device().index).lastOp.store(&c.op, std::memory_order_relaxed);
}

void checkLaunch(const KernelCtx& c, const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return;
  std::string shapes;
  for (const Tensor& t : c.inputs)
    shapes += (shapes.empty() ? "" : ", ") + (t.defined() ? shapeStr(t.shape()) : "-");
  const Tensor* t = cudaTensorOf(c);
  throw Error(detail::concat("op '", c.op.name, "' on ", t ? t->device().name() : "cuda",
                             ": launching ", kernel, " failed: ", cudaGetErrorString(e),
                             " (inputs ", shapes, ")"));
}

void synchronize(int device) {
  syncState(state(device));
}

void copyBytes(int device, void* dst, bool dstOnDevice, const void* src, bool srcOnDevice,
               size_t bytes) {
  copyStaged(state(device), static_cast<char*>(dst), dstOnDevice, static_cast<const char*>(src),
             srcOnDevice, bytes);
}

bool allowTf32() {
  static const bool on = envFlag("KEEL_CUDA_TF32");
  return on;
}
bool nondeterministic() {
  static const bool on = envFlag("KEEL_CUDA_NONDETERMINISTIC");
  return on;
}

std::string deviceParams(const KernelCtx& c) {
  const Tensor* t = cudaTensorOf(c);
  if (!t) return "cuda";
  const DeviceCtx& d = state(t->device().index).ctx;
  return detail::concat(d.name, ", sm_", d.major, d.minor, ", ", d.smCount, " SMs");
}

}  // namespace keel::cuda

extern "C" __attribute__((visibility("default"))) const keel::detail::CudaApi* keelCudaApi() {
  static const keel::detail::CudaApi api = [] {
    keel::detail::CudaApi a;
    a.deviceCount = keel::cuda::apiDeviceCount;
    a.unavailableReason = keel::cuda::apiUnavailableReason;
    a.registerKernels = keel::cuda::registerKernels;
    a.allocator = keel::cuda::apiAllocator;
    a.copy = keel::cuda::copyBytes;
    a.synchronize = keel::cuda::apiSynchronize;
    return a;
  }();
  return &api;
}
