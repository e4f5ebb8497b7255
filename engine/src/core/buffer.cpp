// Buffers and the default host allocator (64-byte aligned malloc with byte accounting).
// Allocators report each allocation and free to observers; see observer.h.
#include "keel/buffer.h"

#include "keel/allocator.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "cuda_backend.h"
#include "keel/error.h"
#include "keel/observer.h"

namespace keel {
namespace {

// See Note [Reading buffers off the engine thread].
std::mutex& bufferMoveMutex() {
  static std::mutex m;
  return m;
}

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {
      if (detail::hasObservers()) {
        MemEvent e;
        e.kind = MemEventKind::Oom;
        e.bytes = bytes;
        e.allocatedAfter = e.reservedAfter = allocated_.load();
        detail::notifyMemory(e);
      }
      throw Error(detail::concat("out of host memory allocating ", bytes, " bytes"));
    }
    size_t a = allocated_.fetch_add(rounded) + rounded;
    if (detail::hasObservers()) {
      MemEvent e;
      e.kind = MemEventKind::Alloc;
      e.address = reinterpret_cast<uint64_t>(p);
      e.bytes = rounded;
      e.allocatedAfter = e.reservedAfter = a;
      detail::notifyMemory(e);
    }
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) & ~size_t(63);
    uint64_t address = reinterpret_cast<uint64_t>(p);
    size_t a = allocated_.fetch_sub(rounded) - rounded;
    if (detail::hasObservers()) {
      MemEvent e;
      e.kind = MemEventKind::Free;
      e.address = address;
      e.bytes = rounded;
      e.allocatedAfter = e.reservedAfter = a;
      detail::notifyMemory(e);
    }
    std::free(p);  // after the event, so observers never see a reused address first
  }
  std::string name() const override { return "host"; }
  size_t allocatedBytes() const override { return allocated_.load(); }
  size_t reservedBytes() const override { return allocated_.load(); }

 private:
  std::atomic<size_t> allocated_{0};
};

std::mutex g_allocMu;
Allocator* g_allocators[kNumBackends] = {nullptr, nullptr, nullptr};

}  // namespace

Allocator& hostAllocator() {
  static auto* a = new HostAllocator;  // leaked: outlives every buffer
  return *a;
}

Allocator& allocatorFor(Device d) {
  {
    std::lock_guard<std::mutex> lk(g_allocMu);
    Allocator* a = g_allocators[int(d.backend)];
    if (a) return *a;
    if (d.isHost()) return allocatorOfKind(defaultAllocatorKind());
  }
  // Not under g_allocMu: the first call loads the plugin and creates the device's context and
  // allocator (seconds), and nothing there may wait on a host allocation (Note [CUDA backend
  // plugin]).
  return *detail::cudaApiFor(d).allocator(d.index);
}

std::vector<MemorySnapshot> hostAllocatorSnapshots() {
  std::vector<MemorySnapshot> out;
  const Allocator* seen = nullptr;
  for (Backend b : {Backend::Cpu, Backend::CpuRef}) {
    const Allocator& a = allocatorFor(Device(b));
    if (&a == seen) continue;
    seen = &a;
    out.push_back(a.snapshot());
  }
  return out;
}

Allocator* setAllocator(Backend b, Allocator* a) {
  std::lock_guard<std::mutex> lk(g_allocMu);
  Allocator* prev = g_allocators[int(b)];
  g_allocators[int(b)] = a;
  return prev;
}

namespace {
std::atomic<uint64_t> g_nextBufferId{1};

// Tells the allocator (and its events) which Buffer the call is for; restores on exit.
struct OwnerGuard {
  detail::AllocContext& c = detail::allocContext();
  detail::AllocContext saved = c;
  OwnerGuard(uint64_t id, Buffer* b) {
    c.bufferId = id;
    c.buffer = b;
  }
  ~OwnerGuard() { c = saved; }
};
}  // namespace

Buffer::Buffer(size_t bytes, Device device)
    : bytes_(bytes),
      device_(device),
      allocator_(&allocatorFor(device)),
      id_(g_nextBufferId.fetch_add(1, std::memory_order_relaxed)) {
  OwnerGuard g(id_, this);
  data_ = allocator_->allocate(bytes);
}

BufferPin::BufferPin(const Buffer& b) : b_(&b) {
  std::lock_guard<std::mutex> lk(bufferMoveMutex());
  ++b_->pins_;
}
BufferPin::~BufferPin() {
  std::lock_guard<std::mutex> lk(bufferMoveMutex());
  --b_->pins_;
}
detail::BufferMoveLock::BufferMoveLock() {
  bufferMoveMutex().lock();
}
detail::BufferMoveLock::~BufferMoveLock() {
  bufferMoveMutex().unlock();
}

Buffer::~Buffer() {
  // Its memory is about to be reused: an observer still to read it reads it now (Note [Weakly
  // held buffers], capture/src/hash_pool.cpp).
  if (detail::hasObservers()) [[unlikely]]
    detail::notifyBufferWrite(*this);
  OwnerGuard g(id_, nullptr);
  g.c.safePoint = false;
  allocator_->deallocate(data_, bytes_);
}

}  // namespace keel
