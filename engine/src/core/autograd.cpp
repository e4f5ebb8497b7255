// The backward engine. Nodes run in a deterministic order: among ready nodes, the one whose
// forward op ran last goes first. Each node's backward runs with phase Backward, the scope of its
// forward op, and that op's sequence number visible to observers (the forward <-> backward link).
#include "keel/autograd.h"

#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "keel/dispatch.h"
#include "keel/ops.h"

namespace keel {

const std::string& Node::name() const {
  return Registry::get().op(opId).name;
}

namespace {

Tensor accumulate(const Tensor& a, const Tensor& b) {
  return a.defined() ? ops::add(a, b) : b;
}

void checkGradShape(const Tensor& g, const Shape& shape, DType dtype, const std::string& what) {
  KEEL_CHECK(g.shape() == shape && g.dtype() == dtype, "backward of ", what,
             " produced a gradient ", shapeStr(g.shape()), " ", dtypeName(g.dtype()),
             " for a tensor ", shapeStr(shape), " ", dtypeName(dtype));
}

// Gradients reaching each leaf during one backward pass, summed; hooks run once on the sum.
class LeafGrads {
 public:
  void add(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g) {
    Tensor t(leaf);
    checkGradShape(g, t.shape(), t.dtype(), "a leaf");
    auto [it, fresh] = index_.try_emplace(leaf.get(), pending_.size());
    if (fresh)
      pending_.push_back({leaf, g});
    else
      pending_[it->second].second = ops::add(pending_[it->second].second, g);
  }
  // Runs each leaf's hooks on its summed gradient and accumulates it into .grad, in the order the
  // leaves were first reached.
  void flush() {
    for (auto& [leaf, g] : pending_) {
      Tensor sum = g;
      for (auto& h : leaf->leafHooks) {
        Tensor r = h(sum);
        if (r.defined()) sum = r;
      }
      Tensor t(leaf);
      checkGradShape(sum, t.shape(), t.dtype(), "a leaf hook");
      leaf->grad = accumulate(t.grad(), sum).implPtr();
    }
  }

 private:
  std::unordered_map<TensorImpl*, size_t> index_;
  std::vector<std::pair<std::shared_ptr<TensorImpl>, Tensor>> pending_;
};

struct NodeOrder {
  bool operator()(const Node* a, const Node* b) const { return a->forwardSeq < b->forwardSeq; }
};

}  // namespace

void runBackward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                 bool retainGraph) {
  KEEL_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
             " gradients");
  NoGradGuard noGrad;
  PhaseGuard phase(Phase::Backward);

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> rootNodes;
  LeafGrads leafGrads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    KEEL_CHECK(r.defined() && r.requiresGrad(),
               "backward: the tensor does not require grad (no parameter reaches it)");
    Tensor g = grads[i];
    if (!g.defined()) {
      KEEL_CHECK(r.numel() == 1,
                 "backward: a gradient must be given for a non-scalar root of shape ",
                 shapeStr(r.shape()));
      g = ops::fill(r.shape(), 1.0, r.dtype(), r.device());
    }
    checkGradShape(g, r.shape(), r.dtype(), "the root");
    if (r.isLeaf()) {
      leafGrads.add(r.implPtr(), g);
      continue;
    }
    Node* n = r.gradFn().get();
    auto& buf = buffers[n];
    buf.resize(n->outputMetas.size());
    buf[size_t(r.impl()->outputNr)] = accumulate(buf[size_t(r.impl()->outputNr)], g);
    rootNodes.push_back(r.gradFn());
  }

  // Count dependencies over the reachable graph.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& n : rootNodes)
    if (seen.insert(n.get()).second) stack.push_back(n.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, NodeOrder> ready;
  std::unordered_set<Node*> queued;
  for (auto& n : rootNodes)
    if (deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push(n.get());

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    const OpDef& def = Registry::get().op(n->opId);
    KEEL_CHECK(!n->released, "backward through the graph of op '", def.name,
               "' a second time: its saved tensors were freed (use retainGraph=true)");
    for (size_t i = 0; i < n->inputs.size(); ++i)
      KEEL_CHECK(n->inputs[i].version() == n->inputVersions[i], "op '", def.name, "' input ", i,
                 " was modified in place after the forward pass; its gradient cannot be computed");

    std::vector<Tensor> gradOut = std::move(buffers[n]);
    buffers.erase(n);
    gradOut.resize(n->outputMetas.size());
    for (size_t i = 0; i < gradOut.size(); ++i)
      for (auto& h : n->outputHooks[i])
        if (gradOut[i].defined()) {
          Tensor r = h(gradOut[i]);
          if (r.defined()) gradOut[i] = r;
        }

    BackwardCtx ctx{def, n->inputs, n->outputs, gradOut, n->attrs, {}};
    ctx.needsGrad.resize(n->inputs.size());
    for (size_t i = 0; i < n->next.size(); ++i) ctx.needsGrad[i] = n->next[i].valid();

    std::vector<Tensor> gin;
    {
      ScopeGuard scope(n->scope, true);
      detail::setBackwardForwardSeq(n->forwardSeq);
      struct Reset {
        ~Reset() { detail::setBackwardForwardSeq(0); }
      } reset;
      bool anyGrad = false;
      for (auto& g : gradOut) anyGrad = anyGrad || g.defined();
      if (anyGrad) {
        if (!def.backward)  // Note [No backward rule]
          throw Error("backward through op '" + def.name + "' (#" + std::to_string(n->forwardSeq) +
                      (n->scope.empty() ? std::string() : ", scope " + n->scope) +
                      "): it has no backward rule, and a gradient reached its output; register "
                      "one (OpDef::backward), or call it under keel::NoGradGuard, or on detached "
                      "inputs, if no gradient should pass");
        gin = def.backward(ctx);
        // One gradient (or an undefined one) per input: a rule returning another count was
        // padded or cut without a word, its gradients landing on the wrong inputs or nowhere.
        KEEL_CHECK(gin.size() == n->inputs.size(), "backward of op '", def.name, "' returned ",
                   gin.size(), gin.size() == 1 ? " gradient" : " gradients", " for ",
                   n->inputs.size(), n->inputs.size() == 1 ? " input" : " inputs",
                   " (one per input, undefined where there is none)");
      }
    }
    gin.resize(n->inputs.size());

    for (size_t i = 0; i < n->next.size(); ++i) {
      Edge& e = n->next[i];
      if (!e.valid()) continue;
      if (gin[i].defined()) {
        checkGradShape(gin[i], n->inputs[i].shape(), n->inputs[i].dtype(), "op '" + def.name + "'");
        if (e.leaf) {
          leafGrads.add(e.leaf, gin[i]);
        } else {
          auto& buf = buffers[e.node.get()];
          buf.resize(e.node->outputMetas.size());
          buf[size_t(e.outputNr)] = accumulate(buf[size_t(e.outputNr)], gin[i]);
        }
      }
      if (e.node && --deps[e.node.get()] == 0 && queued.insert(e.node.get()).second)
        ready.push(e.node.get());
    }
    if (!retainGraph) {
      n->inputs.clear();
      n->outputs.clear();
      n->released = true;
    }
  }
  leafGrads.flush();
}

}  // namespace keel
