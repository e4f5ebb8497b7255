// The CUDA simulator's CUB segmented sort (cub/device/device_segmented_sort.cuh): StableSortPairs
// of unsigned keys within each segment [begin[i], end[i]) (empty where end <= begin); items outside
// every segment are neither read nor written, as CUB documents. Host C++ (runtime.cpp sorts).
#pragma once
#include "device_radix_sort.cuh"

namespace cub {
struct DeviceSegmentedSort {
  template <class NumItems, class NumSegments>
  static cudaError_t StableSortPairs(void* temp, size_t& bytes, const uint64_t* keysIn,
                                     uint64_t* keysOut, const int64_t* valuesIn, int64_t* valuesOut,
                                     NumItems n, NumSegments segments, const int64_t* begin,
                                     const int64_t* end, cudaStream_t = nullptr) {
    return keelSimSortPairsU64(temp, bytes, keysIn, keysOut, valuesIn, valuesOut, int64_t(n), 0, 64,
                               begin, end, int64_t(segments));
  }
};
}  // namespace cub
