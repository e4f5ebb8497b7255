// Shared by the allocator tests: a byte pattern that catches moved or swapped chunks, a recorder
// of memory events, and the randomized alloc/free stress loop that writes a pattern into every
// block and checks every live block after each defragmentation. Memory is reached through the
// caller's fill/intact functions, so the loop runs over host memory, a GPU or a simulated one.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "keel/allocator.h"
#include "keel/error.h"
#include "keel/observer.h"

namespace keel::test {

// Every byte depends on its offset and the seed: a chunk mapped at the wrong place shows.
inline std::vector<uint8_t> bytePattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + (i >> 6) * 31 + (i & 63));
  return v;
}

// The VMM remap scenario: five blocks filled a limit-sized range, the 2nd and 4th were freed, and
// `big` (two blocks) was then served by remapping their four chunks (no byte copied) to the
// addresses right after the 5th block.
inline void expectTwoHolesRemapped(const AllocatorStats& s, size_t limit, size_t block, void* big,
                                   void* fifth) {
  EXPECT_EQ(s.reserved, limit);
  EXPECT_EQ(s.allocated, 5 * block);
  EXPECT_EQ(s.defrags, 1u);
  EXPECT_EQ(s.chunksRemapped, 4u);
  EXPECT_EQ(s.bytesCopied, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big), reinterpret_cast<uintptr_t>(fifth) + block);
}

// Records every memory event (all allocators) from construction to stop() or destruction.
class MemEventRecorder {
 public:
  MemEventRecorder() : obs_(std::make_shared<Obs>()) { addObserver(obs_); }
  ~MemEventRecorder() { stop(); }
  MemEventRecorder(const MemEventRecorder&) = delete;
  MemEventRecorder& operator=(const MemEventRecorder&) = delete;
  void stop() {
    if (on_) removeObserver(obs_);
    on_ = false;
  }
  const std::vector<MemEvent>& events() const { return obs_->events; }

 private:
  struct Obs : Observer {
    std::vector<MemEvent> events;
    void onMemory(const MemEvent& e) override { events.push_back(e); }
  };
  std::shared_ptr<Obs> obs_;
  bool on_ = true;
};

struct StressOptions {
  int ops = 6000;
  size_t largeMax = 6 << 20;    // one request in four is 1..largeMax bytes
  size_t smallMax = 256 << 10;  // the others 1..smallMax
  size_t limit = 0;             // reserved bytes never exceed it (0: not checked)
  int emptyCacheEvery = 1000;
  uint64_t seed = 7;
};

struct StressResult {
  uint64_t defrags = 0, checks = 0, ooms = 0, bytesCopied = 0;
};

// Runs opts.ops random allocations (55%) and frees on `a` (anything with allocate(n), stats(),
// emptyCache() and deallocate(p) or deallocate(p, n)); requests refused with keel::Error count
// as ooms. fill(p, n, seed) writes bytePattern(n, seed) at p; intact(p, n, seed) checks it.
// Frees everything at the end. Fatal failures stop the loop (check HasFatalFailure()).
template <class A, class Fill, class Intact>
void runAllocStress(A& a, const StressOptions& opts, Fill&& fill, Intact&& intact,
                    StressResult& r) {
  auto release = [&](void* p, size_t n) {
    if constexpr (requires { a.deallocate(p, n); })
      a.deallocate(p, n);
    else
      a.deallocate(p);
  };
  std::mt19937_64 rng(opts.seed);
  struct Live {
    size_t n;
    uint8_t seed;
  };
  std::map<void*, Live> live;
  auto verifyAll = [&] {
    for (auto& [p, l] : live) ASSERT_TRUE(intact(p, l.n, l.seed)) << "block at " << p;
  };
  for (int op = 0; op < opts.ops; ++op) {
    if (live.empty() || rng() % 100 < 55) {
      size_t n = rng() % 4 == 0 ? 1 + rng() % opts.largeMax : 1 + rng() % opts.smallMax;
      void* p = nullptr;
      try {
        p = a.allocate(n);
      } catch (const Error&) {
        r.ooms++;
      }
      if (p) {
        uint8_t seed = uint8_t(rng());
        fill(p, n, seed);
        live[p] = {n, seed};
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(intact(it->first, it->second.n, it->second.seed));
      release(it->first, it->second.n);
      live.erase(it);
    }
    AllocatorStats s = a.stats();
    if (opts.limit) {
      ASSERT_LE(s.reserved, opts.limit);
    }
    if (s.defrags != r.defrags) {
      r.defrags = s.defrags;
      verifyAll();
      if (::testing::Test::HasFatalFailure()) return;
      r.checks++;
    }
    if (opts.emptyCacheEvery && op % opts.emptyCacheEvery == opts.emptyCacheEvery - 1)
      a.emptyCache();
  }
  verifyAll();
  for (auto& [p, l] : live) release(p, l.n);
  r.bytesCopied = a.stats().bytesCopied;
  EXPECT_EQ(a.stats().allocated, 0u);
}

}  // namespace keel::test
