// The CUDA simulator itself (Note [CUDA simulator], engine/backends/cuda/sim): kernels written
// here as CUDA C++ run with the semantics a GPU gives them — barriers, shuffles, shared memory,
// the built-in indices — and the simulator refuses what a GPU would (bad launch configurations,
// too much shared memory, copies outside device memory) and reports what it finds wrong in a
// kernel (a divergent barrier) as a launch failure. cuBLAS's gemm, CUB's sorts and the half
// conversions are checked against plain host computations.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cub/device/device_segmented_sort.cuh>
#include <numeric>
#include <string>
#include <vector>

#include "keel/base/dtype.h"

// A kernel's dynamic shared memory, as engine/backends/cuda/cuda_util.cuh declares it.
#define KEEL_DYNAMIC_SHARED_TEST(T, name) \
  T* const name = static_cast<T*>(::keel_sim::dynamicShared())

namespace {

template <class T>
T* deviceCopy(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}
template <class T>
std::vector<T> hostCopy(const T* d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// ---------------------------------------------------------------- kernels
__global__ void indicesKernel(int* out) {
  const int t = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int b = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  out[b * int(blockDim.x * blockDim.y * blockDim.z) + t] = b * 1000 + t;
}

// Reverses each block's 64 values through shared memory; `barrier` false leaves the read racing
// the other threads' writes.
__global__ void reverseKernel(const float* in, float* out, bool barrier) {
  __shared__ float s[64];
  const int t = int(threadIdx.x), base = int(blockIdx.x) * 64;
  s[t] = in[base + t];
  if (barrier) __syncthreads();
  out[base + t] = s[63 - t];
}

__global__ void blockSumKernel(const double* in, double* out) {
  __shared__ double partial[32];
  double v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < int(blockDim.x) / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

__global__ void divergentBarrierKernel(int* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void dynamicSharedKernel(int* out, int n) {
  KEEL_DYNAMIC_SHARED_TEST(int, buf);
  buf[threadIdx.x] = int(threadIdx.x) * 3;
  __syncthreads();
  out[threadIdx.x] = threadIdx.x + 1 < unsigned(n) ? buf[threadIdx.x + 1] : -1;
}

__global__ void uninitialisedSharedKernel(float* out) {
  KEEL_DYNAMIC_SHARED_TEST(float, buf);
  out[threadIdx.x] = buf[threadIdx.x];  // never written
}

// Block b's thread 0 writes b into a shared slot another block's thread would read before writing;
// every thread reports what it read before the write (NaN: nothing carried over from a block).
__global__ void staticSharedKernel(float* before) {
  static const char site = 0;
  float* slot = static_cast<float*>(::keel_sim::staticShared(&site, sizeof(float), alignof(float)));
  before[blockIdx.x * blockDim.x + threadIdx.x] = *slot;
  __syncthreads();
  if (threadIdx.x == 0) *slot = float(blockIdx.x);
}

// Shuffles within groups of 16 lanes: lane ^ 8 stays in the group; lane ^ 16 is the other group,
// readable from the upper group (an earlier one) but not from the lower (its own value).
__global__ void shuffleWidthKernel(int* out) {
  const int lane = int(threadIdx.x);
  out[lane] = __shfl_xor_sync(0xffffffffu, lane, 8, 16);
  out[32 + lane] = __shfl_xor_sync(0xffffffffu, lane, 16, 16);
}

std::string lastErrorText() {
  return cudaGetErrorString(cudaGetLastError());
}

// ---------------------------------------------------------------- launches
TEST(CudaSimulator, EveryThreadSeesItsOwnIndicesInEveryDimension) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int n = 12 * 24;
  int* d = deviceCopy(std::vector<int>(size_t(n), -1));
  keel_sim::launch(indicesKernel, grid, block, 0, nullptr, d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> got = hostCopy(d, size_t(n));
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 24; ++t) ASSERT_EQ(got[size_t(b * 24 + t)], b * 1000 + t);
  cudaFree(d);
}

TEST(CudaSimulator, SyncthreadsOrdersSharedMemoryAndAMissingOneShows) {
  std::vector<float> in(64 * 4);
  std::iota(in.begin(), in.end(), 0.0f);
  float* din = deviceCopy(in);
  float* dout = deviceCopy(std::vector<float>(in.size(), 0.0f));
  std::vector<float> expect(in.size());
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 64; ++t) expect[size_t(b * 64 + t)] = in[size_t(b * 64 + 63 - t)];

  keel_sim::launch(reverseKernel, 4, 64, 0, nullptr, din, dout, true);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(hostCopy(dout, in.size()), expect);

  // Without the barrier a thread reads slots other threads have not written yet in some blocks
  // (the simulator runs odd blocks' threads in reverse order): the result is wrong, not lucky.
  keel_sim::launch(reverseKernel, 4, 64, 0, nullptr, din, dout, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_NE(hostCopy(dout, in.size()), expect);
  cudaFree(din);
  cudaFree(dout);
}

TEST(CudaSimulator, ShufflesExchangeWithinTheWarpInAFixedTree) {
  const int blocks = 3, threads = 256;
  std::vector<double> in(size_t(blocks * threads));
  for (size_t i = 0; i < in.size(); ++i) in[i] = double(i % 97) * 0.25 - 3;
  double* din = deviceCopy(in);
  double* dout = deviceCopy(std::vector<double>(blocks, 0.0));
  keel_sim::launch(blockSumKernel, blocks, threads, 0, nullptr, din, dout);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<double> got = hostCopy(dout, blocks);
  for (int b = 0; b < blocks; ++b) {
    double s = 0;
    for (int t = 0; t < threads; ++t) s += in[size_t(b * threads + t)];
    EXPECT_DOUBLE_EQ(got[size_t(b)], s);  // all values are multiples of 1/4: sums are exact
  }
  cudaFree(din);
  cudaFree(dout);
}

TEST(CudaSimulator, ABarrierAfterThreadsReturnedFailsTheLaunchNamingTheKernel) {
  int* d = deviceCopy(std::vector<int>(32, 0));
  keel_sim::launch(divergentBarrierKernel, 1, 32, 0, nullptr, d);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorLaunchFailure);
  const std::string msg = lastErrorText();
  EXPECT_NE(msg.find("divergentBarrierKernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("divergent barrier"), std::string::npos) << msg;
  // Reported once: the device works on.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  keel_sim::launch(indicesKernel, 1, 32, 0, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaFree(d);
}

TEST(CudaSimulator, DynamicSharedMemoryIsTheLaunchsAndItsLimitIsEnforced) {
  int* d = deviceCopy(std::vector<int>(128, 0));
  keel_sim::launch(dynamicSharedKernel, 1, 128, 128 * sizeof(int), nullptr, d, 128);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> got = hostCopy(d, 128);
  for (int t = 0; t < 127; ++t) ASSERT_EQ(got[size_t(t)], (t + 1) * 3);
  EXPECT_EQ(got[127], -1);

  // More than 48 KiB needs the kernel's attribute, as on a GPU; past 227 KiB nothing is allowed.
  keel_sim::launch(dynamicSharedKernel, 1, 32, size_t(64) << 10, nullptr, d, 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(dynamicSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 << 10),
            cudaSuccess);
  keel_sim::launch(dynamicSharedKernel, 1, 32, size_t(64) << 10, nullptr, d, 32);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(dynamicSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 300 << 10),
            cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(d);
}

TEST(CudaSimulator, UnwrittenSharedMemoryReadsAsNaN) {
  float* d = deviceCopy(std::vector<float>(32, 0.0f));
  keel_sim::launch(uninitialisedSharedKernel, 1, 32, 32 * sizeof(float), nullptr, d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : hostCopy(d, 32)) EXPECT_TRUE(std::isnan(v));
  cudaFree(d);
}

TEST(CudaSimulator, SharedArraysStartEveryBlockAsNaN) {
  float* d = deviceCopy(std::vector<float>(3 * 32, 0.0f));
  keel_sim::launch(staticSharedKernel, 3, 32, 0, nullptr, d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : hostCopy(d, 3 * 32)) EXPECT_TRUE(std::isnan(v));
  cudaFree(d);
}

TEST(CudaSimulator, ShuffleWidthFollowsPtxGroups) {
  int* d = deviceCopy(std::vector<int>(64, -1));
  keel_sim::launch(shuffleWidthKernel, 1, 32, 0, nullptr, d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> got = hostCopy(d, 64);
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(got[size_t(lane)], lane ^ 8) << lane;
    EXPECT_EQ(got[size_t(32 + lane)], lane < 16 ? lane : lane ^ 16) << lane;
  }
  cudaFree(d);
}

TEST(CudaSimulator, BadLaunchConfigurationsAreRefused) {
  int* d = deviceCopy(std::vector<int>(4, 0));
  keel_sim::launch(indicesKernel, 1, 2048, 0, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  keel_sim::launch(indicesKernel, dim3(1, 70000), 1, 0, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  keel_sim::launch(indicesKernel, 0, 32, 0, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  cudaFree(d);
}

// ---------------------------------------------------------------- memory
TEST(CudaSimulator, CopiesOutsideDeviceAllocationsAreRefused) {
  int* d = deviceCopy(std::vector<int>(16, 7));
  std::vector<int> host(32, 0);
  EXPECT_EQ(cudaMemcpy(host.data(), d, 17 * sizeof(int), cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(host[0], 0);  // nothing copied
  EXPECT_EQ(cudaMemcpy(d, host.data(), 4, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaMemset(d + 8, 0, 9 * sizeof(int)), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaMemcpy(host.data(), d, 16 * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[15], 7);
  cudaFree(d);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidDevicePointer);  // freed twice
  cudaGetLastError();
}

TEST(CudaSimulator, TheDeviceMemoryLimitGivesOutOfMemory) {
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
  cudaGetLastError();
}

// ---------------------------------------------------------------- cuBLAS, CUB, half
TEST(CudaSimulator, GemmIsCublasColumnMajorWithEveryTransposeAndBatchStride) {
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 4, k = 3, batch = 2;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string(ta ? "A^T" : "A") + " " + (tb ? "B^T" : "B"));
      const int lda = (ta ? k : m) + 1, ldb = (tb ? n : k) + 2, ldc = m + 1;
      const int aCols = ta ? m : k, bCols = tb ? k : n;
      const long long sA = (long long)lda * aCols, sB = (long long)ldb * bCols,
                      sC = (long long)ldc * n;
      std::vector<double> A(size_t(sA * batch)), B(size_t(sB * batch)), C(size_t(sC * batch), 9);
      for (size_t i = 0; i < A.size(); ++i) A[i] = double(int(i * 7 % 11) - 5);
      for (size_t i = 0; i < B.size(); ++i) B[i] = double(int(i * 5 % 13) - 6);
      double *dA = deviceCopy(A), *dB = deviceCopy(B), *dC = deviceCopy(C);
      const double one = 1, zero = 0;
      ASSERT_EQ(cublasGemmStridedBatchedEx(
                    h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                    &one, dA, CUDA_R_64F, lda, sA, dB, CUDA_R_64F, ldb, sB, &zero, dC, CUDA_R_64F,
                    ldc, sC, batch, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
      std::vector<double> got = hostCopy(dC, C.size());
      for (int p = 0; p < batch; ++p)
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < ldc; ++i) {
            double expect = 9;  // the padding row of C is never written
            if (i < m) {
              expect = 0;
              for (int l = 0; l < k; ++l) {
                const double a =
                    ta ? A[size_t(p * sA + i * lda + l)] : A[size_t(p * sA + l * lda + i)];
                const double b =
                    tb ? B[size_t(p * sB + l * ldb + j)] : B[size_t(p * sB + j * ldb + l)];
                expect += a * b;
              }
            }
            ASSERT_EQ(got[size_t(p * sC + j * ldc + i)], expect) << p << " " << i << " " << j;
          }
      // A leading dimension past the allocation is caught, not read from the host's memory.
      EXPECT_EQ(cublasGemmStridedBatchedEx(
                    h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                    &one, dA, CUDA_R_64F, lda, sA * 2, dB, CUDA_R_64F, ldb, sB, &zero, dC,
                    CUDA_R_64F, ldc, sC, batch, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_EXECUTION_FAILED);
      cudaGetLastError();
      cudaFree(dA);
      cudaFree(dB);
      cudaFree(dC);
    }
  cublasDestroy(h);
}

TEST(CudaSimulator, SegmentedSortIsStableWithinEachSegment) {
  const std::vector<uint64_t> keys{5, 1, 5, 0, 3, 3, 9, 2, 2, 7};
  std::vector<int64_t> vals(keys.size());
  std::iota(vals.begin(), vals.end(), 0);
  const std::vector<int64_t> begins{0, 4}, ends{4, 10};
  uint64_t *kin = deviceCopy(keys), *kout = deviceCopy(std::vector<uint64_t>(keys.size()));
  int64_t *vin = deviceCopy(vals), *vout = deviceCopy(std::vector<int64_t>(vals.size()));
  int64_t *db = deviceCopy(begins), *de = deviceCopy(ends);
  size_t bytes = 0;
  ASSERT_EQ(cub::DeviceSegmentedSort::StableSortPairs(nullptr, bytes, kin, kout, vin, vout, 10, 2,
                                                      db, de),
            cudaSuccess);
  void* tmp = nullptr;
  ASSERT_EQ(cudaMalloc(&tmp, bytes), cudaSuccess);
  ASSERT_EQ(
      cub::DeviceSegmentedSort::StableSortPairs(tmp, bytes, kin, kout, vin, vout, 10, 2, db, de),
      cudaSuccess);
  EXPECT_EQ(hostCopy(kout, 10), (std::vector<uint64_t>{0, 1, 5, 5, 2, 2, 3, 3, 7, 9}));
  EXPECT_EQ(hostCopy(vout, 10), (std::vector<int64_t>{3, 1, 0, 2, 7, 8, 4, 5, 9, 6}));
  for (void* p : {static_cast<void*>(kin), static_cast<void*>(kout), static_cast<void*>(vin),
                  static_cast<void*>(vout), static_cast<void*>(db), static_cast<void*>(de), tmp})
    cudaFree(p);
}

TEST(CudaSimulator, HalfConversionsAreTheHostsRoundToNearestEven) {
  // Every half converts to the float the host gives; floats between halves round as the host's.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = __half2float(__ushort_as_half(uint16_t(b)));
    const float h = keel::Half::toFloat(uint16_t(b));
    if (std::isnan(h)) {
      ASSERT_TRUE(std::isnan(f)) << b;
      continue;
    }
    ASSERT_EQ(std::memcmp(&f, &h, 4), 0) << b;
  }
  for (uint32_t u = 0; u < 0x7f800000u; u += 0x1f3) {
    float f;
    std::memcpy(&f, &u, 4);
    for (float s : {f, -f}) {
      const uint16_t dev = __half_as_ushort(__float2half_rn(s));
      ASSERT_EQ(dev, keel::Half::fromFloat(s)) << u;
    }
  }
}

}  // namespace
