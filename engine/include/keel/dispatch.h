// The dispatcher: every op call goes through dispatch(), which validates (shape inference),
// allocates outputs, runs the backend kernel, records the autograd node and notifies observers.
// Thread-local context — grad mode, phase, module scope — travels with each call.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "keel/attrs.h"
#include "keel/base/non_copyable.h"
#include "keel/observer.h"
#include "keel/op_ids.h"
#include "keel/tensor.h"

namespace keel {

std::vector<Tensor> dispatch(int opId, std::vector<Tensor> inputs, const Attrs& attrs = {});
inline std::vector<Tensor> dispatch(OpId id, std::vector<Tensor> inputs, const Attrs& attrs = {}) {
  return dispatch(int(id), std::move(inputs), attrs);
}
// For single-output ops.
Tensor dispatch1(OpId id, std::vector<Tensor> inputs, const Attrs& attrs = {});

// Grad mode (thread-local): when off, no autograd nodes are recorded.
bool gradEnabled();
class NoGradGuard : NonCopyable {
 public:
  NoGradGuard();
  ~NoGradGuard();

 private:
  bool prev_;
};

Phase currentPhase();
class PhaseGuard : NonCopyable {
 public:
  explicit PhaseGuard(Phase p);
  ~PhaseGuard();

 private:
  Phase prev_;
};

// Module scope path (thread-local). ScopeGuard("attn") inside scope "blocks.3" gives
// "blocks.3.attn"; ScopeGuard::absolute sets a full path (used by Modules, which know theirs).
const std::string& currentScope();
class ScopeGuard : NonCopyable {
 public:
  explicit ScopeGuard(const std::string& name, bool absolute = false);
  ~ScopeGuard();

 private:
  std::string prev_;
};

// Sequence number of the op being dispatched on this thread (0 outside ops); the last one issued.
uint64_t currentOpSeq();
// Name of the op being dispatched on this thread (the innermost); empty outside ops.
std::string_view currentOpName();
uint64_t lastOpSeq();

namespace detail {
// Set by the autograd engine while a grad node's backward runs (forward op link + its scope).
struct BackwardContext {
  uint64_t forwardSeq = 0;
};
void setBackwardForwardSeq(uint64_t seq);
uint64_t backwardForwardSeq();
}  // namespace detail

}  // namespace keel
