// The one main() of keel_bench (Google Benchmark). Benchmarks live in the other bench/*.cpp files
// and register themselves; run `keel_bench --benchmark_filter=<regex>` to pick some.
// Like the keel tool, it first selects OpenBLAS's kernels for this CPU (Note [OpenBLAS core type]);
// KEEL_BLAS_TUNE=0 keeps the library's own choice; under an address-space limit OpenBLAS's and
// Keel's threads are fitted to it before they start (Note [OpenBLAS under an address-space limit]).
#include <benchmark/benchmark.h>

#include "keel/runtime.h"

KEEL_THREADS_PREINIT;  // See Note [OpenBLAS under an address-space limit]

int main(int argc, char** argv) {
  keel::tuneBlasForThisCpu(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
