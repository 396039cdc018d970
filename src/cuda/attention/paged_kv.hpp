// Addressing of a paged KV cache (Eq. 22) for the producer (producer.hpp) and its KV loader
// (load_kv.hpp): the pool rows of whole-tile TMA boxes (through the page table) and of adjacent
// tiles that come as one pair box (through the run table, for pages that do not come in
// whole-tile boxes), the boxes smaller than a tile that the producer's threads issue side by
// side, and the per-lane row numbers of the cp.async path.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"
#include "core/paged_runs.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::attention {

// Whether KV tile t is fetched by TMA: KV that the TMA maps cover (contiguous, or paged with
// pages of a multiple of 16 keys back to back) and every row of the tile inside the request (a
// partial last tile goes through cp.async, whose zero-fill keeps rows past the request, which may
// be another request's or unwritten memory, away from the tensor cores).
__device__ __forceinline__ bool tile_by_tma(const AttentionParams& p, int32_t len_kv, int32_t t) {
  return p.tma && t >= 0 && (t + 1) * kKvTile <= len_kv;
}

template <class Traits>
struct PagedKv {
  static constexpr int kD = Traits::kHeadDim;
  static constexpr int kChunk = Traits::kChunk;
  static constexpr int kChunksPerRow = kD / kChunk;
  static constexpr int kThreads = Traits::kProducerThreads;

  const AttentionParams& p;
  const WorkTile& w;
  int32_t thread;  // 0 .. kProducerThreads - 1

  __device__ bool tma_tile(int32_t t) const { return tile_by_tma(p, w.seq.len_kv, t); }

  // Row of the TMA maps where full KV tile t starts (whole-tile boxes: pages of a multiple of 64
  // keys): its page's first row plus its offset in the page.
  __device__ int32_t tma_row(int32_t t) const {
    const int32_t key = t * kKvTile;
    return pool_row(w.k_addr.pages, p.page_div, key);
  }

  // Whether KV tiles lo and lo + 1 (lo even or not) lie in one page: then one page-table load
  // gives both rows (whole-tile boxes).
  __device__ bool one_page_pair(int32_t lo) const {
    return p.page_div.mod(lo * kKvTile) + 2 * kKvTile <= p.page_size;
  }

  // --- The run table (KvLayout::kPagedRuns) ---

  // Whether request w.b has any pair of tiles back to back in the pool (entry 0 of its row).
  __device__ bool request_runs() const {
    return p.tma_runs && p.pair_rows[int64_t(w.b) * (1 + p.max_pairs)] != 0;
  }

  // The pool row of the pair box holding tiles tile0 and tile1 (an aligned, adjacent pair of
  // tiles back to back in the pool), else -1.
  __device__ int32_t run_row(int32_t tile0, int32_t tile1) const {
    const int32_t lo = tile0 < tile1 ? tile0 : tile1;
    if (tile0 + tile1 == 2 * lo + 1 && lo % 2 == 0)
      return p.pair_rows[int64_t(w.b) * (1 + p.max_pairs) + 1 + lo / 2];
    return -1;
  }

  // --- Boxes smaller than a tile (every producer thread) ---

  // A stage's full tiles come in boxes of p.tma_box_rows rows, nb = 64 / tma_box_rows per tile.
  // Box j < 2 nb (box j % nb of tile j < nb ? tile0 : tile1) belongs to lane j / 4 of producer
  // warp j % 4, so that the four producer warps (one per SM sub-partition) issue a stage's boxes
  // side by side.
  __device__ int box_of_thread() const {
    static_assert(kThreads == 128, "four producer warps");
    return (thread % 32) * 4 + thread / 32;
  }

  // This thread's box row in the TMA maps (0 when it has no box): the box's page, from the page
  // table, plus the box's offset in the page. Every box's page is looked up at once, before the
  // stage's buffer frees.
  __device__ int32_t box_row(int32_t tile0, int32_t tile1) const {
    const int nb = kKvTile / p.tma_box_rows;
    const int lane = box_of_thread();
    const int32_t t = lane < nb ? tile0 : lane < 2 * nb ? tile1 : -1;
    if (!tma_tile(t)) return 0;
    return pool_row(w.k_addr.pages, p.page_div, t * kKvTile + (lane % nb) * p.tma_box_rows);
  }

  // This thread's box (box_row) of the stage's full tiles, for tiles fetched by TMA
  // (tile_by_tma). Its bytes may land before thread 0 has expected them: the barrier's tx-count
  // may go below zero, and the stage cannot complete before thread 0's arrival.
  template <class SmemK, class SmemVt>
  __device__ void tma_boxes(SmemK& sK, SmemVt& sVt, int32_t tile0, int32_t tile1, int32_t row,
                            int stage, uint64_t* bar) const {
    const int nb = kKvTile / p.tma_box_rows;
    const int lane = box_of_thread();
    const int half = lane < nb ? 0 : 1;
    if (lane >= 2 * nb || !tma_tile(half == 0 ? tile0 : tile1)) return;
    const int r = half * kKvTile + (lane % nb) * p.tma_box_rows;
    CUTE_UNROLL
    for (int c = 0; c < kD; c += Traits::kBoxCols) {
      tma_load_3d(&sK(r, c, stage), &p.tma_k, bar, c, w.h, row);
      tma_load_3d(&sVt(c, r, stage), &p.tma_v, bar, c, w.h, row);
    }
  }

  // --- cp.async ---

  // The K and V rows of one row of tile t per lane, as 32-bit row numbers (page *
  // cp_k_page_units + offset * cp_k_token_units; the row starts that many cp_k_unit bytes past
  // the head's K base, and V alike). A warp copies 16 rows of a tile (kCpRowsPerWarp rows per
  // iteration); lane l (mod 16) holds its l-th row's, looked up once for the tile, and each
  // iteration takes its row's by shuffle. Rows past the request hold 0 (harmless: their copies
  // zero-fill).
  struct KvRows {
    uint32_t k;
    uint32_t v;
  };
  static constexpr int kCpRowStep = kThreads / kChunksPerRow;
  static constexpr int kCpRowsPerWarp = 32 / kChunksPerRow;
  static_assert(kCpRowsPerWarp * (kKvTile / kCpRowStep) == 16, "a warp copies 16 rows of a tile");
  __device__ KvRows rows(int32_t t) const {
    const int l = thread % 16;
    const int32_t jl =
        (thread / 32) * kCpRowsPerWarp + l % kCpRowsPerWarp + (l / kCpRowsPerWarp) * kCpRowStep;
    KvRows a{0, 0};
    if (t >= 0 && jl < w.seq.len_kv - t * kKvTile) {
      int32_t slot, in_page;
      p.page_div.divmod(t * kKvTile + jl, slot, in_page);  // a runtime `/` took ~20 instructions
      const uint32_t page = uint32_t(w.k_addr.pages[slot]);
      a.k = page * p.cp_k_page_units + uint32_t(in_page) * p.cp_k_token_units;
      a.v = page * p.cp_v_page_units + uint32_t(in_page) * p.cp_v_token_units;
    }
    return a;
  }

  // KV tile t (t < 0 zero-fills) by cp.async into the stage rows at k_dst / v_dst: this thread's
  // 16-byte chunk (column col) of rows r0 + i kCpRowStep, its destinations advancing by
  // k_dst_step / v_dst_step. An iteration's chain is shuffle, multiply-add, copy: one 32-bit
  // shuffle per operand and one wide multiply-add of the row number by the byte unit (a kernel
  // parameter) onto the thread's column (H200, pages of 1, 8, 100 keys shuffled: 0.955-0.967x the
  // time of shuffling 64-bit addresses at D = 128, 0.92x at D = 64). Unrolled by four at
  // D = 128 (by eight: slower, and the TMA paths' code spilled) and by two at D = 64 (0.97x
  // one's). The rows are looked up just before the tile's copies (both tiles' lookups first, so
  // that their latencies overlap, ran 0-3 % slower: H200, pages of 1, 8, 100 keys).
  template <class Element>
  __device__ void load_tile(Element* k_dst, Element* v_dst, int64_t k_dst_step,
                            int64_t v_dst_step, int r0, int col, int32_t t) const {
    constexpr int kIters = kKvTile / kCpRowStep;
    const KvRows rows_t = rows(t);
    const int32_t rows_left = t >= 0 ? w.seq.len_kv - t * kKvTile : 0;
    const char* k = reinterpret_cast<const char*>(static_cast<const Element*>(p.k) +
                                                  int64_t(w.h) * p.k_stride_head + col);
    const char* v = reinterpret_cast<const char*>(static_cast<const Element*>(p.v) +
                                                  int64_t(w.h) * p.v_stride_head + col);
    constexpr int kUnroll = kD == 64 ? 2 : 4;
#pragma unroll kUnroll
    for (int i = 0; i < kIters; ++i) {
      const bool valid = r0 + i * kCpRowStep < rows_left;
      const int src = i * kCpRowsPerWarp + r0 % kCpRowsPerWarp;
      const uint32_t k_row = __shfl_sync(0xffffffffu, rows_t.k, src);
      const uint32_t v_row = __shfl_sync(0xffffffffu, rows_t.v, src);
      cp_async_16(k_dst + i * k_dst_step, k + uint64_t(k_row) * p.cp_k_unit, valid);
      cp_async_16(v_dst + i * v_dst_step, v + uint64_t(v_row) * p.cp_v_unit, valid);
    }
  }
};

}  // namespace flashprefill::cuda::attention
