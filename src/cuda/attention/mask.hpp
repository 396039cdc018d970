// Turns raw Q K^T scores into log2-domain logits: scale, then either the causal/length mask of an
// exact tile (bottom-right alignment: row r sees keys j <= o + r / g) or the log|B_J| shift of a
// mean window (Eq. 6).
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"

namespace flashprefill::cuda::attention {

// s and coord are (row, col) views of one thread's S fragment; pos[m] is row m's position.
template <class Scores, class Coords>
__device__ __forceinline__ void scale_and_mask_exact(Scores& s, const Coords& coord, int32_t tile,
                                                     const int32_t (&pos)[2], float scale_log2,
                                                     bool need_mask) {
  using cute::size;
  static_assert(decltype(size<0>(s))::value == 2);
  CUTE_UNROLL
  for (int m = 0; m < 2; ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<1>(s); ++n) {
      const int32_t key = tile * kKvTile + int32_t(cute::get<1>(coord(m, n)));
      s(m, n) = (need_mask && key > pos[m]) ? -INFINITY : s(m, n) * scale_log2;
    }
  }
}

// Mean window: column c is a surrogate key with logit q . k_mean * scale + ln |B_J| (Eq. 6);
// bias[c] = log2 |B_J|, or -inf for blocks that get no surrogate.
template <class Scores, class Coords>
__device__ __forceinline__ void scale_and_shift_means(Scores& s, const Coords& coord,
                                                      const float* bias, float scale_log2) {
  using cute::size;
  CUTE_UNROLL
  for (int m = 0; m < size<0>(s); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<1>(s); ++n) {
      const float b = bias[cute::get<1>(coord(m, n))];
      s(m, n) = b == -INFINITY ? -INFINITY : fmaf(s(m, n), scale_log2, b);
    }
  }
}

}  // namespace flashprefill::cuda::attention
