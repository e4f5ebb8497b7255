// Note [VMM fallback] when the VMM allocator's memfd cannot be created, in a test binary of its
// own: the process's VMM allocator is tried once, so no other test here may create it first.
// (Through the keel binary, under address-space and file-size limits: tests/capture/
// cli_limits_test.cpp.)
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fcntl.h>

#include <string>

#include "keel/allocator.h"

namespace keel {
namespace {

// No file descriptor left (RLIMIT_NOFILE at the lowest free one): memfd_create fails, and a run
// asking for vmm gets the caching allocator and the reason in one line; other kinds are kept.
// The failure is remembered: with the limit lifted the process stays on the caching allocator.
TEST(VmmFallback, AMemfdThatCannotBeCreatedFallsBackToTheCachingAllocator) {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check reads /proc/self/maps to validate an object it has not seen: with no file
  // descriptor left it cannot, and reports the allocator under construction as invalid.
  GTEST_SKIP() << "needs a file descriptor table the sanitizers can still open files in";
#endif
  std::string why = "stale";
  EXPECT_EQ(usableAllocatorKind(AllocatorKind::Caching, &why), AllocatorKind::Caching);
  EXPECT_EQ(why, "");
  EXPECT_EQ(usableAllocatorKind(AllocatorKind::Host, &why), AllocatorKind::Host);

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowestFree = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(lowestFree, 0);
  close(lowestFree);
  rlimit none = saved;
  none.rlim_cur = rlim_t(lowestFree);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  const AllocatorKind k = usableAllocatorKind(AllocatorKind::Vmm, &why);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);

  EXPECT_EQ(k, AllocatorKind::Caching);
  EXPECT_EQ(why,
            "vmm allocator: memfd_create failed: Too many open files: using the caching allocator");
  EXPECT_EQ(usableAllocatorKind(AllocatorKind::Vmm, &why), AllocatorKind::Caching);
  EXPECT_EQ(why,
            "vmm allocator: memfd_create failed: Too many open files: using the caching allocator");
}

}  // namespace
}  // namespace keel
