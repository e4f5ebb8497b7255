// Helpers of the training tests (train_test, ckpt_train_test, ckpt_reshard_test): the default
// corpus, loaded once per process, and a tensor's row-major bytes for bit-for-bit comparisons.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "keel/data.h"
#include "keel/tensor.h"

namespace keel::test {

inline std::shared_ptr<const data::TextDataset> corpus() {
  static auto ds = std::make_shared<const data::TextDataset>(data::TextDataset::defaultCorpus());
  return ds;
}

inline std::vector<uint8_t> bytesOf(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

}  // namespace keel::test
