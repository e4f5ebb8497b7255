// The CUDA backend on a real device (ctest label gpu; every test skips without one): tensors
// moved to and from cuda:0 bit for bit, through the pinned staging and for strided views; the
// deferred index error (Note [Deferred device errors]) reported at the next wait and the device
// usable after it; the out-of-memory error with the allocator's summary; a device index out of
// range; bitwise reproducible kernels; and the kernel identity a recording stores.
#include <gtest/gtest.h>

#include <numeric>

#include "keel/allocator.h"
#include "keel/cuda_allocator.h"
#include "keel/dispatch.h"
#include "keel/observer.h"
#include "keel/ops.h"
#include "test_util.h"

// The CUDA runtime maps memory where ASan's shadow gap is protected by default.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() {
  return "protect_shadow_gap=0";
}
#endif

namespace keel::test {
namespace {

const Device kCuda{Backend::Cuda, 0};

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaBackend, ValuesRoundTripBitForBitInEveryDtype) {
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int32,
                  DType::Int64, DType::Bool}) {
    SCOPED_TRACE(std::string(dtypeName(t)));
    Tensor h = t == DType::Bool ? randInt({37, 5}, 0, 1, t, kCpu, 1)
               : isIntegral(t)  ? randInt({37, 5}, -1000, 1000, t, kCpu, 1)
                                : randUniform({37, 5}, -3, 3, t, kCpu, 1);
    Tensor d = h.to(kCuda);
    EXPECT_EQ(d.device(), kCuda);
    EXPECT_TRUE(bitEqual(d.to(kCpu), h));
    EXPECT_TRUE(bitEqual(d, h));  // through toVector's own copy
  }
}

TEST_F(CudaBackend, LargeCopiesCrossTheStagingBuffersIntact) {
  const int64_t n = (int64_t(10) << 20) + 12345;  // 40 MiB of float32: ten 4 MiB chunks and a tail
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  Tensor d = Tensor::fromVector(v, {n}, DType::Float32, kCuda);
  EXPECT_EQ(d.toVector<float>(), v);
}

TEST_F(CudaBackend, StridedViewsCopyInEitherDirection) {
  Tensor h = randUniform({6, 9}, -1, 1, DType::Float32, kCpu, 2);
  Tensor ht = ops::transpose(h, 0, 1);
  EXPECT_TRUE(bitEqual(ht.to(kCuda), ht));  // host view gathered, then copied
  Tensor d = h.to(kCuda);
  Tensor ds = ops::slice(ops::transpose(d, 0, 1), 0, 1, 9, 2);
  EXPECT_TRUE(bitEqual(ds.to(kCpu), ops::slice(ht, 0, 1, 9, 2)));  // device view made contiguous
}

TEST_F(CudaBackend, AnIndexOutOfRangeIsReportedAtTheNextWaitAndTheDeviceStaysUsable) {
  Tensor x = fromDoubles({1, 2, 3, 4, 5}, {5}, DType::Float32, kCuda);
  Tensor idx = fromInts({0, 99, 2}, {3}, DType::Int64, kCuda);
  Tensor y = ops::indexSelect(x, 0, idx);  // enqueued; nothing waits yet
  try {
    y.toVector<double>();
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'index_select' on cuda:0: index 99 is out of range"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(ops::add(x, x).toVector<double>(), (std::vector<double>{2, 4, 6, 8, 10}));
}

TEST_F(CudaBackend, OutOfMemoryIsAnErrorWithTheAllocatorsSummary) {
  auto* vmm = dynamic_cast<CudaVmmAllocator*>(&allocatorFor(kCuda));
  ASSERT_NE(vmm, nullptr) << "cuda:0's default allocator is the device VMM allocator";
  vmm->setLimit(size_t(64) << 20);
  try {
    Tensor::empty({int64_t(32) << 20}, DType::Float32, kCuda);  // 128 MiB
    vmm->setLimit(0);
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    vmm->setLimit(0);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  }
  EXPECT_EQ(ops::fill({4}, 2.0, DType::Float32, kCuda).toVector<double>(),
            (std::vector<double>{2, 2, 2, 2}));
}

TEST_F(CudaBackend, ADeviceIndexOutOfRangeNamesTheDevicesPresent) {
  const int n = cudaDevices();
  try {
    Tensor::zeros({1}, DType::Float32, Device(Backend::Cuda, n));
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not available: there "), std::string::npos)
        << e.what();
  }
}

TEST_F(CudaBackend, KernelsAreBitwiseReproducible) {
  Tensor a = randUniform({257, 300}, -1, 1, DType::Float32, kCuda, 3);
  Tensor b = randUniform({300, 129}, -1, 1, DType::Float32, kCuda, 4);
  Tensor w = randUniform({129}, -1, 1, DType::Float32, kCuda, 5);
  auto run = [&] {
    Tensor y = ops::matmul(a, b);
    return std::vector<Tensor>{y, ops::sum(y, {0}), ops::softmax(y, -1),
                               ops::layerNorm(y, w, w, 1e-5)};
  };
  std::vector<Tensor> r1 = run(), r2 = run();
  for (size_t i = 0; i < r1.size(); ++i) EXPECT_TRUE(bitEqual(r1[i], r2[i])) << "output " << i;
}

// What a recording stores of a cuda op call: the backend, the variant and the device.
class KernelSeen : public Observer {
 public:
  void onOpEnd(const OpEvent& e) override {
    if (e.kernel)
      seen.push_back(std::string(backendName(e.kernel->backend)) + " | " +
                     std::string(e.kernel->variant) + " | " + std::string(e.kernel->params));
  }
  std::vector<std::string> seen;
};

TEST_F(CudaBackend, ObserversSeeTheCudaKernelAndTheDevice) {
  Tensor a = randUniform({8, 8}, -1, 1, DType::Float32, kCuda, 6);
  auto obs = std::make_shared<KernelSeen>();
  addObserver(obs);
  ops::matmul(a, a);
  removeObserver(obs);
  ASSERT_EQ(obs->seen.size(), 1u);
  EXPECT_EQ(obs->seen[0].rfind("cuda | cuBLAS gemm", 0), 0u) << obs->seen[0];
  EXPECT_NE(obs->seen[0].find("TF32 off"), std::string::npos) << obs->seen[0];
  EXPECT_NE(obs->seen[0].find("sm_"), std::string::npos) << obs->seen[0];
}

}  // namespace
}  // namespace keel::test
