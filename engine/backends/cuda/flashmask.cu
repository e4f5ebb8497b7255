// flashmask_attention and its backward on the cuda backend: FlashAttention-2 tiles (FMA arithmetic
// in the compute type: float32 for float32 and the 16-bit floats, float64 for float64), fully
// masked (query tile x key tile) pairs skipped from per-key-tile min/max of the column bounds.
// Invariant: every output element is written by one thread block that sums in an order fixed by
// the shapes (no atomics), so two runs give the same bits (Note [cuda FlashMask]).
#include <cmath>
#include <cstdint>

#include "cuda_util.cuh"
#include "flashmask_plan.h"
#include "kernels.h"

namespace keel::cuda {
namespace {

namespace fp = keel::cuda::fmplan;

// Note [cuda FlashMask]
// Geometry and mask semantics are Note [FlashMask geometry] (flashmask/flashmask_geometry.h); the
// plan (tile sizes, grids, shared memory) is flashmask_plan.h. Every block has 256 threads laid out
// 16 x 16: thread (ty, tx) owns tile rows ty + 16i and tile columns tx + 16j, so the 16 threads of
// one row are a half-warp and row max / row sum are half-warp butterflies (the same bits in every
// lane, since + and max are commutative).
//
// Mask pre-pass: one kernel writes the canonical column bounds (lts, lte, uts, ute) of every
// (batch, mask head, key) as readBounds does, a second the min/max of each bound over every key
// tile (TileMinMax), both into temporary keel Tensors. The first also checks the values as
// validateIndices does on the host (every bound in [0, Sq], starts not above ends) and reports a
// bad one through the deferred error word (IndexOutOfRange). Every block classifies each (query
// tile, key tile) pair it meets with fp::classifyTile (the host's classify): Skip pairs are not
// visited at all, Unmasked pairs check only the sequence ends (tail tiles), Partial pairs evaluate
// the element mask from the column bounds. Without an index tensor the bounds are the constants
// (Sq, Sq, 0, 0) and only causal / window geometry classifies.
//
// Forward: one block per (query tile of Br rows, head, batch). The Q tile (times the scale) stays
// in shared memory; K then V of each visited key tile stream through one shared buffer. Scores S
// = Q K^T in registers (rm x rn per thread), masked to -inf, then the online softmax in the
// compute type: running max m and sum l per row, the accumulator rescaled by exp(m_old - m_new);
// P (times the dropout factor, which l does not see) goes through shared memory into O += P V. A
// row that saw no key ends with l = 0: output 0, lse -inf.
//
// Backward, deterministic without atomics: (1) D_i = rowsum(dO * O) - grad_lse_i (float64 sum
// over a warp in a fixed tree), and lse copied to the compute type; (2) one block per (key tile,
// kv head, batch) keeps K, V and its dK, dV accumulators, walks the query heads of its group and
// the query tiles in order, recomputes P = exp(S - lse) and dS = P (dP - D) with dP = dO V^T (both
// times the dropout factor as the forward applied it) and adds dV += P^T dO, dK += dS^T (scale Q);
// (3) one block per (query tile, head, batch) walks the key tiles in order and adds dQ += dS K,
// times the scale at the end. Both backward kernels share one tile shape (fp::backwardConfig) and
// skip the pairs it classifies Skip. A skipped pair would contribute exact zeros (P = 0, the
// rescale factor exactly 1), so skip_tiles = false gives the same values in both directions.
// Arithmetic is plain FMA on CUDA cores (no tensor cores), so float32 is not rounded to TF32.

constexpr unsigned kFull = 0xffffffffu;

struct View4 {
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};
View4 view4(const Tensor& t) {
  const Shape& s = t.strides();
  return {s[0], s[1], s[2], s[3]};
}
struct View3 {
  int64_t s0 = 0, s1 = 0, s2 = 0;
};
View3 view3(const Tensor& t) {
  const Shape& s = t.strides();
  return {s[0], s[1], s[2]};
}

// Canonical bounds of one key column: query rows [lts, lte) and [uts, ute) do not see it.
struct ColB {
  int32_t lts, lte, uts, ute;
};

// The problem: q [b, sq, h, d], k and v [b, sk, hk, d], grp = h / hk, hm mask heads (1 or hk).
struct Geo {
  int64_t b, sq, h, d, sk, hk, grp, hm, nqt, nkt;
  bool causal, skip;
  int64_t window;  // -1: off
  double p;        // dropout probability
  uint64_t seed, offset;
};

template <typename C>
__device__ __forceinline__ C expC(C x) {
  if constexpr (std::is_same_v<C, double>)
    return exp(x);
  else
    return expf(x);
}
template <typename C>
__device__ __forceinline__ C logC(C x) {
  if constexpr (std::is_same_v<C, double>)
    return log(x);
  else
    return logf(x);
}

template <typename C>
__device__ __forceinline__ C halfWarpMax(C v) {
  for (int o = 8; o > 0; o >>= 1) {
    const C w = __shfl_xor_sync(kFull, v, o);
    v = w > v ? w : v;
  }
  return v;
}
template <typename C>
__device__ __forceinline__ C halfWarpSum(C v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// keel::philoxUniform on the device: Philox4x32-10 of counter offset + i, 24 bits in [0, 1).
__device__ __forceinline__ float philoxUniformD(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t c = offset + i;
  uint32_t c0 = uint32_t(c), c1 = uint32_t(c >> 32), c2 = 0x4b45454cu, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return float(c0 >> 8) * (1.0f / 16777216.0f);
}

// The dropout factor of (b, h, i, j): 0 or keep = 1 / (1 - p), as the cpu kernels draw it.
template <typename C>
__device__ __forceinline__ C dropFactor(const Geo& g, int64_t bi, int64_t h, int64_t i, int64_t j,
                                        C keep) {
  const uint64_t e = uint64_t(((bi * g.h + h) * g.sq + i) * g.sk + j);
  return double(philoxUniformD(g.seed, g.offset, e)) >= g.p ? keep : C(0);
}

__device__ __forceinline__ ColB colBounds(const ColB* bnd, const Geo& g, int64_t bm, int64_t j) {
  if (bnd) return bnd[bm * g.sk + j];
  return {int32_t(g.sq), int32_t(g.sq), 0, 0};
}

__device__ __forceinline__ bool maskedAt(const ColB& cb, const Geo& g, int64_t i, int64_t j) {
  if (i >= cb.lts && i < cb.lte) return true;
  if (i >= cb.uts && i < cb.ute) return true;
  const int64_t ip = i + g.sk - g.sq;
  if (g.causal && j > ip) return true;
  if (g.window > 0 && (ip - j >= g.window || (!g.causal && j - ip >= g.window))) return true;
  return false;
}

// The end of the tile of `size` rows or columns from `start`, cut at `limit` (the last is short).
__device__ __forceinline__ int64_t tileEnd(int64_t start, int size, int64_t limit) {
  return start + size < limit ? start + size : limit;
}

// The mask's (batch, head) index for batch bi and key head kh: one mask serves every head when
// the mask has one head (hm == 1).
__device__ __forceinline__ int64_t maskHead(const Geo& g, int64_t bi, int64_t kh) {
  return bi * g.hm + (g.hm == 1 ? 0 : kh);
}

// Class of the pair (rows [m0, m1), key tile kt of columns [n0, n1)) for batch-mask-head bm.
__device__ __forceinline__ int tileClass(const fp::TileMinMax* tiles, const Geo& g, int64_t bm,
                                         int64_t kt, int64_t m0, int64_t m1, int64_t n0,
                                         int64_t n1) {
  if (!g.skip) return fp::kPartial;
  const auto sq = int32_t(g.sq);
  const fp::TileMinMax t =
      tiles ? tiles[bm * g.nkt + kt] : fp::TileMinMax{sq, sq, sq, sq, 0, 0, 0, 0};
  return fp::classifyTile(t, g.causal, g.window, g.sk - g.sq, m0, m1, n0, n1);
}

// dst[r * ld + x] = src(bi, row0 + r, h, x) * mul for r < ROWS (zero from row nvalid on).
template <int ROWS, typename T, typename C>
__device__ __forceinline__ void loadTile(C* dst, int64_t ld, const T* src, const View4& v,
                                         int64_t bi, int64_t row0, int64_t nvalid, int64_t h, int d,
                                         C mul) {
  for (int e = int(threadIdx.x); e < ROWS * d; e += fp::kThreads) {
    const int r = e / d, x = e - r * d;
    C val = C(0);
    if (r < nvalid) val = readAs<C>(src[bi * v.s0 + (row0 + r) * v.s1 + h * v.s2 + x * v.s3]) * mul;
    dst[r * ld + x] = val;
  }
}

// ---------------------------------------------------------------- mask pre-pass
// Where the pre-pass reports a bound out of [0, Sq] or a start above its end (Note [Deferred device
// errors]): validateIndices cannot read a device index tensor's values on the host.
struct ErrSink {
  int* word;
  long long* value;
  int code;
};

__global__ void boundsKernel(const int32_t* idx, View4 is, int64_t c, Geo g, ErrSink err,
                             ColB* out) {
  const int64_t n = g.b * g.hm * g.sk;
  const auto sq = int32_t(g.sq);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % g.sk, bm = e / g.sk, bi = bm / g.hm, mh = bm % g.hm;
    const int32_t* p = idx + bi * is.s0 + mh * is.s1 + j * is.s2;
    int32_t lts = p[0], lte = sq, uts = 0, ute = 0;
    if (g.causal) {
      if (c == 2) lte = p[is.s3];
    } else if (c == 2) {
      ute = p[is.s3];
    } else {
      lte = p[is.s3];
      uts = p[2 * is.s3];
      ute = p[3 * is.s3];
    }
    for (int32_t v : {lts, lte, uts, ute})
      if (v < 0 || v > sq) reportError(err.word, err.value, err.code, v);
    if (lts > lte) reportError(err.word, err.value, err.code, lts);
    if (uts > ute) reportError(err.word, err.value, err.code, uts);
    if (lts >= lte) lts = lte = sq;
    if (uts >= ute) uts = ute = 0;
    out[e] = {lts, lte, uts, ute};
  }
}

__global__ void tileBoundsKernel(const ColB* bnd, Geo g, int64_t bc, fp::TileMinMax* out) {
  const int64_t n = g.b * g.hm * g.nkt;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t kt = e % g.nkt, bm = e / g.nkt;
    const int64_t n0 = kt * bc, n1 = n0 + bc < g.sk ? n0 + bc : g.sk;
    fp::TileMinMax t{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                     INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
    for (int64_t j = n0; j < n1; ++j) {
      const ColB b = bnd[bm * g.sk + j];
      t.ltsMin = min(t.ltsMin, b.lts);
      t.ltsMax = max(t.ltsMax, b.lts);
      t.lteMin = min(t.lteMin, b.lte);
      t.lteMax = max(t.lteMax, b.lte);
      t.utsMin = min(t.utsMin, b.uts);
      t.utsMax = max(t.utsMax, b.uts);
      t.uteMin = min(t.uteMin, b.ute);
      t.uteMax = max(t.uteMax, b.ute);
    }
    out[e] = t;
  }
}

// The device bounds and tile min/max of an index tensor (null pointers without one), kept alive by
// the temporary Tensors.
struct MaskDev {
  Tensor bounds, tiles;
  const ColB* b = nullptr;
  const fp::TileMinMax* t = nullptr;
};

MaskDev prepareMask(const KernelCtx& c, const Tensor* idx, const Geo& g, int64_t bc,
                    DeviceCtx& dc) {
  cudaStream_t stream = dc.stream;
  MaskDev m;
  if (!idx || g.sk == 0 || g.b == 0) return m;
  const Device dev = c.outputs[0].device();
  KEEL_CHECK(idx->device() == dev, "op '", c.op.name, "': startend_row_indices is on ",
             idx->device().name(), ", the op runs on ", dev.name());
  static_assert(sizeof(ColB) == 16 && sizeof(fp::TileMinMax) == 32);
  m.bounds = makeTensor({g.b * g.hm * g.sk * 4}, DType::Int32, dev);
  m.tiles = makeTensor({g.b * g.hm * g.nkt * 8}, DType::Int32, dev);
  auto* bnd = static_cast<ColB*>(m.bounds.data());
  auto* tiles = static_cast<fp::TileMinMax*>(m.tiles.data());
  const ErrSink err{dc.errorWord, dc.errorValue, errorCode(DeviceError::IndexOutOfRange, c.op.id)};
  const Launch1D l1 = launch1D(g.b * g.hm * g.sk);
  launch(boundsKernel, l1.blocks, l1.threads, 0, stream, ptr<int32_t>(*idx), view4(*idx),
         idx->size(3), g, err, bnd);
  checkLaunch(c, "flashmaskBoundsKernel");
  const Launch1D l2 = launch1D(g.b * g.hm * g.nkt);
  launch(tileBoundsKernel, l2.blocks, l2.threads, 0, stream, bnd, g, bc, tiles);
  checkLaunch(c, "flashmaskTileBoundsKernel");
  m.b = bnd;
  m.t = tiles;
  return m;
}

// ---------------------------------------------------------------- forward
template <typename T>
struct FwdArgs {
  using C = Compute<T>;
  const T *q, *k, *v;
  View4 qv, kv, vv;
  T* out;  // [b, sq, h, d] contiguous
  C* lse;  // [b, h, sq] contiguous
  const ColB* bounds;
  const fp::TileMinMax* tiles;
  Geo g;
  C scale, keep;
};

// acc[i][jj] += sum over c < n, in order, of w[(ty + 16 i) * ldw + c] * rows[c * ld + tx + 16 jj]:
// a score tile (P, or dS) times a value tile (V, or K) from shared memory, into the thread's
// accumulators (the forward's output, the dQ kernel's dQ).
template <int R, int NJ, typename C>
__device__ __forceinline__ void accumulateTile(C (&acc)[R][NJ], const C* w, int ldw, const C* rows,
                                               int64_t ld, int n, int d, int ty, int tx) {
  for (int c = 0; c < n; ++c) {
    const C* row = rows + c * ld;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const C wv = w[(ty + 16 * i) * ldw + c];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const int x = tx + 16 * jj;
        if (x < d) acc[i][jj] += wv * row[x];
      }
    }
  }
}

template <typename T, int DMAX, int RM, int RN>
__global__ void __launch_bounds__(fp::kThreads) fwdKernel(FwdArgs<T> a) {
  using C = Compute<T>;
  constexpr int BR = 16 * RM, BC = 16 * RN, NJ = DMAX / 16, LDP = BC + 1;
  const Geo& g = a.g;
  const int d = int(g.d);
  const int64_t ld = fp::sharedLd(d);
  KEEL_DYNAMIC_SHARED(unsigned char, fmSmem);
  C* Qs = reinterpret_cast<C*>(fmSmem);
  C* KVs = Qs + BR * ld;
  C* Ps = KVs + BC * ld;
  const int tid = int(threadIdx.x), ty = tid / 16, tx = tid % 16;
  const int64_t qt = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, kh = h / g.grp;
  const int64_t bm = maskHead(g, bi, kh);
  const int64_t m0 = qt * BR, m1 = tileEnd(m0, BR, g.sq);
  const C ninf = C(-INFINITY);

  loadTile<BR>(Qs, ld, a.q, a.qv, bi, m0, m1 - m0, h, d, a.scale);

  C m[RM], l[RM], acc[RM][NJ];
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    m[i] = ninf;
    l[i] = C(0);
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) acc[i][jj] = C(0);
  }

  for (int64_t kt = 0; kt < g.nkt; ++kt) {
    const int64_t n0 = kt * BC, n1 = tileEnd(n0, BC, g.sk);
    const int cls = tileClass(a.tiles, g, bm, kt, m0, m1, n0, n1);
    if (cls == fp::kSkip) continue;
    const bool partial = cls == fp::kPartial;
    __syncthreads();  // the previous tile's P V is done with KVs and Ps
    loadTile<BC>(KVs, ld, a.k, a.kv, bi, n0, n1 - n0, kh, d, C(1));
    __syncthreads();

    C s[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN; ++j) s[i][j] = C(0);
    for (int x = 0; x < d; ++x) {
      C qr[RM], kr[RN];
#pragma unroll
      for (int i = 0; i < RM; ++i) qr[i] = Qs[(ty + 16 * i) * ld + x];
#pragma unroll
      for (int j = 0; j < RN; ++j) kr[j] = KVs[(tx + 16 * j) * ld + x];
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) s[i][j] += qr[i] * kr[j];
    }
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      const int64_t col = n0 + tx + 16 * j;
      const bool colOk = col < n1;
      const ColB cb = partial && colOk ? colBounds(a.bounds, g, bm, col) : ColB{0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const int64_t row = m0 + ty + 16 * i;
        const bool ok = colOk && row < m1 && !(partial && maskedAt(cb, g, row, col));
        if (!ok) s[i][j] = ninf;
      }
    }
    // Online softmax: every lane of a half-warp computes the same row statistics.
#pragma unroll
    for (int i = 0; i < RM; ++i) {
      C mx = s[i][0];
#pragma unroll
      for (int j = 1; j < RN; ++j) mx = s[i][j] > mx ? s[i][j] : mx;
      mx = halfWarpMax(mx);
      const C mnew = mx > m[i] ? mx : m[i];
      const C alpha = m[i] == ninf ? C(0) : expC(m[i] - mnew);
      C ps = C(0);
#pragma unroll
      for (int j = 0; j < RN; ++j) {
        const C p = s[i][j] == ninf ? C(0) : expC(s[i][j] - mnew);
        s[i][j] = p;
        ps += p;
      }
      ps = halfWarpSum(ps);
      l[i] = alpha * l[i] + ps;
      m[i] = mnew;
      if (alpha != C(1))
#pragma unroll
        for (int jj = 0; jj < NJ; ++jj) acc[i][jj] *= alpha;
    }
    if (g.p > 0.0) {
#pragma unroll
      for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j)
          if (s[i][j] != C(0))
            s[i][j] *= dropFactor(g, bi, h, m0 + ty + 16 * i, n0 + tx + 16 * j, a.keep);
    }
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RN; ++j) Ps[(ty + 16 * i) * LDP + tx + 16 * j] = s[i][j];
    __syncthreads();  // K is no longer read; P is complete
    loadTile<BC>(KVs, ld, a.v, a.vv, bi, n0, n1 - n0, kh, d, C(1));
    __syncthreads();
    accumulateTile<RM, NJ>(acc, Ps, LDP, KVs, ld, int(n1 - n0), d, ty, tx);  // += P V
  }

#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t row = m0 + ty + 16 * i;
    if (row >= m1) continue;
    T* o = a.out + ((bi * g.sq + row) * g.h + h) * g.d;
    const bool none = l[i] == C(0);
    const C inv = none ? C(0) : C(1) / l[i];
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      const int x = tx + 16 * jj;
      if (x < d) o[x] = storeAs<T>(none ? C(0) : acc[i][jj] * inv);
    }
    if (tx == 0) a.lse[(bi * g.h + h) * g.sq + row] = none ? ninf : m[i] + logC(l[i]);
  }
}

// ---------------------------------------------------------------- backward
// delta[r] = sum_x dO * O (float64, a warp's fixed tree) - grad_lse[r]; lseC[r] = lse[r]; one
// warp per row r = (b, h, i).
template <typename T>
__global__ void deltaKernel(const T* go, View4 gv, const T* o, View4 ov, const Compute<T>* lse,
                            View3 lv, const Compute<T>* gl, View3 glv, Geo g, Compute<T>* delta,
                            Compute<T>* lseC) {
  using C = Compute<T>;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int warps = int(blockDim.x) >> 5;
  const int64_t rows = g.b * g.h * g.sq;
  for (int64_t r = int64_t(blockIdx.x) * warps + warp; r < rows; r += int64_t(gridDim.x) * warps) {
    const int64_t i = r % g.sq, h = (r / g.sq) % g.h, bi = r / (g.sq * g.h);
    double acc = 0;
    for (int64_t x = lane; x < g.d; x += 32)
      acc += double(readAs<C>(go[bi * gv.s0 + i * gv.s1 + h * gv.s2 + x * gv.s3])) *
             double(readAs<C>(o[bi * ov.s0 + i * ov.s1 + h * ov.s2 + x * ov.s3]));
    acc = warpSum(acc);
    if (lane == 0) {
      delta[r] = C(acc - double(gl[bi * glv.s0 + h * glv.s1 + i * glv.s2]));
      lseC[r] = lse[bi * lv.s0 + h * lv.s1 + i * lv.s2];
    }
  }
}

template <typename T>
struct BwdArgs {
  using C = Compute<T>;
  const T *q, *k, *v, *go;
  View4 qv, kv, vv, gv;
  const C *lse, *delta;  // [b, h, sq] contiguous
  T *dq, *dk, *dv;       // contiguous
  const ColB* bounds;
  const fp::TileMinMax* tiles;
  Geo g;
  C scale, keep;
};

// P and dS of one (row, col) pair from the score s, the dO.V dot dpv, the row's lse and delta;
// pd is P times the dropout factor (what the forward multiplied V by).
template <typename C>
__device__ __forceinline__ void probGrad(const Geo& g, bool ok, C s, C dpv, C lse, C delta,
                                         int64_t bi, int64_t h, int64_t row, int64_t col, C keep,
                                         C& pd, C& ds) {
  const C p = ok ? expC(s - lse) : C(0);
  C dp = dpv;
  pd = p;
  if (g.p > 0.0) {
    const C z = ok ? dropFactor(g, bi, h, row, col, keep) : C(0);
    pd = p * z;
    dp = dpv * z;
  }
  ds = p * (dp - delta);
}

// dK and dV of key tile blockIdx.x, kv head blockIdx.y, batch blockIdx.z.
// The backward's two tile products at once (Note [cuda FlashMask]): s[i][j] = a1[r_i] . b1[c_j]
// and p[i][j] = a2[r_i] . b2[c_j] over the head dim, with r_i = ty + 16 i rows of the a tiles and
// c_j = tx + 16 j rows of the b tiles (shared-memory tiles of row stride ld), summed over x in
// order. The dK/dV kernel calls it with (K, V; Q, dO), the dQ kernel with (Q, dO; K, V).
template <int RA, int RB, typename C>
__device__ __forceinline__ void dualTileProduct(const C* a1, const C* a2, const C* b1, const C* b2,
                                                int64_t ld, int d, int ty, int tx, C (&s)[RA][RB],
                                                C (&p)[RA][RB]) {
#pragma unroll
  for (int i = 0; i < RA; ++i)
#pragma unroll
    for (int j = 0; j < RB; ++j) s[i][j] = p[i][j] = C(0);
  for (int x = 0; x < d; ++x) {
    C ra1[RA], ra2[RA], rb1[RB], rb2[RB];
#pragma unroll
    for (int i = 0; i < RA; ++i) {
      ra1[i] = a1[(ty + 16 * i) * ld + x];
      ra2[i] = a2[(ty + 16 * i) * ld + x];
    }
#pragma unroll
    for (int j = 0; j < RB; ++j) {
      rb1[j] = b1[(tx + 16 * j) * ld + x];
      rb2[j] = b2[(tx + 16 * j) * ld + x];
    }
#pragma unroll
    for (int i = 0; i < RA; ++i)
#pragma unroll
      for (int j = 0; j < RB; ++j) {
        s[i][j] += ra1[i] * rb1[j];
        p[i][j] += ra2[i] * rb2[j];
      }
  }
}

template <typename T, int DMAX, int RM, int RN>
__global__ void __launch_bounds__(fp::kThreads) dkvKernel(BwdArgs<T> a) {
  using C = Compute<T>;
  constexpr int BR = 16 * RM, BC = 16 * RN, NJ = DMAX / 16, LDT = BR + 1;
  const Geo& g = a.g;
  const int d = int(g.d);
  const int64_t ld = fp::sharedLd(d);
  KEEL_DYNAMIC_SHARED(unsigned char, fmSmem);
  C* Ks = reinterpret_cast<C*>(fmSmem);
  C* Vs = Ks + BC * ld;
  C* Qs = Vs + BC * ld;
  C* dOs = Qs + BR * ld;
  C* Pt = dOs + BR * ld;
  C* dSt = Pt + BC * LDT;
  const int tid = int(threadIdx.x), ty = tid / 16, tx = tid % 16;
  const int64_t kt = blockIdx.x, kh = blockIdx.y, bi = blockIdx.z;
  const int64_t bm = maskHead(g, bi, kh);
  const int64_t n0 = kt * BC, n1 = tileEnd(n0, BC, g.sk);
  const C ninf = C(-INFINITY);

  loadTile<BC>(Ks, ld, a.k, a.kv, bi, n0, n1 - n0, kh, d, C(1));
  loadTile<BC>(Vs, ld, a.v, a.vv, bi, n0, n1 - n0, kh, d, C(1));

  C dk[RN][NJ], dv[RN][NJ];
#pragma unroll
  for (int i = 0; i < RN; ++i)
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) dk[i][jj] = dv[i][jj] = C(0);
  // This thread's key columns n0 + ty + 16i and their bounds.
  ColB cb[RN];
#pragma unroll
  for (int i = 0; i < RN; ++i) {
    const int64_t col = n0 + ty + 16 * i;
    cb[i] = col < n1 ? colBounds(a.bounds, g, bm, col) : ColB{0, 0, 0, 0};
  }

  for (int64_t hh = 0; hh < g.grp; ++hh) {
    const int64_t h = kh * g.grp + hh;
    for (int64_t qt = 0; qt < g.nqt; ++qt) {
      const int64_t m0 = qt * BR, m1 = tileEnd(m0, BR, g.sq);
      const int cls = tileClass(a.tiles, g, bm, kt, m0, m1, n0, n1);
      if (cls == fp::kSkip) continue;
      const bool partial = cls == fp::kPartial;
      __syncthreads();  // K, V loaded; the previous tile's sums are done with Qs, dOs, Pt, dSt
      loadTile<BR>(Qs, ld, a.q, a.qv, bi, m0, m1 - m0, h, d, a.scale);
      loadTile<BR>(dOs, ld, a.go, a.gv, bi, m0, m1 - m0, h, d, C(1));
      __syncthreads();

      // Rows m0 + tx + 16j.
      C ls[RM], dl[RM];
#pragma unroll
      for (int j = 0; j < RM; ++j) {
        const int64_t row = m0 + tx + 16 * j;
        const int64_t r = (bi * g.h + h) * g.sq + row;
        ls[j] = row < m1 ? a.lse[r] : ninf;
        dl[j] = row < m1 ? a.delta[r] : C(0);
      }
      C s[RN][RM], dpv[RN][RM];
      dualTileProduct<RN, RM>(Ks, Vs, Qs, dOs, ld, d, ty, tx, s, dpv);  // K Q^T, V dO^T
#pragma unroll
      for (int i = 0; i < RN; ++i) {
        const int64_t col = n0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < RM; ++j) {
          const int64_t row = m0 + tx + 16 * j;
          const bool ok =
              col < n1 && row < m1 && ls[j] != ninf && !(partial && maskedAt(cb[i], g, row, col));
          C pd, ds;
          probGrad(g, ok, s[i][j], dpv[i][j], ls[j], dl[j], bi, h, row, col, a.keep, pd, ds);
          Pt[(ty + 16 * i) * LDT + tx + 16 * j] = pd;
          dSt[(ty + 16 * i) * LDT + tx + 16 * j] = ds;
        }
      }
      __syncthreads();
      const int nrow = int(m1 - m0);
      for (int r = 0; r < nrow; ++r) {
        const C* orow = dOs + r * ld;
        const C* qrow = Qs + r * ld;
#pragma unroll
        for (int i = 0; i < RN; ++i) {
          const C p = Pt[(ty + 16 * i) * LDT + r], ds = dSt[(ty + 16 * i) * LDT + r];
#pragma unroll
          for (int jj = 0; jj < NJ; ++jj) {
            const int x = tx + 16 * jj;
            if (x < d) {
              dv[i][jj] += p * orow[x];
              dk[i][jj] += ds * qrow[x];
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < RN; ++i) {
    const int64_t col = n0 + ty + 16 * i;
    if (col >= n1) continue;
    const int64_t e = ((bi * g.sk + col) * g.hk + kh) * g.d;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      const int x = tx + 16 * jj;
      if (x < d) {
        a.dk[e + x] = storeAs<T>(dk[i][jj]);
        a.dv[e + x] = storeAs<T>(dv[i][jj]);
      }
    }
  }
}

// dQ of query tile blockIdx.x, head blockIdx.y, batch blockIdx.z.
template <typename T, int DMAX, int RM, int RN>
__global__ void __launch_bounds__(fp::kThreads) dqKernel(BwdArgs<T> a) {
  using C = Compute<T>;
  constexpr int BR = 16 * RM, BC = 16 * RN, NJ = DMAX / 16, LDS = BC + 1;
  const Geo& g = a.g;
  const int d = int(g.d);
  const int64_t ld = fp::sharedLd(d);
  KEEL_DYNAMIC_SHARED(unsigned char, fmSmem);
  C* Qs = reinterpret_cast<C*>(fmSmem);
  C* dOs = Qs + BR * ld;
  C* Ks = dOs + BR * ld;
  C* Vs = Ks + BC * ld;
  C* dSs = Vs + BC * ld;
  const int tid = int(threadIdx.x), ty = tid / 16, tx = tid % 16;
  const int64_t qt = blockIdx.x, h = blockIdx.y, bi = blockIdx.z, kh = h / g.grp;
  const int64_t bm = maskHead(g, bi, kh);
  const int64_t m0 = qt * BR, m1 = tileEnd(m0, BR, g.sq);
  const C ninf = C(-INFINITY);

  loadTile<BR>(Qs, ld, a.q, a.qv, bi, m0, m1 - m0, h, d, a.scale);
  loadTile<BR>(dOs, ld, a.go, a.gv, bi, m0, m1 - m0, h, d, C(1));
  C ls[RM], dl[RM], dq[RM][NJ];
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t row = m0 + ty + 16 * i;
    const int64_t r = (bi * g.h + h) * g.sq + row;
    ls[i] = row < m1 ? a.lse[r] : ninf;
    dl[i] = row < m1 ? a.delta[r] : C(0);
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) dq[i][jj] = C(0);
  }

  for (int64_t kt = 0; kt < g.nkt; ++kt) {
    const int64_t n0 = kt * BC, n1 = tileEnd(n0, BC, g.sk);
    const int cls = tileClass(a.tiles, g, bm, kt, m0, m1, n0, n1);
    if (cls == fp::kSkip) continue;
    const bool partial = cls == fp::kPartial;
    __syncthreads();  // Q, dO loaded; the previous tile's sums are done with Ks, dSs
    loadTile<BC>(Ks, ld, a.k, a.kv, bi, n0, n1 - n0, kh, d, C(1));
    loadTile<BC>(Vs, ld, a.v, a.vv, bi, n0, n1 - n0, kh, d, C(1));
    __syncthreads();

    C s[RM][RN], dpv[RM][RN];
    dualTileProduct<RM, RN>(Qs, dOs, Ks, Vs, ld, d, ty, tx, s, dpv);  // Q K^T, dO V^T
#pragma unroll
    for (int j = 0; j < RN; ++j) {
      const int64_t col = n0 + tx + 16 * j;
      const bool colOk = col < n1;
      const ColB cb = partial && colOk ? colBounds(a.bounds, g, bm, col) : ColB{0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < RM; ++i) {
        const int64_t row = m0 + ty + 16 * i;
        const bool ok =
            colOk && row < m1 && ls[i] != ninf && !(partial && maskedAt(cb, g, row, col));
        C pd, ds;
        probGrad(g, ok, s[i][j], dpv[i][j], ls[i], dl[i], bi, h, row, col, a.keep, pd, ds);
        dSs[(ty + 16 * i) * LDS + tx + 16 * j] = ds;
      }
    }
    __syncthreads();
    accumulateTile<RM, NJ>(dq, dSs, LDS, Ks, ld, int(n1 - n0), d, ty, tx);  // += dS K
  }

#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int64_t row = m0 + ty + 16 * i;
    if (row >= m1) continue;
    T* o = a.dq + ((bi * g.sq + row) * g.h + h) * g.d;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {
      const int x = tx + 16 * jj;
      if (x < d) o[x] = storeAs<T>(dq[i][jj] * a.scale);
    }
  }
}

// ---------------------------------------------------------------- host side
// The problem of q [B, Sq, H, D], k [B, Sk, Hk, D] and the attributes; checks what the kernels
// cannot do (head dim, grid limits).
Geo makeGeo(const KernelCtx& c, const Tensor& q, const Tensor& k, const Tensor* idx, int64_t br,
            int64_t bc) {
  Geo g{};
  g.b = q.size(0), g.sq = q.size(1), g.h = q.size(2), g.d = q.size(3);
  g.sk = k.size(1), g.hk = k.size(2), g.grp = g.h / g.hk;
  g.hm = idx ? idx->size(1) : 1;
  g.nqt = (g.sq + br - 1) / br, g.nkt = (g.sk + bc - 1) / bc;
  g.causal = c.attrs.getBool("causal", false);
  g.skip = c.attrs.getBool("skip_tiles", true);
  g.window = c.attrs.getInt("window_size", -1);
  g.p = c.attrs.getDouble("dropout", 0.0);
  g.seed = uint64_t(c.attrs.getInt("seed", 0));
  g.offset = uint64_t(c.attrs.getInt("offset", 0));
  KEEL_CHECK(g.h <= 65535 && g.b <= 65535, "op '", c.op.name,
             "': the cuda kernel takes at most 65535 heads and batches, got H = ", g.h,
             ", B = ", g.b);
  KEEL_CHECK(g.sq < INT32_MAX && g.sk < INT32_MAX, "op '", c.op.name,
             "': sequence lengths must be below 2^31 on cuda, got Sq = ", g.sq, ", Sk = ", g.sk);
  return g;
}

void checkHeadDim(const KernelCtx& c, int64_t d) {
  KEEL_CHECK(fp::headDimBucket(d) != 0, "op '", c.op.name, "': head dim D = ", d,
             " is not supported by the cuda kernel (1 to ", fp::kMaxHeadDim, ")");
}

double scaleOf(const KernelCtx& c, int64_t d) {
  const double s = c.attrs.getDouble("scale", 0.0);
  return s == 0.0 ? 1.0 / std::sqrt(double(d)) : s;
}

template <typename K>
void setSmem(const KernelCtx& c, K kernel, int64_t bytes) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        "cudaFuncSetAttribute (flashmask shared memory)", deviceCtx(c).index);
}

template <typename T, int DMAX>
void forwardD(const KernelCtx& c) {
  using C = Compute<T>;
  constexpr fp::TileConfig tc = fp::forwardConfig(int(sizeof(C)), DMAX);
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const Tensor* idx = c.inputs.size() == 4 ? &c.inputs[3] : nullptr;
  const fp::ForwardPlan plan =
      fp::forwardPlan(q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), int(sizeof(C)));
  const Geo g = makeGeo(c, q, k, idx, plan.br, plan.bc);
  DeviceCtx& dc = deviceCtx(c);
  const MaskDev mask = prepareMask(c, idx, g, plan.bc, dc);
  FwdArgs<T> a{};
  a.q = ptr<const T>(q), a.k = ptr<const T>(k), a.v = ptr<const T>(v);
  a.qv = view4(q), a.kv = view4(k), a.vv = view4(v);
  a.out = ptr<T>(c.outputs[0]);
  a.lse = ptr<C>(c.outputs[1]);
  a.bounds = mask.b, a.tiles = mask.t;
  a.g = g;
  a.scale = C(scaleOf(c, g.d));
  a.keep = C(1.0 / (1.0 - g.p));
  auto kernel = fwdKernel<T, DMAX, tc.rm, tc.rn>;
  setSmem(c, kernel, plan.smemBytes);
  launch(kernel, dim3(plan.grid.x, plan.grid.y, plan.grid.z), plan.threads, size_t(plan.smemBytes),
         dc.stream, a);
  checkLaunch(c, "flashmaskForwardKernel");
}

template <typename T, int DMAX>
void backwardD(const KernelCtx& c) {
  using C = Compute<T>;
  constexpr fp::TileConfig tc = fp::backwardConfig(int(sizeof(C)), DMAX);
  const Tensor &go = c.inputs[0], &q = c.inputs[1], &k = c.inputs[2], &v = c.inputs[3];
  const Tensor &o = c.inputs[4], &lse = c.inputs[5], &glse = c.inputs[6];
  const Tensor* idx = c.inputs.size() == 8 ? &c.inputs[7] : nullptr;
  const fp::BackwardPlan plan = fp::backwardPlan(q.size(0), q.size(1), k.size(1), q.size(2),
                                                 k.size(2), q.size(3), int(sizeof(C)));
  const Geo g = makeGeo(c, q, k, idx, plan.br, plan.bc);
  DeviceCtx& dc = deviceCtx(c);
  const Device dev = c.outputs[0].device();
  const DType lt = std::is_same_v<C, double> ? DType::Float64 : DType::Float32;
  const int64_t rows = g.b * g.h * g.sq;
  Tensor delta = makeTensor({rows}, lt, dev), lseC = makeTensor({rows}, lt, dev);
  {
    const int64_t threads = 256, warps = threads / 32;
    const int64_t blocks = std::clamp<int64_t>((rows + warps - 1) / warps, 1, kMaxBlocks);
    launch(deltaKernel<T>, unsigned(blocks), unsigned(threads), 0, dc.stream, ptr<const T>(go),
           view4(go), ptr<const T>(o), view4(o), ptr<const C>(lse), view3(lse), ptr<const C>(glse),
           view3(glse), g, ptr<C>(delta), ptr<C>(lseC));
    checkLaunch(c, "flashmaskDeltaKernel");
  }
  const MaskDev mask = prepareMask(c, idx, g, plan.bc, dc);
  BwdArgs<T> a{};
  a.q = ptr<const T>(q), a.k = ptr<const T>(k), a.v = ptr<const T>(v), a.go = ptr<const T>(go);
  a.qv = view4(q), a.kv = view4(k), a.vv = view4(v), a.gv = view4(go);
  a.lse = ptr<const C>(lseC), a.delta = ptr<const C>(delta);
  a.dq = ptr<T>(c.outputs[0]), a.dk = ptr<T>(c.outputs[1]), a.dv = ptr<T>(c.outputs[2]);
  a.bounds = mask.b, a.tiles = mask.t;
  a.g = g;
  a.scale = C(scaleOf(c, g.d));
  a.keep = C(1.0 / (1.0 - g.p));
  auto kdkv = dkvKernel<T, DMAX, tc.rm, tc.rn>;
  setSmem(c, kdkv, plan.dkvSmemBytes);
  launch(kdkv, dim3(plan.dkvGrid.x, plan.dkvGrid.y, plan.dkvGrid.z), plan.threads,
         size_t(plan.dkvSmemBytes), dc.stream, a);
  checkLaunch(c, "flashmaskDkvKernel");
  auto kdq = dqKernel<T, DMAX, tc.rm, tc.rn>;
  setSmem(c, kdq, plan.dqSmemBytes);
  launch(kdq, dim3(plan.dqGrid.x, plan.dqGrid.y, plan.dqGrid.z), plan.threads,
         size_t(plan.dqSmemBytes), dc.stream, a);
  checkLaunch(c, "flashmaskDqKernel");
}

// Calls f.template operator()<DMAX>() for the head dim's bucket.
template <typename F>
void visitHeadDim(const KernelCtx& c, int64_t d, F&& f) {
  checkHeadDim(c, d);
  switch (fp::headDimBucket(d)) {
    case 32:
      return f.template operator()<32>();
    case 64:
      return f.template operator()<64>();
    case 128:
      return f.template operator()<128>();
    default:
      return f.template operator()<256>();
  }
}

}  // namespace

void kFlashmaskAttention(const KernelCtx& c) {
  const Tensor& q = c.inputs[0];
  if (q.numel() == 0) return;
  visitFloat(q.dtype(), [&]<typename T>() {
    visitHeadDim(c, q.size(3), [&]<int DMAX>() { forwardD<T, DMAX>(c); });
  });
}

void kFlashmaskAttentionBackward(const KernelCtx& c) {
  const Tensor &q = c.inputs[1], &k = c.inputs[2];
  if (q.numel() == 0 || k.numel() == 0) {  // no pair: every gradient is zero
    DeviceCtx& dc = deviceCtx(c);
    for (const Tensor& t : c.outputs)
      if (t.numel() > 0)
        check(cudaMemsetAsync(t.data(), 0, t.nbytes(), dc.stream), "cudaMemsetAsync", dc.index);
    return;
  }
  visitFloat(q.dtype(), [&]<typename T>() {
    visitHeadDim(c, q.size(3), [&]<int DMAX>() { backwardD<T, DMAX>(c); });
  });
}

}  // namespace keel::cuda
