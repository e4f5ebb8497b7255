// Indexing and sorting kernels of the cuda backend: index_select, index_add, gather, scatter_add,
// topk, argsort. Every index is checked on the device (Note [Deferred device errors]); a bad one is
// reported and its element skipped. No floating-point atomics: index_add and scatter_add give each
// output element to one thread, which adds its sources in index order (Note [cuda index order]).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <bit>

#include "cuda_util.cuh"
#include "kernels.h"
#include "shape_util.h"

namespace keel::cuda {
namespace {

// Every dtype but bool, which these kernels do not take (their sums and orderings are of numbers).
template <typename F>
void visitNoBool(const KernelCtx& c, DType t, F&& f) {
  visit(t, [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>)
      KEEL_CHECK(false, "op '", c.op.name, "': no cuda kernel for dtype bool");
    else
      f.template operator()<T>();
  });
}

// Note [cuda index order]
// index_add and scatter_add start from the input `x` and add every source element aimed at an
// output element in the order of its position in the index, in the compute type (float32 for
// float32 and the 16-bit floats, rounded once at the end; float64; int64 for the integers, which
// wrap as on cpu): exactly the cpu backend's sums, so the results are bit-identical to it. One
// thread owns each output element, so nothing is shared and no atomics are needed:
//  - index_add (1-D index of length m along dim): the pairs (index value, position) are sorted by
//    value with CUB's radix sort, which is stable, so each output row's positions form one run in
//    increasing order; a thread finds its row's run by binary search and adds the run in order.
//    Work: O(m log m) for the sort plus one read per source element and output element.
//  - scatter_add (index of x's rank): the positions that can reach output element c differ from
//    c only along dim, so its thread walks the index's line through c (along dim) in order and
//    adds the sources whose index equals c's coordinate. Work: numel(x) * index.size(dim) index
//    reads, cheap where scatter_add is used (gather and topk backward: short lines).
//
// Note [cuda sort order]
// topk and argsort sort each line along dim by a 64-bit key that orders values as the reference
// does (NaN above +inf and all NaNs equal, -0 == +0; descending: the key's complement), with the
// position as the second key: a total order, so any correct sort gives the stable result (ties
// keep the lower index first). Lines up to kSharedSort elements are sorted by one block each, a
// bitonic network in shared memory; longer lines by CUB's DeviceSegmentedSort::StableSortPairs.

// A tensor's stored geometry, dims as they are (nothing merged).
struct Dims {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

Dims dimsOf(const KernelCtx& c, const Tensor& t) {
  KEEL_CHECK(t.dim() <= kMaxDims, "op '", c.op.name, "': at most ", kMaxDims,
             " dims are supported on cuda, got ", shapeStr(t.shape()));
  Dims g;
  g.rank = int(t.dim());
  for (int d = 0; d < g.rank; ++d) {
    g.shape[d] = t.shape()[size_t(d)];
    g.stride[d] = t.strides()[size_t(d)];
  }
  return g;
}

// Offset of row-major position i of g's shape.
__device__ __forceinline__ int64_t offsetOf(const Dims& g, int64_t i) {
  int64_t off = 0;
  for (int d = g.rank - 1; d >= 0; --d) {
    off += (i % g.shape[d]) * g.stride[d];
    i /= g.shape[d];
  }
  return off;
}

// Offset of the element at position r along `dim`, o over the dims before it (row-major) and in
// over the dims after it.
__device__ __forceinline__ int64_t offsetAround(const Dims& g, int dim, int64_t o, int64_t r,
                                                int64_t in) {
  int64_t off = r * g.stride[dim];
  for (int d = g.rank - 1; d > dim; --d) {
    off += (in % g.shape[d]) * g.stride[d];
    in /= g.shape[d];
  }
  for (int d = dim - 1; d >= 0; --d) {
    off += (o % g.shape[d]) * g.stride[d];
    o /= g.shape[d];
  }
  return off;
}

// Where a kernel reports an index out of range (Note [Deferred device errors]).
struct ErrorSink {
  int* word;
  long long* value;
  int code;
  __device__ __forceinline__ void report(int64_t v) const {
    reportError(word, value, code, (long long)v);
  }
};

ErrorSink errorSink(const KernelCtx& c, const DeviceCtx& ctx) {
  return {ctx.errorWord, ctx.errorValue, errorCode(DeviceError::IndexOutOfRange, c.op.id)};
}

// An index tensor (int32 or int64) as the kernels read it.
struct IndexView {
  const void* data;
  bool is64;
  Dims g;
  __device__ __forceinline__ int64_t at(int64_t off) const { return readIndex(data, is64, off); }
};

IndexView indexView(const KernelCtx& c, const Tensor& idx) {
  KEEL_CHECK(idx.dtype() == DType::Int32 || idx.dtype() == DType::Int64, "op '", c.op.name,
             "': index must be int32 or int64, got ", dtypeName(idx.dtype()));
  return {idx.data(), idx.dtype() == DType::Int64, dimsOf(c, idx)};
}

#define KEEL_GRID_STRIDE(i, n)                                              \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Sum in the compute type: integers wrap (two's complement, as the cpu backend's wrapAdd).
template <typename C>
__device__ __forceinline__ C addC(C a, C b) {
  if constexpr (std::is_integral_v<C>)
    return C(uint64_t(a) + uint64_t(b));
  else
    return a + b;
}

// Every index element in [0, extent), else reported.
__global__ void checkIndexKernel(IndexView idx, int64_t n, int64_t extent, ErrorSink err) {
  KEEL_GRID_STRIDE(i, n) {
    const int64_t v = idx.at(offsetOf(idx.g, i));
    if (v < 0 || v >= extent) err.report(v);
  }
}

void checkIndices(const KernelCtx& c, const DeviceCtx& ctx, const IndexView& idx, int64_t n,
                  int64_t extent) {
  if (n == 0) return;
  const Launch1D l = launch1D(n);
  launch(checkIndexKernel, l.blocks, l.threads, 0, ctx.stream, idx, n, extent, errorSink(c, ctx));
  checkLaunch(c, "index check");
}

// ---------------------------------------------------------------- index_select
// out [outer, m, inner] (contiguous) = x[o, index[j], in].
template <typename E>
__global__ void indexSelectKernel(const E* __restrict__ x, Dims xg, int dim, IndexView idx,
                                  int64_t m, int64_t extent, int64_t inner, E* __restrict__ out,
                                  int64_t total, ErrorSink err) {
  KEEL_GRID_STRIDE(u, total) {
    const int64_t in = u % inner, t = u / inner, j = t % m, o = t / m;
    const int64_t v = idx.at(j * idx.g.stride[0]);
    if (v < 0 || v >= extent) {
      err.report(v);
      continue;
    }
    out[u] = x[offsetAround(xg, dim, o, v, in)];
  }
}

// ---------------------------------------------------------------- index_add
// keys[j] = index[j] (extent where out of range, reported: it matches no row), vals[j] = j.
__global__ void indexKeysKernel(IndexView idx, int64_t m, int64_t extent, int64_t* keys,
                                int64_t* vals, ErrorSink err) {
  KEEL_GRID_STRIDE(j, m) {
    int64_t v = idx.at(j * idx.g.stride[0]);
    if (v < 0 || v >= extent) {
      err.report(v);
      v = extent;
    }
    keys[j] = v;
    vals[j] = j;
  }
}

// First position in sorted keys[0, m) whose key is >= v.
__device__ __forceinline__ int64_t lowerBound(const int64_t* keys, int64_t m, int64_t v) {
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// out [outer, n, inner] (contiguous) = x + the src rows aimed at each row, in index order.
template <typename T>
__global__ void indexAddKernel(const T* __restrict__ x, Dims xg, const T* __restrict__ src, Dims sg,
                               int dim, const int64_t* __restrict__ keys,
                               const int64_t* __restrict__ pos, int64_t m, int64_t n, int64_t inner,
                               T* __restrict__ out, int64_t total) {
  using C = Compute<T>;
  KEEL_GRID_STRIDE(u, total) {
    const int64_t in = u % inner, t = u / inner, r = t % n, o = t / n;
    C acc = readAs<C>(x[offsetAround(xg, dim, o, r, in)]);
    const int64_t end = lowerBound(keys, m, r + 1);
    for (int64_t s = lowerBound(keys, m, r); s < end; ++s)
      acc = addC(acc, readAs<C>(src[offsetAround(sg, dim, o, pos[s], in)]));
    out[u] = storeAs<T>(acc);
  }
}

// ---------------------------------------------------------------- gather
// out (contiguous, index's shape) at position i = x at i's coordinates with dim = index[i].
template <typename E>
__global__ void gatherKernel(const E* __restrict__ x, Dims xg, int dim, IndexView idx,
                             E* __restrict__ out, int64_t total, ErrorSink err) {
  const int64_t extent = xg.shape[dim];
  KEEL_GRID_STRIDE(u, total) {
    int64_t rem = u, offI = 0, offX = 0;
    for (int d = idx.g.rank - 1; d >= 0; --d) {
      const int64_t cd = rem % idx.g.shape[d];
      rem /= idx.g.shape[d];
      offI += cd * idx.g.stride[d];
      if (d != dim) offX += cd * xg.stride[d];
    }
    const int64_t v = idx.at(offI);
    if (v < 0 || v >= extent) {
      err.report(v);
      continue;
    }
    out[u] = x[offX + v * xg.stride[dim]];
  }
}

// ---------------------------------------------------------------- scatter_add
// out (contiguous, x's shape) at c = x[c] + src[p] for every index position p on c's line along
// dim (p equals c off dim) with index[p] == c[dim], in order along the line.
template <typename T>
__global__ void scatterAddKernel(const T* __restrict__ x, Dims xg, IndexView idx,
                                 const T* __restrict__ src, Dims sg, int dim, T* __restrict__ out,
                                 int64_t total) {
  using C = Compute<T>;
  KEEL_GRID_STRIDE(u, total) {
    int64_t rem = u, offX = 0, offI = 0, offS = 0, target = 0;
    bool reached = true;
    for (int d = xg.rank - 1; d >= 0; --d) {
      const int64_t cd = rem % xg.shape[d];
      rem /= xg.shape[d];
      offX += cd * xg.stride[d];
      if (d == dim) {
        target = cd;
      } else {
        reached = reached && cd < idx.g.shape[d];
        offI += cd * idx.g.stride[d];
        offS += cd * sg.stride[d];
      }
    }
    C acc = readAs<C>(x[offX]);
    if (reached) {
      const int64_t len = idx.g.shape[dim], si = idx.g.stride[dim], ss = sg.stride[dim];
      for (int64_t j = 0; j < len; ++j)
        if (idx.at(offI + j * si) == target) acc = addC(acc, readAs<C>(src[offS + j * ss]));
    }
    out[u] = storeAs<T>(acc);
  }
}

// ---------------------------------------------------------------- topk / argsort
// Note [cuda sort order]: 64-bit keys whose unsigned order is the sort order.
template <typename T>
__device__ __forceinline__ uint64_t sortKey(T v, bool descending) {
  uint64_t u;
  if constexpr (std::is_same_v<T, double>) {
    double d = v;
    if (d != d) {
      u = ~uint64_t(0);
    } else {
      if (d == 0.0) d = 0.0;  // -0 sorts as +0
      const uint64_t b = uint64_t(__double_as_longlong(d));
      u = (b >> 63) ? ~b : (b | (uint64_t(1) << 63));
    }
  } else if constexpr (kIsFloatD<T>) {
    float f = readAs<float>(v);
    if (f != f) {
      u = 0xffffffffu;
    } else {
      if (f == 0.0f) f = 0.0f;
      const uint32_t b = __float_as_uint(f);
      u = (b >> 31) ? uint32_t(~b) : (b | 0x80000000u);
    }
  } else if constexpr (std::is_same_v<T, int64_t>) {
    u = uint64_t(v) ^ (uint64_t(1) << 63);
  } else {
    u = uint32_t(v) ^ 0x80000000u;
  }
  return descending ? ~u : u;
}

// Lines sorted in shared memory: at most this many elements (keys + positions: 12 bytes each, so
// 48 KiB of dynamic shared memory, the limit without an opt-in).
constexpr int64_t kSharedSort = 4096;

struct LineGeom {
  int64_t lines, n, inner, k;  // k: how many of each sorted line are written
  int dim;
};

// One block per line: load (key, position) pairs, padded to `pow2` with keys after every real
// one, bitonic sort ascending by (key, position), write the first k positions (and values).
template <typename T>
__global__ void __launch_bounds__(1024)
    sortLinesKernel(const T* __restrict__ x, Dims xg, LineGeom lg, int pow2, bool descending,
                    T* __restrict__ vals, int64_t* __restrict__ ids) {
  KEEL_DYNAMIC_SHARED(uint64_t, sortShared);
  uint64_t* key = sortShared;
  int32_t* pos = reinterpret_cast<int32_t*>(sortShared + pow2);
  const int n = int(lg.n), half = pow2 / 2;
  for (int64_t line = blockIdx.x; line < lg.lines; line += gridDim.x) {
    const int64_t o = line / lg.inner, in = line % lg.inner;
    for (int j = threadIdx.x; j < pow2; j += blockDim.x) {
      key[j] = j < n ? sortKey(x[offsetAround(xg, lg.dim, o, j, in)], descending) : ~uint64_t(0);
      pos[j] = j;
    }
    __syncthreads();
    for (int size = 2; size <= pow2; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int p = threadIdx.x; p < half; p += blockDim.x) {
          const int i = 2 * stride * (p / stride) + (p % stride), j = i + stride;
          const bool up = (i & size) == 0;
          const bool greater = key[i] > key[j] || (key[i] == key[j] && pos[i] > pos[j]);
          if (greater == up) {
            const uint64_t tk = key[i];
            key[i] = key[j];
            key[j] = tk;
            const int32_t tp = pos[i];
            pos[i] = pos[j];
            pos[j] = tp;
          }
        }
        __syncthreads();
      }
    }
    for (int64_t j = threadIdx.x; j < lg.k; j += blockDim.x) {
      const int64_t at = (o * lg.k + j) * lg.inner + in, p = pos[j];
      ids[at] = p;
      if (vals) vals[at] = x[offsetAround(xg, lg.dim, o, p, in)];
    }
    __syncthreads();  // the next line reuses the shared arrays
  }
}

// Long lines (CUB): keys and positions of every line, laid out line after line, and the lines'
// start offsets.
template <typename T>
__global__ void lineKeysKernel(const T* __restrict__ x, Dims xg, LineGeom lg, bool descending,
                               uint64_t* __restrict__ keys, int64_t* __restrict__ pos,
                               int64_t* __restrict__ starts) {
  KEEL_GRID_STRIDE(u, lg.lines * lg.n) {
    const int64_t line = u / lg.n, j = u % lg.n;
    keys[u] = sortKey(x[offsetAround(xg, lg.dim, line / lg.inner, j, line % lg.inner)], descending);
    pos[u] = j;
  }
  KEEL_GRID_STRIDE(u, lg.lines + 1) starts[u] = u * lg.n;
}

template <typename T>
__global__ void lineWriteKernel(const T* __restrict__ x, Dims xg, LineGeom lg,
                                const int64_t* __restrict__ sortedPos, T* __restrict__ vals,
                                int64_t* __restrict__ ids) {
  KEEL_GRID_STRIDE(u, lg.lines * lg.k) {
    const int64_t line = u / lg.k, j = u % lg.k;
    const int64_t o = line / lg.inner, in = line % lg.inner;
    const int64_t p = sortedPos[line * lg.n + j], at = (o * lg.k + j) * lg.inner + in;
    ids[at] = p;
    if (vals) vals[at] = x[offsetAround(xg, lg.dim, o, p, in)];
  }
}

// Temporary device bytes (CUB's scratch) as a keel tensor on the op's device; never empty, since
// CUB takes a null scratch address for a size query.
Tensor scratch(size_t bytes, Device d) {
  return makeTensor({int64_t((std::max<size_t>(bytes, 1) + 7) / 8)}, DType::Int64, d);
}

void sortLines(const KernelCtx& c, int64_t k, bool descending, const Tensor* vals,
               const Tensor& ids) {
  const Tensor& x = c.inputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const DimSplit sp = splitAt(x.shape(), d);
  KEEL_CHECK(k >= 0 && k <= sp.n, "op '", c.op.name, "': k = ", k, " out of range for extent ",
             sp.n);
  const LineGeom lg{sp.outer * sp.inner, sp.n, sp.inner, k, int(d)};
  if (k == 0 || lg.lines == 0) return;
  DeviceCtx& ctx = deviceCtx(c);
  const Dims xg = dimsOf(c, x);
  visitNoBool(c, x.dtype(), [&]<typename T>() {
    T* pv = vals ? ptr<T>(*vals) : nullptr;
    int64_t* pi = ptr<int64_t>(ids);
    if (lg.n <= kSharedSort) {
      int pow2 = 1;
      while (pow2 < lg.n) pow2 *= 2;
      const int threads = std::clamp(pow2 / 2, 32, 1024);
      const unsigned blocks = unsigned(std::min<int64_t>(lg.lines, int64_t(1) << 20));
      const size_t shared = size_t(pow2) * (sizeof(uint64_t) + sizeof(int32_t));
      launch(sortLinesKernel<T>, blocks, threads, shared, ctx.stream, ptr<T>(x), xg, lg, pow2,
             descending, pv, pi);
      checkLaunch(c, "sort lines (shared memory)");
      return;
    }
    const int64_t total = lg.lines * lg.n;
    const Device dev = ids.device();
    Tensor keys = makeTensor({total}, DType::Int64, dev),
           keysOut = makeTensor({total}, DType::Int64, dev);
    Tensor pos = makeTensor({total}, DType::Int64, dev),
           posOut = makeTensor({total}, DType::Int64, dev);
    Tensor starts = makeTensor({lg.lines + 1}, DType::Int64, dev);
    uint64_t* pk = static_cast<uint64_t*>(keys.data());
    uint64_t* pko = static_cast<uint64_t*>(keysOut.data());
    const Launch1D l = launch1D(total);
    launch(lineKeysKernel<T>, l.blocks, l.threads, 0, ctx.stream, ptr<T>(x), xg, lg, descending, pk,
           ptr<int64_t>(pos), ptr<int64_t>(starts));
    checkLaunch(c, "sort keys");
    const int64_t* ps = ptr<int64_t>(starts);
    size_t bytes = 0;
    check(cub::DeviceSegmentedSort::StableSortPairs(nullptr, bytes, pk, pko, ptr<int64_t>(pos),
                                                    ptr<int64_t>(posOut), total, lg.lines, ps,
                                                    ps + 1, ctx.stream),
          "cub::DeviceSegmentedSort::StableSortPairs (size query)", ctx.index);
    Tensor tmp = scratch(bytes, dev);
    check(cub::DeviceSegmentedSort::StableSortPairs(tmp.data(), bytes, pk, pko, ptr<int64_t>(pos),
                                                    ptr<int64_t>(posOut), total, lg.lines, ps,
                                                    ps + 1, ctx.stream),
          "cub::DeviceSegmentedSort::StableSortPairs", ctx.index);
    const Launch1D w = launch1D(lg.lines * k);
    launch(lineWriteKernel<T>, w.blocks, w.threads, 0, ctx.stream, ptr<T>(x), xg, lg,
           ptr<int64_t>(posOut), pv, pi);
    checkLaunch(c, "sort write");
  });
}

}  // namespace

void kIndexSelect(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const DimSplit sp = splitAt(x.shape(), d);
  DeviceCtx& ctx = deviceCtx(c);
  const IndexView idx = indexView(c, index);
  const int64_t m = index.numel(), total = out.numel();
  if (total == 0) {  // nothing read the indices: check them on their own
    checkIndices(c, ctx, idx, m, sp.n);
    return;
  }
  const Dims xg = dimsOf(c, x);
  const Launch1D l = launch1D(total);
  visitWidth(dtypeSize(x.dtype()), [&]<typename E>() {
    launch(indexSelectKernel<E>, l.blocks, l.threads, 0, ctx.stream, ptr<E>(x), xg, int(d), idx, m,
           sp.n, sp.inner, ptr<E>(out), total, errorSink(c, ctx));
  });
  checkLaunch(c, "index_select");
}

void kIndexAdd(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &src = c.inputs[2], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const DimSplit sp = splitAt(x.shape(), d);
  DeviceCtx& ctx = deviceCtx(c);
  const IndexView idx = indexView(c, index);
  const int64_t m = index.numel(), total = out.numel();
  const Device dev = out.device();
  // Note [cuda index order]: the positions sorted by index value (stable).
  Tensor keys, pos, keysSorted, posSorted;
  if (m > 0) {
    keys = makeTensor({m}, DType::Int64, dev);
    pos = makeTensor({m}, DType::Int64, dev);
    const Launch1D l = launch1D(m);
    launch(indexKeysKernel, l.blocks, l.threads, 0, ctx.stream, idx, m, sp.n, ptr<int64_t>(keys),
           ptr<int64_t>(pos), errorSink(c, ctx));
    checkLaunch(c, "index_add keys");
  }
  if (total == 0) return;
  if (m > 0) {
    keysSorted = makeTensor({m}, DType::Int64, dev);
    posSorted = makeTensor({m}, DType::Int64, dev);
    const int endBit = std::max(1, int(std::bit_width(uint64_t(sp.n))));  // keys are in [0, n]
    size_t bytes = 0;
    // Unsigned keys (all are in [0, n]): CUB sorts their bits [0, endBit) as they are.
    const uint64_t* kin = static_cast<const uint64_t*>(keys.data());
    uint64_t* kout = static_cast<uint64_t*>(keysSorted.data());
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, kin, kout, ptr<int64_t>(pos),
                                          ptr<int64_t>(posSorted), m, 0, endBit, ctx.stream),
          "cub::DeviceRadixSort::SortPairs (size query)", ctx.index);
    Tensor tmp = scratch(bytes, dev);
    check(cub::DeviceRadixSort::SortPairs(tmp.data(), bytes, kin, kout, ptr<int64_t>(pos),
                                          ptr<int64_t>(posSorted), m, 0, endBit, ctx.stream),
          "cub::DeviceRadixSort::SortPairs", ctx.index);
  }
  const int64_t* pk = m > 0 ? ptr<int64_t>(keysSorted) : nullptr;
  const int64_t* pp = m > 0 ? ptr<int64_t>(posSorted) : nullptr;
  const Dims xg = dimsOf(c, x), sg = dimsOf(c, src);
  const Launch1D l = launch1D(total);
  visitNoBool(c, x.dtype(), [&]<typename T>() {
    launch(indexAddKernel<T>, l.blocks, l.threads, 0, ctx.stream, ptr<T>(x), xg, ptr<T>(src), sg,
           int(d), pk, pp, m, sp.n, sp.inner, ptr<T>(out), total);
  });
  checkLaunch(c, "index_add");
}

void kGather(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  KEEL_CHECK(index.dim() == x.dim(), "op '", c.op.name, "': index must have the input's rank");
  const int64_t total = out.numel();
  if (total == 0) return;  // the output is index-shaped: no index to check
  DeviceCtx& ctx = deviceCtx(c);
  const IndexView idx = indexView(c, index);
  const Dims xg = dimsOf(c, x);
  const Launch1D l = launch1D(total);
  visitWidth(dtypeSize(x.dtype()), [&]<typename E>() {
    launch(gatherKernel<E>, l.blocks, l.threads, 0, ctx.stream, ptr<E>(x), xg, int(d), idx,
           ptr<E>(out), total, errorSink(c, ctx));
  });
  checkLaunch(c, "gather");
}

void kScatterAdd(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &src = c.inputs[2], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  KEEL_CHECK(index.dim() == x.dim() && src.shape() == index.shape(), "op '", c.op.name,
             "': index and source must have the input's rank and one shape");
  DeviceCtx& ctx = deviceCtx(c);
  const IndexView idx = indexView(c, index);
  // The main kernel reads only indices that hit an element; every one is checked here.
  checkIndices(c, ctx, idx, index.numel(), x.size(d));
  const int64_t total = out.numel();
  if (total == 0) return;
  const Dims xg = dimsOf(c, x), sg = dimsOf(c, src);
  const Launch1D l = launch1D(total);
  visitNoBool(c, x.dtype(), [&]<typename T>() {
    launch(scatterAddKernel<T>, l.blocks, l.threads, 0, ctx.stream, ptr<T>(x), xg, idx, ptr<T>(src),
           sg, int(d), ptr<T>(out), total);
  });
  checkLaunch(c, "scatter_add");
}

void kTopk(const KernelCtx& c) {
  sortLines(c, c.attrs.getInt("k"), c.attrs.getBool("largest", true), &c.outputs[0], c.outputs[1]);
}

void kArgsort(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  sortLines(c, x.size(d), c.attrs.getBool("descending", false), nullptr, c.outputs[0]);
}

#undef KEEL_GRID_STRIDE

}  // namespace keel::cuda
