// zeroTie: keeps a collective's output in every rank's autograd graph. See Note [Collectives in
// every rank's backward].
#pragma once
#include "keel/ops.h"

namespace keel::detail {

// Note [Collectives in every rank's backward]
// The autograd engine runs a backward node only when a gradient reaches it, and in descending
// forward order. A collective whose output one rank does not use (a MoE rank that kept no token,
// a ring step whose keys a rank's mask hides) would then run in backward on some ranks only: a
// hang. Adding zeroTie(output) to a result that is used gives every rank the same nodes. It is
// the sum of none of x's elements, so no value of x (NaN, Inf, overflow) leaks into the result.
inline Tensor zeroTie(const Tensor& x) {
  return ops::sum(ops::slice(ops::reshape(x, {-1}), 0, 0, 0));
}

}  // namespace keel::detail
