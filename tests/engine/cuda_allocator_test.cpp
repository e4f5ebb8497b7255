// GPU tests (ctest label `gpu`) of CudaVmmAllocator: the classic fragmentation case remapped
// without a copy and checked through cudaMemcpy, best fit and statistics, snapshot and memory
// events, the out-of-memory message under a limit, and a randomized stress test verifying every
// live block after each defragmentation. Without a CUDA device every test skips, except the one
// pinning the "no CUDA device" error.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "alloc_test_util.h"
#include "keel/cuda_allocator.h"
#include "keel/error.h"
#include "keel/observer.h"

// The CUDA runtime maps memory where ASan's shadow gap is protected by default.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() {
  return "protect_shadow_gap=0";
}
#endif

namespace keel {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

uintptr_t addr(void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

void fill(void* p, size_t n, uint8_t seed) {
  auto v = test::bytePattern(n, seed);
  ASSERT_EQ(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
}
bool intact(const void* p, size_t n, uint8_t seed) {
  std::vector<uint8_t> got(n);
  if (cudaMemcpy(got.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  return got == test::bytePattern(n, seed);
}

class CudaVmmAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

TEST(CudaVmmAllocatorNoDeviceTest, ConstructionRaisesNoCudaDeviceError) {
  const int n = cudaDeviceCount();
  CudaVmmAllocatorOptions o;
  o.device = n;  // one past the last device, or device 0 where there is none
  try {
    CudaVmmAllocator a(o);
    FAIL() << "constructed an allocator on a missing device";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(m.rfind("no CUDA device: ", 0), 0u) << m;
    if (n > 0) {
      EXPECT_NE(m.find("cuda:" + std::to_string(n) + " requested"), std::string::npos) << m;
    }
  }
}

TEST_F(CudaVmmAllocatorTest, ClassicCaseRemapsWithoutCopying) {
  CudaVmmAllocatorOptions o;
  o.reserve = size_t(1) << 30;
  CudaVmmAllocator a(o);
  const size_t chunk = a.chunkBytes();
  ASSERT_GE(chunk, 2 * kMiB);
  ASSERT_EQ(a.base() % chunk, 0u);
  const size_t kBlock = 2 * chunk, kLimit = 5 * kBlock;
  a.setLimit(kLimit);
  std::vector<void*> p(5);
  for (int i = 0; i < 5; ++i) {
    p[i] = a.allocate(kBlock);
    EXPECT_EQ(addr(p[i]), a.base() + i * kBlock);
    fill(p[i], kBlock, uint8_t(i + 1));
  }
  EXPECT_EQ(a.reservedBytes(), kLimit);
  a.deallocate(p[1], kBlock);
  a.deallocate(p[3], kBlock);
  void* big = a.allocate(2 * kBlock);
  test::expectTwoHolesRemapped(a.stats(), kLimit, kBlock, big, p[4]);
  ASSERT_EQ(cudaMemset(big, 0xab, 2 * kBlock), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i : {0, 2, 4}) EXPECT_TRUE(intact(p[i], kBlock, uint8_t(i + 1))) << i;
  fill(big, 2 * kBlock, 77);
  EXPECT_TRUE(intact(big, 2 * kBlock, 77));
  a.deallocate(big, 2 * kBlock);
  for (int i : {0, 2, 4}) a.deallocate(p[i], kBlock);
  EXPECT_EQ(a.stats().allocated, 0u);
  a.emptyCache();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().chunksReleased, 10u);
  // Released chunks are created again on demand.
  void* again = a.allocate(kBlock);
  fill(again, kBlock, 9);
  EXPECT_TRUE(intact(again, kBlock, 9));
  a.deallocate(again, kBlock);
}

TEST_F(CudaVmmAllocatorTest, BestFitStatisticsSnapshotAndEvents) {
  test::MemEventRecorder rec;
  {
    CudaVmmAllocatorOptions o;
    o.reserve = size_t(1) << 30;
    CudaVmmAllocator a(o);
    const size_t chunk = a.chunkBytes();
    EXPECT_EQ(a.name(), "cuda-vmm");
    void* p0 = a.allocate(1000);  // rounded to 1024, at the start of the reservation
    EXPECT_EQ(addr(p0), a.base());
    void* p1 = a.allocate(chunk + kMiB);  // spans chunks 0 and 1
    EXPECT_EQ(addr(p1), a.base() + 1024);
    void* p2 = a.allocate(512);
    EXPECT_EQ(addr(p2), a.base() + 1024 + chunk + kMiB);
    a.deallocate(p0, 1000);
    void* p3 = a.allocate(512);
    EXPECT_EQ(addr(p3), a.base());  // best fit: the 1024-byte hole, not the tail
    AllocatorStats s = a.stats();
    EXPECT_EQ(s.reserved, 2 * chunk);
    EXPECT_EQ(s.segments, 2u);
    EXPECT_EQ(s.blocks, 3u);
    EXPECT_EQ(s.freeBlocks, 2u);
    EXPECT_EQ(s.allocated, 512 + chunk + kMiB + 512);
    EXPECT_EQ(s.active, 512 + chunk + kMiB + 512);
    EXPECT_EQ(s.peakAllocated, 1024 + chunk + kMiB + 512);
    EXPECT_EQ(s.totalFree, s.reserved - s.allocated);
    EXPECT_EQ(s.largestFree, 2 * chunk - (1024 + chunk + kMiB + 512));
    MemorySnapshot snap = a.snapshot();
    EXPECT_EQ(snap.allocator, "cuda-vmm");
    ASSERT_EQ(snap.segments.size(), 1u);
    EXPECT_EQ(snap.segments[0].address, a.base());
    EXPECT_EQ(snap.segments[0].size, 2 * chunk);
    ASSERT_EQ(snap.blocks.size(), 5u);
    EXPECT_EQ(snap.blocks[0].state, BlockState::Allocated);
    EXPECT_EQ(snap.blocks[0].reuse, 1u);  // the second block at the reservation's start
    EXPECT_EQ(snap.blocks[1].state, BlockState::Free);
    for (void* p : {p1, p2, p3}) a.deallocate(p, 0);
    EXPECT_EQ(a.stats().allocated, 0u);
  }
  rec.stop();
  size_t allocs = 0, frees = 0, maps = 0;
  for (const MemEvent& e : rec.events()) {
    EXPECT_EQ(e.device, Device(Backend::Cuda, 0));
    allocs += e.kind == MemEventKind::Alloc;
    frees += e.kind == MemEventKind::Free;
    maps += e.kind == MemEventKind::Map;
  }
  EXPECT_EQ(allocs, 4u);
  EXPECT_EQ(frees, 4u);
  EXPECT_EQ(maps, 2u);
}

TEST_F(CudaVmmAllocatorTest, OutOfMemoryUnderALimitHasTheSummary) {
  CudaVmmAllocatorOptions o;
  o.reserve = size_t(1) << 30;
  CudaVmmAllocator a(o);
  const size_t chunk = a.chunkBytes();
  a.setLimit(2 * chunk);
  void* p = a.allocate(chunk + 1);
  try {
    a.allocate(chunk);
    FAIL() << "the limit allows two chunks";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory in the cuda-vmm allocator: requested " + std::to_string(chunk) +
                     " bytes"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("largest free block"), std::string::npos) << m;
    EXPECT_NE(m.find("fragmentation"), std::string::npos) << m;
  }
  EXPECT_EQ(a.stats().ooms, 1u);
  EXPECT_EQ(a.stats().reserved, 2 * chunk);          // the refused request changed nothing
  EXPECT_THROW(a.allocate(size_t(2) << 30), Error);  // larger than the reservation
  a.deallocate(p, chunk + 1);
}

TEST_F(CudaVmmAllocatorTest, RandomizedStressKeepsDataThroughDefragmentation) {
  CudaVmmAllocatorOptions o;
  o.reserve = size_t(4) << 30;
  CudaVmmAllocator a(o);
  test::StressOptions so;
  so.ops = 3000;
  so.largeMax = 3 * a.chunkBytes();
  so.limit = 24 * a.chunkBytes();
  a.setLimit(so.limit);
  test::StressResult r;
  test::runAllocStress(a, so, fill, intact, r);
  if (HasFatalFailure()) return;
  EXPECT_EQ(r.bytesCopied, 0u);
  EXPECT_GE(r.defrags, 5u) << "the stress test should exercise remapping";
  std::printf("cuda stress: %llu defragmentations checked, %llu refused requests\n",
              (unsigned long long)r.checks, (unsigned long long)r.ooms);
}

}  // namespace
}  // namespace keel
