// Contiguous float32 loops of the transcendental ops, compiled twice (AVX2 and baseline) and picked
// at load time (GCC target_clones). No FMA in either clone, so both give the same bits: the
// speed-up is width only, and results stay identical across machines.
#include "cpu_util.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KEEL_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#define KEEL_CPU_CLONES_ON 1
#else
#define KEEL_CPU_CLONES
#endif

namespace keel::cpu {

const char* vecMathClone() {
#if defined(KEEL_CPU_CLONES_ON)
  // GCC's resolver for target_clones("avx2", "default") asks the same question.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") ? "avx2" : "baseline";
#else
  return "baseline";
#endif
}

KEEL_CPU_CLONES
void floatUnaryArray(FloatUnary op, const float* x, float* y, int64_t n) {
  switch (op) {
    case FloatUnary::Exp:
      for (int64_t i = 0; i < n; ++i) y[i] = math::expF(x[i]);
      break;
    case FloatUnary::Tanh:
      for (int64_t i = 0; i < n; ++i) y[i] = math::tanhF(x[i]);
      break;
    case FloatUnary::Sigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = math::sigmoidF(x[i]);
      break;
    case FloatUnary::Gelu:
      for (int64_t i = 0; i < n; ++i) y[i] = math::geluF(x[i]);
      break;
    case FloatUnary::Silu:
      for (int64_t i = 0; i < n; ++i) y[i] = math::siluF(x[i]);
      break;
  }
}

KEEL_CPU_CLONES
void floatGradArray(FloatGrad op, const float* g, const float* x, float* y, int64_t n) {
  switch (op) {
    case FloatGrad::Gelu:
      for (int64_t i = 0; i < n; ++i) y[i] = g[i] * math::geluGradF(x[i]);
      break;
    case FloatGrad::Silu:
      for (int64_t i = 0; i < n; ++i) y[i] = g[i] * math::siluGradF(x[i]);
      break;
  }
}

KEEL_CPU_CLONES
void expShiftArray(const float* x, float shift, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = math::expF(x[i] - shift);
}

}  // namespace keel::cpu
