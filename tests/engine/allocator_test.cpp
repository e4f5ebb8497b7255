// Tests for the caching and VMM allocators: exact best-fit/split/merge placement and statistics,
// the out-of-memory message, the classic fragmentation case (caching fails, VMM remaps without
// copying), a randomized stress test with data checks after every defragmentation, and the
// engine giving bitwise-identical results (ops and 3 training steps) under host, caching and vmm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "alloc_test_util.h"
#include "keel/allocator.h"
#include "keel/data.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

uintptr_t addr(void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// ---- caching ------------------------------------------------------------------------------

TEST(CachingAllocatorTest, SmallPoolSplitsBestFitsAndMerges) {
  CachingAllocator a;
  void* p0 = a.allocate(1000);  // rounded to 1024, at the segment start
  uintptr_t seg = addr(p0);
  void* p1 = a.allocate(4000);  // 4096
  void* p2 = a.allocate(1);     // 512
  void* p3 = a.allocate(4096);
  void* p4 = a.allocate(512);
  EXPECT_EQ(addr(p1), seg + 1024);
  EXPECT_EQ(addr(p2), seg + 5120);
  EXPECT_EQ(addr(p3), seg + 5632);
  EXPECT_EQ(addr(p4), seg + 9728);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated, 1024u + 4096 + 512 + 4096 + 512);
  EXPECT_EQ(s.active, 1000u + 4000 + 1 + 4096 + 512);
  EXPECT_EQ(s.reserved, 2 * kMiB);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.blocks, 5u);
  EXPECT_EQ(s.freeBlocks, 1u);
  EXPECT_EQ(s.largestFree, 2 * kMiB - 10240);

  // Free 1024 at 0 and 4096 at 5632: a 900-byte request best-fits the 1024 block, not 4096.
  a.deallocate(p0, 1000);
  a.deallocate(p3, 4096);
  EXPECT_EQ(a.stats().freeBlocks, 3u);
  void* q = a.allocate(900);
  EXPECT_EQ(addr(q), seg);
  // A 3000-byte request best-fits the 4096 hole and splits it: 3072 used, 1024 left at 8704.
  void* r = a.allocate(3000);
  EXPECT_EQ(addr(r), seg + 5632);
  void* t = a.allocate(1024);
  EXPECT_EQ(addr(t), seg + 8704);

  // Freeing neighbours merges them: p1 (4096) + p2 (512) + r (3072) + t (1024) become 8704 bytes
  // at 1024, which then serves an 8704-byte request exactly.
  a.deallocate(p1, 4000);
  a.deallocate(r, 3000);
  a.deallocate(p2, 1);
  a.deallocate(t, 1024);
  s = a.stats();
  EXPECT_EQ(s.freeBlocks, 2u);
  EXPECT_EQ(s.allocated, 1024u + 512);
  void* big = a.allocate(8704);
  EXPECT_EQ(addr(big), seg + 1024);
  a.deallocate(big, 8704);
  a.deallocate(q, 900);
  a.deallocate(p4, 512);
  s = a.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.freeBlocks, 1u);
  EXPECT_EQ(s.largestFree, 2 * kMiB);
  EXPECT_EQ(s.peakAllocated, 1024u + 4096 + 512 + 4096 + 512);
  EXPECT_DOUBLE_EQ(s.fragmentation(), 1.0);
  EXPECT_DOUBLE_EQ(s.scatter(), 0.0);
  a.emptyCache();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().segments, 0u);
}

TEST(CachingAllocatorTest, LargePoolSegmentsAndStats) {
  CachingAllocator a;
  void* m = a.allocate(3 * kMiB);  // shares a 20 MiB segment
  void* n = a.allocate(5 * kMiB);
  EXPECT_EQ(addr(n), addr(m) + 3 * kMiB);
  void* h = a.allocate(12 * kMiB + 7);  // misses the 12 MiB hole: own 14 MiB segment
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved, 34 * kMiB);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.allocated, 8 * kMiB + 12 * kMiB + 512);
  EXPECT_EQ(s.freeBlocks, 2u);  // 12 MiB in the first segment, 2 MiB - 512 in the second
  EXPECT_EQ(s.largestFree, 12 * kMiB);
  EXPECT_EQ(s.totalFree, 14 * kMiB - 512);
  EXPECT_DOUBLE_EQ(s.fragmentation(), double(s.totalFree) / double(34 * kMiB));
  EXPECT_DOUBLE_EQ(s.scatter(), 1.0 - double(12 * kMiB) / double(s.totalFree));
  a.deallocate(h, 12 * kMiB + 7);
  a.deallocate(m, 3 * kMiB);
  a.deallocate(n, 5 * kMiB);
  a.emptyCache();
  EXPECT_EQ(a.stats().reserved, 0u);
}

TEST(CachingAllocatorTest, OutOfMemoryMessageHasTheSummary) {
  CachingAllocatorOptions o;
  o.limit = 20 * kMiB;
  CachingAllocator a(o);
  void* p = a.allocate(4 * kMiB);
  try {
    a.allocate(16 * kMiB + 1);
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory in the caching allocator"), std::string::npos) << m;
    EXPECT_NE(m.find("requested 16777217 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("limit of 20971520 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("allocated 4.0 MiB (4194304 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved 20.0 MiB (20971520 bytes)"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block 16.0 MiB (16777216 bytes)"), std::string::npos) << m;
    // The words keel memory stats uses for the same figures.
    EXPECT_NE(m.find("cached free 80.0% of reserved, fragmentation 0.0%"), std::string::npos) << m;
    EXPECT_NE(m.find("a large-pool request (over 1.00 MiB; 16777728 bytes once rounded): the "
                     "largest free block of that pool is 16777216 bytes;"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(a.stats().ooms, 1u);
  a.deallocate(p, 4 * kMiB);
}

// A small request refused while a large free block sits in the other pool: the message says the
// large pool never serves it, or "largest free block 19 MiB" reads as a contradiction.
TEST(CachingAllocatorTest, OutOfMemoryMessageNamesThePoolThatRanOut) {
  CachingAllocatorOptions o;
  o.limit = 20 * kMiB;
  CachingAllocator a(o);
  void* p = a.allocate(2 * kMiB);  // from a 20 MiB large-pool segment: 18 MiB of it stay free
  try {
    a.allocate(400 * 1024);
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("requested 409600 bytes with a limit of 20971520 bytes; a small-pool request "
                     "(up to 1.00 MiB; 409600 bytes once rounded): the largest free block of that "
                     "pool is 0 bytes, and the large pool's free blocks (up to 18874368 bytes) "
                     "never serve it; "),
              std::string::npos)
        << m;
  }
  a.deallocate(p, 2 * kMiB);
}

// The segment source a device's caching allocator uses (Note [cuda allocators]): every segment
// comes from mapSegment and goes back through unmapSegment with its size, a null segment is out of
// memory (after releasing what is cached), and events carry the allocator's device.
TEST(CachingAllocatorTest, SegmentsComeFromTheGivenSourceAndEventsNameItsDevice) {
  std::map<void*, size_t> mapped;
  size_t budget = 6 * kMiB;  // what the "device" has
  CachingAllocatorOptions o;
  o.name = "test-device-caching";
  o.device = Device(Backend::Cuda, 3);
  o.mapSegment = [&](size_t bytes) -> void* {
    if (bytes > budget) return nullptr;
    budget -= bytes;
    void* p = std::malloc(bytes);
    mapped[p] = bytes;
    return p;
  };
  o.unmapSegment = [&](void* p, size_t bytes) {
    ASSERT_EQ(mapped.at(p), bytes);
    mapped.erase(p);
    budget += bytes;
    std::free(p);
  };
  test::MemEventRecorder rec;
  {
    CachingAllocator a(o);
    void* x = a.allocate(1000);  // a 2 MiB small-pool segment
    ASSERT_EQ(mapped.size(), 1u);
    EXPECT_EQ(mapped.begin()->second, 2 * kMiB);
    try {
      a.allocate(3 * kMiB);  // wants a 20 MiB large-pool segment: more than the 4 MiB left
      FAIL() << "expected keel::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of memory in the test-device-caching allocator"),
                std::string::npos)
          << e.what();
    }
    a.deallocate(x, 1000);
    a.emptyCache();
    EXPECT_TRUE(mapped.empty());
    EXPECT_EQ(budget, 6 * kMiB);
  }
  rec.stop();
  int reserves = 0, releases = 0;
  for (const MemEvent& e : rec.events()) {
    EXPECT_EQ(e.device, Device(Backend::Cuda, 3));
    reserves += e.kind == MemEventKind::Reserve;
    releases += e.kind == MemEventKind::Release;
  }
  EXPECT_EQ(reserves, 1);
  EXPECT_EQ(releases, 1);
}

// ---- the classic case -----------------------------------------------------------------------

void fill(void* p, size_t n, uint8_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; i += 64) b[i] = uint8_t(seed + i / 64 * 31);
  std::memset(b + n - 1, seed, 1);
}
bool intact(const void* p, size_t n, uint8_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; i += 64)
    if (b[i] != uint8_t(seed + i / 64 * 31) && !(i == n - 1)) return false;
  return b[n - 1] == seed;
}

TEST(VmmAllocatorTest, ClassicCaseCachingFailsVmmRemapsWithoutCopying) {
  const size_t kBlock = 4 * kMiB, kLimit = 20 * kMiB;
  CachingAllocatorOptions co;
  co.limit = kLimit;
  CachingAllocator caching(co);
  VmmAllocatorOptions vo;
  vo.limit = kLimit;
  vo.reserve = size_t(1) << 30;
  VmmAllocator vmm(vo);
  for (Allocator* a : std::vector<Allocator*>{&caching, &vmm}) {
    SCOPED_TRACE(a->name());
    std::vector<void*> p(5);
    for (int i = 0; i < 5; ++i) {
      p[i] = a->allocate(kBlock);
      fill(p[i], kBlock, uint8_t(i + 1));
    }
    EXPECT_EQ(a->reservedBytes(), kLimit);
    a->deallocate(p[1], kBlock);
    a->deallocate(p[3], kBlock);
    if (a == &caching) {
      EXPECT_THROW(a->allocate(2 * kBlock), Error);
      for (int i : {0, 2, 4}) a->deallocate(p[i], kBlock);
      continue;
    }
    void* big = a->allocate(2 * kBlock);
    test::expectTwoHolesRemapped(vmm.stats(), kLimit, kBlock, big, p[4]);
    std::memset(big, 0xab, 2 * kBlock);
    for (int i : {0, 2, 4}) EXPECT_TRUE(intact(p[i], kBlock, uint8_t(i + 1))) << i;
    a->deallocate(big, 2 * kBlock);
    for (int i : {0, 2, 4}) a->deallocate(p[i], kBlock);
    EXPECT_EQ(vmm.stats().allocated, 0u);
    vmm.emptyCache();
    EXPECT_EQ(vmm.stats().reserved, 0u);
    EXPECT_EQ(vmm.stats().chunksReleased, 10u);
  }
}

TEST(VmmAllocatorTest, BestFitSplitMergeAndOutOfMemory) {
  VmmAllocatorOptions o;
  o.reserve = 64 * kMiB;
  o.limit = 4 * kMiB;
  VmmAllocator a(o);
  void* p0 = a.allocate(1000);
  EXPECT_EQ(addr(p0), a.base());
  void* p1 = a.allocate(3 * kMiB);  // spans chunks 0 and 1
  EXPECT_EQ(addr(p1), a.base() + 1024);
  void* p2 = a.allocate(512);
  EXPECT_EQ(addr(p2), a.base() + 1024 + 3 * kMiB);
  a.deallocate(p0, 1000);
  EXPECT_EQ(addr(a.allocate(512)), a.base());  // best fit: the 1024 hole, not the tail
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved, 4 * kMiB);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.blocks, 3u);
  EXPECT_EQ(s.freeBlocks, 2u);
  EXPECT_THROW(
      {
        try {
          a.allocate(2 * kMiB);
        } catch (const Error& e) {
          std::string m = e.what();
          EXPECT_NE(m.find("out of memory in the vmm allocator: requested 2097152 bytes"),
                    std::string::npos)
              << m;
          EXPECT_NE(m.find("largest free block"), std::string::npos) << m;
          EXPECT_NE(m.find("fragmentation"), std::string::npos) << m;
          throw;
        }
      },
      Error);
  a.deallocate(p1, 3 * kMiB);  // merges with the 512-byte remainder and the tail
  s = a.stats();
  EXPECT_EQ(s.freeBlocks, 2u);
  EXPECT_EQ(s.allocated, 1024u);
}

TEST(VmmAllocatorTest, RandomizedStressKeepsDataThroughDefragmentation) {
  VmmAllocatorOptions o;
  o.reserve = size_t(4) << 30;
  o.limit = 48 * kMiB;
  VmmAllocator a(o);
  test::StressOptions so;
  so.limit = o.limit;
  test::StressResult r;
  test::runAllocStress(a, so, fill, intact, r);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(r.bytesCopied, 0u);  // raw blocks are never moved: remapping only
  EXPECT_GE(r.defrags, 5u) << "the stress test should exercise remapping";
  RecordProperty("defrags", int(r.defrags));
  RecordProperty("ooms", int(r.ooms));
  std::printf("stress: %llu defragmentations checked, %llu refused requests\n",
              (unsigned long long)r.checks, (unsigned long long)r.ooms);
}

// ---- selection and the engine ---------------------------------------------------------------

TEST(AllocatorSelectionTest, ParsesKindsAndDefaultsToVmm) {
  EXPECT_EQ(parseAllocatorKind("vmm"), AllocatorKind::Vmm);
  EXPECT_EQ(parseAllocatorKind("caching"), AllocatorKind::Caching);
  EXPECT_EQ(parseAllocatorKind("host"), AllocatorKind::Host);
  EXPECT_FALSE(parseAllocatorKind("cuda"));
  if (!std::getenv("KEEL_ALLOCATOR")) {
#if defined(__SANITIZE_ADDRESS__)  // sanitizer builds keep aligned_alloc so ASan sees every block
    EXPECT_EQ(defaultAllocatorKind(), AllocatorKind::Host);
#else
    EXPECT_EQ(defaultAllocatorKind(), AllocatorKind::Vmm);
#endif
  }
  EXPECT_EQ(allocatorFor(Device(Backend::Cpu)).name(), allocatorKindName(defaultAllocatorKind()));
}

// Sets the default host allocator for a scope.
class KindScope {
 public:
  explicit KindScope(AllocatorKind k) : prev_(defaultAllocatorKind()) {
    setDefaultAllocatorKind(k);
  }
  ~KindScope() { setDefaultAllocatorKind(prev_); }

 private:
  AllocatorKind prev_;
};

std::vector<uint8_t> bytesOf(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

std::vector<std::vector<uint8_t>> runOps(Device d) {
  using namespace ops;
  Tensor x = test::randNormal({64, 96}, DType::Float32, d, 1);
  Tensor w = test::randNormal({96, 128}, DType::Float32, d, 2);
  Tensor y = matmul(x, w);
  Tensor z = softmax(gelu(addScalar(y, 0.5)), -1);
  Tensor big = test::randNormal({1024, 1024}, DType::Float32, d, 3);  // 4 MiB: large pool
  Tensor s = sum(mul(big, big), {1});
  return {bytesOf(y), bytesOf(z), bytesOf(s)};
}

TEST(AllocatorEngineTest, OpsGiveIdenticalBytesUnderEveryAllocator) {
  for (Device d : {test::kCpu, test::kCpuRef}) {
    std::vector<std::vector<uint8_t>> ref;
    {
      KindScope k(AllocatorKind::Host);
      ref = runOps(d);
    }
    for (AllocatorKind kind : {AllocatorKind::Caching, AllocatorKind::Vmm}) {
      KindScope k(kind);
      Allocator& a = allocatorOfKind(kind);
      uint64_t before = a.stats().allocs;
      EXPECT_EQ(runOps(d), ref) << allocatorKindName(kind) << " on " << d.name();
      EXPECT_GT(a.stats().allocs, before) << "the engine did not use " << a.name();
    }
  }
  // Explicit installation through setAllocator also works and is undone.
  // Never destroyed (a buffer could outlive the test body); reachable from a static, so not a leak.
  static CachingAllocator* own = new CachingAllocator;
  Allocator* prev = setAllocator(Backend::Cpu, own);
  EXPECT_EQ(runOps(test::kCpu), [] {
    KindScope k(AllocatorKind::Host);
    Allocator* inner = setAllocator(Backend::Cpu, nullptr);
    auto r = runOps(test::kCpu);
    setAllocator(Backend::Cpu, inner);
    return r;
  }());
  EXPECT_GT(own->stats().allocs, 0u);
  setAllocator(Backend::Cpu, prev);
}

// The shipped gpt-mini and moe-mini configs (MoE: tensor sizes change with the routing every
// step), two steps each, give bitwise the same losses under every allocator.
TEST(AllocatorEngineTest, TrainingLossesAreBitwiseEqualUnderEveryAllocator) {
  auto corpus = std::make_shared<const data::TextDataset>(data::TextDataset::defaultCorpus());
  for (const char* name : {"gpt-mini", "moe-mini"}) {
    SCOPED_TRACE(name);
    GptConfig cfg =
        loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/configs/" + std::string(name) + ".json");
    std::map<std::string, std::vector<double>> losses;
    for (AllocatorKind kind : {AllocatorKind::Host, AllocatorKind::Caching, AllocatorKind::Vmm}) {
      KindScope k(kind);
      Trainer tr(cfg, test::kCpu, 5, corpus, 2);
      for (auto& s : tr.run(2)) losses[std::string(allocatorKindName(kind))].push_back(s.loss);
    }
    ASSERT_EQ(losses["host"].size(), 2u);
    for (const char* k : {"caching", "vmm"}) {
      ASSERT_EQ(losses[k].size(), 2u);
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(std::memcmp(&losses[k][i], &losses["host"][i], sizeof(double)), 0)
            << k << " step " << i + 1 << ": " << losses[k][i] << " vs " << losses["host"][i];
    }
  }
}

}  // namespace
}  // namespace keel
