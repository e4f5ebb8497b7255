// flashmask_test.cpp against cuda:0 instead of cpu: every mask kind forward and backward in
// float32 and bfloat16, the geometry corner cases (lengths that are not multiples of a tile, GQA,
// per-head masks, windows, rows that see nothing), dropout masks equal to cpu-ref's, bitwise
// determinism, tile skipping on and off, float64 gradchecks. Label gpu (skipped without a device);
// also built as cudasim_cuda_flashmask_test, on the CUDA simulator.
#define KEEL_FLASHMASK_CUDA 1
#include "flashmask_test.cpp"
