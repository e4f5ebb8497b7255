// Helpers the multi-rank analyses share (ranks.cpp, parameters.cpp): a run folder's recordings
// opened and checked against its manifest, the steps every rank finished, expert scopes and the
// layout's one-line spelling.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "keel/storage/errors.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::analysis::detail {

// Each rank's recording, in rank order; StorageError when one was recorded by another rank.
inline std::vector<storage::Recording> openRanks(const std::string& dir,
                                                 const storage::RunManifest& m) {
  std::vector<storage::Recording> recs;
  for (int64_t r = 0; r < m.worldSize; ++r) {
    storage::Recording rec = storage::Recording::open(storage::rankPath(dir, m, r));
    storage::checkRankRun(dir, m, r, rec.run());
    recs.push_back(std::move(rec));
  }
  return recs;
}

// The steps every recording finished: 1..n with an end time (a run stopped or hung mid-step has
// a last step with no end, whose ops stop wherever the rank was).
inline int64_t finishedSteps(std::vector<storage::Recording>& recs) {
  int64_t steps = -1;
  for (storage::Recording& rec : recs) {
    int64_t n = 0;
    for (const storage::StepRecord& st : rec.steps())
      if (st.endNs != 0 && st.step == n + 1) n = st.step;
    steps = steps < 0 ? n : std::min(steps, n);
  }
  return std::max<int64_t>(steps, 0);
}

// An op or parameter of a MoE layer's experts (the engine's GPT::isExpertParameter naming).
inline bool isExpertScope(const std::string& scope) {
  return scope.find(".moe.experts.") != std::string::npos;
}

}  // namespace keel::analysis::detail
