// The CUDA simulator's core (Note [CUDA simulator] in engine/backends/cuda/sim/kernel.cpp): what
// device code needs to compile as host C++ and run on the CPU — the CUDA keywords as plain C++,
// dim3 and the built-in thread indices, __syncthreads and warp shuffles as cooperative switches
// between the block's threads, atomics, the device intrinsics used by engine/backends/cuda, and
// launch(). Included by the simulator's cuda_runtime.h; never by a build that has nvcc.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define KEEL_CUDA_SIM 1

// ---------------------------------------------------------------- keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Every thread of a block runs on one OS thread and blocks run one after another, so a function's
// static variable is the block's shared memory.
#define __shared__ static

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

typedef struct CUstream_st* cudaStream_t;
enum cudaError_t : int;

namespace keel_sim {

// The running thread's indices (set by the scheduler before it resumes a thread).
struct Indices {
  uint3 thread, block;
  dim3 blockSize, gridSize;
};
extern Indices g_idx;

// Barriers of the running block (kernel.cpp); a thread waiting at one lets the others run.
void syncThreads();
void syncWarp(unsigned mask);
// Exchanges 8 bytes with lane (own lane ^ laneMask) of the running thread's warp.
uint64_t shuffleXor(unsigned mask, uint64_t bits, int laneMask, int width);
// The launch's dynamic shared memory (its third launch argument, 16-byte aligned).
void* dynamicShared();
// The running block's shared array for the declaration `site` (KEEL_SHARED in cuda_util.cuh):
// `bytes` of it, the same address for every thread of the launch, 0xFF bytes at each block start.
void* staticShared(const void* site, size_t bytes, size_t align);

// Runs body(arg) as every thread of grid x block (kernel.cpp); a bad configuration (or a kernel
// error: a barrier not reached by every thread, a deadlock) is returned as the launch's error,
// read by cudaGetLastError.
void runKernel(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
               void (*body)(void*), void* arg);

template <class K, class Params>
struct Bound {
  K kernel;
  Params* params;
  static void run(void* p) {
    auto* b = static_cast<Bound*>(p);
    std::apply(b->kernel, *b->params);  // each thread gets its own copies of the parameters
  }
};

// k<<<grid, block, smem, stream>>>(args...): the arguments are converted to the kernel's
// parameter types once, as the CUDA runtime copies them into the launch.
template <class... P, class... A>
void launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
  Bound<void (*)(P...), decltype(params)> b{k, &params};
  runKernel(reinterpret_cast<const void*>(k), grid, block, smem, stream,
            &Bound<void (*)(P...), decltype(params)>::run, &b);
}

}  // namespace keel_sim

#define threadIdx (::keel_sim::g_idx.thread)
#define blockIdx (::keel_sim::g_idx.block)
#define blockDim (::keel_sim::g_idx.blockSize)
#define gridDim (::keel_sim::g_idx.gridSize)
inline constexpr int warpSize = 32;

inline void __syncthreads() {
  ::keel_sim::syncThreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::keel_sim::syncWarp(mask);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::keel_sim::shuffleXor(mask, bits, laneMask, width);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// ---------------------------------------------------------------- atomics
// One thread runs at a time, so a read-modify-write is atomic as it stands.
template <class T>
T atomicCAS(T* p, T compare, T value) {
  const T old = *p;
  if (old == compare) *p = value;
  return old;
}
template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <class T>
T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}

// ---------------------------------------------------------------- intrinsics
// IEEE operations rounded to nearest (the simulator is built with -ffp-contract=off, so none of
// them is fused into an FMA).
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dsub_rn(double a, double b) {
  return a - b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}
inline float __expf(float a) {
  return std::exp(a);
}
inline float __logf(float a) {
  return std::log(a);
}
inline float rsqrtf(float a) {
  return 1.0f / std::sqrt(a);
}
inline double rsqrt(double a) {
  return 1.0 / std::sqrt(a);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return unsigned((uint64_t(a) * b) >> 32);
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline int __float_as_int(float f) {
  int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline long long __double_as_longlong(double d) {
  long long u;
  std::memcpy(&u, &d, 8);
  return u;
}
inline double __longlong_as_double(long long u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline int __popc(unsigned v) {
  return __builtin_popcount(v);
}
inline int __clz(int v) {
  return v == 0 ? 32 : __builtin_clz(unsigned(v));
}
inline int __ffs(int v) {
  return __builtin_ffs(v);
}

// CUDA's device min/max overloads.
#define KEEL_SIM_MINMAX(T) \
  inline T min(T a, T b) { \
    return b < a ? b : a;  \
  }                        \
  inline T max(T a, T b) { \
    return a < b ? b : a;  \
  }
KEEL_SIM_MINMAX(int)
KEEL_SIM_MINMAX(unsigned)
KEEL_SIM_MINMAX(long)
KEEL_SIM_MINMAX(unsigned long)
KEEL_SIM_MINMAX(long long)
KEEL_SIM_MINMAX(unsigned long long)
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
#undef KEEL_SIM_MINMAX
