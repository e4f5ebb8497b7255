// matmul on the cpu backend: OpenBLAS sgemm/dgemm with broadcast batch dims. Operands are passed
// in place whenever their last two dims are row- or column-contiguous (a transposed layout becomes
// CblasTrans); only other layouts are copied. 16-bit floats go through float32 buffers.
#include <cblas.h>

#include "cpu_util.h"
#include "keel/runtime.h"
#include "kernels.h"
#include "matmul_layout.h"

namespace keel::cpu {
namespace {

// Products below this many multiply-adds run single-threaded inside OpenBLAS, so batches of them
// are spread over our own threads instead.
constexpr double kSmallGemm = 262144.0;

using detail::MatLayout;
constexpr auto classify = detail::classifyMatrix;  // engine/src/matmul_layout.h

// One operand: base pointer, its batch strides aligned to the output batch (0 = broadcast), and
// the BLAS view of its trailing matrix.
template <typename T>
struct Operand {
  const T* data = nullptr;
  Shape batchStrides;
  MatLayout mat;
  bool trans = false;   // effective CBLAS transpose flag
  std::vector<T> copy;  // owns a contiguous copy when the layout needed one
};

template <typename T>
Operand<T> makeOperand(const T* data, const Shape& shape, const Shape& strides, const Shape& batch,
                       bool transFlag) {
  Operand<T> op;
  const size_t r = shape.size();
  const int64_t rows = shape[r - 2], cols = shape[r - 1];
  Shape st = strides;
  op.data = data;
  op.mat = classify(rows, cols, st[r - 2], st[r - 1]);
  if (!op.mat.ok) {
    op.copy.resize(size_t(shapeNumel(shape)));
    Shape cs = contiguousStrides(shape);
    copyStrided(op.copy.data(), cs, data, strides, shape, sizeof(T));
    op.data = op.copy.data();
    st = cs;
    op.mat = classify(rows, cols, st[r - 2], st[r - 1]);
  }
  op.trans = transFlag != op.mat.colMajor;
  op.batchStrides.assign(batch.size(), 0);
  const size_t lead = batch.size() - (r - 2);
  for (size_t i = 0; i + 2 < r; ++i) op.batchStrides[lead + i] = shape[i] == 1 ? 0 : st[i];
  return op;
}

inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0f, a, blasint(lda), b, blasint(ldb), 0.0f, c,
              blasint(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0, a, blasint(lda), b, blasint(ldb), 0.0, c,
              blasint(ldc));
}

// C[batch, M, N] (contiguous) = op(A) op(B) for float or double operands of any layout.
template <typename T>
void batchedGemm(const T* pa, const Shape& as, const Shape& ast, bool transA, const T* pb,
                 const Shape& bs, const Shape& bst, bool transB, T* out, const Shape& os) {
  const size_t r = os.size();
  const Shape batch(os.begin(), os.end() - 2);
  const int64_t m = os[r - 2], n = os[r - 1];
  const int64_t k = transA ? as[as.size() - 2] : as[as.size() - 1];
  const int64_t nb = shapeNumel(batch);
  if (m == 0 || n == 0 || nb == 0) return;
  if (k == 0) {
    std::fill(out, out + nb * m * n, T(0));
    return;
  }
  Operand<T> a = makeOperand(pa, as, ast, batch, transA);
  Operand<T> b = makeOperand(pb, bs, bst, batch, transB);

  // Fold the batch into M when B is shared by every batch and A's rows run on through the batch.
  bool bShared =
      std::all_of(b.batchStrides.begin(), b.batchStrides.end(), [](int64_t s) { return s == 0; });
  if (nb > 1 && bShared && !a.trans) {
    bool fold = true;
    int64_t expect = m * a.mat.ld;
    for (size_t d = batch.size(); d-- > 0;) {
      if (batch[d] == 1) continue;
      if (a.batchStrides[d] != expect) fold = false;
      expect *= batch[d];
    }
    if (fold) {
      gemm(false, b.trans, nb * m, n, k, a.data, a.mat.ld, b.data, b.mat.ld, out, n);
      return;
    }
  }

  auto one = [&](int64_t p) {
    int64_t oa = 0, ob = 0, rem = p;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t i = rem % batch[d];
      rem /= batch[d];
      oa += i * a.batchStrides[d];
      ob += i * b.batchStrides[d];
    }
    gemm(a.trans, b.trans, m, n, k, a.data + oa, a.mat.ld, b.data + ob, b.mat.ld, out + p * m * n,
         n);
  };
  if (nb > 1 && double(m) * double(n) * double(k) < kSmallGemm) {
    parallelFor(nb, 1, [&](int64_t b0, int64_t e0) {
      for (int64_t p = b0; p < e0; ++p) one(p);
    });
  } else {
    for (int64_t p = 0; p < nb; ++p) one(p);
  }
}

template <typename T>
std::vector<float> toFloat(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  Tensor c = contig(t);
  const T* p = c.data<T>();
  parallelFor(int64_t(v.size()), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) v[size_t(i)] = load(p[i]);
  });
  return v;
}

}  // namespace

void kMatmul(const KernelCtx& c) {
  ensureBlasBuffer();  // Note [OpenBLAS under an address-space limit]
  const Tensor &a = c.inputs[0], &b = c.inputs[1], &out = c.outputs[0];
  const bool ta = c.attrs.getBool("trans_a"), tb = c.attrs.getBool("trans_b");
  KEEL_CHECK(a.dim() >= 2 && b.dim() >= 2 && out.dim() >= 2, "op '", c.op.name,
             "': operands must have rank >= 2");
  visitDType(a.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      batchedGemm<T>(a.data<T>(), a.shape(), a.strides(), ta, b.data<T>(), b.shape(), b.strides(),
                     tb, out.data<T>(), out.shape());
    } else if constexpr (k16Bit<T>) {
      std::vector<float> fa = toFloat<T>(a), fb = toFloat<T>(b);
      std::vector<float> fo(size_t(out.numel()));
      batchedGemm<float>(fa.data(), a.shape(), contiguousStrides(a.shape()), ta, fb.data(),
                         b.shape(), contiguousStrides(b.shape()), tb, fo.data(), out.shape());
      T* o = out.data<T>();
      parallelFor(out.numel(), kGrain, [&](int64_t b0, int64_t e0) {
        for (int64_t i = b0; i < e0; ++i) o[i] = store<T>(fo[size_t(i)]);
      });
    } else {
      unsupported(c, a.dtype());
    }
  });
}

}  // namespace keel::cpu
