// What every multi-rank test binary shares: this process's rank and the world's size, and the main
// that starts the process group (under `layout`), runs every test on every rank and finishes.
#pragma once
#include <gtest/gtest.h>

#include "keel/dist.h"

namespace keel::test {

inline int rank() {
  return dist::worldRank();
}
inline int world() {
  return dist::worldSize();
}

// `layout` from the launcher's world size (mpirun -np N).
template <typename LayoutOf>
int runAllRanks(int argc, char** argv, LayoutOf layout) {
  ::testing::InitGoogleTest(&argc, argv);
  dist::init(layout(dist::launcherWorldSize()));
  const int rc = RUN_ALL_TESTS();
  dist::finalize();
  return rc;
}

}  // namespace keel::test
