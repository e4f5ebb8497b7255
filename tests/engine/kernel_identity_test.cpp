// Kernel identity (Note [Kernel identity], Note [Kernel variant vocabulary]): every built-in kernel
// of cpu and cpu-ref names its variant; exact ops share one string on both backends, reductions
// whose arithmetic differs do not; observers see the variant and the call's parameters (threads,
// OpenBLAS) in onOpEnd, and nothing for a view; `keel ops --kernels` prints the variants.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "keel/observer.h"
#include "keel/registry.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel {
namespace {

const std::string& variantOf(const std::string& op, Backend b) {
  const OpDef* def = Registry::get().find(op);
  EXPECT_NE(def, nullptr) << op;
  static const std::string none;
  return def ? def->kernels[int(b)].variant : none;
}

TEST(KernelIdentity, EveryBuiltinKernelNamesItsVariantOnBothCpuBackends) {
  const Registry& r = Registry::get();
  for (int i = 0; i < kNumBuiltinOps; ++i) {
    const OpDef& op = r.op(i);
    for (Backend b : {Backend::Cpu, Backend::CpuRef}) {
      const KernelEntry& k = op.kernels[int(b)];
      if (op.view) {
        EXPECT_EQ(k.fn, nullptr) << op.name << " is a view";
        continue;
      }
      ASSERT_NE(k.fn, nullptr) << op.name << " on " << backendName(b);
      EXPECT_FALSE(k.variant.empty()) << op.name << " on " << backendName(b);
    }
    // The optimized backend reports run-time parameters for every kernel; the reference none.
    if (!op.view) {
      EXPECT_NE(op.kernels[int(Backend::Cpu)].params, nullptr) << op.name;
      EXPECT_EQ(op.kernels[int(Backend::CpuRef)].params, nullptr) << op.name;
    }
  }
}

// Ops that move, choose or compare values, and those whose two kernels compute the same bits
// (same formula in float64, same Philox stream), carry one string on both backends.
TEST(KernelIdentity, ExactOpsShareTheirVariantAcrossBackends) {
  const std::vector<std::pair<std::string, std::string>> same = {
      {"copy_to", "copy (exact)"},
      {"contiguous", "copy (exact)"},
      {"concat", "copy (exact)"},
      {"slice_backward", "copy (exact)"},
      {"index_select", "gather (exact)"},
      {"gather", "gather (exact)"},
      {"embedding", "gather (exact)"},
      {"where", "select (exact)"},
      {"masked_fill", "select (exact)"},
      {"maximum", "select (exact)"},
      {"eq", "compare (exact)"},
      {"max", "first maximum, NaN largest (exact)"},
      {"argmax", "first maximum, NaN largest (exact)"},
      {"topk", "stable sort, NaN largest (exact)"},
      {"add", "elementwise, correctly rounded"},
      {"div", "elementwise, correctly rounded"},
      {"sqrt", "elementwise, correctly rounded"},
      {"cast", "cast via float64 (16-bit floats via float32), integers saturate"},
      {"dropout", "Philox4x32-10 mask, x/(1-p) in float64, rounded once"},
      {"uniform", "Philox4x32-10, lo+(hi-lo)*u in float64, rounded once"},
      {"embedding_backward", "float64 sum in index order, rounded once"},
  };
  for (const auto& [op, want] : same) {
    EXPECT_EQ(variantOf(op, Backend::Cpu), want) << op;
    EXPECT_EQ(variantOf(op, Backend::CpuRef), want) << op;
  }
}

TEST(KernelIdentity, ReductionsWithDifferentArithmeticDiffer) {
  struct Row {
    std::string op, cpu, ref;
  };
  const std::vector<Row> rows = {
      {"sum", "float64, 8 strided lanes per 1024 block, blocks in order (columns: 4096-row blocks)",
       "float64, sequential"},
      {"matmul", "OpenBLAS sgemm, float32 accumulation, BLAS order",
       "naive, float64 accumulation, k in order"},
      {"softmax", "Cephes exp in float32 (vec_math), float64 sum in 8 lanes, times 1/sum",
       "libm exp in float64, sequential sum, divided, rounded once"},
      {"layer_norm",
       "float64 mean and variance in 8 lanes (squares in float32), normalized in float32",
       "float64, sequential mean and variance, rounded once"},
      {"exp", "Cephes exp polynomial in float32 (vec_math)", "libm exp in float64, rounded once"},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(variantOf(r.op, Backend::Cpu), r.cpu) << r.op;
    EXPECT_EQ(variantOf(r.op, Backend::CpuRef), r.ref) << r.op;
    EXPECT_NE(variantOf(r.op, Backend::Cpu), variantOf(r.op, Backend::CpuRef)) << r.op;
  }
}

// What an observer saw of each op call's kernel in onOpEnd (copied: the views die with the event).
struct KernelSeen {
  std::string op;
  bool hasKernel = false;
  Backend backend = Backend::Cpu;
  std::string variant, params;
};

class KernelRecorder : public Observer {
 public:
  bool wantsOpDescriptions() const override { return false; }
  void onOpEnd(const OpEvent& e) override {
    KernelSeen s;
    s.op = e.op->name;
    if (e.kernel) {
      s.hasKernel = true;
      s.backend = e.kernel->backend;
      s.variant = std::string(e.kernel->variant);
      s.params = std::string(e.kernel->params);
    }
    seen.push_back(s);
  }
  std::vector<KernelSeen> seen;
};

struct ObserverScope {
  std::shared_ptr<KernelRecorder> rec = std::make_shared<KernelRecorder>();
  ObserverScope() { addObserver(rec); }
  ~ObserverScope() { removeObserver(rec); }
};

std::string threadsText(int n) {
  return "up to " + std::to_string(n) + (n == 1 ? " thread" : " threads");
}

TEST(KernelIdentity, ObserverSeesVariantAndParamsOfMatmulAndSum) {
  test::ThreadsScope threads;
  setCpuThreads(1);
  Tensor a = test::randUniform({4, 8}, -1, 1, DType::Float32, test::kCpu, 1);
  Tensor b = test::randUniform({8, 3}, -1, 1, DType::Float32, test::kCpu, 2);
  ObserverScope obs;
  Tensor c = ops::matmul(a, b);
  Tensor s = ops::sum(c);
  ASSERT_EQ(obs.rec->seen.size(), 2u);

  const KernelSeen& mm = obs.rec->seen[0];
  EXPECT_EQ(mm.op, "matmul");
  ASSERT_TRUE(mm.hasKernel);
  EXPECT_EQ(mm.backend, Backend::Cpu);
  EXPECT_EQ(mm.variant, "OpenBLAS sgemm, float32 accumulation, BLAS order");
  EXPECT_EQ(mm.params.rfind("OpenBLAS ", 0), 0u) << mm.params;
  EXPECT_NE(mm.params.find(" BLAS thread"), std::string::npos) << mm.params;
  EXPECT_EQ(mm.params.find("1 BLAS threads"), std::string::npos) << mm.params;
  EXPECT_NE(mm.params.find(", " + threadsText(1)), std::string::npos) << mm.params;

  const KernelSeen& sm = obs.rec->seen[1];
  EXPECT_EQ(sm.op, "sum");
  ASSERT_TRUE(sm.hasKernel);
  EXPECT_EQ(sm.variant,
            "float64, 8 strided lanes per 1024 block, blocks in order (columns: 4096-row blocks)");
  EXPECT_NE(sm.params.find(", " + threadsText(1)), std::string::npos) << sm.params;
  EXPECT_EQ(sm.params.find("OpenBLAS"), std::string::npos) << sm.params;

  // The parameters follow the thread count of the call.
  setCpuThreads(threads.saved());
  ops::sum(c);
  ASSERT_EQ(obs.rec->seen.size(), 3u);
  EXPECT_NE(obs.rec->seen[2].params.find(", " + threadsText(cpuThreads())), std::string::npos)
      << obs.rec->seen[2].params;
}

TEST(KernelIdentity, ExactOpObservedOnBothBackendsCarriesOneVariantAndRefHasNoParams) {
  Tensor x = test::randUniform({3, 5}, -1, 1, DType::Float32, test::kCpuRef, 3);
  Tensor y = test::toDevice(x, test::kCpu);
  ObserverScope obs;
  ops::contiguous(ops::transpose(x, 0, 1));
  ops::contiguous(ops::transpose(y, 0, 1));
  std::vector<KernelSeen> copies;
  for (const KernelSeen& s : obs.rec->seen)
    if (s.op == "contiguous") copies.push_back(s);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].backend, Backend::CpuRef);
  EXPECT_EQ(copies[1].backend, Backend::Cpu);
  EXPECT_EQ(copies[0].variant, "copy (exact)");
  EXPECT_EQ(copies[0].variant, copies[1].variant);
  EXPECT_EQ(copies[0].params, "");
  EXPECT_NE(copies[1].params, "");
}

TEST(KernelIdentity, FlashmaskParamsNameTheTileShape) {
  // q [B, Sq, H, D] with D = 64: 64-row tiles of 64 columns (Note [FlashMask tile shape]).
  Tensor q = test::randUniform({1, 8, 1, 64}, -1, 1, DType::Float32, test::kCpu, 4);
  Tensor k = test::randUniform({1, 8, 1, 64}, -1, 1, DType::Float32, test::kCpu, 5);
  Tensor v = test::randUniform({1, 8, 1, 64}, -1, 1, DType::Float32, test::kCpu, 6);
  ObserverScope obs;
  ops::flashmaskAttention(q, k, v, Tensor(), /*causal=*/true);
  ASSERT_FALSE(obs.rec->seen.empty());
  const KernelSeen& fa = obs.rec->seen.back();
  EXPECT_EQ(fa.op, "flashmask_attention");
  EXPECT_EQ(fa.params.rfind("tiles 64x64, OpenBLAS ", 0), 0u) << fa.params;
  EXPECT_NE(fa.params.find(", vec_math "), std::string::npos) << fa.params;
}

TEST(KernelIdentity, ViewRunsNoKernel) {
  Tensor x = test::randUniform({2, 6}, -1, 1, DType::Float32, test::kCpu, 7);
  ObserverScope obs;
  ops::reshape(x, {3, 4});
  ASSERT_EQ(obs.rec->seen.size(), 1u);
  EXPECT_EQ(obs.rec->seen[0].op, "reshape");
  EXPECT_FALSE(obs.rec->seen[0].hasKernel);
}

#ifdef KEEL_CLI_PATH
// The fields of `keel ops --kernels`'s line for (op, backend): the variant, "" if no such line.
std::string listedVariant(const std::string& out, const std::string& op,
                          const std::string& backend) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string name, b;
    f >> name >> b;
    if (name != op || b != backend) continue;
    std::string rest;
    std::getline(f >> std::ws, rest);
    return rest;
  }
  return "";
}

class KeelOpsKernels : public test::TempDirTest {};

TEST_F(KeelOpsKernels, PrintsEachBackendsVariantPerOp) {
  test::CliResult r = test::runKeelCli("ops --kernels", dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(listedVariant(r.out, "sum", "cpu"),
            "float64, 8 strided lanes per 1024 block, blocks in order (columns: 4096-row blocks)");
  EXPECT_EQ(listedVariant(r.out, "sum", "cpu-ref"), "float64, sequential");
  EXPECT_EQ(listedVariant(r.out, "copy_to", "cpu"), "copy (exact)");
  EXPECT_EQ(listedVariant(r.out, "copy_to", "cpu-ref"), "copy (exact)");
  EXPECT_EQ(listedVariant(r.out, "reshape", "all"), "view (no kernel)");
  EXPECT_EQ(r.out.rfind("OP ", 0), 0u) << r.out.substr(0, 80);
  test::expectOneLineError(test::runKeelCli("ops --kernels --markdown", dir_.string()),
                           "--kernels");
}
#endif

}  // namespace
}  // namespace keel
