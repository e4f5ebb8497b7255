// The collective ops' kernels (see collective_kernels.h).
#include "collective_kernels.h"

#include <mpi.h>

#include <cstring>
#include <vector>

#include "keel/dist.h"
#include "keel/error.h"

namespace keel::detail {
namespace {

// x's elements in row-major order: straight from its buffer when contiguous, else gathered.
const uint8_t* contiguousBytes(const Tensor& x, std::vector<uint8_t>& scratch) {
  if (x.isContiguous()) return static_cast<const uint8_t*>(x.data());
  const size_t es = dtypeSize(x.dtype());
  scratch.resize(size_t(x.numel()) * es);
  const auto* base = static_cast<const uint8_t*>(x.data());
  const Shape& shape = x.shape();
  const Shape& strides = x.strides();
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    std::memcpy(scratch.data() + size_t(i) * es, base + off * int64_t(es), es);
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
  return scratch.data();
}

// [outer, n, inner] as one block per rank along the middle dim: the parts of a dim-`dim` gather
// or scatter (outer = the product of the dims before dim, inner = after).
struct Split3 {
  int64_t outer = 1, inner = 1;
};
Split3 around(const Shape& s, int64_t dim) {
  Split3 r;
  for (int64_t d = 0; d < dim; ++d) r.outer *= s[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < s.size(); ++d) r.inner *= s[d];
  return r;
}

int64_t dimAttr(const KernelCtx& c) {
  const int64_t d = c.attrs.getInt("dim");
  return d < 0 ? d + c.inputs[0].dim() : d;
}

dist::Call callOf(const KernelCtx& c, int64_t extra) {
  const Tensor& x = c.inputs[0];
  return dist::Call{c.op.name, c.attrs.getString("group"), x.dtype(), x.numel(), extra};
}

}  // namespace

// Note [Reference all-reduce]: cpu-ref's all_reduce (and its reduce_scatter) gather every rank's
// tensor and reduce in rank order in float64, rounded once: obviously the same bits on every
// rank, whatever algorithm MPI picks; the cpu backend calls MPI_Allreduce / Reduce_scatter.
void collectiveKernel(OpId op, const KernelCtx& c, bool reference) {
  const Tensor& x = c.inputs[0];
  const Tensor& out = c.outputs[0];
  std::vector<uint8_t> scratch;
  const uint8_t* in = contiguousBytes(x, scratch);
  const size_t es = dtypeSize(x.dtype());
  void* o = out.data();
  switch (op) {
    case OpId::AllReduce: {
      const dist::ReduceOp r = dist::parseReduceOp(c.attrs.getString("op"));
      if (reference)
        dist::allReduceInRankOrder(callOf(c, 0), in, o, r);
      else
        dist::allReduce(callOf(c, 0), in, o, r);
      return;
    }
    case OpId::CopyToGroup:
      std::memcpy(o, in, size_t(x.numel()) * es);
      return;
    case OpId::Broadcast:
      std::memcpy(o, in, size_t(x.numel()) * es);
      dist::broadcast(callOf(c, c.attrs.getInt("root")), o, int(c.attrs.getInt("root")));
      return;
    case OpId::AllToAll:
      dist::allToAll(callOf(c, 0), in, o);
      return;
    case OpId::AllGather: {
      const int64_t dim = dimAttr(c);
      const Split3 s = around(x.shape(), dim);
      const int size = dist::group(c.attrs.getString("group")).size;
      if (s.outer == 1) {
        dist::allGather(callOf(c, dim), in, o);
        return;
      }
      std::vector<uint8_t> all(size_t(x.numel()) * es * size_t(size));
      dist::allGather(callOf(c, dim), in, all.data());
      // all: [rank][outer][n][inner] -> out: [outer][rank][n][inner].
      const size_t row = size_t(x.size(dim) * s.inner) * es;
      for (int r = 0; r < size; ++r)
        for (int64_t i = 0; i < s.outer; ++i)
          std::memcpy(static_cast<uint8_t*>(o) + (size_t(i) * size_t(size) + size_t(r)) * row,
                      all.data() + (size_t(r) * size_t(s.outer) + size_t(i)) * row, row);
      return;
    }
    case OpId::ReduceScatter: {
      const int64_t dim = dimAttr(c);
      const Split3 s = around(x.shape(), dim);
      const dist::GroupInfo g = dist::group(c.attrs.getString("group"));
      const dist::ReduceOp r = dist::parseReduceOp(c.attrs.getString("op"));
      const size_t row = size_t(x.size(dim) / g.size * s.inner) * es;  // one rank's block row
      // Blocks rank-major: [outer][rank][m][inner] -> [rank][outer][m][inner].
      std::vector<uint8_t> blocks;
      const uint8_t* send = in;
      if (s.outer > 1) {
        blocks.resize(size_t(x.numel()) * es);
        for (int k = 0; k < g.size; ++k)
          for (int64_t i = 0; i < s.outer; ++i)
            std::memcpy(blocks.data() + (size_t(k) * size_t(s.outer) + size_t(i)) * row,
                        in + (size_t(i) * size_t(g.size) + size_t(k)) * row, row);
        send = blocks.data();
      }
      if (!reference) {
        dist::reduceScatter(callOf(c, dim), send, o, r);
        return;
      }
      std::vector<uint8_t> sum(size_t(x.numel()) * es);
      dist::allReduceInRankOrder(callOf(c, dim), send, sum.data(), r);
      std::memcpy(o, sum.data() + size_t(g.rank) * size_t(s.outer) * row, size_t(s.outer) * row);
      return;
    }
    default:
      throw Error("op '" + c.op.name + "' is not a collective");
  }
}

std::string collectiveParams(const KernelCtx& c) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string lib(version, size_t(std::max(0, len)));
  lib = lib.substr(0, lib.find(','));  // "Open MPI v4.1.4"
  const dist::GroupInfo g = dist::group(c.attrs.getString("group"));
  return lib + ", group " + c.attrs.getString("group") + " of " + std::to_string(g.size);
}

}  // namespace keel::detail
