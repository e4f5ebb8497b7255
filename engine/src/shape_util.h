// Shape helpers shared by shape inference and kernels: dim normalisation, broadcasting, and
// element-offset computation for strided tensors.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "keel/error.h"
#include "keel/tensor.h"

namespace keel {

struct KernelCtx;

// Maps d in [-rank, rank) to [0, rank); throws naming the op otherwise.
int64_t normDim(int64_t d, int64_t rank, std::string_view op);
// NumPy broadcast of two shapes; throws naming the op and both shapes.
Shape broadcastShapes(const Shape& a, const Shape& b, std::string_view op);
// Strides of t seen at outShape's rank, 0 along broadcast dims.
Shape broadcastStrides(const Tensor& t, const Shape& outShape);

// Element offset (in elements, from data()) of linear index i in row-major order of shape.
inline int64_t stridedOffset(int64_t i, const Shape& shape, const Shape& strides) {
  int64_t off = 0;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    int64_t s = shape[size_t(d)];
    off += (i % s) * strides[size_t(d)];
    i /= s;
  }
  return off;
}

// Python-style slice bounds over an extent n (negative start/end count from the end, clamped):
// returns {start, length}. Throws for step <= 0.
std::pair<int64_t, int64_t> sliceBounds(int64_t n, int64_t start, int64_t end, int64_t step,
                                        std::string_view op);

// Where slice_backward's gradient (input 0) goes in its output: along `dim`, `length` slices from
// `start`, `step` apart — its attributes as every backend's kernel reads them, the gradient's
// shape checked against them.
struct SlicePlace {
  int64_t dim = 0, start = 0, length = 0, step = 1;
};
SlicePlace slicePlace(const KernelCtx& c);

// Splits shape around dim: outer = prod(shape[:dim]), n = shape[dim], inner = prod(shape[dim+1:]).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
DimSplit splitAt(const Shape& shape, int64_t dim);

}  // namespace keel
