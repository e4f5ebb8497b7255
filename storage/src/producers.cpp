// ProducerIndex: see producers.h and Note [Producer]. One hash entry per distinct output value and
// one chain entry per output; a lookup walks the outputs of one value (almost always one).
#include "keel/storage/producers.h"

#include <functional>

namespace keel::storage {

size_t ProducerIndex::KeyHash::operator()(const Key& k) const {
  return std::hash<uint64_t>()(k.id * 0x9e3779b97f4a7c15ull ^ k.version);
}

ProducerIndex::ProducerIndex(std::span<const OpRecord> ops) {
  latest_.reserve(ops.size() * 2);
  for (size_t i = 0; i < ops.size(); ++i) add(ops[i], i);
}

ProducerIndex::ProducerIndex(std::span<const OpRecord* const> ops) {
  latest_.reserve(ops.size() * 2);
  for (size_t i = 0; i < ops.size(); ++i) add(*ops[i], i);
}

void ProducerIndex::add(const OpRecord& op, size_t position) {
  for (const TensorRecord& t : op.tensors) {
    if (t.role != Role::Output) continue;
    auto it = latest_.try_emplace({t.tensorId, t.version}, kEnd).first;
    entries_.push_back({op.seq, uint32_t(position), it->second});
    it->second = uint32_t(entries_.size() - 1);
  }
}

std::optional<size_t> ProducerIndex::find(const TensorRecord& input, uint64_t consumerSeq) const {
  return find(input.tensorId, input.version, consumerSeq);
}

std::optional<size_t> ProducerIndex::find(uint64_t tensorId, uint64_t version,
                                          uint64_t consumerSeq) const {
  auto it = latest_.find({tensorId, version});
  if (it == latest_.end()) return std::nullopt;
  const Entry* best = nullptr;
  for (uint32_t e = it->second; e != kEnd; e = entries_[e].prev) {
    const Entry& entry = entries_[e];
    if (entry.seq < consumerSeq && (!best || entry.seq > best->seq)) best = &entry;
  }
  if (!best) return std::nullopt;
  return best->position;
}

}  // namespace keel::storage
