#include "reference/numerics.hpp"

// The hot loops of the CPU reference, cloned for AVX2 where the processor has it. Floating-point
// contraction is off (ISO C++ mode), so every clone computes bit-identical results.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP_CLONES
#endif

namespace flashprefill::ref {

FP_CLONES float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

FP_CLONES double dot_f64(const float* a, const float* b, int n) {
  double acc[4] = {0, 0, 0, 0};
  int i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) acc[l] += double(a[i + l]) * double(b[i + l]);
  for (int l = 0; i < n; ++i, ++l) acc[l] += double(a[i]) * double(b[i]);
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

FP_CLONES void axpy(float w, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += w * x[i];
}

FP_CLONES void axpy(double w, const float* x, double* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += w * double(x[i]);
}

}  // namespace flashprefill::ref
