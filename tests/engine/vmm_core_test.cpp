// Tests of the VMM allocators' shared bookkeeping (alloc::VmmCore) over a simulated memory system:
// chunks are host byte vectors, mapping is a slot -> chunk table, and addresses are never
// dereferenced. This pins, without a GPU, the exact code CudaVmmAllocator runs: the classic case
// remapped without a copy, a driver out of memory leaving the allocator unchanged, released
// chunks created again, sync before every unmap, events stamped with the device, and a randomized
// stress test checking every live block's bytes after each defragmentation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "alloc/vmm_core.h"
#include "alloc_test_util.h"
#include "keel/observer.h"

namespace keel {
namespace {

// Memory as a device driver would manage it, with the misuse the driver would reject recorded as
// test failures: mapping a mapped slot or a mapped chunk, unmapping without a sync since the
// last map, releasing a mapped chunk.
class SimulatedMemory final : public alloc::VmmChunkOps {
 public:
  SimulatedMemory(uintptr_t base, size_t chunk, size_t capacity)
      : base_(base), chunk_(chunk), capacity_(capacity) {}

  bool create(int64_t phys) override {
    EXPECT_FALSE(chunks_.count(phys)) << "chunk " << phys << " created twice";
    if (chunks_.size() >= capacity_) return false;
    chunks_[phys].assign(chunk_, 0xee);
    creates++;
    return true;
  }
  void map(uintptr_t addr, int64_t phys, size_t n) override {
    for (size_t i = 0; i < n; ++i, addr += chunk_, ++phys) {
      EXPECT_EQ((addr - base_) % chunk_, 0u);
      EXPECT_TRUE(chunks_.count(phys)) << "mapping chunk " << phys << " that does not exist";
      EXPECT_FALSE(slots_.count(addr)) << "slot mapped twice";
      EXPECT_FALSE(mappedPhys_.count(phys)) << "chunk " << phys << " mapped twice";
      slots_[addr] = phys;
      mappedPhys_.insert(phys);
    }
    synced_ = false;
    mapCalls++;
  }
  void unmap(uintptr_t addr) override {
    EXPECT_TRUE(synced_) << "unmapped without waiting for queued work";
    ASSERT_TRUE(slots_.count(addr));
    mappedPhys_.erase(slots_[addr]);
    slots_.erase(addr);
    unmaps++;
  }
  void release(int64_t phys) override {
    EXPECT_FALSE(mappedPhys_.count(phys)) << "released a mapped chunk";
    chunks_.erase(phys);
    releases++;
  }
  void copy(uintptr_t to, uintptr_t from, size_t bytes) override {
    std::vector<uint8_t> tmp(bytes);
    read(from, tmp.data(), bytes);
    write(to, tmp.data(), bytes);
    copies++;
  }
  void sync() override { synced_ = true; }

  void write(uintptr_t a, const uint8_t* src, size_t n) {
    access(a, n, [&](uint8_t* p, size_t k) {
      std::memcpy(p, src, k);
      src += k;
    });
  }
  void read(uintptr_t a, uint8_t* dst, size_t n) {
    access(a, n, [&](uint8_t* p, size_t k) {
      std::memcpy(dst, p, k);
      dst += k;
    });
  }
  size_t liveChunks() const { return chunks_.size(); }
  size_t mappedSlots() const { return slots_.size(); }

  uint64_t creates = 0, mapCalls = 0, unmaps = 0, releases = 0, copies = 0;

 private:
  template <class F>
  void access(uintptr_t a, size_t n, F&& f) {
    while (n) {
      uintptr_t slot = base_ + (a - base_) / chunk_ * chunk_;
      auto it = slots_.find(slot);
      ASSERT_NE(it, slots_.end()) << "access to an unmapped address";
      size_t off = a - slot, k = std::min(n, chunk_ - off);
      f(chunks_.at(it->second).data() + off, k);
      a += k;
      n -= k;
    }
  }

  uintptr_t base_;
  size_t chunk_, capacity_;
  std::map<int64_t, std::vector<uint8_t>> chunks_;
  std::map<uintptr_t, int64_t> slots_;
  std::set<int64_t> mappedPhys_;
  bool synced_ = false;
};

constexpr uintptr_t kBase = uintptr_t(1) << 40;  // never dereferenced
constexpr size_t kChunk = 64 << 10;

VmmAllocatorOptions options(size_t slots, size_t limit) {
  VmmAllocatorOptions o;
  o.reserve = slots * kChunk;
  o.chunk = kChunk;
  o.limit = limit;
  o.name = "sim-vmm";
  return o;
}

uintptr_t addr(void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

void fill(SimulatedMemory& m, void* p, size_t n, uint8_t seed) {
  auto v = test::bytePattern(n, seed);
  m.write(addr(p), v.data(), n);
}
bool intact(SimulatedMemory& m, void* p, size_t n, uint8_t seed) {
  std::vector<uint8_t> got(n);
  m.read(addr(p), got.data(), n);
  return got == test::bytePattern(n, seed);
}

TEST(VmmCoreTest, ClassicCaseRemapsChunksWithoutCopying) {
  const size_t kBlock = 2 * kChunk;
  SimulatedMemory mem(kBase, kChunk, 1000);
  alloc::VmmCore core(options(256, 5 * kBlock), kBase, mem);
  std::vector<void*> p(5);
  for (int i = 0; i < 5; ++i) {
    p[i] = core.allocate(kBlock);
    EXPECT_EQ(addr(p[i]), kBase + i * kBlock);
    fill(mem, p[i], kBlock, uint8_t(i + 1));
  }
  core.deallocate(p[1]);
  core.deallocate(p[3]);
  void* big = core.allocate(2 * kBlock);
  EXPECT_EQ(addr(big), addr(p[4]) + kBlock);
  AllocatorStats s = core.stats();
  EXPECT_EQ(s.reserved, 5 * kBlock);
  EXPECT_EQ(s.defrags, 1u);
  EXPECT_EQ(s.chunksRemapped, 4u);
  EXPECT_EQ(s.chunksMapped, 10u);
  EXPECT_EQ(s.bytesCopied, 0u);
  EXPECT_EQ(mem.copies, 0u);
  EXPECT_EQ(mem.creates, 10u);  // the remap created no chunk
  fill(mem, big, 2 * kBlock, 99);
  for (int i : {0, 2, 4}) EXPECT_TRUE(intact(mem, p[i], kBlock, uint8_t(i + 1))) << i;
  EXPECT_TRUE(intact(mem, big, 2 * kBlock, 99));
  for (void* q : {p[0], p[2], p[4], big}) core.deallocate(q);
  core.emptyCache();
  EXPECT_EQ(mem.liveChunks(), 0u);
  EXPECT_EQ(mem.mappedSlots(), 0u);
  EXPECT_EQ(core.stats().chunksReleased, 10u);
  // Released chunk indices are created again before they are mapped.
  void* again = core.allocate(3 * kChunk);
  EXPECT_EQ(mem.creates, 13u);
  fill(mem, again, 3 * kChunk, 5);
  EXPECT_TRUE(intact(mem, again, 3 * kChunk, 5));
  core.deallocate(again);
}

TEST(VmmCoreTest, DriverOutOfMemoryFailsTheRequestAndChangesNothing) {
  SimulatedMemory mem(kBase, kChunk, 3);  // the "device" holds three chunks; no limit
  alloc::VmmCore core(options(64, 0), kBase, mem);
  void* a = core.allocate(2 * kChunk);
  fill(mem, a, 2 * kChunk, 1);
  AllocatorStats before = core.stats();
  try {
    core.allocate(2 * kChunk);  // needs two fresh chunks, one exists
    FAIL() << "the simulated device is full";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory in the sim-vmm allocator"),
              std::string::npos)
        << e.what();
  }
  AllocatorStats after = core.stats();
  EXPECT_EQ(after.reserved, before.reserved);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.ooms, 1u);
  EXPECT_EQ(mem.liveChunks(), 2u);  // the one chunk created for the plan was given back
  EXPECT_TRUE(intact(mem, a, 2 * kChunk, 1));
  void* b = core.allocate(kChunk);  // one fresh chunk still fits
  core.deallocate(a);
  core.deallocate(b);
}

TEST(VmmCoreTest, EventsCarryTheDevice) {
  test::MemEventRecorder rec;
  SimulatedMemory mem(kBase, kChunk, 100);
  {
    alloc::VmmCore core(options(64, 0), kBase, mem, Device(Backend::Cuda, 1));
    core.deallocate(core.allocate(kChunk + 1));
    core.emptyCache();
  }
  rec.stop();
  std::vector<MemEventKind> kinds;
  for (const MemEvent& e : rec.events()) {
    EXPECT_EQ(e.device, Device(Backend::Cuda, 1));
    kinds.push_back(e.kind);
  }
  using K = MemEventKind;
  EXPECT_EQ(kinds, (std::vector<K>{K::Map, K::Map, K::Alloc, K::Free, K::Unmap, K::Release,
                                   K::Unmap, K::Release}));
}

TEST(VmmCoreTest, RandomizedStressKeepsDataThroughDefragmentation) {
  test::StressOptions so;
  so.ops = 4000;
  so.largeMax = 3 * kChunk;
  so.smallMax = kChunk / 8;
  so.limit = 24 * kChunk;
  SimulatedMemory mem(kBase, kChunk, 1000);
  alloc::VmmCore core(options(2048, so.limit), kBase, mem);
  test::StressResult r;
  test::runAllocStress(
      core, so, [&](void* p, size_t n, uint8_t seed) { fill(mem, p, n, seed); },
      [&](void* p, size_t n, uint8_t seed) {
        EXPECT_EQ(core.reservedBytes(), mem.mappedSlots() * kChunk);
        return intact(mem, p, n, seed);
      },
      r);
  if (HasFatalFailure()) return;
  EXPECT_EQ(mem.copies, 0u);
  EXPECT_EQ(mem.mappedSlots() * kChunk, core.reservedBytes());
  EXPECT_GE(r.defrags, 5u) << "the stress test should exercise remapping";
}

}  // namespace
}  // namespace keel
