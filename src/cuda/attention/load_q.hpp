// The producer's loader of the Q tile: one TMA box of the 5-D Q map when g is a power of two
// (p.q_tma), else cp.async by every producer thread; and the TMA box's L2 prefetch when an item
// is decoded.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::attention {

// First token of item w's query tile in the Q tensor map (g divides the 128 rows).
__device__ __forceinline__ int32_t q_tile_token(const AttentionParams& p, const WorkTile& w) {
  return int32_t(w.q_row0) + w.tile * (kTileRows / p.group);
}

template <class Traits>
struct QLoader {
  using Element = typename Traits::Element;
  static constexpr int kChunk = Traits::kChunk;
  static constexpr int kChunksPerRow = Traits::kHeadDim / kChunk;
  static constexpr int kThreads = Traits::kProducerThreads;

  const AttentionParams& p;
  const WorkTile& w;
  int32_t thread;  // 0 .. kProducerThreads - 1

  // Q tile by cp.async: packed row r -> query r / g of head h g + r % g (Eq. 12-13). A thread
  // copies one 16-byte column chunk of every kRowStep-th row; (query, head in group) advance by
  // constant steps, so the tile costs one division per thread. Rows past the request are zeros.
  template <class SmemQ>
  __device__ void load_q(SmemQ& sQ) const {
    static_assert(kThreads % kChunksPerRow == 0 && Traits::kBlockM % (kThreads / kChunksPerRow) == 0);
    constexpr int kRowStep = kThreads / kChunksPerRow;
    const Element* q = static_cast<const Element*>(p.q);
    const int64_t rows = w.seq.packed_rows();
    const int row0 = thread / kChunksPerRow, col = (thread % kChunksPerRow) * kChunk;
    const int64_t r0 = w.seq.tile_row_begin(w.tile) + row0;
    const int32_t g = p.group;
    int64_t query = r0 / g;
    int32_t head = int32_t(r0 - query * g);
    const int32_t step_query = kRowStep / g, step_head = kRowStep % g;
    const Element* base = q + w.q_row0 * p.q_stride_token + int64_t(w.h) * g * p.q_stride_head + col;
    // Not unrolled: the producer runs on few registers; unrolled, the 16 row addresses spilled to
    // local memory and the reloads serialized the copies (ncu: the consumers' wait for Q doubled).
#pragma unroll 1
    for (int i = 0; i < Traits::kBlockM / kRowStep; ++i) {
      const bool valid = r0 + i * kRowStep < rows;
      const Element* src = valid ? base + query * p.q_stride_token + head * p.q_stride_head : q;
      cp_async_16(&sQ(row0 + i * kRowStep, col), src, valid);
      query += step_query;
      head += step_head;
      if (head >= g) {
        head -= g;
        ++query;
      }
    }
  }

  // Q tile by TMA: the box (64, g, 1, 128 / g, D / 64) of the map (64, g, Hkv, total_q, D / 64)
  // at (0, 0, head, token, 0), issued by one thread. Rows past the request read the next
  // request's queries or zeros, finite either way, and their outputs are never stored.
  template <class SmemQ>
  __device__ void tma_q(SmemQ& sQ, uint64_t* bar) const {
    tma_load_5d(&sQ(0, 0), &p.tma_q, bar, 0, 0, w.h, q_tile_token(p, w), 0);
  }

  // The same box into L2 only, issued by one thread when the item is decoded: its Q load, which
  // waits for the previous item's last S = Q K^T, then reads L2.
  __device__ void prefetch_q() const {
    if (p.q_tma) tma_prefetch_5d(&p.tma_q, 0, 0, w.h, q_tile_token(p, w), 0);
  }
};

}  // namespace flashprefill::cuda::attention
