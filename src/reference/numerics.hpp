// Exact dtype conversions of the CPU reference: bf16/fp16/e4m3 widen exactly to float32, and
// float32 narrows with round-to-nearest-even, as the tensor-core path rounds.
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

// OCP e4m3fn: bias 7, subnormals mant * 2^-9, S.1111.111 is NaN, no infinity, largest 448.
inline constexpr float kE4m3Max = 448.f;

inline float e4m3_to_float(uint8_t b) {
  const uint32_t exp = (b >> 3) & 0xf, mant = b & 7;
  float a;
  if (exp == 15 && mant == 7) a = NAN;
  else if (exp == 0) a = float(mant) * 0.001953125f;           // mant * 2^-9
  else a = bits_to_float(((exp + 120) << 23) | (mant << 20));  // (1 + mant / 8) 2^(exp - 7)
  return (b & 0x80) ? -a : a;
}

// Round-to-nearest-even with saturation: finite values beyond 448 and infinities become +-448
// (cvt.rn.satfinite.e4m3x2.f32, the conversion FP8 kernels use; quantizers clamp the same way),
// NaN stays NaN.
inline uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= kE4m3Max) return uint8_t(sign | 0x7e);
  if (a < 0.015625f) return uint8_t(sign | uint8_t(std::nearbyint(a * 512.f)));  // 2^-6: subnormal
  const uint32_t au = float_to_bits(a);
  const uint32_t r = au + 0x7ffff + ((au >> 20) & 1);  // to 3 mantissa bits, ties to even
  return uint8_t(sign | ((((r >> 23) - 120) << 3) | ((r >> 20) & 7)));
}

inline float round_to_e4m3(float x) { return e4m3_to_float(float_to_e4m3(x)); }

inline float load(const void* base, int64_t i, fp_dtype dtype) {
  switch (dtype) {
    case FP_FLOAT32: return static_cast<const float*>(base)[i];
    case FP_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case FP_FLOAT16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case FP_FLOAT8_E4M3: return e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.f;
}

inline void store(void* base, int64_t i, fp_dtype dtype, float x) {
  switch (dtype) {
    case FP_FLOAT32: static_cast<float*>(base)[i] = x; break;
    case FP_BFLOAT16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); break;
    case FP_FLOAT16: static_cast<uint16_t*>(base)[i] = float_to_fp16(x); break;
    case FP_FLOAT8_E4M3: static_cast<uint8_t*>(base)[i] = float_to_e4m3(x); break;
  }
}

// rho(x) of docs/ALGORITHM.md: a float32 value rounded to the problem's dtype and widened back.
inline float round_to_dtype(float x, fp_dtype dtype) {
  switch (dtype) {
    case FP_FLOAT32: return x;
    case FP_BFLOAT16: return bf16_to_float(float_to_bf16(x));
    case FP_FLOAT16: return fp16_to_float(float_to_fp16(x));
    case FP_FLOAT8_E4M3: return round_to_e4m3(x);
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
