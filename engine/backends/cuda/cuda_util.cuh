// Device-side helpers shared by the cuda kernels: the element types as the device stores them
// (16-bit floats converted with exactly the host's rounding, keel/base/dtype.h), strided geometry
// of an input seen at the output's shape (broadcast dims have stride 0), the compute types, and a
// dtype switch for launching a kernel template. Included by .cu files only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/registry.h"
#include "kernel_util.h"
#include "launch.h"
#include "runtime.h"

namespace keel::cuda {

// ---------------------------------------------------------------- element types
// Same bits and layout as keel::Half / keel::BFloat16 (the host's), so buffers move unchanged.
struct alignas(2) DHalf {
  uint16_t bits;
};
struct alignas(2) DBFloat16 {
  uint16_t bits;
};

// Float values of stored elements, and stores rounded to nearest even (NaN stays NaN), as the
// host converts (Half::fromFloat, BFloat16::fromFloat).
__device__ __forceinline__ float toFloat(DHalf h) {
  return __half2float(__ushort_as_half(h.bits));
}
__device__ __forceinline__ float toFloat(DBFloat16 b) {
  return __uint_as_float(uint32_t(b.bits) << 16);
}
__device__ __forceinline__ DBFloat16 toBFloat16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
__device__ __forceinline__ DHalf toHalf(float f) {
  if (f != f) return {uint16_t((__float_as_uint(f) >> 16 & 0x8000u) | 0x7e00u)};  // host's NaN
  return {__half_as_ushort(__float2half_rn(f))};
}

template <typename T>
inline constexpr bool kIsFloatD = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                  std::is_same_v<T, DHalf> || std::is_same_v<T, DBFloat16>;
template <typename T>
inline constexpr bool kIs16D = std::is_same_v<T, DHalf> || std::is_same_v<T, DBFloat16>;

// Compute type: float for float32 and the 16-bit floats, double for float64, int64 for integers
// and bool (as the cpu backend's AccT).
template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double,
                                   std::conditional_t<kIsFloatD<T>, float, int64_t>>;

// Reads an element as type C (C: float, double or int64_t). Integers read as floats convert
// exactly below 2^24 / 2^53, as on the host.
template <typename C, typename T>
__device__ __forceinline__ C readAs(T v) {
  if constexpr (kIs16D<T>)
    return C(toFloat(v));
  else
    return C(v);
}

// A double/float/int64 stored as T: floats rounded once (16-bit through float), integers from
// floating values saturate with NaN -> 0 (keel::saturatingInt), bool is "non-zero".
template <typename T, typename C>
__device__ __forceinline__ T storeAs(C x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x != C(0);
  } else if constexpr (std::is_same_v<T, DHalf>) {
    return toHalf(float(x));
  } else if constexpr (std::is_same_v<T, DBFloat16>) {
    return toBFloat16(float(x));
  } else if constexpr (std::is_floating_point_v<T>) {
    return T(x);
  } else if constexpr (std::is_floating_point_v<C>) {
    if (x != x) return T(0);
    constexpr T tmin = std::numeric_limits<T>::min(), tmax = std::numeric_limits<T>::max();
    if (double(x) <= double(tmin)) return tmin;
    if (double(x) >= double(tmax)) return tmax;
    return T(x);
  } else {
    return T(x);
  }
}

// ---------------------------------------------------------------- geometry
inline constexpr int kMaxDims = 8;

// A strided view: element i (row-major over shape) is at data + offset(i).
struct Geom {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  bool contiguous = true;  // offset(i) == i

  __device__ __forceinline__ int64_t offset(int64_t i) const {
    if (contiguous) return i;
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t s = shape[d];
      off += (i % s) * stride[d];
      i /= s;
    }
    return off;
  }
};
// Dims (size, stride) with size-1 dims dropped and adjacent mergeable dims merged, as a strided
// Geom whose offset(i) is the i-th element's offset in row-major order (offsetOf reads it, with a
// fast path for one dim). Throws keel::Error naming the op past kMaxDims dims after merging.
Geom packDims(const KernelCtx& c, const std::vector<std::pair<int64_t, int64_t>>& dims);
__device__ __forceinline__ int64_t offsetOf(const Geom& g, int64_t i) {
  return g.rank == 1 ? i * g.stride[0] : g.offset(i);
}

// t's geometry, or t seen at `shape` (broadcast dims: stride 0). Throws keel::Error naming the op
// for more than kMaxDims dims.
Geom geomOf(const Tensor& t);
Geom geomAs(const Tensor& t, const Shape& shape);
// Enqueues dst[dg] = src[sg] for the n elements both geometries describe, `elem` bytes each (bytes
// only move: exact for every dtype). copy.cu.
void copyStrided(const KernelCtx& c, cudaStream_t s, void* dst, const Geom& dg, const void* src,
                 const Geom& sg, int64_t n, size_t elem);

// ---------------------------------------------------------------- launches
// kernel<<<grid, block, smem, stream>>>(args...), spelled as a call so that the same source runs
// on the CUDA simulator (Note [CUDA simulator], engine/backends/cuda/sim/kernel.cpp), where device
// code is host C++ and `<<<` does not parse.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            A&&... args) {
#if KEEL_CUDA_SIM
  keel_sim::launch(kernel, grid, block, smem, stream, std::forward<A>(args)...);
#else
  kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
#endif
}

// Declares `name`, the launch's dynamic shared memory as T[] (16-byte aligned), inside a kernel
// (T a fixed type, never a template parameter: nvcc rejects two extern __shared__ arrays of one
// name with different types — the simulator would not notice; cast from unsigned char instead);
// and `name`, a block's shared array T[n]. On the simulator both are the block's memory from the
// launch, 0xFF bytes when the block starts, so a read before any write shows.
#if KEEL_CUDA_SIM
#define KEEL_DYNAMIC_SHARED(T, name) T* const name = static_cast<T*>(::keel_sim::dynamicShared())
#define KEEL_SHARED(T, name, n)     \
  static const char name##Site = 0; \
  T* const name =                   \
      static_cast<T*>(::keel_sim::staticShared(&name##Site, sizeof(T) * (n), alignof(T)))
#else
#define KEEL_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#define KEEL_SHARED(T, name, n) __shared__ T name[n]
#endif

// ---------------------------------------------------------------- dtype switch
// Calls f.template operator()<T>() with the device storage type of t (kernel_util.h).
template <typename F>
decltype(auto) visit(DType t, F&& f) {
  return visitDTypeAs<DHalf, DBFloat16>(t, std::forward<F>(f));
}

// Floating dtypes only (kernels registered for kFloatTypes).
template <typename F>
decltype(auto) visitFloat(DType t, F&& f) {
  return visit(t, [&]<typename T>() -> decltype(f.template operator()<float>()) {
    if constexpr (kIsFloatD<T>)
      return f.template operator()<T>();
    else
      throw Error("a floating dtype was expected");
  });
}

// Typed device address of a tensor's element [0,...,0].
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data());
}

// Reads an index (int32 or int64 storage) as int64.
__device__ __forceinline__ int64_t readIndex(const void* p, bool is64, int64_t off) {
  return is64 ? static_cast<const int64_t*>(p)[off] : int64_t(static_cast<const int32_t*>(p)[off]);
}

// Note [Deferred device errors] (runtime.h): the first bad value wins.
__device__ __forceinline__ void reportError(int* word, long long* value, int code, long long v) {
  if (atomicCAS(word, 0, code) == 0) *value = v;
}

// Warp and block sums in a fixed tree (the same order every run: deterministic).
template <typename C>
__device__ __forceinline__ C warpSum(C v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename C>
__device__ __forceinline__ C warpMax(C v) {
  for (int o = 16; o > 0; o >>= 1) {
    C w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values in shared memory.
template <typename C>
__device__ C blockSum(C v, C* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  // Only warp 0 reads the partial sums, so thread 0's write below races with no reader.
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : C(0);
    v = warpSum(v);
  }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}
template <typename C>
__device__ C blockMax(C v, C* scratch, C lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : lowest;
    v = warpMax(v);
  }
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

}  // namespace keel::cuda
