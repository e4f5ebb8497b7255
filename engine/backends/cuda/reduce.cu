// Reductions of the cuda backend: sum and mean over a dim set, max and argmax along one dim, read
// from any strided layout in place (no copy). Sums accumulate in float64 (integers: wrapping
// int64) in an order fixed by the shape alone (Note [cuda reduction order]); max and argmax are
// exact: the first maximum, NaN counting as the largest value (the first NaN wins).
#include <cmath>
#include <vector>

#include "cuda_util.cuh"
#include "kernels.h"
#include "shape_util.h"

namespace keel::cuda {
namespace {

// Note [cuda reduction order]
// A sum (or mean) reads x as outputs × n: the kept dims in row-major order name the output o, the
// reduced dims in row-major order give the position j in [0, n) of each term (size-1 dims are
// dropped and adjacent dims merged, which keeps both orders). The plan is reducePlan(outer, n,
// inner) (launch.h), with inner = the product of the kept extents after the last reduced one.
// Terms are widened to double (integers: to int64, added with wrap-around) and added as follows,
// every partial sum starting from zero; nothing depends on the device, the grid or timing.
//  - Block per output (inner == 1 and n >= 64; the block has T = rowLaunch(., n).threads
//    threads): j is cut into chunks of kBlockChunk = 65536 positions. In a chunk, thread t adds
//    positions chunk start + t, + t + T, + t + 2T, ... in increasing order; the T thread sums are
//    combined by blockSum's tree (cuda_util.cuh: butterfly __shfl_xor over lanes 16, 8, 4, 2, 1
//    in each warp, then the same butterfly over the warps' sums in warp order).
//  - Thread per output (otherwise): one thread adds positions in increasing order, in chunks of
//    kThreadChunk = 1024 positions when there are fewer than kThreadChunkOutputs = 32768
//    outputs (so a few long columns still spread over many threads), else in a single chunk.
// With more than one chunk, the chunk sums go to a float64 (int64) buffer and one thread per
// output adds them in chunk order: ((0 + c0) + c1) + .... The sum is rounded once to the output
// dtype (16-bit floats through float32, as the cpu backend); a mean divides it in float64 by n
// first (NaN when n is 0). An empty reduction gives 0. Max and argmax read x as outputs × n along
// their dim with the same plan (no chunks): each thread keeps the best of its positions under
// `beats` below and the block combines them in the same butterfly; `beats` is a total order, so
// the result is exact and the same whatever the order.
constexpr int64_t kBlockChunk = 65536;
constexpr int64_t kThreadChunk = 1024;
constexpr int64_t kThreadChunkOutputs = 32768;

// ---------------------------------------------------------------- geometry

// ---------------------------------------------------------------- sum and mean

template <typename T>
using SumAcc = std::conditional_t<kIsFloatD<T>, double, unsigned long long>;

template <typename T>
__device__ __forceinline__ SumAcc<T> term(T v) {
  if constexpr (kIsFloatD<T>)
    return readAs<double>(v);
  else
    return (unsigned long long)(long long)(v);
}

template <typename T>
__device__ __forceinline__ T storeSum(SumAcc<T> s, double count, bool mean) {
  if constexpr (kIsFloatD<T>)
    return storeAs<T>(mean ? (count > 0 ? s / count : __longlong_as_double(0x7ff8000000000000LL))
                           : s);  // the quiet NaN of std::nan(""), as the cpu backend
  else
    return T((long long)s);  // wraps like the integer ops (int32: the low 32 bits)
}

struct SumArgs {
  Geom kept, red;  // output o's offset; term j's offset from it
  int64_t outputs = 0, n = 0, chunkLen = 0, chunks = 1;
  double count = 0;
  bool mean = false;
};

// Block per (output, chunk) unit; unit u = o * chunks + chunk. kPartial: chunk sums to `part`.
template <typename T, bool kPartial>
__global__ void __launch_bounds__(1024)
    sumBlockKernel(const T* x, SumArgs a, SumAcc<T>* part, T* out) {
  using A = SumAcc<T>;
  KEEL_SHARED(A, scratch, 32);
  const int64_t units = a.outputs * a.chunks;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const int64_t o = u / a.chunks, ch = u % a.chunks;
    const T* base = x + offsetOf(a.kept, o);
    const int64_t j1 = min(a.n, (ch + 1) * a.chunkLen);
    A s = A(0);
    for (int64_t j = ch * a.chunkLen + threadIdx.x; j < j1; j += blockDim.x)
      s += term(base[offsetOf(a.red, j)]);
    s = blockSum(s, scratch);
    if (threadIdx.x == 0) {
      if constexpr (kPartial)
        part[u] = s;
      else
        out[o] = storeSum<T>(s, a.count, a.mean);
    }
  }
}

// Thread per (output, chunk) unit; unit u = chunk * outputs + o (neighbouring threads read
// neighbouring columns); chunk sums go to part[o * chunks + chunk].
template <typename T, bool kPartial>
__global__ void sumThreadKernel(const T* x, SumArgs a, SumAcc<T>* part, T* out) {
  using A = SumAcc<T>;
  const int64_t units = a.outputs * a.chunks;
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units;
       u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = u / a.outputs, o = u % a.outputs;
    const T* base = x + offsetOf(a.kept, o);
    const int64_t j1 = min(a.n, (ch + 1) * a.chunkLen);
    A s = A(0);
    for (int64_t j = ch * a.chunkLen; j < j1; ++j) s += term(base[offsetOf(a.red, j)]);
    if constexpr (kPartial)
      part[o * a.chunks + ch] = s;
    else
      out[o] = storeSum<T>(s, a.count, a.mean);
  }
}

// out[o] = chunk sums of output o added in chunk order.
template <typename T>
__global__ void sumChunksKernel(const SumAcc<T>* part, SumArgs a, T* out) {
  using A = SumAcc<T>;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < a.outputs;
       o += int64_t(gridDim.x) * blockDim.x) {
    A s = A(0);
    for (int64_t ch = 0; ch < a.chunks; ++ch) s += part[o * a.chunks + ch];
    out[o] = storeSum<T>(s, a.count, a.mean);
  }
}

template <typename T>
void launchSum(const KernelCtx& c, SumArgs a, const ReducePlan& plan) {
  using A = SumAcc<T>;
  cudaStream_t stream = deviceCtx(c).stream;
  const T* x = ptr<T>(c.inputs[0]);
  T* out = ptr<T>(c.outputs[0]);
  const bool block = plan.blockPerOutput;
  a.chunkLen = block ? kBlockChunk
                     : (a.outputs < kThreadChunkOutputs ? kThreadChunk : std::max<int64_t>(a.n, 1));
  a.chunks = std::max<int64_t>(1, (a.n + a.chunkLen - 1) / a.chunkLen);
  const int64_t units = a.outputs * a.chunks;
  Tensor part;
  A* pp = nullptr;
  if (a.chunks > 1) {
    part = makeTensor({units}, DType::Int64, c.outputs[0].device());  // 8-byte slots
    pp = static_cast<A*>(part.data());
  }
  if (block) {
    const unsigned blocks = unsigned(std::clamp<int64_t>(units, 1, 65535));
    if (a.chunks > 1)
      launch(sumBlockKernel<T, true>, blocks, plan.threads, 0, stream, x, a, pp, out);
    else
      launch(sumBlockKernel<T, false>, blocks, plan.threads, 0, stream, x, a, pp, out);
    checkLaunch(c, "sumBlockKernel");
  } else {
    const Launch1D l = launch1D(units);
    if (a.chunks > 1)
      launch(sumThreadKernel<T, true>, l.blocks, l.threads, 0, stream, x, a, pp, out);
    else
      launch(sumThreadKernel<T, false>, l.blocks, l.threads, 0, stream, x, a, pp, out);
    checkLaunch(c, "sumThreadKernel");
  }
  if (a.chunks > 1) {
    const Launch1D l = launch1D(a.outputs);
    launch(sumChunksKernel<T>, l.blocks, l.threads, 0, stream, pp, a, out);
    checkLaunch(c, "sumChunksKernel");
  }
}

void sumOrMean(const KernelCtx& c, bool mean) {
  const Tensor& x = c.inputs[0];
  const Tensor& out = c.outputs[0];
  const int64_t outputs = out.numel();
  if (outputs == 0) return;
  const auto& dims = c.attrs.getInts("dims");
  std::vector<bool> red(size_t(x.dim()), dims.empty());
  for (int64_t d : dims) red[size_t(normDim(d, x.dim(), c.op.name))] = true;

  std::vector<std::pair<int64_t, int64_t>> keptDims, redDims;
  int64_t n = 1, inner = 1;
  for (size_t d = 0; d < red.size(); ++d) {
    const int64_t size = x.shape()[d];
    (red[d] ? redDims : keptDims).push_back({size, x.strides()[d]});
    if (red[d]) {
      n *= size;
      if (size != 1) inner = 1;  // kept extents after the last reduced one
    } else {
      inner *= size;
    }
  }
  SumArgs a;
  a.kept = packDims(c, keptDims);
  a.red = packDims(c, redDims);
  a.outputs = outputs;
  a.n = n;
  a.count = double(x.numel()) / double(outputs);
  a.mean = mean;
  const ReducePlan plan = reducePlan(outputs / inner, n, inner);
  visit(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatD<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      KEEL_CHECK(!mean || kIsFloatD<T>, "op '", c.op.name, "': no cuda kernel for integers");
      launchSum<T>(c, a, plan);
    } else {
      throw Error(
          detail::concat("op '", c.op.name, "': no cuda kernel for ", dtypeName(x.dtype())));
    }
  });
}

// ---------------------------------------------------------------- max and argmax

// Whether candidate (v, i) beats the current best (bv, bi) under "NaN is the largest value, then
// the larger value, then the smaller index"; i < 0 marks no candidate. This is a total order on
// distinct indices, so any combination order picks the element the sequential rule of the
// reference picks (the first NaN if there is one, else the first maximum).
template <typename C>
__device__ __forceinline__ bool beats(C v, int64_t i, C bv, int64_t bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  if constexpr (std::is_floating_point_v<C>) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && bn ? i < bi : vn;
  }
  return v > bv || (v == bv && i < bi);
}

struct MaxArgs {
  Geom kept;         // output o's offset
  int64_t step = 0;  // stride of the reduced dim
  int64_t outputs = 0, n = 0;
};

template <typename T>
__device__ __forceinline__ void storeMax(const T* base, const MaxArgs& a, int64_t o, int64_t bi,
                                         T* vals, int64_t* idx) {
  if (idx)
    idx[o] = bi;
  else
    vals[o] = base[bi * a.step];  // the element itself (exact, NaN payload included)
}

// Every lane of the warp ends with the warp's best (value, position) by `beats` (a butterfly
// over lanes 16, 8, 4, 2, 1: the same order whatever the data).
template <typename C>
__device__ __forceinline__ void warpBest(C& bv, int64_t& bi) {
  for (int s = 16; s > 0; s >>= 1) {
    const C v = __shfl_xor_sync(0xffffffffu, bv, s);
    const int64_t i = __shfl_xor_sync(0xffffffffu, bi, s);
    if (beats(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
}

// Block per output: thread t scans positions t, t + T, ...; the block combines by `beats`.
template <typename T>
__global__ void __launch_bounds__(1024)
    maxBlockKernel(const T* x, MaxArgs a, T* vals, int64_t* idx) {
  using C = Compute<T>;
  KEEL_SHARED(C, sv, 32);
  KEEL_SHARED(int64_t, si, 32);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {
    const T* base = x + offsetOf(a.kept, o);
    C bv = C(0);
    int64_t bi = -1;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      const C v = readAs<C>(base[j * a.step]);
      if (beats(v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
    }
    warpBest(bv, bi);
    __syncthreads();  // the previous output's readers are done with sv, si
    if (lane == 0) {
      sv[warp] = bv;
      si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      bv = lane < warps ? sv[lane] : C(0);
      bi = lane < warps ? si[lane] : -1;
      warpBest(bv, bi);
      if (lane == 0) storeMax(base, a, o, bi, vals, idx);
    }
  }
}

// Thread per output: the reference's sequential scan.
template <typename T>
__global__ void maxThreadKernel(const T* x, MaxArgs a, T* vals, int64_t* idx) {
  using C = Compute<T>;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < a.outputs;
       o += int64_t(gridDim.x) * blockDim.x) {
    const T* base = x + offsetOf(a.kept, o);
    C bv = readAs<C>(base[0]);
    int64_t bi = 0;
    for (int64_t j = 1; j < a.n; ++j) {
      const C v = readAs<C>(base[j * a.step]);
      if (beats(v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
    }
    storeMax(base, a, o, bi, vals, idx);
  }
}

void maxAlong(const KernelCtx& c, bool wantIndex) {
  const Tensor& x = c.inputs[0];
  const Tensor& out = c.outputs[0];
  const int64_t dim = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  if (out.numel() == 0) return;
  KEEL_CHECK(x.size(dim) > 0, "op '", c.op.name, "': cannot reduce an empty dim of ",
             shapeStr(x.shape()));
  std::vector<std::pair<int64_t, int64_t>> keptDims;
  int64_t inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim) continue;
    keptDims.push_back({x.shape()[size_t(d)], x.strides()[size_t(d)]});
    if (d > dim) inner *= x.shape()[size_t(d)];
  }
  MaxArgs a;
  a.kept = packDims(c, keptDims);
  a.step = x.strides()[size_t(dim)];
  a.outputs = out.numel();
  a.n = x.size(dim);
  const ReducePlan plan = reducePlan(a.outputs / inner, a.n, inner);
  cudaStream_t stream = deviceCtx(c).stream;
  visit(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatD<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
      T* vals = wantIndex ? nullptr : ptr<T>(out);
      int64_t* idx = wantIndex ? ptr<int64_t>(out) : nullptr;
      if (plan.blockPerOutput) {
        launch(maxBlockKernel<T>, plan.blocks, plan.threads, 0, stream, ptr<T>(x), a, vals, idx);
        checkLaunch(c, "maxBlockKernel");
      } else {
        launch(maxThreadKernel<T>, plan.blocks, plan.threads, 0, stream, ptr<T>(x), a, vals, idx);
        checkLaunch(c, "maxThreadKernel");
      }
    } else {
      throw Error(
          detail::concat("op '", c.op.name, "': no cuda kernel for ", dtypeName(x.dtype())));
    }
  });
}

}  // namespace

void kSum(const KernelCtx& c) {
  sumOrMean(c, false);
}
void kMean(const KernelCtx& c) {
  sumOrMean(c, true);
}
void kMax(const KernelCtx& c) {
  maxAlong(c, false);
}
void kArgmax(const KernelCtx& c) {
  maxAlong(c, true);
}

}  // namespace keel::cuda
