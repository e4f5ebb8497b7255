// The CUDA simulator's half type (cuda_fp16.h): the conversions device code uses, rounded to
// nearest even as the hardware does (runtime.cpp).
#pragma once
#include "cuda_runtime.h"

struct __half {
  unsigned short x;
};
inline __half __ushort_as_half(unsigned short u) {
  return __half{u};
}
inline unsigned short __half_as_ushort(__half h) {
  return h.x;
}
float keelSimHalfToFloat(unsigned short bits);
unsigned short keelSimFloatToHalf(float f);
inline float __half2float(__half h) {
  return keelSimHalfToFloat(h.x);
}
inline __half __float2half_rn(float f) {
  return __half{keelSimFloatToHalf(f)};
}
inline __half __float2half(float f) {
  return __float2half_rn(f);
}
