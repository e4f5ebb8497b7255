// parallelFor: a fixed thread pool with a static partition. Chunk boundaries depend only on n, the
// grain and the thread count, so a kernel whose elements do not depend on the partition gives the
// same bits on every run. Nested calls (from a worker) run serially.
#pragma once
#include <cstdint>
#include <functional>

namespace keel {

int numThreads();  // KEEL_NUM_THREADS, else the hardware thread count
void setNumThreads(int n);
// Calls fn(begin, end) over [0, n) in at most numThreads() contiguous chunks of >= grain items.
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace keel
