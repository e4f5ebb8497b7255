// gradcheck_test.cpp on cuda:0: every backward rule's float64 finite-difference check with the
// cuda kernels. Label gpu (skipped without a device); also built as cudasim_cuda_gradcheck_test,
// on the CUDA simulator.
#define KEEL_GRADCHECK_CUDA 1
#include "gradcheck_test.cpp"
