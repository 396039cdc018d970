// The e4m3 pieces of the attention kernel (Eq. 15, docs/ALGORITHM.md "FP8 e4m3"): the e4m3 <->
// float conversions, and P~ = round_e4m3(2^8 exp(S - m)) written from the fp32 S accumulator
// straight into the registers of the A operand of P V, in place: the key order of V^T
// (fp8_slot_key) is chosen so that no value crosses lanes.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/attention/params.hpp"

namespace flashprefill::cuda::attention {

// P~ = round_e4m3(2^8 exp(S - m)) lies in [0, 256]: the offset, in log2 units. It cancels in O
// and comes out of the LSE.
inline constexpr float kFp8ProbabilityOffsetLog2 = 8.f;

// The key of K slot s (0 <= s < 32) of every 32-key group of an e4m3 P V. The fp32 accumulator
// of S = Q K^T gives lane t of a quad, per row and 32 keys, the columns 2t + c + 8a + 16h
// (a, c, h in {0, 1}); the e4m3 A operand of P V holds in that lane the K slots 4t + i + 16h
// (i = 0 ... 3). Slot 4t + 2a + c + 16h therefore holds key 2t + c + 8a + 16h, and each lane's
// probabilities are already its operand values: V^T lists its keys in this order
// (transpose_v.cuh writes it so), and P V sums over the same pairs (key, value).
__host__ __device__ constexpr int32_t fp8_slot_key(int32_t s) {
  const int32_t h = s / 16, t = (s % 16) / 4, a = (s % 4) / 2, c = s % 2;
  return 16 * h + 8 * a + 2 * t + c;
}

// First row of request b (whose keys start at key0 in K) in the transposed V (transpose_v.cuh):
// key0 rounded down to a multiple of 64, plus 128 b. Consecutive requests' starts lie at least
// len + 65 rows apart, room for the previous one's last tile in full, with 64-aligned tiles.
__host__ __device__ constexpr int64_t transposed_v_start(int64_t key0, int32_t b) {
  return key0 / 64 * 64 + 128 * int64_t(b);
}

// Factor c(b, h) of descale tensor d for request b and KV head h; 1 without a tensor.
__device__ __forceinline__ float descale_at(const Descale& d, int32_t b, int32_t h) {
  return d.data == nullptr ? 1.f : d.data[b * d.stride_batch + h * d.stride_head];
}

// round_e4m3 of two floats (round to nearest even, saturating: cvt.rn.satfinite), lo in the low
// byte.
__device__ __forceinline__ uint32_t e4m3x2_from_floats(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// The two e4m3 values of the low 16 bits of x, exactly, as fp16 (e4m3 is exact in fp16).
__device__ __forceinline__ __half2 halves_from_e4m3x2(uint32_t x) {
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(uint16_t(x)));
  return *reinterpret_cast<__half2*>(&h2);
}

// acc: one thread's S accumulator ((2, 2, N/8), 1, 1) holding 2^8 exp(S - m); words: the A
// operand of P V in its compact layout ((4, 2, 2), 1, N/32) of e4m3, four to a 32-bit word
// (word i1 + 2 i2 + 4 k holds row i1 and slots 4t + 16 i2 + {0 ... 3} of group k). Adds each
// row's rounded probabilities to sums (Eq. 15's denominator sums the rounded P~): per row, the
// thread's N/4 values of the stage are added in fp16 pairs, pairwise (a tree of depth
// log2(N/8), partial sums <= 256 N/8, each addition rounded to fp16's 11 bits), and the two
// halves of the pair then in float32: one fp16 addition per two probabilities instead of a
// conversion and a float32 addition per probability (docs/ALGORITHM.md "FP8 e4m3").
template <class Acc>
__device__ __forceinline__ void convert_p_e4m3(const Acc& acc, uint32_t* words, float (&sums)[2]) {
  constexpr int kGroups = decltype(cute::size(acc))::value / 16;  // 32 keys each
  constexpr int kPairs = 2 * kGroups;                              // per row: words of the stage
  static_assert((kPairs & (kPairs - 1)) == 0, "a pairwise tree over a power of two");
  __half2 pair[2][kPairs];
  CUTE_UNROLL
  for (int k = 0; k < kGroups; ++k) {
    CUTE_UNROLL
    for (int i2 = 0; i2 < 2; ++i2) {
      CUTE_UNROLL
      for (int i1 = 0; i1 < 2; ++i1) {
        const int base = 2 * i1 + 8 * i2 + 16 * k;  // (c = 0, row i1, column block 4k + 2 i2)
        const uint32_t lo = e4m3x2_from_floats(acc(base), acc(base + 1));          // a = 0
        const uint32_t hi = e4m3x2_from_floats(acc(base + 4), acc(base + 5));      // a = 1
        const uint32_t w = lo | (hi << 16);
        words[i1 + 2 * i2 + 4 * k] = w;
        pair[i1][i2 + 2 * k] = __hadd2(halves_from_e4m3x2(lo), halves_from_e4m3x2(hi));
      }
    }
  }
  CUTE_UNROLL
  for (int i1 = 0; i1 < 2; ++i1) {
    CUTE_UNROLL
    for (int width = kPairs / 2; width > 0; width /= 2) {
      CUTE_UNROLL
      for (int j = 0; j < width; ++j) pair[i1][j] = __hadd2(pair[i1][j], pair[i1][j + width]);
    }
    const float2 x = __half22float2(pair[i1][0]);
    sums[i1] += x.x + x.y;
  }
}

}  // namespace flashprefill::cuda::attention
