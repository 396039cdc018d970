// Online softmax over the KV iterations of one query tile, in the log2 domain (FlashAttention's
// running max and sum). Each thread owns two rows of its warpgroup's 64-row slab; the four
// threads of a quad share a row, so row reductions are two xor-shuffles.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "cuda/ptx.cuh"  // fast_exp2
#include "cuda/attention/fp8.hpp"  // kFp8ProbabilityOffsetLog2

namespace flashprefill::cuda::attention {

template <class Op>
__device__ __forceinline__ float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return op(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// ((2, 2, V), M, N) accumulator -> ((2, M), (2, V, N)) = (row, col) view.
template <class Layout>
__host__ __device__ constexpr auto rowcol(Layout l) {
  using cute::get;
  auto v = get<0>(l);
  return cute::make_layout(cute::make_layout(get<1>(v), get<1>(l)),
                           cute::make_layout(get<0>(v), get<2>(v), get<2>(l)));
}

struct OnlineSoftmax {
  // Scores stay unscaled (raw Q K^T, masked entries -inf); the softmax scale is folded into the
  // exponent, exp2(s * scale_log2 - max * scale_log2), one FFMA per element.
  float scale_log2;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw-score units
  float row_sum[2] = {0.f, 0.f};              // this thread's columns only until finalize

  __device__ explicit OnlineSoftmax(float scale) : scale_log2(scale) {}

  // Scores s (row, col) -> probabilities; returns the factor by which each output row must be
  // rescaled to the new maximum (applied by rescale once the previous P V has landed).
  // kE4m3 (Eq. 15): the probabilities are 2^8 exp(S - m), and the row sums are left to
  // add_rounded, which adds them once rounded to e4m3.
  template <bool kE4m3 = false, class Scores>
  __device__ __forceinline__ void update(Scores& s, float (&factors)[2]) {
    using cute::size;
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m) {
      float mx = row_max[m];
      CUTE_UNROLL
      for (int n = 0; n < size<1>(s); ++n) mx = fmaxf(mx, s(m, n));
      mx = quad_allreduce(mx, [](float a, float b) { return fmaxf(a, b); });
      // A row with no key yet stays at zero (its factor multiplies zeros).
      const float base = mx == -INFINITY ? 0.f : mx * scale_log2;
      const float factor = fast_exp2(row_max[m] * scale_log2 - base);
      row_max[m] = mx;
      float sum = 0.f;
      if constexpr (kE4m3) {
        const float shifted = kFp8ProbabilityOffsetLog2 - base;
        CUTE_UNROLL
        for (int n = 0; n < size<1>(s); ++n) s(m, n) = fast_exp2(fmaf(s(m, n), scale_log2, shifted));
      } else {
        CUTE_UNROLL
        for (int n = 0; n < size<1>(s); ++n) {
          s(m, n) = fast_exp2(fmaf(s(m, n), scale_log2, -base));
          sum += s(m, n);
        }
      }
      row_sum[m] = row_sum[m] * factor + sum;
      factors[m] = factor;
    }
  }

  template <class Out>
  __device__ __forceinline__ static void rescale(Out& o, const float (&factors)[2]) {
    using cute::size;
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m) {
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); ++n) o(m, n) *= factors[m];
    }
  }

  // kE4m3: this thread's sums of the stage's rounded probabilities P~, per row.
  __device__ __forceinline__ void add_rounded(const float (&sums)[2]) {
    row_sum[0] += sums[0];
    row_sum[1] += sums[1];
  }

  // Normalizes o and returns each row's natural-log LSE (-inf and o = 0 for a row with no key).
  // kE4m3: o also takes the factor out_scale (c_v), and the LSE loses the 2^8 offset.
  template <bool kE4m3 = false, class Out>
  __device__ __forceinline__ void finalize(Out& o, float (&lse)[2], float out_scale = 1.f) {
    using cute::size;
    constexpr float kLn2 = 0.69314718055994531f;
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m) {
      const float sum = quad_allreduce(row_sum[m], [](float a, float b) { return a + b; });
      // sum >= 1 for a row with any key (its maximum contributes exp2(0)), so the fast
      // reciprocal and logarithm (MUFU, no slow paths) are within a few ulp.
      float inv;
      if constexpr (kE4m3) {
        inv = sum > 0.f ? __fdividef(out_scale, sum) : 0.f;
        lse[m] = sum > 0.f
                     ? (row_max[m] * scale_log2 + __log2f(sum) - kFp8ProbabilityOffsetLog2) * kLn2
                     : -INFINITY;
      } else {
        inv = sum > 0.f ? __fdividef(1.f, sum) : 0.f;
        lse[m] = sum > 0.f ? (row_max[m] * scale_log2 + __log2f(sum)) * kLn2 : -INFINITY;
      }
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); ++n) o(m, n) *= inv;
    }
  }
};

}  // namespace flashprefill::cuda::attention
