// Selection: see selection.h.
#include "keel/views/selection.h"

#include <algorithm>

namespace keel::views {

void Selection::select(Side side, uint64_t seq, bool force) {
  auto& cur = current_[int(side)];
  if (!force && cur && *cur == seq) return;
  cur = seq;
  emit selected(side, quint64(seq));
}

void Selection::selectPair(std::optional<uint64_t> seqA, std::optional<uint64_t> seqB) {
  if (seqA) select(Side::A, *seqA);
  if (seqB) select(Side::B, *seqB);
}

void Selection::clear() {
  current_[0].reset();
  current_[1].reset();
  emit cleared();
}

int64_t StepData::indexOf(uint64_t seq) const {
  auto it = std::lower_bound(ops.begin(), ops.end(), seq,
                             [](const storage::OpRecord& o, uint64_t s) { return o.seq < s; });
  return it != ops.end() && it->seq == seq ? int64_t(it - ops.begin()) : -1;
}

}  // namespace keel::views
