// The VMM allocator on Linux CPU: one PROT_NONE reservation and physical chunks from a memfd,
// driven by the shared VMM bookkeeping (alloc/vmm_core.h: best fit, remap plan, compaction).
// Invariant: a slot maps either PROT_NONE anonymous memory or one chunk-sized range of the memfd.
// See Note [VMM remap] and Note [VMM compaction] in vmm_core.cpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "alloc/vmm_core.h"
#include "keel/base/text.h"

namespace keel {

// Note [CPU VMM]: the address range is reserved with mmap(PROT_NONE, MAP_NORESERVE). Chunk i is
// bytes [i·chunk, (i+1)·chunk) of a memfd ftruncate'd to the reservation size (sparse), so
// creating a chunk costs nothing. Mapping is mmap(MAP_FIXED|MAP_SHARED) of that range; unmapping
// maps PROT_NONE anonymous memory over the slot (munmap would give the addresses away) and keeps
// the chunk's bytes in the memfd; releasing punches a hole (fallocate PUNCH_HOLE).
namespace {

// A soft resource limit, or 0 when there is none.
uint64_t softLimit(int resource) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return uint64_t(r.rlim_cur);
}

}  // namespace

struct VmmAllocator::Impl final : alloc::VmmChunkOps {
  int fd = -1;
  uintptr_t base = 0;
  size_t reserve = 0, chunk = 0;
  std::unique_ptr<alloc::VmmCore> core;

  bool create(int64_t) override { return true; }
  void map(uintptr_t addr, int64_t phys, size_t n) override {
    void* p = mmap(reinterpret_cast<void*>(addr), n * chunk, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, off_t(phys) * off_t(chunk));
    KEEL_CHECK(p != MAP_FAILED, "vmm allocator: mapping a chunk failed: ", std::strerror(errno));
  }
  void unmap(uintptr_t addr) override {
    mmap(reinterpret_cast<void*>(addr), chunk, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  }
  void release(int64_t phys) override {
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(phys) * off_t(chunk),
              off_t(chunk));
  }
  void copy(uintptr_t to, uintptr_t from, size_t bytes) override {
    std::memcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), bytes);
  }
};

VmmAllocator::VmmAllocator(VmmAllocatorOptions o) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  long page = sysconf(_SC_PAGESIZE);
  KEEL_CHECK(o.chunk > 0 && o.chunk % size_t(page) == 0 && o.round > 0 && o.round <= o.chunk,
             "vmm allocator: the chunk size must be a multiple of the page size");
  o.reserve = alloc::roundUp(std::max(o.reserve, o.chunk), o.chunk);
  m.reserve = o.reserve;
  m.chunk = o.chunk;
  // The memfd is a file: a file-size limit smaller than the reservation refuses it (and would
  // raise SIGXFSZ in ftruncate), so it is checked first. See Note [VMM fallback] (select.cpp).
  if (const uint64_t fsize = softLimit(RLIMIT_FSIZE); fsize != 0 && fsize < m.reserve)
    throw Error(detail::concat("vmm allocator: its memfd cannot grow to ", formatBytes(m.reserve),
                               " under the file-size limit (ulimit -f) of ", formatBytes(fsize)));
  m.fd = memfd_create("keel-vmm", MFD_CLOEXEC);
  KEEL_CHECK(m.fd >= 0, "vmm allocator: memfd_create failed: ", std::strerror(errno));
  if (ftruncate(m.fd, off_t(m.reserve)) != 0) {
    int e = errno;
    close(m.fd);
    throw Error(detail::concat("vmm allocator: ftruncate failed: ", std::strerror(e)));
  }
  void* p = mmap(nullptr, m.reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(m.fd);
    if (const uint64_t as = softLimit(RLIMIT_AS); as != 0)
      throw Error(detail::concat("vmm allocator: cannot reserve ", formatBytes(m.reserve),
                                 " of addresses under the address-space limit (ulimit -v) of ",
                                 formatBytes(as)));
    throw Error(detail::concat("vmm allocator: reserving ", m.reserve,
                               " bytes of addresses failed: ", std::strerror(e)));
  }
  m.base = reinterpret_cast<uintptr_t>(p);
  m.core = std::make_unique<alloc::VmmCore>(o, m.base, m);
}

VmmAllocator::~VmmAllocator() {
  munmap(reinterpret_cast<void*>(impl_->base), impl_->reserve);
  close(impl_->fd);
}

void* VmmAllocator::allocate(size_t bytes) {
  return impl_->core->allocate(bytes);
}
void VmmAllocator::deallocate(void* ptr, size_t) {
  impl_->core->deallocate(ptr);
}
std::string VmmAllocator::name() const {
  return impl_->core->name();
}
size_t VmmAllocator::allocatedBytes() const {
  return impl_->core->allocatedBytes();
}
size_t VmmAllocator::reservedBytes() const {
  return impl_->core->reservedBytes();
}
AllocatorStats VmmAllocator::stats() const {
  return impl_->core->stats();
}
void VmmAllocator::emptyCache() {
  impl_->core->emptyCache();
}
void VmmAllocator::resetPeaks() {
  impl_->core->resetPeaks();
}
void VmmAllocator::setLimit(size_t bytes) {
  impl_->core->setLimit(bytes);
}
MemorySnapshot VmmAllocator::snapshot() const {
  return impl_->core->snapshot();
}
uintptr_t VmmAllocator::base() const {
  return impl_->base;
}

}  // namespace keel
