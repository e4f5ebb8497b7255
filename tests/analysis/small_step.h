// A hand-made step for the graph tests: the ops the engine's observer would record for a tiny
// model's forward pass, its backward and one optimizer op, with the tensors that link them.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "keel/storage/records.h"

namespace keel::analysis::test {

using storage::OpRecord;
using storage::Role;
using storage::TensorRecord;

inline TensorRecord tensor(Role role, int index, uint64_t id, uint64_t version = 0) {
  TensorRecord t;
  t.role = role;
  t.index = index;
  t.tensorId = id;
  t.version = version;
  t.shape = {4, 8};
  t.dtype = "float32";
  t.bytes = 128;
  return t;
}

inline OpRecord op(uint64_t seq, const char* phase, const char* name, const char* scope,
                   std::vector<TensorRecord> tensors, uint64_t forwardSeq = 0) {
  OpRecord o;
  o.seq = seq;
  o.step = 1;
  o.phase = *keel::parsePhase(phase);
  o.name = name;
  o.scope = scope;
  o.forwardSeq = forwardSeq;
  o.beginNs = int64_t(seq) * 1000;
  o.endNs = o.beginNs + 500;
  o.tensors = std::move(tensors);
  return o;
}

// A tiny step: embedding -> block (norm, attention, residual add) -> in-place add -> sum, its
// backward (reading a saved activation, and an autograd accumulation outside any module), and
// one optimizer op.
inline std::vector<OpRecord> smallStep() {
  const Role I = Role::Input, O = Role::Output;
  return {
      op(1, "forward", "embedding", "wte", {tensor(O, 0, 10)}),
      op(2, "forward", "layer_norm", "blocks.0.norm1", {tensor(I, 0, 10), tensor(O, 0, 11)}),
      op(3, "forward", "matmul", "blocks.0.attn", {tensor(I, 0, 11), tensor(O, 0, 12)}),
      op(4, "forward", "softmax", "blocks.0.attn", {tensor(I, 0, 12), tensor(O, 0, 13)}),
      op(5, "forward", "add", "blocks.0", {tensor(I, 0, 10), tensor(I, 1, 13), tensor(O, 0, 14)}),
      op(6, "forward", "add_", "", {tensor(I, 0, 14), tensor(O, 0, 14, 1)}),  // in place: v1
      op(7, "forward", "sum", "", {tensor(I, 0, 14, 1), tensor(O, 0, 15)}),
      op(8, "backward", "sum_backward", "", {tensor(I, 0, 16), tensor(O, 0, 17)}, 7),
      op(9, "backward", "add", "blocks.0", {tensor(I, 0, 17), tensor(O, 0, 18)}, 5),
      op(10, "backward", "softmax_backward", "blocks.0.attn",
         {tensor(I, 0, 18), tensor(I, 1, 13), tensor(O, 0, 19)}, 4),
      op(11, "backward", "add", "", {tensor(I, 0, 18), tensor(I, 1, 19), tensor(O, 0, 20)}),
      op(12, "optimizer", "adamw_step", "wte", {tensor(I, 0, 20), tensor(O, 0, 21)}),
  };
}

}  // namespace keel::analysis::test
