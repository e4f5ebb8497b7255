// Copies and shared plumbing of the cpu backend: strided copy (memcpy rows, tiled transposes),
// contiguous / copy_to / concat / slice_backward, index loading and checking, error helpers.
// Copies move bytes only, so they are exact for every dtype.
#include <cstring>

#include "cpu_util.h"
#include "kernels.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace keel::cpu {
namespace {

template <typename E>
void copyRows(char* dst, const char* src, const Layout<2>& l) {
  const int64_t sd = l.innerStride(0), ss = l.innerStride(1);
  parallelLayout(l, kGrain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    E* d = reinterpret_cast<E*>(dst) + off[0];
    const E* s = reinterpret_cast<const E*>(src) + off[1];
    if (sd == 1 && ss == 1)
      std::memcpy(d, s, size_t(n) * sizeof(E));
    else if (sd == 1 && ss == 0)
      std::fill(d, d + n, s[0]);
    else
      for (int64_t i = 0; i < n; ++i) d[i * sd] = s[i * ss];
  });
}

// The last two coalesced dims are [P, Q] with src strides [1, sq]: a batch of transposes, done in
// 32x32 tiles so that both sides stay in cache.
template <typename E>
void copyTransposed(char* dstBytes, const char* srcBytes, const Layout<2>& l) {
  E* dst = reinterpret_cast<E*>(dstBytes);
  const E* src = reinterpret_cast<const E*>(srcBytes);
  const size_t nd = l.shape.size();
  const int64_t p = l.shape[nd - 2], q = l.shape[nd - 1];
  const int64_t dp = l.strides[0][nd - 2], dq = l.strides[0][nd - 1];
  const int64_t sp = l.strides[1][nd - 2], sq = l.strides[1][nd - 1];
  int64_t outer = 1;
  for (size_t d = 0; d + 2 < nd; ++d) outer *= l.shape[d];
  constexpr int64_t kTile = 32;
  const int64_t tp = (p + kTile - 1) / kTile, tq = (q + kTile - 1) / kTile;
  parallelFor(outer * tp * tq, std::max<int64_t>(1, kGrain / (kTile * kTile)),
              [&](int64_t b, int64_t e) {
                for (int64_t u = b; u < e; ++u) {
                  int64_t o = u / (tp * tq), rem = u % (tp * tq);
                  int64_t i0 = (rem / tq) * kTile, j0 = (rem % tq) * kTile;
                  int64_t od = 0, os = 0;
                  for (size_t d = nd - 2; d-- > 0;) {
                    int64_t idx = o % l.shape[d];
                    o /= l.shape[d];
                    od += idx * l.strides[0][d];
                    os += idx * l.strides[1][d];
                  }
                  const int64_t i1 = std::min(p, i0 + kTile), j1 = std::min(q, j0 + kTile);
                  for (int64_t i = i0; i < i1; ++i) {  // dst rows contiguous, src read strided
                    E* d = dst + od + i * dp;
                    const E* s = src + os + i * sp;
                    for (int64_t j = j0; j < j1; ++j) d[j * dq] = s[j * sq];
                  }
                }
              });
}

template <typename E>
void copyTyped(void* dst, const void* src, const Layout<2>& l) {
  const size_t nd = l.shape.size();
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (nd >= 2 && l.innerStride(0) == 1 && l.innerStride(1) != 1 && l.strides[1][nd - 2] == 1 &&
      l.inner >= 4 && l.shape[nd - 2] >= 4)
    copyTransposed<E>(d, s, l);
  else
    copyRows<E>(d, s, l);
}

}  // namespace

void copyStrided(void* dst, const Shape& dstStrides, const void* src, const Shape& srcStrides,
                 const Shape& shape, size_t elemSize) {
  Layout<2> l = makeLayout<2>(shape, {dstStrides, srcStrides});
  if (l.rows == 0 || l.inner == 0) return;
  visitWidth(elemSize, [&]<typename E>() { copyTyped<E>(dst, src, l); });
}

void copyToContiguous(const Tensor& t, void* dst) {
  copyStrided(dst, contiguousStrides(t.shape()), t.data(), t.strides(), t.shape(),
              dtypeSize(t.dtype()));
}

Tensor contig(const Tensor& t) {
  if (t.isContiguous()) return t;
  Tensor out = makeTensor(t.shape(), t.dtype(), t.device());
  copyToContiguous(t, out.data());
  return out;
}

void unsupported(const KernelCtx& c, DType t) {
  throw Error(detail::concat("op '", c.op.name, "' on backend 'cpu' does not support dtype ",
                             dtypeName(t)));
}

void throwIndex(std::string_view op, int64_t idx, int64_t extent) {
  throw Error(detail::concat("op '", op, "': index ", idx, " is out of range for extent ", extent));
}

std::vector<int64_t> readIndices(std::string_view op, const Tensor& idx) {
  KEEL_CHECK(idx.dtype() == DType::Int32 || idx.dtype() == DType::Int64, "op '", op,
             "': index tensor must be int32 or int64, got ", dtypeName(idx.dtype()));
  std::vector<int64_t> v(size_t(idx.numel()));
  if (v.empty()) return v;
  Layout<1> l = makeLayout<1>(idx.shape(), {idx.strides()});
  const int64_t s = l.innerStride(0);
  int64_t at = 0;
  auto read = [&]<typename I>(const I* p) {
    forUnits(l, 1, l.inner, 0, l.rows, [&](const std::array<int64_t, 1>& off, int64_t n) {
      for (int64_t i = 0; i < n; ++i) v[size_t(at++)] = int64_t(p[off[0] + i * s]);
    });
  };
  if (idx.dtype() == DType::Int32)
    read(idx.data<int32_t>());
  else
    read(idx.data<int64_t>());
  return v;
}

std::vector<int64_t> loadIndices(std::string_view op, const Tensor& idx, int64_t extent) {
  std::vector<int64_t> v = readIndices(op, idx);
  for (int64_t i : v) checkIndex(op, i, extent);
  return v;
}

void sqrtArray(const float* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(in + i)));
  for (; i < n; ++i) out[i] = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(in[i])));
#else
  for (; i < n; ++i) out[i] = std::sqrt(in[i]);
#endif
}

void sqrtArray(const double* in, double* out, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  for (; i + 2 <= n; i += 2) _mm_storeu_pd(out + i, _mm_sqrt_pd(_mm_loadu_pd(in + i)));
  for (; i < n; ++i) out[i] = _mm_cvtsd_f64(_mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(in[i])));
#else
  for (; i < n; ++i) out[i] = std::sqrt(in[i]);
#endif
}

// ---------------------------------------------------------------- kernels

void kContiguous(const KernelCtx& c) {
  copyToContiguous(c.inputs[0], c.outputs[0].data());
}

void kCopyTo(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  KEEL_CHECK(out.device().isHost(), "op '", c.op.name, "': the cpu backend cannot copy to device ",
             out.device().name());
  copyToContiguous(c.inputs[0], out.data());
}

void kConcat(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  const size_t elem = dtypeSize(out.dtype());
  const Shape& os = out.strides();
  int64_t base = 0;
  for (const Tensor& t : c.inputs) {
    KEEL_CHECK(t.dtype() == out.dtype() && t.dim() == out.dim(), "op '", c.op.name,
               "': inputs must share dtype and rank");
    char* dst = static_cast<char*>(out.data()) + size_t(base * os[size_t(d)]) * elem;
    copyStrided(dst, os, t.data(), t.strides(), t.shape(), elem);
    base += t.size(d);
  }
}

void kSliceBackward(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &out = c.outputs[0];
  const auto [d, s0, len, step] = slicePlace(c);
  const size_t elem = dtypeSize(out.dtype());
  char* o = static_cast<char*>(out.data());
  const int64_t bytes = out.numel() * int64_t(elem);
  parallelFor(bytes, kGrain * 4,
              [&](int64_t b, int64_t e) { std::memset(o + b, 0, size_t(e - b)); });
  Shape st = out.strides();
  char* dst = o + size_t(s0 * st[size_t(d)]) * elem;
  st[size_t(d)] *= step;
  copyStrided(dst, st, g.data(), g.strides(), g.shape(), elem);
}

}  // namespace keel::cpu
