// Process-level set-up: picking OpenBLAS's kernels on CPUs it does not recognise.
#include "keel/runtime.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace keel {

// Note [OpenBLAS core type]: OpenBLAS picks its kernels from the CPU model when the library
// loads. Debian 12's OpenBLAS (0.3.21) does not know recent Xeons and falls back to "Prescott"
// (SSE3) kernels: sgemm then runs ~2.7x slower than with its AVX2 "Haswell" kernels on the same
// CPU (measured: 62 vs 165 GFLOP/s for 1024^3, bench_matmul). The choice can only be made through
// OPENBLAS_CORETYPE before the library loads, so programs re-execute themselves once with it set.
// Haswell kernels need only AVX2 + FMA, which we check first. Tests do not do this: results must
// not depend on it (cpu vs cpu-ref tolerances hold for every kernel family).

std::string blasCoreName() {
  const char* n = openblas_get_corename();
  return n ? n : "";
}

void tuneBlasForThisCpu(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  if (const char* t = std::getenv("KEEL_BLAS_TUNE"); t && std::strcmp(t, "0") == 0) return;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
  std::string core = blasCoreName();
  for (char& c : core) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (core != "prescott" && core != "core2" && core != "nehalem") return;
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // exec failed: carry on with the generic kernels
#else
  (void)argv;
#endif
}

}  // namespace keel
