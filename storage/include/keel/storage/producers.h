// Which op produced the value an op input read: the one producer -> consumer definition of Keel,
// shared by the run diff's "fed by" chains (diff.cpp), the dataflow graph and `keel export graph`
// (analysis/). See Note [Producer]. Plain lookups over records; no SQLite.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "keel/storage/records.h"

namespace keel::storage {

// Note [Producer]
// The producer of an input that op C read is the latest earlier op output of the same value:
// among the ops given, the op with the greatest seq below C's seq that lists an output with the
// input's (tensor id, version). No other place defines it.
//  - The value is (tensor id, version), as docs/capture.md defines it, not the id alone: a tensor
//    written outside any op (filled from host memory, a checkpoint load) gets a new version that
//    no op output, so it has no producer, where keying by id would name the op that wrote the
//    old contents. An op that writes its input lists it again as an output at the next version:
//    readers after it are fed by it, readers of the old version by the op that wrote that one.
//  - "Latest earlier": several ops can output one value (an op returning its input unchanged
//    outputs the same id and version); the one closest before the consumer fed it. Earlier means
//    a smaller seq (execution order), so an op is never its own producer, and the ops may be
//    given in any order.
//  - Backward ops' reads of saved tensors have forward producers: autograd keeps the forward ids
//    (Note [Saved tensors] in engine/src/core/dispatch.cpp). Cross-phase edges are part of the
//    definition; whether to draw them is the graph's business (Note [Graph shape]).
//  - Which ops are searched is the caller's choice, and the only difference between users: the
//    graph and `keel export graph` pass one step (every phase), so the weights a step's forward
//    pass reads, written by the previous step's optimizer, have no producer there; the diff passes
//    every aligned op of a run, so its chains cross steps.
class ProducerIndex {
 public:
  // Indexes the outputs of `ops` (any order). Lookups return positions in that sequence; only
  // seqs and positions are kept, not the records.
  explicit ProducerIndex(std::span<const OpRecord> ops);
  explicit ProducerIndex(std::span<const OpRecord* const> ops);

  // The position of the producer of `input` as op `consumerSeq` read it; nullopt when no indexed
  // op output that value before it (a leaf: a weight, a host input, or an op not indexed).
  std::optional<size_t> find(const TensorRecord& input, uint64_t consumerSeq) const;
  std::optional<size_t> find(uint64_t tensorId, uint64_t version, uint64_t consumerSeq) const;

 private:
  struct Key {
    uint64_t id, version;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  // The outputs of one value are entries_[begin, end) of its range, by seq: a lookup is a binary
  // search, whatever the number of ops that output one value (a damaged or crafted recording can
  // list one value as the output of every op; walking them all per lookup was quadratic).
  struct Entry {
    uint64_t seq;
    uint32_t position;
  };
  void add(const OpRecord& op, size_t position, std::vector<std::pair<Key, Entry>>& out) const;
  void build(std::vector<std::pair<Key, Entry>> outputs);

  std::unordered_map<Key, std::pair<uint32_t, uint32_t>, KeyHash> ranges_;
  std::vector<Entry> entries_;
};

}  // namespace keel::storage
