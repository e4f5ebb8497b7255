// ProducerIndex: see producers.h and Note [Producer]. One hash entry per distinct output value and
// one entry per output, sorted by value then seq; a lookup is a binary search in one value's run.
#include "keel/storage/producers.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <tuple>

namespace keel::storage {

size_t ProducerIndex::KeyHash::operator()(const Key& k) const {
  return std::hash<uint64_t>()(k.id * 0x9e3779b97f4a7c15ull ^ k.version);
}

ProducerIndex::ProducerIndex(std::span<const OpRecord> ops) {
  std::vector<std::pair<Key, Entry>> outputs;
  for (size_t i = 0; i < ops.size(); ++i) add(ops[i], i, outputs);
  build(std::move(outputs));
}

ProducerIndex::ProducerIndex(std::span<const OpRecord* const> ops) {
  std::vector<std::pair<Key, Entry>> outputs;
  for (size_t i = 0; i < ops.size(); ++i) add(*ops[i], i, outputs);
  build(std::move(outputs));
}

void ProducerIndex::add(const OpRecord& op, size_t position,
                        std::vector<std::pair<Key, Entry>>& out) const {
  for (const TensorRecord& t : op.tensors)
    if (t.role == Role::Output)
      out.push_back({{t.tensorId, t.version}, {op.seq, uint32_t(position)}});
}

void ProducerIndex::build(std::vector<std::pair<Key, Entry>> outputs) {
  std::stable_sort(outputs.begin(), outputs.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.id, a.first.version, a.second.seq) <
           std::tie(b.first.id, b.first.version, b.second.seq);
  });
  ranges_.reserve(outputs.size());
  entries_.reserve(outputs.size());
  for (const auto& [key, entry] : outputs) {
    auto [it, fresh] = ranges_.try_emplace(key, uint32_t(entries_.size()), 0);
    entries_.push_back(entry);
    it->second.second = uint32_t(entries_.size());
  }
}

std::optional<size_t> ProducerIndex::find(const TensorRecord& input, uint64_t consumerSeq) const {
  return find(input.tensorId, input.version, consumerSeq);
}

std::optional<size_t> ProducerIndex::find(uint64_t tensorId, uint64_t version,
                                          uint64_t consumerSeq) const {
  auto it = ranges_.find({tensorId, version});
  if (it == ranges_.end()) return std::nullopt;
  const auto first = entries_.begin() + it->second.first,
             last = entries_.begin() + it->second.second;
  // The latest output before the consumer: the last entry whose seq is below consumerSeq.
  const auto after = std::lower_bound(first, last, consumerSeq,
                                      [](const Entry& e, uint64_t seq) { return e.seq < seq; });
  if (after == first) return std::nullopt;
  return std::prev(after)->position;
}

}  // namespace keel::storage
