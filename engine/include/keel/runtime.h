// Process-level set-up for programs built on the engine (the keel tool, the studio, benchmarks).
// Call tuneBlasForThisCpu(argv) first thing in main(); libraries never call it.
#pragma once
#include <string>

namespace keel {

// The OpenBLAS kernel family in use ("Haswell", "SkylakeX", "Prescott", ...).
std::string blasCoreName();

// See Note [OpenBLAS core type]. If OpenBLAS fell back to its generic kernels on a CPU with AVX2
// and FMA, and OPENBLAS_CORETYPE is unset (and KEEL_BLAS_TUNE is not "0"), re-executes this
// program with OPENBLAS_CORETYPE=Haswell; otherwise returns. Never returns on a successful exec.
void tuneBlasForThisCpu(char** argv);

}  // namespace keel
