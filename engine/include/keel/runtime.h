// Process-level set-up for programs built on the engine (the keel tool, the studio, benchmarks).
// Call tuneBlasForThisCpu(argv) first thing in main(); libraries never call it. Programs that run
// the engine under an address-space limit also say KEEL_THREADS_PREINIT once in their main file.
#pragma once
#include <exception>
#include <string>

namespace keel {

// The OpenBLAS kernel family in use ("Haswell", "SkylakeX", "Prescott", ...).
std::string blasCoreName();

// See Note [OpenBLAS core type]. If OpenBLAS fell back to its generic kernels on a CPU with AVX2
// and FMA, and OPENBLAS_CORETYPE is unset (and KEEL_BLAS_TUNE is not "0"), re-executes this
// program with OPENBLAS_CORETYPE=Haswell; otherwise returns. Never returns on a successful exec.
void tuneBlasForThisCpu(char** argv);

// See Note [OpenBLAS under an address-space limit]. Runs before any library's constructor (an ELF
// preinit function, installed by KEEL_THREADS_PREINIT): under a finite RLIMIT_AS of less than
// 1 GiB per CPU, executes this program again with OPENBLAS_NUM_THREADS and KEEL_NUM_THREADS set
// to what fits (1 below 2 GiB), each unless the user chose it (also GOTO_NUM_THREADS and
// OMP_NUM_THREADS for OpenBLAS), so that neither OpenBLAS nor Keel's pool starts more threads.
// Otherwise returns, having touched nothing.
void fitThreadsToAddressLimit(int argc, char** argv, char** envp);
// One line for a warning when fitThreadsToAddressLimit (in this process or the one that
// re-executed it) chose thread counts; empty otherwise.
std::string addressLimitWarning();
// Under a finite RLIMIT_AS, maps OpenBLAS's work buffer now (one small sgemm; OpenBLAS keeps it
// for the process's life), or throws keel::Error naming the limit when there is no room for it
// (OpenBLAS itself would retry forever). Once per process; no-op without a limit. The cpu kernels
// call it before their first BLAS call; programs call it before they build a model, so a run
// that cannot fit is refused before it starts.
void ensureBlasBuffer();
// " under the address-space limit (ulimit -v) of <bytes>", or "" without one: appended to a
// message about memory or threads that such a limit explains.
std::string underAddressLimit();
// What to say for a std::bad_alloc: "out of memory (a C++ allocation failed)", naming the
// address-space limit (ulimit -v) when there is one (a bare "std::bad_alloc" says neither).
std::string outOfMemoryText();
// An exception's text for a message: outOfMemoryText() for a std::bad_alloc, else e.what().
std::string exceptionText(const std::exception& e);

}  // namespace keel

// In a program's main file (at namespace scope, `KEEL_THREADS_PREINIT;`): runs
// keel::fitThreadsToAddressLimit before the shared libraries' constructors (OpenBLAS starts its
// threads in its own, before main).
#define KEEL_THREADS_PREINIT                                                    \
  [[gnu::used, gnu::section(".preinit_array")]] static void (*keelBlasPreinit)( \
      int, char**, char**) = &::keel::fitThreadsToAddressLimit
