// Tensor handles: construction, views, host read-back, autograd entry points.
#include "keel/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>

#include "cuda_backend.h"
#include "keel/autograd.h"
#include "keel/observer.h"
#include "keel/ops.h"
#include "kernel_util.h"
#include "shape_util.h"

namespace keel {
namespace {
std::atomic<uint64_t> g_nextTensorId{1};
}

Tensor makeTensor(const Shape& shape, DType dtype, Device device) {
  // Overflow-checked: an element or byte count past 2^63 would wrap into a small buffer.
  int64_t numel = 1, bytes = 0;
  for (int64_t d : shape) {
    KEEL_CHECK(d >= 0, "cannot create a tensor of shape ", shapeStr(shape), ": negative extent");
    KEEL_CHECK(!__builtin_mul_overflow(numel, d, &numel), "cannot create a tensor of shape ",
               shapeStr(shape), ": more than 2^63 elements");
  }
  KEEL_CHECK(!__builtin_mul_overflow(numel, int64_t(dtypeSize(dtype)), &bytes),
             "cannot create a tensor of shape ", shapeStr(shape), " of ", dtypeName(dtype),
             ": more than 2^63 bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguousStrides(shape);
  impl->dtype = dtype;
  impl->buffer = std::make_shared<Buffer>(size_t(bytes), device);
  impl->id = g_nextTensorId.fetch_add(1, std::memory_order_relaxed);
  return Tensor(std::move(impl));
}

Tensor Tensor::makeView(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->buffer = base.buffer();
  impl->id = g_nextTensorId.fetch_add(1, std::memory_order_relaxed);
  return Tensor(std::move(impl));
}

namespace {
// The bytes of a contiguous tensor moved between a cuda device and a host tensor of the same
// shape and dtype, outside the op stream (no op for observers: as for host reads and writes).
void copyBytes(const Tensor& dst, const Tensor& src) {
  const bool dstDev = !dst.device().isHost(), srcDev = !src.device().isHost();
  const Device d = dstDev ? dst.device() : src.device();
  detail::cudaApiFor(d).copy(d.index, dst.data(), dstDev, src.data(), srcDev, src.nbytes());
}
}  // namespace

Tensor hostCopy(const Tensor& t) {
  if (t.device().isHost()) return t;
  Tensor h = makeTensor(t.shape(), t.dtype(), Device(Backend::Cpu));
  if (t.isContiguous() || t.numel() == 0) {
    if (t.numel() > 0) copyBytes(h, t);
    return h;
  }
  // A strided view: the bytes its elements span come back whole, then are gathered here (no op
  // runs, so an observer may call this while it handles an op).
  int64_t span = 1;
  for (size_t d = 0; d < t.shape().size(); ++d) span += (t.shape()[d] - 1) * t.strides()[d];
  Tensor raw = Tensor::makeView(t, {span}, {1}, t.offset());
  Tensor hr = makeTensor({span}, t.dtype(), Device(Backend::Cpu));
  copyBytes(hr, raw);
  const size_t es = dtypeSize(t.dtype());
  const char* src = static_cast<const char*>(hr.data());
  char* dst = static_cast<char*>(h.data());
  for (int64_t i = 0; i < t.numel(); ++i)
    std::memcpy(dst + size_t(i) * es, src + size_t(stridedOffset(i, t.shape(), t.strides())) * es,
                es);
  return h;
}

void copyFromHost(const Tensor& t, const void* src, DType srcType, int64_t n) {
  KEEL_CHECK(t.isContiguous(), "copyFromHost needs a contiguous tensor");
  if (!t.device().isHost()) {  // staged through a host tensor of t's dtype
    Tensor h = makeTensor(t.shape(), t.dtype(), Device(Backend::Cpu));
    copyFromHost(h, src, srcType, n);
    beforeBufferWrite(t);
    copyBytes(t, h);
    t.bumpVersion();
    return;
  }
  KEEL_CHECK(n == t.numel(), "copyFromHost: ", n, " values for a tensor of shape ",
             shapeStr(t.shape()));
  beforeBufferWrite(t);  // See Observer::onBufferWrite
  visitDType(srcType, [&]<typename S>() {
    const S* s = static_cast<const S*>(src);
    visitDType(t.dtype(), [&]<typename D>() {
      D* d = t.data<D>();
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<D, bool>)
          d[i] = double(s[i]) != 0.0;
        else if constexpr (!kIsFloat<D> && !kIsFloat<S>)
          d[i] = D(s[i]);  // int -> int: exact
        else if constexpr (std::is_same_v<D, double>)
          d[i] = double(s[i]);
        else if constexpr (kIsFloat<D>)
          d[i] = D(float(double(s[i])));
        else
          d[i] = D(double(s[i]));
      }
    });
  });
  t.bumpVersion();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  return makeTensor(shape, dtype, device);
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return ops::fill(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return ops::fill(shape, 1.0, dtype, device);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  return ops::fill(shape, value, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return ops::fill({}, value, dtype, device);
}

template <typename T>
Tensor Tensor::fromVector(const std::vector<T>& values, const Shape& shape, DType dtype,
                          Device device) {
  KEEL_CHECK(int64_t(values.size()) == shapeNumel(shape), "fromVector: ", values.size(),
             " values do not fill shape ", shapeStr(shape));
  Tensor t = makeTensor(shape, dtype, device);
  copyFromHost(t, values.data(), DTypeOf<T>::value, int64_t(values.size()));
  return t;
}
template Tensor Tensor::fromVector<float>(const std::vector<float>&, const Shape&, DType, Device);
template Tensor Tensor::fromVector<double>(const std::vector<double>&, const Shape&, DType, Device);
template Tensor Tensor::fromVector<int32_t>(const std::vector<int32_t>&, const Shape&, DType,
                                            Device);
template Tensor Tensor::fromVector<int64_t>(const std::vector<int64_t>&, const Shape&, DType,
                                            Device);

void Tensor::undefinedTensor() {
  throw Error(
      "use of an undefined Tensor (default-constructed, moved from, or a grad() before "
      "backward): check defined() first");
}

int64_t Tensor::size(int64_t d) const {
  int64_t r = dim();
  int64_t n = d < 0 ? d + r : d;
  KEEL_CHECK(n >= 0 && n < r, "size(", d, ") out of range for shape ", shapeStr(shape()));
  return shape()[size_t(n)];
}

bool Tensor::isContiguous() const {
  int64_t expect = 1;
  const Shape &sh = shape(), &st = strides();
  for (int64_t d = dim() - 1; d >= 0; --d) {
    int64_t s = sh[size_t(d)];
    if (s == 1) continue;
    if (st[size_t(d)] != expect) return false;
    expect *= s;
  }
  return true;
}

Tensor& Tensor::setRequiresGrad(bool r) {
  KEEL_CHECK(!r || isFloating(dtype()), "only floating-point tensors can require grad, got ",
             dtypeName(dtype()));
  KEEL_CHECK(isLeaf(), "setRequiresGrad on a non-leaf tensor: use detach() first");
  d().requiresGrad = r;
  return *this;
}

Tensor Tensor::grad() const {
  return d().grad ? Tensor(impl_->grad) : Tensor();
}

void Tensor::setGrad(const Tensor& g) const {
  if (g.defined())
    KEEL_CHECK(g.shape() == shape() && g.dtype() == dtype(), "setGrad: gradient ",
               shapeStr(g.shape()), " ", dtypeName(g.dtype()), " does not match tensor ",
               shapeStr(shape()), " ", dtypeName(dtype()));
  d().grad = g.implPtr();
}

Tensor Tensor::detach() const {
  return makeView(*this, shape(), strides(), offset());
}

void Tensor::backward(const Tensor& grad, bool retainGraph) const {
  KEEL_CHECK(defined(), "backward() of an undefined Tensor");
  runBackward({*this}, {grad}, retainGraph);
}

void Tensor::registerHook(TensorHook hook) const {
  KEEL_CHECK(defined(), "registerHook on an undefined Tensor");
  KEEL_CHECK(requiresGrad(), "registerHook on a tensor that does not require grad");
  if (isLeaf())
    impl_->leafHooks.push_back(std::move(hook));
  else
    impl_->gradFn->outputHooks[size_t(impl_->outputNr)].push_back(std::move(hook));
}

template <typename T>
std::vector<T> Tensor::toVector() const {
  Tensor c = hostCopy(*this);
  if (!c.isContiguous()) {
    NoGradGuard ng;
    c = ops::contiguous(*this);
  }
  std::vector<T> out(size_t(c.numel()));
  visitDType(c.dtype(), [&]<typename S>() {
    const S* s = c.data<S>();
    for (size_t i = 0; i < out.size(); ++i) {
      if constexpr (kIsFloat<S>)
        out[i] = T(double(s[i]));
      else
        out[i] = T(s[i]);
    }
  });
  return out;
}
template std::vector<float> Tensor::toVector<float>() const;
template std::vector<double> Tensor::toVector<double>() const;
template std::vector<int32_t> Tensor::toVector<int32_t>() const;
template std::vector<int64_t> Tensor::toVector<int64_t>() const;

double Tensor::item() const {
  KEEL_CHECK(numel() == 1, "item() needs a one-element tensor, got shape ", shapeStr(shape()));
  return toVector<double>()[0];
}

Tensor Tensor::to(Device d) const {
  return d == device() ? *this : ops::copyTo(*this, d);
}
Tensor Tensor::contiguous() const {
  return isContiguous() ? *this : ops::contiguous(*this);
}

std::string Tensor::toString(int64_t maxElements) const {
  if (!defined()) return "Tensor(undefined)";  // printing a grad() before backward segfaulted
  std::ostringstream os;
  os << "Tensor(" << shapeStr(shape()) << ", " << dtypeName(dtype()) << ", " << device().name();
  auto put = [&](const auto& v) {
    os << ", [";
    for (int64_t i = 0; i < std::min<int64_t>(maxElements, int64_t(v.size())); ++i)
      os << (i ? ", " : "") << v[size_t(i)];
    if (int64_t(v.size()) > maxElements) os << ", ...";
    os << "]";
  };
  if (isFloating(dtype()))
    put(toVector<double>());
  else
    put(toVector<int64_t>());  // exact: 2147483647 printed as 2.14748e+09
  os << ")";
  return os.str();
}

}  // namespace keel
