// Where non-finite values appear (records.h, Note [Where non-finite values appear]).
#include <algorithm>
#include <string_view>

#include "keel/storage/records.h"

namespace keel::storage {

namespace {
uint64_t elementsOf(const TensorRecord& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape) n *= uint64_t(std::max<int64_t>(d, 0));
  return n;
}
}  // namespace

bool isMaskingFill(const std::string& opName) {
  std::string_view n = opName;
  if (!n.empty() && n.back() == '_') n.remove_suffix(1);  // PyTorch's in-place spelling
  static constexpr std::string_view kFills[] = {"fill",     "full",         "full_like",
                                                "new_full", "masked_fill",  "index_fill",
                                                "where",    "scalar_tensor"};
  return std::find(std::begin(kFills), std::end(kFills), n) != std::end(kFills);
}

bool holdsNonFinite(const OpRecord& op) {
  return std::any_of(op.tensors.begin(), op.tensors.end(), [](const TensorRecord& t) {
    return t.role == Role::Output && t.hasStats && (t.stats.nanCount > 0 || t.stats.infCount > 0);
  });
}

bool nonFiniteAppearsAt(const OpRecord& op) {
  for (const TensorRecord& t : op.tensors)
    if (t.role == Role::Output && t.hasStats && t.stats.nanCount > 0) return true;
  if (isMaskingFill(op.name)) return false;
  // An output holds new infinities when it has more than its inputs could have carried into it:
  // each input's count, times how many times over the output's elements cover the input's (a
  // mask broadcast over the batch and heads repeats its -inf for each).
  for (const TensorRecord& o : op.tensors) {
    if (o.role != Role::Output || !o.hasStats || o.stats.infCount <= 0) continue;
    const uint64_t out = elementsOf(o);
    double carried = 0;
    for (const TensorRecord& in : op.tensors)
      if (in.role != Role::Output && in.hasStats && in.stats.infCount > 0) {
        const uint64_t n = elementsOf(in);
        carried += double(in.stats.infCount) * (n > 0 && out > n ? double(out) / double(n) : 1.0);
      }
    if (double(o.stats.infCount) > carried) return true;
  }
  return false;
}

}  // namespace keel::storage
