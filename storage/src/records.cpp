// Where non-finite values appear (records.h, Note [Where non-finite values appear]).
#include <algorithm>
#include <string_view>

#include "keel/storage/records.h"

namespace keel::storage {

bool isMaskingFill(const std::string& opName) {
  std::string_view n = opName;
  if (!n.empty() && n.back() == '_') n.remove_suffix(1);  // PyTorch's in-place spelling
  static constexpr std::string_view kFills[] = {"fill",     "full",         "full_like",
                                                "new_full", "masked_fill",  "index_fill",
                                                "where",    "scalar_tensor"};
  return std::find(std::begin(kFills), std::end(kFills), n) != std::end(kFills);
}

bool nonFiniteAppearsAt(const OpRecord& op) {
  bool infOut = false, infIn = false;
  for (const TensorRecord& t : op.tensors) {
    if (!t.hasStats) continue;
    if (t.role == Role::Output) {
      if (t.stats.nanCount > 0) return true;
      infOut = infOut || t.stats.infCount > 0;
    } else {
      infIn = infIn || t.stats.infCount > 0;
    }
  }
  return infOut && !infIn && !isMaskingFill(op.name);
}

}  // namespace keel::storage
