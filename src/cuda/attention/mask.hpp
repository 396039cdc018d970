// Prepares the raw Q K^T scores of exact tiles for the online softmax: the causal/length mask
// (bottom-right alignment: row r sees keys j <= o + r / g). Mean windows get the log |B_J| shift
// instead (shift_means, mean_correction.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"

namespace flashprefill::cuda::attention {

// Whether a stage of exact tiles needs the mask at all: an empty half or a tile that reaches past
// the tile's first position.
template <int kTiles>
__device__ __forceinline__ bool stage_needs_mask(const int32_t (&tiles)[kTiles], int32_t pmin) {
  bool need = false;
  CUTE_UNROLL
  for (int i = 0; i < kTiles; ++i) need |= tiles[i] < 0 || tiles[i] * kKvTile + kKvTile - 1 > pmin;
  return need;
}

// s and coord are (row, col) views of one thread's S fragment; pos[m] is row m's position;
// column c holds key 64 tiles[c / 64] + c % 64 (an empty half, tiles[i] < 0, is all masked).
// Columns are compared as offsets from the thread's first column, which are compile-time
// constants, against one limit per (row, half): no per-element coordinate stays live.
template <int kTiles, class Scores, class Coords>
__device__ __forceinline__ void mask_exact(Scores& s, const Coords& coord,
                                           const int32_t (&tiles)[kTiles], const int32_t (&pos)[2]) {
  using cute::size;
  static_assert(decltype(size<0>(s))::value == 2);
  const int32_t col0 = int32_t(cute::get<1>(coord(0, 0)));
  CUTE_UNROLL
  for (int m = 0; m < 2; ++m) {
    int32_t limit[kTiles];  // key <= pos  <=>  c - col0 <= limit[half]
    CUTE_UNROLL
    for (int h = 0; h < kTiles; ++h)
      limit[h] = tiles[h] < 0 ? -kKvTile * kTiles : pos[m] - tiles[h] * kKvTile + h * kKvTile - col0;
    CUTE_UNROLL
    for (int n = 0; n < size<1>(s); ++n) {
      const int32_t offset = int32_t(cute::get<1>(coord(m, n))) - col0;
      // The wgmma accumulator gives a thread columns 2 (lane % 4) + {0, 1} + 8 i, so a column's
      // half is its offset's: col0 < 8 never carries an offset across a 64-column boundary.
      const int h = offset / kKvTile;
      if (offset > limit[h]) s(m, n) = -INFINITY;
    }
  }
}

}  // namespace flashprefill::cuda::attention
