// The functional op API: attribute packing and dispatch, nothing else. Attribute names used here
// are the ones shape inference, kernels and backward rules read (see ops/op_defs.cpp).
#include "keel/ops.h"

#include "keel/error.h"

#include "shape_util.h"

namespace keel::ops {
namespace {
Tensor d1(OpId id, std::vector<Tensor> in, const Attrs& a = {}) {
  return dispatch1(id, std::move(in), a);
}
std::vector<int64_t> toInts(const Shape& s) {
  return std::vector<int64_t>(s.begin(), s.end());
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return d1(OpId::Add, {a, b});
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return d1(OpId::Sub, {a, b});
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return d1(OpId::Mul, {a, b});
}
Tensor div(const Tensor& a, const Tensor& b) {
  return d1(OpId::Div, {a, b});
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return d1(OpId::Pow, {a, b});
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return d1(OpId::Maximum, {a, b});
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return d1(OpId::Minimum, {a, b});
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return d1(OpId::Eq, {a, b});
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return d1(OpId::Lt, {a, b});
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return d1(OpId::Gt, {a, b});
}

Tensor neg(const Tensor& x) {
  return d1(OpId::Neg, {x});
}
Tensor exp(const Tensor& x) {
  return d1(OpId::Exp, {x});
}
Tensor log(const Tensor& x) {
  return d1(OpId::Log, {x});
}
Tensor sqrt(const Tensor& x) {
  return d1(OpId::Sqrt, {x});
}
Tensor rsqrt(const Tensor& x) {
  return d1(OpId::Rsqrt, {x});
}
Tensor tanh(const Tensor& x) {
  return d1(OpId::Tanh, {x});
}
Tensor sigmoid(const Tensor& x) {
  return d1(OpId::Sigmoid, {x});
}
Tensor relu(const Tensor& x) {
  return d1(OpId::Relu, {x});
}
Tensor gelu(const Tensor& x) {
  return d1(OpId::Gelu, {x});
}
Tensor silu(const Tensor& x) {
  return d1(OpId::Silu, {x});
}
Tensor abs(const Tensor& x) {
  return d1(OpId::Abs, {x});
}

Tensor addScalar(const Tensor& x, double s) {
  return d1(OpId::AddScalar, {x}, Attrs().set("scalar", s));
}
Tensor mulScalar(const Tensor& x, double s) {
  return d1(OpId::MulScalar, {x}, Attrs().set("scalar", s));
}
Tensor powScalar(const Tensor& x, double e) {
  return d1(OpId::PowScalar, {x}, Attrs().set("exponent", e));
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return d1(OpId::Sum, {x}, Attrs().set("dims", std::move(dims)).set("keepdim", keepdim));
}
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return d1(OpId::Mean, {x}, Attrs().set("dims", std::move(dims)).set("keepdim", keepdim));
}
Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return d1(OpId::Max, {x}, Attrs().set("dim", dim).set("keepdim", keepdim));
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return d1(OpId::Argmax, {x}, Attrs().set("dim", dim).set("keepdim", keepdim));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transA, bool transB) {
  return d1(OpId::Matmul, {a, b}, Attrs().set("trans_a", transA).set("trans_b", transB));
}

Tensor softmax(const Tensor& x, int64_t dim) {
  return d1(OpId::Softmax, {x}, Attrs().set("dim", dim));
}
Tensor logSoftmax(const Tensor& x, int64_t dim) {
  return d1(OpId::LogSoftmax, {x}, Attrs().set("dim", dim));
}
Tensor layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  return d1(OpId::LayerNorm, {x, weight, bias}, Attrs().set("eps", eps));
}
Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  return d1(OpId::RmsNorm, {x, weight}, Attrs().set("eps", eps));
}
Tensor embedding(const Tensor& weight, const Tensor& indices) {
  return d1(OpId::Embedding, {weight, indices});
}
Tensor crossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignoreIndex) {
  return d1(OpId::CrossEntropy, {logits, targets}, Attrs().set("ignore_index", ignoreIndex));
}
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  return d1(OpId::Dropout, {x},
            Attrs().set("p", p).set("seed", int64_t(seed)).set("offset", int64_t(offset)));
}
Tensor rope(const Tensor& x, double base, bool inverse) {
  return d1(OpId::Rope, {x}, Attrs().set("base", base).set("inverse", inverse));
}
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  if (!training || p == 0.0) return x;
  uint64_t off = gen.take(uint64_t(x.numel()));
  return dropout(x, p, gen.seed(), off);
}

namespace {
std::pair<Tensor, Tensor> flashmaskImpl(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& startendRowIndices, bool causal,
                                        int64_t windowSize, double dropout, double scale,
                                        uint64_t seed, uint64_t offset, const char* kind) {
  std::vector<Tensor> in{q, k, v};
  if (startendRowIndices.defined()) in.push_back(startendRowIndices);
  Attrs a;
  a.set("causal", causal)
      .set("window_size", windowSize)
      .set("dropout", dropout)
      .set("scale", scale)
      .set("seed", int64_t(seed))
      .set("offset", int64_t(offset));
  // The builder's kind is known only here; the rest of the mask's description is computed from
  // the inputs, for observers only (Note [FlashMask op attributes]).
  if (kind) a.set("mask", kind);
  auto outs = dispatch(OpId::FlashmaskAttention, std::move(in), a);
  return {outs.at(0), outs.at(1)};
}
// (seed, offset) of B*H*Sq*Sk dropout counters drawn from gen.
std::pair<uint64_t, uint64_t> dropoutCounters(const Tensor& q, const Tensor& k, Generator& gen) {
  uint64_t n = q.dim() == 4 ? uint64_t(q.size(0) * q.size(2) * q.size(1)) *
                                  uint64_t(k.dim() == 4 ? k.size(1) : 0)
                            : 0;
  uint64_t off = gen.take(n);
  return {gen.seed(), off};
}
}  // namespace

std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& startendRowIndices, bool causal,
                                             int64_t windowSize, double dropout, double scale,
                                             uint64_t seed, uint64_t offset) {
  return flashmaskImpl(q, k, v, startendRowIndices, causal, windowSize, dropout, scale, seed,
                       offset, nullptr);
}
std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& startendRowIndices, bool causal,
                                             int64_t windowSize, double dropout, double scale,
                                             Generator& gen, bool training) {
  if (!training || dropout == 0.0)
    return flashmaskAttention(q, k, v, startendRowIndices, causal, windowSize, 0.0, scale);
  auto [seed, off] = dropoutCounters(q, k, gen);
  return flashmaskAttention(q, k, v, startendRowIndices, causal, windowSize, dropout, scale, seed,
                            off);
}
std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const flashmask::Mask& mask, int64_t windowSize,
                                             double dropout, double scale, Generator* gen,
                                             bool training) {
  const char* kind = flashmask::maskKindName(mask.kind);
  if (!training || dropout == 0.0)
    return flashmaskImpl(q, k, v, mask.startendRowIndices, mask.causal, windowSize, 0.0, scale, 0,
                         0, kind);
  KEEL_CHECK(gen != nullptr, "flashmask_attention: dropout ", dropout,
             " while training needs a generator");
  auto [seed, off] = dropoutCounters(q, k, *gen);
  return flashmaskImpl(q, k, v, mask.startendRowIndices, mask.causal, windowSize, dropout, scale,
                       seed, off, kind);
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  return d1(OpId::Reshape, {x}, Attrs().set("shape", toInts(shape)));
}
Tensor view(const Tensor& x, const Shape& shape) {
  return d1(OpId::View, {x}, Attrs().set("shape", toInts(shape)));
}
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1_) {
  return d1(OpId::Transpose, {x}, Attrs().set("dim0", d0).set("dim1", d1_));
}
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  return d1(OpId::Permute, {x}, Attrs().set("dims", dims));
}
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return d1(OpId::Slice, {x},
            Attrs().set("dim", dim).set("start", start).set("end", end).set("step", step));
}
Tensor expand(const Tensor& x, const Shape& shape) {
  return d1(OpId::Expand, {x}, Attrs().set("shape", toInts(shape)));
}
Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  return d1(OpId::Concat, xs, Attrs().set("dim", dim));
}
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  return dispatch(OpId::Split, {x}, Attrs().set("sizes", sizes).set("dim", dim));
}
Tensor contiguous(const Tensor& x) {
  return d1(OpId::Contiguous, {x});
}
Tensor copyTo(const Tensor& x, Device device) {
  return d1(OpId::CopyTo, {x}, Attrs().set("device", device.name()));
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t d = normDim(dim, x.dim() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + d, 1);
  return reshape(x, s);
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = normDim(dim, x.dim(), "squeeze");
  KEEL_CHECK(x.shape()[size_t(d)] == 1, "op 'squeeze': dim ", dim, " of shape ",
             shapeStr(x.shape()), " is not 1");
  Shape s = x.shape();
  s.erase(s.begin() + d);
  return reshape(x, s);
}
Tensor flatten(const Tensor& x, int64_t startDim, int64_t endDim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s0 = normDim(startDim, x.dim(), "flatten"), e0 = normDim(endDim, x.dim(), "flatten");
  Shape s;
  int64_t prod = 1;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < s0 || i > e0)
      s.push_back(x.shape()[size_t(i)]);
    else
      prod *= x.shape()[size_t(i)];
    if (i == e0) s.push_back(prod);
  }
  return reshape(x, s);
}

Tensor indexSelect(const Tensor& x, int64_t dim, const Tensor& index) {
  return d1(OpId::IndexSelect, {x, index}, Attrs().set("dim", dim));
}
Tensor indexAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return d1(OpId::IndexAdd, {x, index, src}, Attrs().set("dim", dim));
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return d1(OpId::Gather, {x, index}, Attrs().set("dim", dim));
}
Tensor scatterAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return d1(OpId::ScatterAdd, {x, index, src}, Attrs().set("dim", dim));
}
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  auto o = dispatch(OpId::Topk, {x}, Attrs().set("k", k).set("dim", dim).set("largest", largest));
  return {o.at(0), o.at(1)};
}
Tensor argsort(const Tensor& x, int64_t dim, bool descending) {
  return d1(OpId::Argsort, {x}, Attrs().set("dim", dim).set("descending", descending));
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return d1(OpId::Where, {cond, a, b});
}
Tensor maskedFill(const Tensor& x, const Tensor& mask, double value) {
  return d1(OpId::MaskedFill, {x, mask}, Attrs().set("value", value));
}
Tensor cast(const Tensor& x, DType dtype) {
  return d1(OpId::Cast, {x}, Attrs().set("dtype", std::string(dtypeName(dtype))));
}

namespace {
Attrs factoryAttrs(const Shape& shape, DType dtype, Device device) {
  return Attrs()
      .set("shape", toInts(shape))
      .set("dtype", std::string(dtypeName(dtype)))
      .set("device", device.name());
}
}  // namespace

Tensor fill(const Shape& shape, double value, DType dtype, Device device) {
  return d1(OpId::Fill, {}, factoryAttrs(shape, dtype, device).set("value", value));
}
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed, uint64_t offset,
               DType dtype, Device device) {
  return d1(OpId::Uniform, {},
            factoryAttrs(shape, dtype, device)
                .set("low", low)
                .set("high", high)
                .set("seed", int64_t(seed))
                .set("offset", int64_t(offset)));
}
Tensor uniform(const Shape& shape, double low, double high, Generator& gen, DType dtype,
               Device device) {
  uint64_t off = gen.take(uint64_t(shapeNumel(shape)));
  return uniform(shape, low, high, gen.seed(), off, dtype, device);
}
Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed, uint64_t offset,
              DType dtype, Device device) {
  return d1(OpId::Normal, {},
            factoryAttrs(shape, dtype, device)
                .set("mean", mean)
                .set("std", stddev)
                .set("seed", int64_t(seed))
                .set("offset", int64_t(offset)));
}
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen, DType dtype,
              Device device) {
  uint64_t off = gen.take(uint64_t(shapeNumel(shape)));
  return normal(shape, mean, stddev, gen.seed(), off, dtype, device);
}
Tensor arange(int64_t n, DType dtype, Device device) {
  return d1(OpId::Arange, {}, factoryAttrs({n}, dtype, device));
}

void sgdStep(const Tensor& param, const Tensor& grad, const Tensor& momentumBuf, double lr,
             double momentum, double weightDecay, bool nesterov) {
  dispatch(OpId::SgdStep, {param, grad, momentumBuf},
           Attrs()
               .set("lr", lr)
               .set("momentum", momentum)
               .set("weight_decay", weightDecay)
               .set("nesterov", nesterov));
}
void adamwStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr,
               double beta1, double beta2, double eps, double weightDecay, int64_t step) {
  dispatch(OpId::AdamwStep, {param, grad, m, v},
           Attrs()
               .set("lr", lr)
               .set("beta1", beta1)
               .set("beta2", beta2)
               .set("eps", eps)
               .set("weight_decay", weightDecay)
               .set("step", step));
}

Tensor allReduce(const Tensor& x, const std::string& op, const std::string& group) {
  return d1(OpId::AllReduce, {x}, Attrs().set("op", op).set("group", group));
}
Tensor copyToGroup(const Tensor& x, const std::string& group) {
  return d1(OpId::CopyToGroup, {x}, Attrs().set("group", group));
}
Tensor allGather(const Tensor& x, int64_t dim, const std::string& group) {
  return d1(OpId::AllGather, {x}, Attrs().set("dim", dim).set("group", group));
}
Tensor reduceScatter(const Tensor& x, int64_t dim, const std::string& op,
                     const std::string& group) {
  return d1(OpId::ReduceScatter, {x}, Attrs().set("dim", dim).set("op", op).set("group", group));
}
Tensor broadcast(const Tensor& x, int64_t root, const std::string& group) {
  return d1(OpId::Broadcast, {x}, Attrs().set("root", root).set("group", group));
}
Tensor allToAll(const Tensor& x, const std::string& group) {
  return d1(OpId::AllToAll, {x}, Attrs().set("group", group));
}

}  // namespace keel::ops
