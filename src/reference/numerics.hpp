// Exact dtype conversions of the CPU reference: bf16/fp16 widen exactly to float32, and float32
// narrows with round-to-nearest-even, as the tensor-core path rounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashprefill/flashprefill.h"

namespace flashprefill::ref {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  const uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return uint16_t((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000 | (mant << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00);
  if (a >= 65520.f) return uint16_t(sign | 0x7c00);  // rounds to infinity
  if (a < 6.103515625e-05f) {                        // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.f);  // default rounding mode: to nearest even
    return uint16_t(sign | uint16_t(q));
  }
  const uint32_t au = float_to_bits(a);
  const uint32_t rounding = 0xfff + ((au >> 13) & 1);
  const uint32_t r = au + rounding;
  return uint16_t(sign | uint16_t(((r >> 23) - 112) << 10 | ((r >> 13) & 0x3ff)));
}

inline float load(const void* base, int64_t i, fp_dtype dtype) {
  switch (dtype) {
    case FP_FLOAT32: return static_cast<const float*>(base)[i];
    case FP_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case FP_FLOAT16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.f;
}

inline void store(void* base, int64_t i, fp_dtype dtype, float x) {
  switch (dtype) {
    case FP_FLOAT32: static_cast<float*>(base)[i] = x; break;
    case FP_BFLOAT16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); break;
    case FP_FLOAT16: static_cast<uint16_t*>(base)[i] = float_to_fp16(x); break;
  }
}

// rho(x) of docs/ALGORITHM.md: a float32 value rounded to the problem's dtype and widened back.
inline float round_to_dtype(float x, fp_dtype dtype) {
  switch (dtype) {
    case FP_FLOAT32: return x;
    case FP_BFLOAT16: return bf16_to_float(float_to_bf16(x));
    case FP_FLOAT16: return fp16_to_float(float_to_fp16(x));
  }
  return x;
}

// Dot products with independent partial sums combined in a fixed order, and axpy: deterministic,
// independent of the thread count and of the instruction set chosen at run time (numerics.cpp).
float dot(const float* a, const float* b, int n);
double dot_f64(const float* a, const float* b, int n);
void axpy(float w, const float* x, float* y, int n);
void axpy(double w, const float* x, double* y, int n);

}  // namespace flashprefill::ref
