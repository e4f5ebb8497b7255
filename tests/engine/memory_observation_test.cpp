// Tests for the memory observation API and VMM compaction: snapshots (segments, blocks, owners,
// tags, block ids), tracking scopes (counts, peak, what is left alive and by which op), and
// compaction moving live Buffers so a request fits when remapping cannot help, with every tensor
// still reading its data.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "keel/allocator.h"
#include "keel/ops.h"
#include "test_util.h"

namespace keel {
namespace {
using namespace ops;

constexpr size_t kMiB = size_t(1) << 20;

// Installs `a` for the cpu backend for the scope's lifetime.
struct UseAllocator {
  Allocator* prev;
  explicit UseAllocator(Allocator* a) : prev(setAllocator(Backend::Cpu, a)) {}
  ~UseAllocator() { setAllocator(Backend::Cpu, prev); }
};

// Marks the scope as a compaction safe point (what the dispatcher does around op outputs).
struct SafePoint {
  bool prev = detail::allocContext().safePoint;
  SafePoint() { detail::allocContext().safePoint = true; }
  ~SafePoint() { detail::allocContext().safePoint = prev; }
};

Tensor filled(size_t bytes, float seed) {
  Tensor t = Tensor::empty({int64_t(bytes / 4)}, DType::Float32, test::kCpu);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = seed + float(i % 1000);
  return t;
}

bool holds(const Tensor& t, float seed) {
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] != seed + float(i % 1000)) return false;
  return true;
}

VmmAllocatorOptions smallVmm(size_t limit) {
  VmmAllocatorOptions o;
  o.reserve = 256 * kMiB;
  o.limit = limit;
  return o;
}

TEST(MemorySnapshotTest, VmmBlocksCarryOwnerTagOpAndBlockId) {
  VmmAllocator vmm(smallVmm(0));
  UseAllocator use(&vmm);
  {
    Tensor param;
    {
      MemTagScope tag(MemTag::Parameter);
      param = Tensor::empty({1024}, DType::Float32, test::kCpu);  // 4 KiB
    }
    Tensor a = Tensor::ones({256}, DType::Float32, test::kCpu);
    Tensor b = addScalar(a, 1.0);  // allocated by an op
    MemorySnapshot s = vmm.snapshot();
    EXPECT_EQ(s.allocator, "vmm");
    ASSERT_EQ(s.segments.size(), 1u);
    EXPECT_EQ(s.segments[0].size, 2 * kMiB);
    EXPECT_TRUE(s.segments[0].mapped);
    ASSERT_EQ(s.blocks.size(), 4u);  // param, a, b, the free rest
    uint64_t total = 0;
    for (auto& blk : s.blocks) total += blk.size;
    EXPECT_EQ(total, 2 * kMiB);
    EXPECT_EQ(s.blocks[0].state, BlockState::Allocated);
    EXPECT_EQ(s.blocks[0].address, uint64_t(reinterpret_cast<uintptr_t>(param.data())));
    EXPECT_EQ(s.blocks[0].bufferId, param.buffer()->id());
    EXPECT_EQ(s.blocks[0].tag, MemTag::Parameter);
    EXPECT_EQ(s.blocks[0].size, 4096u);
    EXPECT_EQ(s.blocks[0].requested, 4096u);
    EXPECT_EQ(s.blocks[1].bufferId, a.buffer()->id());
    EXPECT_EQ(s.blocks[1].tag, MemTag::None);
    EXPECT_EQ(s.blocks[2].bufferId, b.buffer()->id());
    EXPECT_GT(s.blocks[2].opSeq, 0u);  // the add_scalar op
    EXPECT_EQ(s.blocks[3].state, BlockState::Free);
    EXPECT_EQ(s.stats.blocks, 3u);
  }
  // Reusing an address bumps the reuse half of the block id.
  Tensor again = Tensor::empty({1024}, DType::Float32, test::kCpu);
  MemorySnapshot s2 = vmm.snapshot();
  ASSERT_FALSE(s2.blocks.empty());
  EXPECT_EQ(s2.blocks[0].address, uint64_t(reinterpret_cast<uintptr_t>(again.data())));
  EXPECT_EQ(s2.blocks[0].reuse, 1u);
  EXPECT_EQ(s2.blocks[0].tag, MemTag::None);
}

TEST(MemorySnapshotTest, VmmShowsUnmappedHolesAndCachingShowsSegments) {
  VmmAllocator vmm(smallVmm(10 * kMiB));
  void* p[4];
  for (auto& x : p) x = vmm.allocate(2 * kMiB);
  vmm.deallocate(p[1], 2 * kMiB);
  void* big = vmm.allocate(4 * kMiB);  // slot 1's chunk and a fresh one: slot 1 is a hole
  MemorySnapshot s = vmm.snapshot();
  ASSERT_EQ(s.segments.size(), 3u);
  EXPECT_TRUE(s.segments[0].mapped);
  EXPECT_FALSE(s.segments[1].mapped);
  EXPECT_EQ(s.segments[1].size, 2 * kMiB);
  EXPECT_TRUE(s.segments[2].mapped);
  int unmapped = 0;
  for (auto& b : s.blocks) unmapped += b.state == BlockState::Unmapped;
  EXPECT_EQ(unmapped, 1);
  vmm.deallocate(big, 4 * kMiB);
  for (int i : {0, 2, 3}) vmm.deallocate(p[i], 2 * kMiB);

  CachingAllocator caching;
  void* q = caching.allocate(1000);
  void* r = caching.allocate(12 * kMiB);
  MemorySnapshot c = caching.snapshot();
  ASSERT_EQ(c.segments.size(), 2u);
  uint64_t sizes = c.segments[0].size + c.segments[1].size;
  EXPECT_EQ(sizes, 2 * kMiB + 12 * kMiB);
  EXPECT_EQ(c.blocks.size(), 3u);  // 1024-byte block + free rest; the 12 MiB block
  caching.deallocate(q, 1000);
  caching.deallocate(r, 12 * kMiB);
}

// 16 one-MiB tensors fill 8 chunks at the limit; freeing every other one leaves 8 MiB free in
// 1 MiB pieces with every chunk touched, so a 4 MiB request cannot be met by remapping. At a safe
// point the allocator moves two tensors out of a 2-chunk window and the request fits.
TEST(VmmCompactionTest, MovesLiveTensorsWhenRemapCannotHelp) {
  VmmAllocator vmm(smallVmm(16 * kMiB));
  UseAllocator use(&vmm);
  std::vector<Tensor> ts;
  for (int i = 0; i < 16; ++i) ts.push_back(filled(kMiB, float(i * 1000)));
  std::vector<Tensor> kept;
  std::vector<float> seeds;
  for (int i = 0; i < 16; i += 2) {
    kept.push_back(ts[size_t(i)]);
    seeds.push_back(float(i * 1000));
  }
  std::vector<void*> before;
  for (auto& t : kept) before.push_back(t.data());
  ts.clear();
  EXPECT_EQ(vmm.stats().allocated, 8 * kMiB);
  EXPECT_THROW(Tensor::empty({int64_t(kMiB)}, DType::Float32, test::kCpu), Error);  // no safe pt
  Tensor big;
  {
    SafePoint sp;
    big = Tensor::empty({int64_t(kMiB)}, DType::Float32, test::kCpu);  // 4 MiB
  }
  AllocatorStats s = vmm.stats();
  EXPECT_EQ(s.compactions, 1u);
  EXPECT_EQ(s.blocksMoved, 2u);
  EXPECT_EQ(s.bytesCopied, 2 * kMiB);
  EXPECT_EQ(s.reserved, 16 * kMiB);
  EXPECT_EQ(s.allocated, 12 * kMiB);
  int moved = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_TRUE(holds(kept[i], seeds[i])) << i;
    moved += kept[i].data() != before[i];
  }
  EXPECT_EQ(moved, 2);
  std::memset(big.data(), 0x5a, 4 * kMiB);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(holds(kept[i], seeds[i])) << i;
  // Ops read moved tensors through their Buffer.
  Tensor sum0 = addScalar(kept[0], 0.0);
  EXPECT_TRUE(holds(sum0, seeds[0]));
}

TEST(VmmCompactionTest, RawBlocksAreNeverMoved) {
  VmmAllocator vmm(smallVmm(16 * kMiB));
  std::vector<void*> p;
  for (int i = 0; i < 16; ++i) p.push_back(vmm.allocate(kMiB));
  for (int i = 1; i < 16; i += 2) vmm.deallocate(p[size_t(i)], kMiB);
  SafePoint sp;
  try {
    vmm.allocate(4 * kMiB);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory in the vmm allocator"), std::string::npos);
  }
  EXPECT_EQ(vmm.stats().compactions, 0u);
  for (int i = 0; i < 16; i += 2) vmm.deallocate(p[size_t(i)], kMiB);
}

TEST(MemoryTrackingTest, SummarisesASectionAndWhatItLeftAlive) {
  CachingAllocator caching;
  UseAllocator use(&caching);
  Tensor outside = Tensor::ones({1024}, DType::Float32, test::kCpu);
  Tensor kept;
  MemoryTrackSummary s;
  {
    MemoryTrackingScope scope("section");
    Tensor tmp = addScalar(outside, 1.0);  // 4 KiB, freed inside
    kept = mul(tmp, tmp);                  // 4 KiB, alive at the end
    outside = Tensor();                    // a free of a block from before the section
    tmp = Tensor();
    s = scope.end();
  }
  EXPECT_EQ(s.name, "section");
  EXPECT_EQ(s.allocs, 2u);
  EXPECT_EQ(s.bytesAllocated, 8192u);
  EXPECT_EQ(s.frees, 2u);  // tmp and `outside`
  EXPECT_EQ(s.bytesFreed, 8192u);
  EXPECT_EQ(s.peakBytes, 8192u);
  EXPECT_EQ(s.aliveBytes, 4096u);
  ASSERT_EQ(s.alive.size(), 1u);
  EXPECT_EQ(s.alive[0].op, "mul");
  EXPECT_EQ(s.alive[0].bufferId, kept.buffer()->id());
  EXPECT_EQ(s.alive[0].address, uint64_t(reinterpret_cast<uintptr_t>(kept.data())));
  std::string text = formatTrackSummary(s);
  EXPECT_NE(text.find("memory section 'section': 2 allocations (8192 bytes)"), std::string::npos)
      << text;
  EXPECT_NE(text.find(" mul"), std::string::npos) << text;
}

TEST(MemoryTrackingTest, EventsCarryBufferIdsTagsAndSectionMarks) {
  struct Collect : Observer {
    std::vector<MemEvent> ev;
    std::vector<std::string> labels;
    void onMemory(const MemEvent& e) override {
      ev.push_back(e);
      labels.emplace_back(e.label);
    }
  };
  auto obs = std::make_shared<Collect>();
  addObserver(obs);
  uint64_t id = 0;
  {
    MemoryTrackingScope scope("marks");
    MemTagScope tag(MemTag::OptimizerState);
    Tensor t = Tensor::zeros({16}, DType::Float32, test::kCpu);
    id = t.buffer()->id();
  }
  removeObserver(obs);
  ASSERT_GE(obs->ev.size(), 4u);
  EXPECT_EQ(obs->ev.front().kind, MemEventKind::TrackBegin);
  EXPECT_EQ(obs->labels.front(), "marks");
  EXPECT_EQ(obs->ev.back().kind, MemEventKind::TrackEnd);
  EXPECT_EQ(obs->labels.back(), "marks");
  bool sawAlloc = false, sawFree = false;
  for (auto& e : obs->ev) {
    if (e.kind == MemEventKind::Alloc && e.bufferId == id) {
      sawAlloc = true;
      EXPECT_EQ(e.tag, MemTag::OptimizerState);
    }
    if (e.kind == MemEventKind::Free && e.bufferId == id) sawFree = true;
  }
  EXPECT_TRUE(sawAlloc);
  EXPECT_TRUE(sawFree);
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {

TEST(MemoryOomTest, OutOfMemoryInsideAnOpNamesTheOp) {
  VmmAllocatorOptions o;
  o.reserve = 64 * kMiB;
  o.limit = 2 * kMiB;
  o.compaction = false;
  VmmAllocator vmm(o);
  UseAllocator use(&vmm);
  Tensor x = Tensor::ones({int64_t(kMiB * 3 / 8)}, DType::Float32, test::kCpu);  // 1.5 MiB
  try {
    Tensor y = ops::addScalar(x, 1.0);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory in the vmm allocator: requested 1572864 bytes by op #"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find(" add_scalar with a limit of 2097152 bytes; allocated 1.5 MiB"),
              std::string::npos)
        << m;
  }
  // A limit under the allocator's chunk: no request can succeed, and the message says why (it
  // read as if 4 bytes had overflowed the limit with nothing allocated).
  VmmAllocatorOptions small = o;
  small.limit = 500 * 1024;
  VmmAllocator tiny(small);
  UseAllocator useTiny(&tiny);
  try {
    Tensor z = Tensor::ones({1}, DType::Float32, test::kCpu);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("with a limit of 512000 bytes: the vmm allocator reserves at least 2.00 MiB "
                     "at a time, more than the limit allows; allocated"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace keel
