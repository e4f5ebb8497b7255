// One step's dataflow: for every op, the ops that produced the inputs it read, by storage's one
// producer definition (See Note [Producer] in keel/storage/producers.h). The graph's edges and its
// adopted scopes are built from it, for the studio and `keel export graph` alike.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "keel/storage/records.h"

namespace keel::analysis {

struct Dataflow {
  // producers[i]: for each input of ops[i] (in the op's tensor order) that has a producer among
  // `ops`, that producer's index in `ops`; an op read twice is listed twice.
  std::vector<std::vector<uint32_t>> producers;
};

// The producers of every input of `ops` (any order; usually one step, every phase, by seq),
// searched among `ops` only.
Dataflow buildDataflow(std::span<const storage::OpRecord> ops);

}  // namespace keel::analysis
