// Autograd: a dynamic tape of grad nodes. Each node remembers the forward op call that made it
// (op id, attributes, saved inputs/outputs, the op's sequence number and scope), so observers can
// link every backward op to the forward op it differentiates.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "keel/attrs.h"
#include "keel/registry.h"
#include "keel/tensor.h"

namespace keel {

class Node;

// Where an input's gradient goes: another node's output, or a leaf tensor's .grad.
struct Edge {
  std::shared_ptr<Node> node;
  int outputNr = 0;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return node || leaf; }
};

class Node {
 public:
  int opId = -1;
  Attrs attrs;
  // Aliases outside the graph that keep the forward tensors' ids (Note [Saved tensors], in
  // dispatch.cpp); released after backward unless retained.
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<uint64_t> inputVersions, outputVersions;
  std::vector<Edge> next;  // one per input
  std::vector<TensorMeta> outputMetas;
  std::vector<std::vector<TensorHook>> outputHooks;
  uint64_t forwardSeq = 0;
  std::string scope;
  bool released = false;

  const std::string& name() const;
};

// Runs backward from roots with the given seed gradients (undefined: ones for a scalar root).
void runBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                 bool retainGraph);

}  // namespace keel
