// Fused neural-network kernels of the cuda backend: softmax / log_softmax (+ backward), layer_norm
// / rms_norm (+ backward), embedding (+ backward), cross_entropy (+ backward), rope. Row kernels
// run one block per row (rowLaunch) on inputs of any layout, with the cpu backend's numerics:
// compute type float32 (float64 for float64), row sums in float64 in blockSum's fixed tree. Nothing
// uses floating-point atomics: every result is the same bits on every run.
#include <cub/device/device_radix_sort.cuh>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "cuda_util.cuh"
#include "kernels.h"
#include "shape_util.h"

namespace keel::cuda {
namespace {

// ---------------------------------------------------------------- geometry

// t's dims (except `skip`, when >= 0) packed (packDims, cuda_util.cuh).
Geom packDimsExcept(const KernelCtx& c, const Tensor& t, int64_t skip = -1) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != skip) dims.emplace_back(t.shape()[size_t(d)], t.strides()[size_t(d)]);
  return packDims(c, dims);
}

// Rows along one dim of a tensor: row r (row-major over the other dims) starts at
// offsetOf(rows, r); its element j is `step` further per j.
struct RowGeom {
  Geom rows;
  int64_t step = 0;
};
RowGeom rowGeom(const KernelCtx& c, const Tensor& t, int64_t dim) {
  return {packDimsExcept(c, t, dim), t.strides()[size_t(dim)]};
}

// ---------------------------------------------------------------- shared device helpers

__device__ __forceinline__ float expC(float x) {
  return expf(x);
}
__device__ __forceinline__ double expC(double x) {
  return exp(x);
}

template <typename T>
__device__ __forceinline__ Compute<T> ld(const T* p, int64_t off) {
  return readAs<Compute<T>>(p[off]);
}

// Row maximum in the compute type, ignoring NaN (v > m ? v : m from -inf, as the cpu rowMax).
template <typename T>
__device__ Compute<T> rowMax(const T* row, int64_t step, int64_t n, Compute<T>* scratch) {
  using C = Compute<T>;
  const C lowest = -std::numeric_limits<C>::infinity();
  C m = lowest;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const C v = ld(row, j * step);
    m = v > m ? v : m;
  }
  return blockMax(m, scratch, lowest);
}

// Sum of exp(x - m) over the row: exponentials in the compute type, summed in float64.
template <typename T>
__device__ double rowSumExp(const T* row, int64_t step, int64_t n, Compute<T> m, double* scratch) {
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += double(expC(ld(row, j * step) - m));
  return blockSum(s, scratch);
}

// ---------------------------------------------------------------- softmax family

enum class Soft { Softmax, LogSoftmax, SoftmaxBackward, LogSoftmaxBackward };

// Forward: a = x. Backward: a = grad, b = y. Output rows (contiguous) described by go.
template <typename T, Soft kKind>
__global__ void __launch_bounds__(1024)
    softmaxKernel(const T* a, RowGeom ga, const T* b, RowGeom gb, T* out, RowGeom go, int64_t rows,
                  int64_t n) {
  using C = Compute<T>;
  KEEL_SHARED(double, sd, 32);
  KEEL_SHARED(C, sc, 32);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* ar = a + offsetOf(ga.rows, r);
    T* orow = out + offsetOf(go.rows, r);
    const int64_t as = ga.step, os = go.step;
    if constexpr (kKind == Soft::Softmax) {
      const C m = rowMax(ar, as, n, sc);
      const double s = rowSumExp(ar, as, n, m, sd);
      if constexpr (std::is_same_v<C, double>) {
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
          orow[j * os] = expC(ld(ar, j * as) - m) / s;
      } else {
        const float inv = float(1.0 / s);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
          orow[j * os] = storeAs<T>(expC(ld(ar, j * as) - m) * inv);
      }
    } else if constexpr (kKind == Soft::LogSoftmax) {
      const C m = rowMax(ar, as, n, sc);
      const double lse = double(m) + log(rowSumExp(ar, as, n, m, sd));
      // x - lse in float64, rounded once (as the cpu backend; its comment says why).
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        orow[j * os] = storeAs<T>(double(ld(ar, j * as)) - lse);
    } else if constexpr (kKind == Soft::SoftmaxBackward) {
      const T* br = b + offsetOf(gb.rows, r);
      const int64_t bs = gb.step;
      double d = 0.0;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        d += double(ld(ar, j * as) * ld(br, j * bs));
      const C dot = C(blockSum(d, sd));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        orow[j * os] = storeAs<T>(ld(br, j * bs) * (ld(ar, j * as) - dot));
    } else {
      const T* br = b + offsetOf(gb.rows, r);
      const int64_t bs = gb.step;
      double d = 0.0;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) d += double(ld(ar, j * as));
      const C s = C(blockSum(d, sd));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        orow[j * os] = storeAs<T>(ld(ar, j * as) - expC(ld(br, j * bs)) * s);
    }
  }
}

template <Soft kKind>
void softmaxFamily(const KernelCtx& c, const char* name) {
  const Tensor& out = c.outputs[0];
  if (out.numel() == 0) return;
  const int64_t dim = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  const int64_t n = out.size(dim), rows = out.numel() / n;
  constexpr bool kBackward = kKind == Soft::SoftmaxBackward || kKind == Soft::LogSoftmaxBackward;
  const RowGeom ga = rowGeom(c, c.inputs[0], dim);
  const RowGeom gb = kBackward ? rowGeom(c, c.inputs[1], dim) : RowGeom{};
  const RowGeom go = rowGeom(c, out, dim);
  const RowLaunch l = rowLaunch(rows, n);
  cudaStream_t stream = deviceCtx(c).stream;
  visitFloat(out.dtype(), [&]<typename T>() {
    const T* b = kBackward ? ptr<T>(c.inputs[1]) : nullptr;
    launch(softmaxKernel<T, kKind>, l.blocks, l.threads, 0, stream, ptr<T>(c.inputs[0]), ga, b, gb,
           ptr<T>(out), go, rows, n);
    checkLaunch(c, name);
  });
}

// ---------------------------------------------------------------- norms

// Note [cuda norm backward]: dx is a row kernel (one block per row) that also stores the row's
// statistics in the compute type (layer_norm: mean and rstd; rms_norm: the scale). dweight (and
// dbias) are sums over all rows, made deterministic without atomics: rows are cut into chunks of
// kChunkRows = 64 consecutive rows (the last may be shorter); one thread per (chunk, column) adds
// its rows' terms in row order in float64, then one thread per column adds the chunk sums in chunk
// order, starting from 0, and rounds once. The terms are recomputed from x, g and the stored
// statistics with the same compute-type expressions as the cpu backend's (which cuts the rows
// into at most 64 chunks instead: the order differs, the terms do not).
constexpr int64_t kChunkRows = 64;

struct NormArgs {
  RowGeom x, g;  // x and (backward) grad rows along the last dim
  int64_t wStep = 0, bStep = 0;
  int64_t rows = 0, d = 0;
  double eps = 0;
  int64_t chunkRows = 1, chunks = 0;
};

// Mean and 1/sqrt(var + eps) of a row (float64 sums of the compute-type values and squares).
template <typename T>
__device__ void layerStats(const T* xr, int64_t sx, const NormArgs& a, double* sd, Compute<T>& m,
                           Compute<T>& rs) {
  using C = Compute<T>;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) s += double(ld(xr, j * sx));
  m = C(blockSum(s, sd) / double(a.d));
  double v = 0.0;
  for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
    const C t = ld(xr, j * sx) - m;
    v += double(t * t);
  }
  const double var = blockSum(v, sd) / double(a.d);
  rs = C(1.0 / sqrt(var + a.eps));
}

// 1/sqrt(mean(x^2) + eps) of a row, in float64.
template <typename T>
__device__ double rmsScale(const T* xr, int64_t sx, const NormArgs& a, double* sd) {
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
    const Compute<T> v = ld(xr, j * sx);
    s += double(v * v);
  }
  return 1.0 / sqrt(blockSum(s, sd) / double(a.d) + a.eps);
}

template <typename T, bool kRms>
__global__ void __launch_bounds__(1024)
    normKernel(const T* x, const T* w, const T* bias, NormArgs a, T* out) {
  using C = Compute<T>;
  KEEL_SHARED(double, sd, 32);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* xr = x + offsetOf(a.x.rows, r);
    const int64_t sx = a.x.step;
    T* yr = out + r * a.d;
    if constexpr (kRms) {
      const C rr = C(rmsScale(xr, sx, a, sd));
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x)
        yr[j] = storeAs<T>(ld(xr, j * sx) * rr * ld(w, j * a.wStep));
    } else {
      C m, rs;
      layerStats(xr, sx, a, sd, m, rs);
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x)
        yr[j] = storeAs<T>((ld(xr, j * sx) - m) * rs * ld(w, j * a.wStep) + ld(bias, j * a.bStep));
    }
  }
}

// dx rows, and each row's statistics into stats (layer_norm: 2 per row, rms_norm: 1).
template <typename T, bool kRms>
__global__ void __launch_bounds__(1024)
    normBackwardKernel(const T* g, const T* x, const T* w, NormArgs a, T* dx, double* stats) {
  using C = Compute<T>;
  KEEL_SHARED(double, sd, 32);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* xr = x + offsetOf(a.x.rows, r);
    const T* gr = g + offsetOf(a.g.rows, r);
    const int64_t sx = a.x.step, sg = a.g.step;
    T* dr = dx + r * a.d;
    if constexpr (kRms) {
      const double rrD = rmsScale(xr, sx, a, sd);
      const C rr = C(rrD);
      double s = 0.0;
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
        const C gw = ld(gr, j * sg) * ld(w, j * a.wStep);
        s += double(gw * ld(xr, j * sx));
      }
      const C dot = C(blockSum(s, sd) / double(a.d));
      const C k3 = C(rrD * rrD * rrD) * dot;
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
        const C gw = ld(gr, j * sg) * ld(w, j * a.wStep);
        dr[j] = storeAs<T>(rr * gw - ld(xr, j * sx) * k3);
      }
      if (threadIdx.x == 0) stats[r] = double(rr);
    } else {
      C m, rs;
      layerStats(xr, sx, a, sd, m, rs);
      double s1 = 0.0, s2 = 0.0;
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
        const C xhat = (ld(xr, j * sx) - m) * rs;
        const C gw = ld(gr, j * sg) * ld(w, j * a.wStep);
        s1 += double(gw);
        s2 += double(gw * xhat);
      }
      const C mg = C(blockSum(s1, sd) / double(a.d));
      const C mgx = C(blockSum(s2, sd) / double(a.d));
      for (int64_t j = threadIdx.x; j < a.d; j += blockDim.x) {
        const C xhat = (ld(xr, j * sx) - m) * rs;
        const C gw = ld(gr, j * sg) * ld(w, j * a.wStep);
        dr[j] = storeAs<T>(rs * (gw - mg - xhat * mgx));
      }
      if (threadIdx.x == 0) {
        stats[2 * r] = double(m);
        stats[2 * r + 1] = double(rs);
      }
    }
  }
}

// Chunk sums of dweight (and dbias): unit u = chunk * d + column (Note [cuda norm backward]).
// part[(chunk * parts + 0) * d + j]: dweight; part[(chunk * parts + 1) * d + j]: dbias.
template <typename T, bool kRms>
__global__ void normParamChunksKernel(const T* g, const T* x, NormArgs a, const double* stats,
                                      double* part) {
  using C = Compute<T>;
  constexpr int64_t parts = kRms ? 1 : 2;
  const int64_t units = a.chunks * a.d;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = u / a.d, j = u % a.d;
    const int64_t r1 = min(a.rows, (ch + 1) * a.chunkRows);
    double sw = 0.0, sb = 0.0;
    for (int64_t r = ch * a.chunkRows; r < r1; ++r) {
      const C xv = ld(x, offsetOf(a.x.rows, r) + j * a.x.step);
      const C gv = ld(g, offsetOf(a.g.rows, r) + j * a.g.step);
      if constexpr (kRms) {
        sw += double(gv * xv * C(stats[r]));
      } else {
        const C xhat = (xv - C(stats[2 * r])) * C(stats[2 * r + 1]);
        sw += double(gv * xhat);
        sb += double(gv);
      }
    }
    part[(ch * parts) * a.d + j] = sw;
    if constexpr (!kRms) part[(ch * parts + 1) * a.d + j] = sb;
  }
}

template <typename T, bool kRms>
__global__ void normParamSumKernel(const double* part, NormArgs a, T* dw, T* db) {
  constexpr int64_t parts = kRms ? 1 : 2;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < a.d;
       j += int64_t(gridDim.x) * blockDim.x) {
    double sw = 0.0, sb = 0.0;
    for (int64_t ch = 0; ch < a.chunks; ++ch) {
      sw += part[(ch * parts) * a.d + j];
      if constexpr (!kRms) sb += part[(ch * parts + 1) * a.d + j];
    }
    dw[j] = storeAs<T>(sw);
    if constexpr (!kRms) db[j] = storeAs<T>(sb);
  }
}

template <bool kRms>
void normForward(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &out = c.outputs[0];
  if (out.numel() == 0) return;
  NormArgs a;
  a.d = w.size(0);
  a.rows = out.numel() / a.d;
  a.x = rowGeom(c, x, x.dim() - 1);
  a.wStep = w.strides()[0];
  a.bStep = kRms ? 0 : c.inputs[2].strides()[0];
  a.eps = c.attrs.getDouble("eps");
  const RowLaunch l = rowLaunch(a.rows, a.d);
  cudaStream_t stream = deviceCtx(c).stream;
  visitFloat(x.dtype(), [&]<typename T>() {
    const T* bias = kRms ? nullptr : ptr<T>(c.inputs[2]);
    launch(normKernel<T, kRms>, l.blocks, l.threads, 0, stream, ptr<T>(x), ptr<T>(w), bias, a,
           ptr<T>(out));
    checkLaunch(c, kRms ? "rmsNormKernel" : "layerNormKernel");
  });
}

template <bool kRms>
void normBackward(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &x = c.inputs[1], &w = c.inputs[2];
  const Tensor &dx = c.outputs[0], &dw = c.outputs[1];
  NormArgs a;
  a.d = w.size(0);
  if (a.d == 0) return;  // every output is empty
  a.rows = x.numel() / a.d;
  a.x = rowGeom(c, x, x.dim() - 1);
  a.g = rowGeom(c, g, g.dim() - 1);
  a.wStep = w.strides()[0];
  a.eps = c.attrs.getDouble("eps");
  a.chunkRows = kChunkRows;
  a.chunks = (a.rows + kChunkRows - 1) / kChunkRows;
  const int64_t parts = kRms ? 1 : 2;
  const Device dev = dx.device();
  Tensor stats, part;
  if (a.rows > 0) {
    stats = makeTensor({a.rows * parts}, DType::Float64, dev);
    part = makeTensor({a.chunks * parts * a.d}, DType::Float64, dev);
  }
  double* ps = a.rows ? ptr<double>(stats) : nullptr;
  double* pp = a.rows ? ptr<double>(part) : nullptr;
  cudaStream_t stream = deviceCtx(c).stream;
  visitFloat(x.dtype(), [&]<typename T>() {
    if (a.rows > 0) {
      const RowLaunch l = rowLaunch(a.rows, a.d);
      launch(normBackwardKernel<T, kRms>, l.blocks, l.threads, 0, stream, ptr<T>(g), ptr<T>(x),
             ptr<T>(w), a, ptr<T>(dx), ps);
      checkLaunch(c, kRms ? "rmsNormBackwardKernel" : "layerNormBackwardKernel");
      const Launch1D lc = launch1D(a.chunks * a.d);
      launch(normParamChunksKernel<T, kRms>, lc.blocks, lc.threads, 0, stream, ptr<T>(g), ptr<T>(x),
             a, ps, pp);
      checkLaunch(c, "normParamChunksKernel");
    }
    const Launch1D ls = launch1D(a.d);
    T* db = kRms ? nullptr : ptr<T>(c.outputs[2]);
    launch(normParamSumKernel<T, kRms>, ls.blocks, ls.threads, 0, stream, pp, a, ptr<T>(dw), db);
    checkLaunch(c, "normParamSumKernel");
  });
}

// ---------------------------------------------------------------- embedding

struct DeviceErrors {
  int* word = nullptr;
  long long* value = nullptr;
  int code = 0;
};
DeviceErrors deviceErrors(const KernelCtx& c) {
  DeviceCtx& d = deviceCtx(c);
  return {d.errorWord, d.errorValue, errorCode(DeviceError::IndexOutOfRange, c.op.id)};
}

// out[i, j] = w[idx[i], j]; an index outside [0, V) is reported and its row skipped.
template <typename T>
__global__ void embeddingKernel(const T* w, int64_t v, int64_t d, int64_t s0, int64_t s1,
                                const void* idx, bool idx64, Geom gi, int64_t n, T* out,
                                DeviceErrors err) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * d;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / d, j = e % d;
    const int64_t k = readIndex(idx, idx64, offsetOf(gi, i));
    if (k < 0 || k >= v) {
      if (j == 0) reportError(err.word, err.value, err.code, k);
      continue;
    }
    out[e] = w[k * s0 + j * s1];
  }
}

// Note [cuda embedding backward]: out[k, j] is the float64 sum, in position order, of grad[i, j]
// over the positions i whose index is k, rounded once (0 for rows no index names), as on cpu.
// No atomics: the (index, position) pairs are sorted by index with CUB's radix sort, which is
// stable, so equal indices keep their positions in increasing order; starts[k] (lower bound of k
// in the sorted indices) delimits each row's positions, and one thread per (row, column) adds
// them in that order. Out-of-range indices are reported and sorted past every valid row (key V).
__global__ void embeddingKeysKernel(const void* idx, bool idx64, Geom gi, int64_t n, int64_t v,
                                    uint64_t* keys, int64_t* pos, DeviceErrors err) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = readIndex(idx, idx64, offsetOf(gi, i));
    if (k < 0 || k >= v) reportError(err.word, err.value, err.code, k);
    keys[i] = (k < 0 || k >= v) ? uint64_t(v) : uint64_t(k);
    pos[i] = i;
  }
}

// starts[k] = the first position of sorted keys >= k, for k in [0, V].
__global__ void embeddingStartsKernel(const uint64_t* keys, int64_t n, int64_t v, int64_t* starts) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k <= v;
       k += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < uint64_t(k))
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[k] = lo;
  }
}

// out[k, j] = sum over sorted slots s in [starts[k], starts[k + 1]) of grad[pos[s], j]; zeros
// when starts is null (no indices).
template <typename T>
__global__ void embeddingSumKernel(const T* g, RowGeom gg, const int64_t* starts,
                                   const int64_t* pos, int64_t v, int64_t d, T* out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < v * d;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e / d, j = e % d;
    double s = 0.0;
    if (starts) {
      const int64_t s1 = starts[k + 1];
      for (int64_t q = starts[k]; q < s1; ++q)
        s += readAs<double>(g[offsetOf(gg.rows, pos[q]) + j * gg.step]);
    }
    out[e] = storeAs<T>(s);
  }
}

// ---------------------------------------------------------------- cross entropy

struct Targets {
  const void* p = nullptr;
  bool is64 = false;
  int64_t step = 0;  // stride of the [N] targets
  int64_t ignore = -100;
};
Targets targetsOf(const KernelCtx& c, const Tensor& t) {
  return {t.data(), t.dtype() == DType::Int64, t.dim() ? t.strides()[0] : 0,
          c.attrs.getInt("ignore_index", -100)};
}

// loss[i] = lse(row i) - x[i, t] (float64), 0 for ignored (or reported out-of-range) targets.
template <typename T>
__global__ void __launch_bounds__(1024)
    crossEntropyRowsKernel(const T* x, RowGeom gx, Targets tg, int64_t rows, int64_t cls,
                           double* loss, DeviceErrors err) {
  using C = Compute<T>;
  KEEL_SHARED(double, sd, 32);
  KEEL_SHARED(C, sc, 32);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = readIndex(tg.p, tg.is64, r * tg.step);
    if (t == tg.ignore || t < 0 || t >= cls) {  // the same for the whole block
      if (threadIdx.x == 0) {
        if (t != tg.ignore) reportError(err.word, err.value, err.code, t);
        loss[r] = 0.0;
      }
      continue;
    }
    const T* xr = x + offsetOf(gx.rows, r);
    const C m = rowMax(xr, gx.step, cls, sc);
    const double lse = double(m) + log(rowSumExp(xr, gx.step, cls, m, sd));
    if (threadIdx.x == 0) loss[r] = lse - double(ld(xr, t * gx.step));
  }
}

// The number of targets that are not ignore_index, by one block (integer sum: exact).
__device__ long long countTargets(const Targets& tg, int64_t rows, long long* scratch) {
  long long k = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x)
    k += readIndex(tg.p, tg.is64, i * tg.step) != tg.ignore;
  return blockSum(k, scratch);
}

// out = (sum of loss in the fixed tree) / count, or 0 when every target is ignored. One block.
template <typename T>
__global__ void __launch_bounds__(1024)
    crossEntropyMeanKernel(const double* loss, Targets tg, int64_t rows, T* out) {
  KEEL_SHARED(double, sd, 32);
  KEEL_SHARED(long long, sk, 32);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) s += loss[i];
  s = blockSum(s, sd);
  const long long count = countTargets(tg, rows, sk);
  if (threadIdx.x == 0) out[0] = storeAs<T>(count ? s / double(count) : 0.0);
}

__global__ void __launch_bounds__(1024)
    countTargetsKernel(Targets tg, int64_t rows, long long* count) {
  KEEL_SHARED(long long, sk, 32);
  const long long k = countTargets(tg, rows, sk);
  if (threadIdx.x == 0) *count = k;
}

// Note [cross_entropy backward precision] (cpu/nn.cpp): softmax as exp(x - max) times 1 / sum in
// float64, so the log-sum-exp is never rounded to the compute type.
template <typename T>
__global__ void __launch_bounds__(1024)
    crossEntropyBackwardKernel(const T* grad, const T* x, RowGeom gx, Targets tg, int64_t rows,
                               int64_t cls, const long long* countp, T* out, DeviceErrors err) {
  using C = Compute<T>;
  KEEL_SHARED(double, sd, 32);
  KEEL_SHARED(C, sc, 32);
  const long long count = *countp;
  const double scale = count ? double(readAs<C>(grad[0])) / double(count) : 0.0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    T* dr = out + r * cls;
    const int64_t t = readIndex(tg.p, tg.is64, r * tg.step);
    if (t == tg.ignore || count == 0 || t < 0 || t >= cls) {  // the same for the whole block
      if (threadIdx.x == 0 && t != tg.ignore && (t < 0 || t >= cls))
        reportError(err.word, err.value, err.code, t);
      for (int64_t j = threadIdx.x; j < cls; j += blockDim.x) dr[j] = storeAs<T>(C(0));
      continue;
    }
    const T* xr = x + offsetOf(gx.rows, r);
    const C m = rowMax(xr, gx.step, cls, sc);
    const double inv = 1.0 / rowSumExp(xr, gx.step, cls, m, sd), f = scale * inv;
    for (int64_t j = threadIdx.x; j < cls; j += blockDim.x) {
      const double e = double(expC(ld(xr, j * gx.step) - m));
      dr[j] = storeAs<T>(C(j == t ? (e * inv - 1.0) * scale : e * f));
    }
  }
}

// ---------------------------------------------------------------- rope

// tab[p * half + i] = cos(a), tab[T * half + p * half + i] = sin(a), a = sign·p·base^(-2i/D),
// computed in float64 and rounded to the compute type (as the cpu backend's table).
template <typename C>
__global__ void ropeTableKernel(int64_t t, int64_t half, int64_t d, double base, double sign,
                                C* tab) {
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < t * half;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = u / half, i = u % half;
    const double a = sign * double(p) * pow(base, -2.0 * double(i) / double(d));
    tab[u] = C(cos(a));
    tab[t * half + u] = C(sin(a));
  }
}

// One thread per (row, pair): row r = (b, t, h) of x [B, T, H, D], pair (i, i + D/2).
template <typename T>
__global__ void ropeKernel(const T* x, RowGeom gx, const Compute<T>* tab, int64_t rows, int64_t t,
                           int64_t h, int64_t half, T* out) {
  using C = Compute<T>;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < rows * half;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = u / half, i = u % half;
    const int64_t p = (r / h) % t;
    const T* xr = x + offsetOf(gx.rows, r);
    const C x1 = ld(xr, i * gx.step), x2 = ld(xr, (i + half) * gx.step);
    const C cs = tab[p * half + i], sn = tab[t * half + p * half + i];
    T* o = out + r * 2 * half;
    o[i] = storeAs<T>(x1 * cs - x2 * sn);
    o[i + half] = storeAs<T>(x2 * cs + x1 * sn);
  }
}

}  // namespace

void kSoftmax(const KernelCtx& c) {
  softmaxFamily<Soft::Softmax>(c, "softmaxKernel");
}
void kLogSoftmax(const KernelCtx& c) {
  softmaxFamily<Soft::LogSoftmax>(c, "logSoftmaxKernel");
}
void kSoftmaxBackward(const KernelCtx& c) {
  softmaxFamily<Soft::SoftmaxBackward>(c, "softmaxBackwardKernel");
}
void kLogSoftmaxBackward(const KernelCtx& c) {
  softmaxFamily<Soft::LogSoftmaxBackward>(c, "logSoftmaxBackwardKernel");
}
void kLayerNorm(const KernelCtx& c) {
  normForward<false>(c);
}
void kLayerNormBackward(const KernelCtx& c) {
  normBackward<false>(c);
}
void kRmsNorm(const KernelCtx& c) {
  normForward<true>(c);
}
void kRmsNormBackward(const KernelCtx& c) {
  normBackward<true>(c);
}

void kEmbedding(const KernelCtx& c) {
  const Tensor &w = c.inputs[0], &idx = c.inputs[1], &out = c.outputs[0];
  if (out.numel() == 0) return;
  const int64_t v = w.size(0), d = w.size(1), n = idx.numel();
  const Geom gi = packDimsExcept(c, idx);
  const DeviceErrors err = deviceErrors(c);
  const Launch1D l = launch1D(n * d);
  cudaStream_t stream = deviceCtx(c).stream;
  visitFloat(w.dtype(), [&]<typename T>() {
    launch(embeddingKernel<T>, l.blocks, l.threads, 0, stream, ptr<T>(w), v, d, w.strides()[0],
           w.strides()[1], idx.data(), idx.dtype() == DType::Int64, gi, n, ptr<T>(out), err);
    checkLaunch(c, "embeddingKernel");
  });
}

void kEmbeddingBackward(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &idx = c.inputs[1], &out = c.outputs[0];
  if (out.numel() == 0) return;
  const int64_t v = out.size(0), d = out.size(1), n = idx.numel();
  KEEL_CHECK(n <= int64_t(std::numeric_limits<int>::max()), "op '", c.op.name, "': ", n,
             " indices are more than the cuda kernel sorts");
  DeviceCtx& ctx = deviceCtx(c);
  cudaStream_t stream = ctx.stream;
  const Device dev = out.device();
  Tensor keysIn, keysOut, posIn, posOut, temp, starts;
  if (n > 0) {
    keysIn = makeTensor({n}, DType::Int64, dev);
    keysOut = makeTensor({n}, DType::Int64, dev);
    posIn = makeTensor({n}, DType::Int64, dev);
    posOut = makeTensor({n}, DType::Int64, dev);
    starts = makeTensor({v + 1}, DType::Int64, dev);
    uint64_t* kin = static_cast<uint64_t*>(keysIn.data());
    uint64_t* kout = static_cast<uint64_t*>(keysOut.data());
    const Launch1D lk = launch1D(n);
    launch(embeddingKeysKernel, lk.blocks, lk.threads, 0, stream, idx.data(),
           idx.dtype() == DType::Int64, packDimsExcept(c, idx), n, v, kin, ptr<int64_t>(posIn),
           deviceErrors(c));
    checkLaunch(c, "embeddingKeysKernel");
    const int endBit = int(std::bit_width(uint64_t(v)));  // keys are in [0, V]
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, kin, kout, ptr<int64_t>(posIn),
                                          ptr<int64_t>(posOut), int(n), 0, endBit, stream),
          "cub::DeviceRadixSort::SortPairs (size query)", ctx.index);
    temp = makeTensor({int64_t((bytes + 7) / 8) + 1}, DType::Int64, dev);
    check(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, kin, kout, ptr<int64_t>(posIn),
                                          ptr<int64_t>(posOut), int(n), 0, endBit, stream),
          "cub::DeviceRadixSort::SortPairs", ctx.index);
    const Launch1D ls = launch1D(v + 1);
    launch(embeddingStartsKernel, ls.blocks, ls.threads, 0, stream, kout, n, v,
           ptr<int64_t>(starts));
    checkLaunch(c, "embeddingStartsKernel");
  }
  const RowGeom gg = rowGeom(c, g, g.dim() - 1);
  const Launch1D l = launch1D(v * d);
  visitFloat(out.dtype(), [&]<typename T>() {
    launch(embeddingSumKernel<T>, l.blocks, l.threads, 0, stream, ptr<T>(g), gg,
           n > 0 ? ptr<int64_t>(starts) : nullptr, n > 0 ? ptr<int64_t>(posOut) : nullptr, v, d,
           ptr<T>(out));
    checkLaunch(c, "embeddingSumKernel");
  });
}

void kCrossEntropy(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  const int64_t rows = x.size(0), cls = x.size(1);
  const Targets tg = targetsOf(c, c.inputs[1]);
  cudaStream_t stream = deviceCtx(c).stream;
  Tensor loss;
  if (rows > 0) loss = makeTensor({rows}, DType::Float64, out.device());
  double* pl = rows > 0 ? ptr<double>(loss) : nullptr;
  visitFloat(x.dtype(), [&]<typename T>() {
    if (rows > 0) {
      const RowLaunch l = rowLaunch(rows, cls);
      launch(crossEntropyRowsKernel<T>, l.blocks, l.threads, 0, stream, ptr<T>(x), rowGeom(c, x, 1),
             tg, rows, cls, pl, deviceErrors(c));
      checkLaunch(c, "crossEntropyRowsKernel");
    }
    const RowLaunch one = rowLaunch(1, rows);
    launch(crossEntropyMeanKernel<T>, 1, one.threads, 0, stream, pl, tg, rows, ptr<T>(out));
    checkLaunch(c, "crossEntropyMeanKernel");
  });
}

void kCrossEntropyBackward(const KernelCtx& c) {
  const Tensor &grad = c.inputs[0], &x = c.inputs[1], &out = c.outputs[0];
  if (out.numel() == 0) return;
  const int64_t rows = x.size(0), cls = x.size(1);
  const Targets tg = targetsOf(c, c.inputs[2]);
  cudaStream_t stream = deviceCtx(c).stream;
  Tensor count = makeTensor({1}, DType::Int64, out.device());
  long long* pc = static_cast<long long*>(count.data());
  const RowLaunch one = rowLaunch(1, rows);
  launch(countTargetsKernel, 1, one.threads, 0, stream, tg, rows, pc);
  checkLaunch(c, "countTargetsKernel");
  const RowLaunch l = rowLaunch(rows, cls);
  visitFloat(x.dtype(), [&]<typename T>() {
    launch(crossEntropyBackwardKernel<T>, l.blocks, l.threads, 0, stream, ptr<T>(grad), ptr<T>(x),
           rowGeom(c, x, 1), tg, rows, cls, pc, ptr<T>(out), deviceErrors(c));
    checkLaunch(c, "crossEntropyBackwardKernel");
  });
}

void kRope(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  if (out.numel() == 0) return;
  const int64_t t = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  const int64_t rows = out.numel() / d;
  const double base = c.attrs.getDouble("base", 10000.0);
  const double sign = c.attrs.getBool("inverse", false) ? -1.0 : 1.0;
  cudaStream_t stream = deviceCtx(c).stream;
  visitFloat(x.dtype(), [&]<typename T>() {
    using C = Compute<T>;
    Tensor tab = makeTensor(
        {2 * t * half}, std::is_same_v<C, double> ? DType::Float64 : DType::Float32, out.device());
    const Launch1D lt = launch1D(t * half);
    launch(ropeTableKernel<C>, lt.blocks, lt.threads, 0, stream, t, half, d, base, sign,
           ptr<C>(tab));
    checkLaunch(c, "ropeTableKernel");
    const Launch1D l = launch1D(rows * half);
    launch(ropeKernel<T>, l.blocks, l.threads, 0, stream, ptr<T>(x), rowGeom(c, x, 3), ptr<C>(tab),
           rows, t, h, half, ptr<T>(out));
    checkLaunch(c, "ropeKernel");
  });
}

}  // namespace keel::cuda
