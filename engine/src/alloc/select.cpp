// Allocator statistics helpers and the choice of the host allocator (KEEL_ALLOCATOR).
// Invariant: the default kind is read from the environment once; instances are never destroyed,
// so buffers served by a previously selected allocator stay valid after a switch.
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>

#include "keel/allocator.h"
#include "keel/base/text.h"
#include "keel/base/vocabulary.h"
#include "keel/error.h"

namespace keel {

AllocatorStats Allocator::stats() const {
  AllocatorStats s;
  s.allocated = s.active = allocatedBytes();
  s.reserved = reservedBytes();
  s.totalFree = s.reserved > s.allocated ? s.reserved - s.allocated : 0;
  return s;
}

MemorySnapshot Allocator::snapshot() const {
  MemorySnapshot s;
  s.allocator = name();
  s.stats = stats();
  return s;
}

constexpr std::array<std::string_view, 3> kBlockStateNames = {"allocated", "free", "unmapped"};
static_assert(kBlockStateNames.size() == size_t(BlockState::Unmapped) + 1);
std::string_view blockStateName(BlockState s) {
  return detail::enumName(kBlockStateNames, s);
}

double AllocatorStats::peakFragmentation() const {
  return peakReserved == 0 ? 0.0 : 1.0 - double(peakAllocated) / double(peakReserved);
}

double AllocatorStats::fragmentation() const {
  return reserved == 0 ? 0.0 : double(reserved - allocated) / double(reserved);
}

double AllocatorStats::scatter() const {
  return totalFree == 0 ? 0.0 : 1.0 - double(largestFree) / double(totalFree);
}

std::string memorySummary(const AllocatorStats& s) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "allocated " << formatMiB(s.allocated) << " (" << s.allocated << " bytes), reserved "
     << formatMiB(s.reserved) << " (" << s.reserved << " bytes), largest free block "
     << formatMiB(s.largestFree) << " (" << s.largestFree << " bytes), cached free "
     << 100.0 * s.fragmentation() << "% of reserved, fragmentation " << 100.0 * s.scatter() << "%, "
     << s.blocks << " live blocks in " << s.segments << " segments/chunks";
  return os.str();
}

namespace {
std::atomic<int> g_kind{-1};  // -1: not read from the environment yet

size_t envLimit() {
  const char* v = std::getenv("KEEL_MEMORY_LIMIT");
  if (!v || !*v) return 0;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  KEEL_CHECK(end != v && x >= 0, "KEEL_MEMORY_LIMIT='", v, "' is not a byte count");
  switch (*end) {
    case 'k':
    case 'K':
      x *= 1024.0;
      ++end;
      break;
    case 'm':
    case 'M':
      x *= 1024.0 * 1024.0;
      ++end;
      break;
    case 'g':
    case 'G':
      x *= 1024.0 * 1024.0 * 1024.0;
      ++end;
      break;
    default:
      break;
  }
  // "16M", "16MB" and "16MiB" are the same limit; "16Mx" or "16 M" is a mistake, not 16 MiB.
  const std::string_view rest(end);
  KEEL_CHECK(rest.empty() || rest == "B" || rest == "iB" || rest == "b", "KEEL_MEMORY_LIMIT='", v,
             "' is not a byte count (bytes with an optional K, M or G suffix, e.g. 512M)");
  return size_t(x);  // 0: no limit
}
}  // namespace

// Note [Default allocator]: host memory comes from the VMM allocator unless KEEL_ALLOCATOR says
// otherwise. Sanitizer builds default to the host allocator (aligned_alloc): AddressSanitizer
// only sees overflows of blocks it allocated itself, and the sanitizer suite exists to find them.
AllocatorKind environmentAllocatorKind() {
  // Read once: the environment is the process's, and a bad value fails the same way every time.
  static const std::optional<AllocatorKind> kind = [] {
  // See Note [Default allocator].
#if defined(__SANITIZE_ADDRESS__)  // set by -fsanitize=address
    std::optional<AllocatorKind> k = AllocatorKind::Host;
#else
    std::optional<AllocatorKind> k = AllocatorKind::Vmm;
#endif
    if (const char* v = std::getenv("KEEL_ALLOCATOR"); v && *v) k = parseAllocatorKind(v);
    return k;
  }();
  if (!kind) {
    KEEL_CHECK(false, "KEEL_ALLOCATOR='", std::getenv("KEEL_ALLOCATOR"),
               "' is not an allocator: use host, caching or vmm");
  }
  return *kind;
}

AllocatorKind resolveAllocatorKind(std::string_view flag, std::string_view configValue,
                                   std::string_view what) {
  const std::string_view kind = flag.empty() ? configValue : flag;
  if (kind.empty()) return environmentAllocatorKind();
  auto k = parseAllocatorKind(kind);
  KEEL_CHECK(k, what, ": unknown allocator '", kind, "' (expected host, caching or vmm)");
  return *k;
}

// Note [VMM fallback]: the VMM allocator reserves 64 GiB of addresses and backs them with a memfd
// of that size, so an address-space limit (ulimit -v) or a file-size limit (ulimit -f: the memfd
// is a file) smaller than that refuses it, and every run failed ("vmm allocator: ftruncate
// failed: File too large"). A limit the user set for other reasons should not stop training, so
// a run that would use the VMM allocator (by default, or asked for) gets the caching allocator
// instead, with a one-line warning saying why; the recording names the allocator that ran.
// The VMM allocator is tried once per process (creating it is what would fail at the first
// allocation anyway).
AllocatorKind usableAllocatorKind(AllocatorKind k, std::string* why) {
  if (why) why->clear();
  // A limit the host allocator cannot keep is said, not silently ignored.
  if (k == AllocatorKind::Host && why && envLimit() > 0)
    *why = std::string("KEEL_MEMORY_LIMIT=") + std::getenv("KEEL_MEMORY_LIMIT") +
           " does not limit the host allocator (only caching and vmm have a limit)";
  if (k != AllocatorKind::Vmm) return k;
  static const std::string failure = [] {
    envLimit();  // a bad KEEL_MEMORY_LIMIT is the user's error, not a reason to fall back
    try {
      vmmAllocator();
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  }();
  if (failure.empty()) return k;
  if (why) *why = failure + ": using the caching allocator";
  return AllocatorKind::Caching;
}

AllocatorKind defaultAllocatorKind() {
  int k = g_kind.load(std::memory_order_acquire);
  if (k >= 0) return AllocatorKind(k);
  int expected = -1;
  g_kind.compare_exchange_strong(expected, int(environmentAllocatorKind()),
                                 std::memory_order_acq_rel);
  return AllocatorKind(g_kind.load(std::memory_order_acquire));
}

void setDefaultAllocatorKind(AllocatorKind k) {
  g_kind.store(int(k), std::memory_order_release);
}

// The process's one A, limited by the environment's limit (envLimit); never destroyed.
template <typename A, typename Options>
A& processAllocator() {
  static auto* a = [] {
    Options o;
    o.limit = envLimit();
    return new A(o);
  }();
  return *a;
}

CachingAllocator& cachingAllocator() {
  return processAllocator<CachingAllocator, CachingAllocatorOptions>();
}

VmmAllocator& vmmAllocator() {
  return processAllocator<VmmAllocator, VmmAllocatorOptions>();
}

Allocator& allocatorOfKind(AllocatorKind k) {
  switch (k) {
    case AllocatorKind::Caching:
      return cachingAllocator();
    case AllocatorKind::Vmm:
      return vmmAllocator();
    case AllocatorKind::Host:
      break;
  }
  return hostAllocator();
}

}  // namespace keel
