// Writes one consumer thread's rows of the finished tile: the normalized output in the dtype and
// the LSE, or, when the KV range is split (Eq. 18), float partials for combine.cu.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"

namespace flashprefill::cuda::attention {

template <class Element, int kHeadDim, class Out, class Coords>
__device__ __forceinline__ void store_tile(const AttentionParams& p, const WorkTile& w,
                                           const Out& o, const Coords& coord,
                                           const float (&lse)[2]) {
  using cute::get;
  using cute::size;
  const int64_t rows = w.seq.packed_rows();
  const int64_t heads_q = int64_t(p.heads_kv) * p.group;
  CUTE_UNROLL
  for (int m = 0; m < 2; ++m) {
    const int64_t r = w.seq.tile_row_begin(w.tile) + get<0>(coord(m, 0));
    if (r >= rows) continue;
    const int64_t token = w.q_row0 + w.seq.query_index(r);  // Eq. 13
    const int64_t head = int64_t(w.h) * p.group + w.seq.head_in_group(r);
    const bool owns_lse = get<1>(coord(m, 0)) == 0;
    if (p.num_splits == 1) {
      Element* out = static_cast<Element*>(p.out) + token * p.out_stride_token +
                     head * p.out_stride_head;
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); n += 2) {
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o(m, n));
        pair[1] = Element(o(m, n + 1));
        *reinterpret_cast<cutlass::Array<Element, 2>*>(out + get<1>(coord(m, n))) = pair;
      }
      if (p.lse != nullptr && owns_lse) p.lse[head * p.total_q + token] = lse[m];
    } else {
      const int64_t slot = (int64_t(w.split) * p.total_q + token) * heads_q + head;
      float* out = p.o_partial + slot * kHeadDim;
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); n += 2)
        *reinterpret_cast<float2*>(out + get<1>(coord(m, n))) = make_float2(o(m, n), o(m, n + 1));
      if (owns_lse) p.lse_partial[(int64_t(w.split) * heads_q + head) * p.total_q + token] = lse[m];
    }
  }
}

}  // namespace flashprefill::cuda::attention
