// Process-level set-up: picking OpenBLAS's kernels on CPUs it does not recognise, and fitting its
// threads and work buffer under an address-space limit.
#include "keel/runtime.h"

#include <cblas.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <new>
#include <vector>

#include "keel/base/text.h"
#include "keel/error.h"

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

// Note [OpenBLAS under an address-space limit]
// OpenBLAS (0.3.21) starts one worker thread per CPU in its library constructor, before main(),
// and every thread that computes maps a 128 MiB work buffer: a worker as soon as it starts, a
// caller at its first sgemm (Keel's pool threads call sgemm concurrently, so each maps its own).
// Under an address-space limit (ulimit -v, prlimit --as) this breaks, measured with `keel train`
// on 2 CPUs: at 64 MiB pthread_create fails and OpenBLAS exits the process (status 130) before
// main; from 96 to 192 MiB the worker retries its buffer forever, so even a `keel` that only
// prints an error hangs at exit; at 128 MiB the caller's first sgemm spins the same way, and at
// 384 MiB a pool thread's does (gpt-mini). Nothing after main can undo the first two, so:
// - fitThreadsToAddressLimit runs as an ELF preinit function (KEEL_THREADS_PREINIT in a program's
//   main file), before any library's constructor. Under a finite limit it allows one compute
//   thread per GiB of the limit (a buffer, a stack and a malloc arena each, with room for the
//   run) and, when that is fewer than the CPUs, executes the program again with
//   OPENBLAS_NUM_THREADS and KEEL_NUM_THREADS set to it, each unless the user chose it
//   (KEEL_THREADS_FITTED=<cpus> marks the choice as ours, for the warning). It cannot simply
//   setenv: libc's initializer runs next and resets the environment to the one the kernel gave.
//   Below 2 GiB everything computes on the main thread, so one buffer serves the whole run.
// - ensureBlasBuffer, under a finite limit, checks that a buffer can be mapped (an mmap probe of
//   its size and an 8 MiB margin: with the bare size the probe passed at 187 MiB and the sgemm
//   still spun) and then maps the main thread's with one sgemm, which OpenBLAS keeps for the
//   process's life; when it cannot, it throws keel::Error naming the limit instead of letting
//   OpenBLAS spin. `keel train`, `record`, `memory trace` and `bench allocator` call it before
//   they build anything, so a limit too small for any training (64 to 195 MiB here) is one line
//   and exit 2, then print addressLimitWarning(); the cpu kernels call it before their BLAS calls.
// Above 2 GiB per thread, the other threads' buffers are mapped when they first compute; a run
// whose model fills nearly all of such a limit could still find no room for them.

namespace {

constexpr const char* kFittedMark = "KEEL_THREADS_FITTED";
constexpr uint64_t kBlasBufferBytes = uint64_t(128) << 20;  // 0.3.21's BUFFER_SIZE (32 << 22)
constexpr uint64_t kBlasBufferMargin = uint64_t(8) << 20;
constexpr uint64_t kAddressPerThread = uint64_t(1) << 30;

// The soft RLIMIT_AS, or 0 when there is none.
uint64_t addressLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return uint64_t(r.rlim_cur);
}

// How many threads OpenBLAS (the CPUs this process may run on) or Keel's pool (the CPUs online)
// would start, whichever is more.
uint64_t cpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const long allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  return uint64_t(std::max<long>({online, allowed, 1}));
}

// "NAME=<v>" in buf (preinit code: no stdio, no allocation).
char* assignment(const char* name, uint64_t v, char (&buf)[64]) {
  size_t n = std::strlen(name);
  std::memcpy(buf, name, n);
  buf[n++] = '=';
  char digits[24];
  size_t d = 0;
  do {
    digits[d++] = char('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (d > 0) buf[n++] = digits[--d];
  buf[n] = '\0';
  return buf;
}

// Whether env (a NULL-terminated "NAME=value" array) sets name to something non-empty.
bool isSet(char** env, const char* name) {
  const size_t n = std::strlen(name);
  for (char** e = env; *e; ++e)
    if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') return (*e)[n + 1] != '\0';
  return false;
}

// Bytes this process maps now (VmSize), or 0 when /proc does not say.
uint64_t mappedBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0)
      return uint64_t(std::strtoull(line.c_str() + 7, nullptr, 10)) << 10;
  return 0;
}

}  // namespace

void fitThreadsToAddressLimit(int, char** argv, char** envp) {
  const uint64_t limit = addressLimit();
  if (limit == 0 || !argv || !envp) return;
  const uint64_t cpus = cpuCount();
  const uint64_t fit = std::max<uint64_t>(limit / kAddressPerThread, 1);
  if (fit >= cpus) return;
  // setenv here would be lost: libc's initializer, which runs after this function and before
  // OpenBLAS's, resets the environment to envp. So this program is executed again with the
  // counts added to envp, before any library has started a thread.
  static char blas[64], pool[64], mark[64];
  static char* env[4096];
  size_t n = 0;
  for (char** e = envp; *e; ++e)
    if (n + 4 < std::size(env)) env[n++] = *e;
  bool chose = false;
  if (!isSet(envp, "OPENBLAS_NUM_THREADS") && !isSet(envp, "GOTO_NUM_THREADS") &&
      !isSet(envp, "OMP_NUM_THREADS")) {
    env[n++] = assignment("OPENBLAS_NUM_THREADS", fit, blas);
    chose = true;
  }
  if (!isSet(envp, "KEEL_NUM_THREADS")) {
    env[n++] = assignment("KEEL_NUM_THREADS", fit, pool);
    chose = true;
  }
  if (!chose) return;  // the user's counts (or ours, in the program executed again)
  env[n++] = assignment(kFittedMark, cpus, mark);
  env[n] = nullptr;
  execve("/proc/self/exe", argv, env);
  // The exec failed: carry on with the libraries' own counts.
}

std::string underAddressLimit() {
  const uint64_t limit = addressLimit();
  return limit ? " under the address-space limit (ulimit -v) of " + formatBytes(limit)
               : std::string();
}

std::string outOfMemoryText() {
  return "out of memory (a C++ allocation failed)" + underAddressLimit();
}

std::string exceptionText(const std::exception& e) {
  return dynamic_cast<const std::bad_alloc*>(&e) ? outOfMemoryText() : std::string(e.what());
}

std::string addressLimitWarning() {
  const char* cpus = std::getenv(kFittedMark);
  const uint64_t limit = addressLimit();
  if (!cpus || limit == 0) return {};
  auto value = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(name) + "=" + (v ? v : "");
  };
  return "the address-space limit (ulimit -v) of " + formatBytes(limit) +
         " leaves room for fewer compute threads than the " + cpus +
         " CPUs (each maps a 128 MiB OpenBLAS work buffer): running with " +
         value("OPENBLAS_NUM_THREADS") + " " + value("KEEL_NUM_THREADS") + " (set them to choose)";
}

void ensureBlasBuffer() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    const uint64_t limit = addressLimit();
    if (limit == 0) return;
    // The sgemm's operands first (each is mmapped by malloc), then the probe: the buffer and a
    // margin for what the sgemm maps beside it (a page, malloc arenas). A probe of the bare
    // buffer passed at 187 MiB and the sgemm then spun.
    constexpr int n = 256;  // large enough to take OpenBLAS's buffered path
    std::vector<float> a(size_t(n) * n, 0.0f), c(size_t(n) * n, 0.0f);
    const uint64_t probe = kBlasBufferBytes + kBlasBufferMargin;
    void* p = mmap(nullptr, probe, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      failure = "the address-space limit (ulimit -v) of " + formatBytes(limit) +
                " leaves no room for OpenBLAS's " + formatBytes(kBlasBufferBytes) +
                " work buffer (" + formatBytes(mappedBytes()) +
                " is mapped already): run with a larger limit";
      return;
    }
    munmap(p, probe);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, a.data(), n,
                0.0f, c.data(), n);
  });
  if (!failure.empty()) throw Error(failure);
}

}  // namespace keel
