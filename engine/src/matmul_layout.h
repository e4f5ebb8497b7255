// How a stored matrix can be handed to a BLAS (OpenBLAS on cpu, cuBLAS on cuda) without a copy:
// the one rule both backends' matmul kernels use for their operands.
#pragma once
#include <algorithm>
#include <cstdint>

namespace keel::detail {

// A stored [rows, cols] matrix with element strides (s0, s1), as BLAS sees it.
struct MatLayout {
  bool ok = false;        // false: neither layout fits (copy it contiguous first)
  bool colMajor = false;  // stored transposed: element (i, j) at i + j * ld
  int64_t ld = 1;
};

inline MatLayout classifyMatrix(int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  if ((cols == 1 || s1 == 1) && (rows == 1 || s0 >= std::max<int64_t>(cols, 1)))
    return {true, false, rows == 1 ? std::max<int64_t>(cols, 1) : s0};
  if ((rows == 1 || s0 == 1) && (cols == 1 || s1 >= std::max<int64_t>(rows, 1)))
    return {true, true, cols == 1 ? std::max<int64_t>(rows, 1) : s1};
  return {};
}

}  // namespace keel::detail
