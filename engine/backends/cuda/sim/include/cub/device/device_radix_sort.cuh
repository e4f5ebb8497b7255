// The CUDA simulator's CUB radix sort (cub/device/device_radix_sort.cuh): SortPairs over unsigned
// keys' bits [beginBit, endBit), stable, as CUB sorts; the temporary storage size query as CUB's
// two-call protocol. Host C++ (runtime.cpp does the sort).
#pragma once
#include <cstdint>

#include "cuda_runtime.h"

cudaError_t keelSimSortPairsU64(void* temp, size_t& bytes, const uint64_t* keysIn,
                                uint64_t* keysOut, const int64_t* valuesIn, int64_t* valuesOut,
                                int64_t n, int beginBit, int endBit, const int64_t* segBegin,
                                const int64_t* segEnd, int64_t segments);

namespace cub {
struct DeviceRadixSort {
  template <class NumItems>
  static cudaError_t SortPairs(void* temp, size_t& bytes, const uint64_t* keysIn, uint64_t* keysOut,
                               const int64_t* valuesIn, int64_t* valuesOut, NumItems n,
                               int beginBit = 0, int endBit = 64, cudaStream_t = nullptr) {
    return keelSimSortPairsU64(temp, bytes, keysIn, keysOut, valuesIn, valuesOut, int64_t(n),
                               beginBit, endBit, nullptr, nullptr, 0);
  }
};
}  // namespace cub
