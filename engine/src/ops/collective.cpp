// Op definitions, collectives across the ranks of a process group (keel/dist.h): inference
// (shapes depend on the group's size), backward rules in Megatron's convention (a collective's
// consumers are replicated across the group), and a describe rule that records the group, this
// rank, the collective's per-group number and its bytes. Kernels live in the backends.
#include "keel/dist.h"
#include "op_defs_util.h"

namespace keel::detail {

using namespace keel::ops;

namespace {

const std::string& groupOf(const Attrs& a) {
  return a.getString("group");
}

// This rank's block of g along dim (the gradient of all_gather).
Tensor ownBlock(const Tensor& g, int64_t dim, const std::string& group) {
  const dist::GroupInfo gi = dist::group(group);
  const int64_t block = g.size(dim) / gi.size;
  return contiguous(slice(g, dim, gi.rank * block, (gi.rank + 1) * block));
}

// Note [Recorded collectives]: a collective op's recorded attributes name its group, this rank's
// place in it, the collective's per-group number (the one the ring, the descriptor check and a
// hang report use) and the bytes this rank sends; the op's time is the time this rank waited.
void describeCollective(const std::string& kind, Inputs in, Attrs& a) {
  const std::string group = a.getString("group");  // a copy: set() below may move the attributes
  const dist::GroupInfo gi = dist::group(group);
  a.set("rank", int64_t(gi.rank));
  a.set("group_size", int64_t(gi.size));
  a.set("collective", kind + " #" + std::to_string(dist::groupSeq(group) + 1));
  a.set("bytes", int64_t(in[0].nbytes()));
}

}  // namespace

void defineCollectiveOps(OpTable& t) {
  t.family("Collectives");
  t.doc(OpId::AllReduce, "x", "op (sum, mean, max), group (world, dp, tp)", "like x",
        "every rank's x reduced; backward: the gradient as is (sum) or / group size (mean)");
  t.doc(OpId::CopyToGroup, "x", "group", "like x",
        "x; backward: the all_reduce sum of the ranks' gradients");
  t.doc(OpId::AllGather, "x", "dim, group", "x with dim × group size",
        "the ranks' x in rank order; backward: this rank's block");
  t.doc(OpId::ReduceScatter, "x", "dim, op (sum, mean, max), group", "x with dim / group size",
        "this rank's block of the reduction; backward: all_gather");
  t.doc(OpId::Broadcast, "x", "root, group", "like x", "the root's x; not differentiable");
  t.doc(OpId::AllToAll, "x [group size · n, ...]", "group", "like x",
        "block j of dim 0 to rank j, blocks received in rank order; backward: all_to_all");

  auto checkGroup = [](const OpDef& op, const Attrs& a) {
    try {
      return dist::group(groupOf(a));
    } catch (const Error& e) {
      throw Error("op '" + op.name + "': " + e.what());
    }
  };
  auto checkReduce = [](const OpDef& op, Inputs in, const Attrs& a) {
    const dist::ReduceOp r = dist::parseReduceOp(a.getString("op"));
    KEEL_CHECK(r != dist::ReduceOp::Mean || isFloating(in[0].dtype()), "op '", op.name,
               "': mean needs a floating-point tensor, got ", dtypeName(in[0].dtype()));
    return r;
  };

  for (OpId id : {OpId::AllReduce, OpId::CopyToGroup, OpId::Broadcast, OpId::AllToAll}) {
    OpDef& o = t.at(id, 1);
    o.infer = [id, checkGroup, checkReduce](const OpDef& op, Inputs in, const Attrs& a) {
      const dist::GroupInfo g = checkGroup(op, a);
      if (id == OpId::AllReduce) checkReduce(op, in, a);
      if (id == OpId::Broadcast)
        KEEL_CHECK(a.getInt("root") >= 0 && a.getInt("root") < g.size, "op '", op.name, "': root ",
                   a.getInt("root"), " is not a rank of group ", groupOf(a), " (", g.size,
                   " ranks)");
      if (id == OpId::AllToAll)
        KEEL_CHECK(in[0].dim() >= 1 && in[0].size(0) % g.size == 0, "op '", op.name, "': dim 0 of ",
                   shapeStr(in[0].shape()), " is not a multiple of group ", groupOf(a), "'s ",
                   g.size, " ranks");
      return inferUnary(in);
    };
  }
  t.at(OpId::AllGather, 1).infer = [checkGroup](const OpDef& op, Inputs in, const Attrs& a) {
    const dist::GroupInfo g = checkGroup(op, a);
    KEEL_CHECK(in[0].dim() >= 1, "op '", op.name, "': needs a tensor of rank >= 1");
    Shape s = in[0].shape();
    s[size_t(normDim(a.getInt("dim"), in[0].dim(), op.name))] *= g.size;
    return one(s, in[0].dtype());
  };
  t.at(OpId::ReduceScatter, 1).infer = [checkGroup, checkReduce](const OpDef& op, Inputs in,
                                                                 const Attrs& a) {
    const dist::GroupInfo g = checkGroup(op, a);
    checkReduce(op, in, a);
    KEEL_CHECK(in[0].dim() >= 1, "op '", op.name, "': needs a tensor of rank >= 1");
    const int64_t dim = normDim(a.getInt("dim"), in[0].dim(), op.name);
    KEEL_CHECK(in[0].size(dim) % g.size == 0, "op '", op.name, "': dim ", dim, " of ",
               shapeStr(in[0].shape()), " is not a multiple of group ", groupOf(a), "'s ", g.size,
               " ranks");
    Shape s = in[0].shape();
    s[size_t(dim)] /= g.size;
    return one(s, in[0].dtype());
  };

  t.at(OpId::AllReduce, 1).backward = [](const BackwardCtx& c) -> Grads {
    const dist::ReduceOp r = dist::parseReduceOp(c.attrs.getString("op"));
    KEEL_CHECK(r != dist::ReduceOp::Max, "all_reduce max is not differentiable");
    if (r == dist::ReduceOp::Sum) return {c.gradOutputs[0]};
    return {mulScalar(c.gradOutputs[0], 1.0 / double(dist::group(groupOf(c.attrs)).size))};
  };
  t.at(OpId::CopyToGroup, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {allReduce(c.gradOutputs[0], "sum", groupOf(c.attrs))};
  };
  t.at(OpId::AllGather, 1).backward = [](const BackwardCtx& c) -> Grads {
    const int64_t dim = normDim(c.attrs.getInt("dim"), c.inputs[0].dim(), "all_gather");
    return {ownBlock(c.gradOutputs[0], dim, groupOf(c.attrs))};
  };
  t.at(OpId::ReduceScatter, 1).backward = [](const BackwardCtx& c) -> Grads {
    const dist::ReduceOp r = dist::parseReduceOp(c.attrs.getString("op"));
    KEEL_CHECK(r != dist::ReduceOp::Max, "reduce_scatter max is not differentiable");
    Tensor g = allGather(c.gradOutputs[0], c.attrs.getInt("dim"), groupOf(c.attrs));
    if (r == dist::ReduceOp::Mean)
      g = mulScalar(g, 1.0 / double(dist::group(groupOf(c.attrs)).size));
    return {g};
  };
  t.at(OpId::AllToAll, 1).backward = [](const BackwardCtx& c) -> Grads {
    return {allToAll(c.gradOutputs[0], groupOf(c.attrs))};
  };

  const std::pair<OpId, const char*> kinds[] = {
      {OpId::AllReduce, "all_reduce"}, {OpId::CopyToGroup, "copy_to_group"},
      {OpId::AllGather, "all_gather"}, {OpId::ReduceScatter, "reduce_scatter"},
      {OpId::Broadcast, "broadcast"},  {OpId::AllToAll, "all_to_all"}};
  for (const auto& [id, kind] : kinds) {
    if (id == OpId::CopyToGroup) continue;  // no communication forward
    const std::string k = kind;
    t.at(id, 1).describe = [k](Inputs in, Attrs& a) { describeCollective(k, in, a); };
  }
}

}  // namespace keel::detail
