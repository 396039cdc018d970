// The producer's loader of exact KV tiles into the shared-memory stages: TMA boxes for full tiles
// of contiguous KV and of paged KV whose pages hold a multiple of 16 keys (whole-tile boxes, or
// one pair box for two adjacent tiles), cp.async for other paged KV (Eq. 22) and for a request's
// partial last tile, whose rows past the sequence are zero-filled so that no stale value can
// reach the tensor cores. The paged cache's addressing is paged_kv.hpp's.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"
#include "cuda/attention/fp8.hpp"
#include "cuda/attention/paged_kv.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::attention {

template <class Traits>
struct KvLoader {
  using Element = typename Traits::Element;
  static constexpr int kChunksPerRow = Traits::kHeadDim / Traits::kChunk;

  const AttentionParams& p;
  const WorkTile& w;
  int32_t thread;  // 0 .. kProducerThreads - 1

  __device__ PagedKv<Traits> paged() const { return PagedKv<Traits>{p, w, thread}; }

  // e4m3 KV: every tile, the request's partial last one too (its keys past the request are
  // masked, and the transposed V is zero there: transpose_v.cuh), so that no stage is written
  // by cp.async, whose 16-byte rows do not fit the keys-contiguous V^T.
  __device__ bool tma_tile(int32_t t) const {
    if constexpr (Traits::kFp8) return true;
    return tile_by_tma(p, w.seq.len_kv, t);
  }

  // Row of the TMA maps where full KV tile t starts: the request's first row plus 64 t, or,
  // paged, PagedKv::tma_row.
  __device__ int32_t tma_row(int32_t t) const {
    if constexpr (Traits::kPaged) {
      return paged().tma_row(t);
    } else {
      return int32_t(w.k_addr.row0) + t * kKvTile;
    }
  }

  // KV tile t (from map row `row`, tma_row) by TMA into rows [64 half, 64 half + 64) of stage
  // `stage`, kHeadDim / kBoxCols boxes per operand; issued by one thread. e4m3: V^T in one box
  // of the transposed V's map (keys, D, Hkv), where request b's keys start at row
  // transposed_v_start(first key, b) (transpose_v.cuh).
  template <class SmemK, class SmemVt>
  __device__ void tma_kv_tile(SmemK& sK, SmemVt& sVt, int32_t row, int half, int stage,
                              uint64_t* bar) const {
    CUTE_UNROLL
    for (int c = 0; c < Traits::kHeadDim; c += Traits::kBoxCols) {
      tma_load_3d(&sK(half * kKvTile, c, stage), &p.tma_k, bar, c, w.h, row);
      if constexpr (!Traits::kFp8)
        tma_load_3d(&sVt(c, half * kKvTile, stage), &p.tma_v, bar, c, w.h, row);
    }
    if constexpr (Traits::kFp8)
      tma_load_3d(&sVt(0, half * kKvTile, stage), &p.tma_v, bar,
                  int32_t(transposed_v_start(w.k_addr.row0, w.b)) + (row - int32_t(w.k_addr.row0)),
                  0, w.h);
  }

  // KV tiles t and t + 1 (from map row `row` of tile t; paged, rows back to back) by TMA into
  // stage `stage`, one box of the pair maps per operand; issued by one thread.
  template <class SmemK, class SmemVt>
  __device__ void tma_kv_pair(SmemK& sK, SmemVt& sVt, int32_t row, int stage, uint64_t* bar) const {
    tma_load_4d(&sK(0, 0, stage), &p.tma_k_pair, bar, 0, row, 0, w.h);
    tma_load_4d(&sVt(0, 0, stage), &p.tma_v_pair, bar, 0, row, 0, w.h);
  }

  // KV tile t by cp.async: keys [64 t, 64 t + 64) of the request into rows
  // [64 half, 64 half + 64) of stage `stage`; t < 0 zero-fills them. A thread copies one 16-byte
  // column chunk of every kRowStep-th row, so its addresses advance by constant strides. Paged
  // KV takes its rows from the page table (PagedKv::load_tile).
  template <class SmemK, class SmemVt>
  __device__ void load_kv_tile(SmemK& sK, SmemVt& sVt, int32_t t, int half, int stage) const {
    static_assert(Traits::kProducerThreads % kChunksPerRow == 0);
    constexpr int kRowStep = Traits::kProducerThreads / kChunksPerRow;
    constexpr int kIters = kKvTile / kRowStep;
    const int r0 = thread / kChunksPerRow, col = (thread % kChunksPerRow) * Traits::kChunk;
    const int row0 = half * kKvTile + r0;
    Element* k_dst = &sK(row0, col, stage);
    Element* v_dst = &sVt(col, row0, stage);
    const int64_t k_dst_step = &sK(row0 + kRowStep, col, stage) - k_dst;
    const int64_t v_dst_step = &sVt(col, row0 + kRowStep, stage) - v_dst;
    if constexpr (Traits::kPaged) {
      paged().load_tile(k_dst, v_dst, k_dst_step, v_dst_step, r0, col, t);
    } else {
      const Element* k = static_cast<const Element*>(p.k) + int64_t(w.h) * p.k_stride_head + col;
      const Element* v = static_cast<const Element*>(p.v) + int64_t(w.h) * p.v_stride_head + col;
      const int32_t j0 = t * kKvTile + r0;
      CUTE_UNROLL
      for (int i = 0; i < kIters; ++i) {
        const int32_t j = j0 + i * kRowStep;
        const bool valid = t >= 0 && j < w.seq.len_kv;
        int64_t k_off = 0, v_off = 0;
        if (valid) {
          const int64_t row = w.k_addr.row0 + j;
          k_off = row * p.k_stride_token;
          v_off = row * p.v_stride_token;
        }
        cp_async_16(k_dst + i * k_dst_step, k + k_off, valid);
        cp_async_16(v_dst + i * v_dst_step, v + v_off, valid);
      }
    }
  }
};

}  // namespace flashprefill::cuda::attention
