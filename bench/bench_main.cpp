// The one main() of keel_bench (Google Benchmark). Benchmarks live in the other bench/*.cpp files
// and register themselves; run `keel_bench --benchmark_filter=<regex>` to pick some.
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
