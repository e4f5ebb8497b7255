// Helpers for op definitions: inference shorthands and sumTo (reduces a broadcast gradient back
// to an input's shape).
#pragma once
#include <optional>
#include <span>
#include <vector>

#include "keel/ops.h"
#include "keel/registry.h"
#include "shape_util.h"

namespace keel::detail {

using Inputs = std::span<const Tensor>;
using Metas = std::vector<TensorMeta>;

inline Metas one(Shape s, DType d) {
  return {TensorMeta{std::move(s), d}};
}

// Checks that every input has the dtype of input 0.
void requireSameDtype(std::string_view op, Inputs in);
void requireFloat(std::string_view op, const Tensor& t, std::string_view what);
void requireIndex(std::string_view op, const Tensor& t, std::string_view what);
// Sums g over broadcast dims so it has `shape`.
Tensor sumTo(const Tensor& g, const Shape& shape);
// Strides that view (shape, strides) as newShape without copying, if any exist.
std::optional<Shape> viewStrides(const Shape& shape, const Shape& strides, const Shape& newShape);
// Resolves one -1 in a requested shape against numel.
Shape inferShape(std::string_view op, const Shape& from, const std::vector<int64_t>& to);
Tensor zerosLike(const Tensor& t);

}  // namespace keel::detail
