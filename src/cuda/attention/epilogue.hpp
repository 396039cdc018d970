// Writes one consumer thread's rows of the finished tile: the normalized output in the dtype and
// the LSE, or, when the KV range is split (Eq. 18), float partials for combine.cu.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::attention {

// A 4 x 4 transpose of 32-bit values across the four lanes of a quad, in place: on entry lane q
// holds a[c] = M[q][c]; on return a[r] = M[r][q]. Two butterfly rounds (xor 1, then xor 2), each
// swapping with the partner lane the two entries whose index bit differs from the lane's: four
// shuffles and selects on one lane bit, no data-dependent indexing. Called by all 32 lanes.
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4]) {
  const int q = threadIdx.x % 4;
  CUTE_UNROLL
  for (int m = 1; m <= 2; m *= 2) {
    const bool upper = (q & m) != 0;
    CUTE_UNROLL
    for (int lo = 0; lo < 4; ++lo) {
      if (lo & m) continue;
      const int hi = lo | m;
      const uint32_t v = __shfl_xor_sync(0xffffffffu, upper ? a[lo] : a[hi], m);
      if (upper) a[lo] = v;
      else a[hi] = v;
    }
  }
}

template <class Element, int kHeadDim, class Out, class Coords>
__device__ __forceinline__ void store_tile(const AttentionParams& p, const WorkTile& w,
                                           const Out& o, const Coords& coord,
                                           const float (&lse)[2]) {
  using cute::get;
  using cute::size;
  static_assert(kHeadDim % 32 == 0 && sizeof(Element) == 2);
  const int64_t rows = w.seq.packed_rows();
  const int64_t heads_q = int64_t(p.heads_kv) * p.group;
  const int q = threadIdx.x % 4;
  CUTE_UNROLL
  for (int m = 0; m < 2; ++m) {
    // Every lane runs the loop body (the transposes shuffle across the quad); stores are
    // predicated on the row being inside the request.
    const int64_t r = w.seq.tile_row_begin(w.tile) + get<0>(coord(m, 0));
    const bool valid = r < rows;
    const int64_t token = valid ? w.q_row0 + w.seq.query_index(r) : 0;  // Eq. 13
    const int64_t head = valid ? int64_t(w.h) * p.group + w.seq.head_in_group(r) : 0;
    const bool owns_lse = valid && get<1>(coord(m, 0)) == 0;
    if (p.num_splits > 1) {  // float partials for combine.cu
      const int64_t slot = (int64_t(w.split) * p.total_q + token) * heads_q + head;
      float* out = p.o_partial + slot * kHeadDim;
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); n += 2)
        if (valid)
          *reinterpret_cast<float2*>(out + get<1>(coord(m, n))) = make_float2(o(m, n), o(m, n + 1));
      if (owns_lse) p.lse_partial[(int64_t(w.split) * heads_q + head) * p.total_q + token] = lse[m];
      continue;
    }
    Element* out = static_cast<Element*>(p.out) + token * p.out_stride_token +
                   head * p.out_stride_head;
    if (p.out_vec16) {
      // The quad's four threads share a row and hold interleaved column pairs (8 j + 2 q, + 1 in
      // group j); after a transpose each owns a whole 8-column group and writes it as one 16-byte
      // store: a quarter of the store instructions and of the cache lines each one touches.
      CUTE_UNROLL
      for (int k = 0; k < kHeadDim / 32; ++k) {
        uint32_t a[4];
        CUTE_UNROLL
        for (int c = 0; c < 4; ++c) {
          cutlass::Array<Element, 2> pair;
          pair[0] = Element(o(m, 2 * (4 * k + c)));
          pair[1] = Element(o(m, 2 * (4 * k + c) + 1));
          a[c] = reinterpret_cast<const uint32_t&>(pair);
        }
        quad_transpose(a);
        const int col = get<1>(coord(m, 2 * (4 * k + q))) - 2 * q;  // 8 (4 k + q)
        if (valid) *reinterpret_cast<uint4*>(out + col) = make_uint4(a[0], a[1], a[2], a[3]);
      }
    } else {  // rows not 16-byte aligned: element pairs
      CUTE_UNROLL
      for (int n = 0; n < size<1>(o); n += 2) {
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o(m, n));
        pair[1] = Element(o(m, n + 1));
        if (valid) *reinterpret_cast<cutlass::Array<Element, 2>*>(out + get<1>(coord(m, n))) = pair;
      }
    }
    if (owns_lse && p.lse != nullptr) p.lse[head * p.total_q + token] = lse[m];
  }
}

// Whether the consumers write the finished tile through shared memory (store_tile_staged): the
// output rows are 16-byte aligned and the tile is not a split's partial.
__device__ __forceinline__ bool staged_store(const AttentionParams& p) {
  return p.out_vec16 && p.num_splits == 1;
}

// The same tile as store_tile (normalized o, the dtype, 16-byte aligned rows, no split), through
// shared memory: each warp writes its 16 rows with stmatrix into `staging` (rows of kHeadDim
// elements, 16-byte chunks XOR-swizzled by row so that neither side conflicts on banks), then
// copies them out a whole row per 16 lanes with 16-byte loads and stores. Each row's address is
// worked out once, by one lane. `staging` holds this warpgroup's 64 rows; the warp touches only
// its own 16, so a __syncwarp orders the two halves.
template <class Element, int kHeadDim, class Out, class Coords>
__device__ __forceinline__ void store_tile_staged(const AttentionParams& p, const WorkTile& w,
                                                  const Out& o, const Coords& coord,
                                                  const float (&lse)[2], char* staging) {
  using cute::get;
  static_assert(sizeof(Element) == 2 && kHeadDim % 16 == 0);
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kChunks = kHeadDim / 8;        // 16-byte chunks per row
  constexpr int kRowsPerPass = 32 / kChunks;   // rows one warp copies per pass
  const int lane = threadIdx.x % 32;
  const int warp_row0 = 16 * ((threadIdx.x / 32) % 4);  // the warp's rows in the 64-row slab
  const uint32_t base = cute::cast_smem_ptr_to_uint(staging) + warp_row0 * kRowBytes;

  // stmatrix_x4 from the wgmma accumulator layout (lane t holds row t / 4, columns
  // 2 (t % 4) + {0, 1} of each 8 x 8 matrix). Matrix i of call c: rows 8 (i % 2) .. + 7 of the
  // warp's 16, columns 8 (2 c + i / 2) .. + 7.
  {
    const int i = lane / 8, rr = lane % 8;
    const uint32_t row_addr = base + (8 * (i % 2) + rr) * kRowBytes;
    CUTE_UNROLL
    for (int c = 0; c < kChunks / 2; ++c) {
      uint32_t r[4];
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int m = k % 2, j = 2 * c + k / 2;  // pair j of row m: columns 8 j + 2 (lane % 4)
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(o(m, 2 * j));
        pair[1] = Element(o(m, 2 * j + 1));
        r[k] = reinterpret_cast<const uint32_t&>(pair);
      }
      stmatrix_x4(row_addr + (((2 * c + i / 2) ^ rr) << 4), r[0], r[1], r[2], r[3]);
    }
  }

  // Lane l < 16 owns row l of the warp's 16: its output address (null past the request) and LSE.
  const int64_t r = w.seq.tile_row_begin(w.tile) + get<0>(coord(0, 0)) - lane / 4 + lane % 16;
  const bool valid = lane < 16 && r < w.seq.packed_rows();
  const int64_t token = valid ? w.q_row0 + w.seq.query_index(r) : 0;  // Eq. 13
  const int64_t head = valid ? int64_t(w.h) * p.group + w.seq.head_in_group(r) : 0;
  Element* row_out = valid ? static_cast<Element*>(p.out) + token * p.out_stride_token +
                                 head * p.out_stride_head
                           : nullptr;
  const float lse0 = __shfl_sync(0xffffffffu, lse[0], 4 * (lane % 8));
  const float lse1 = __shfl_sync(0xffffffffu, lse[1], 4 * (lane % 8));
  if (valid && p.lse != nullptr) p.lse[head * p.total_q + token] = (lane % 16) < 8 ? lse0 : lse1;
  __syncwarp();

  const int chunk = lane % kChunks;
  CUTE_UNROLL
  for (int pass = 0; pass < 16 / kRowsPerPass; ++pass) {
    const int row = pass * kRowsPerPass + lane / kChunks;
    Element* out = reinterpret_cast<Element*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row_out), row));
    const uint4 v = ld_shared_16(base + row * kRowBytes + ((chunk ^ (row % 8)) << 4));
    if (out != nullptr) *reinterpret_cast<uint4*>(out + 8 * chunk) = v;
  }
}

}  // namespace flashprefill::cuda::attention
