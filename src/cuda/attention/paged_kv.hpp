// Producer-side copies into the shared-memory stages: TMA boxes for full KV tiles of contiguous KV
// and of paged KV whose pages hold a multiple of 16 keys, and for mean windows (the converted means
// of means.hpp); cp.async for the Q tile, for other paged KV (Eq. 22) and for a request's partial
// last tile, whose rows past the sequence are zero-filled so that no stale value can reach the
// tensor cores.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"
#include "core/paged_runs.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"

namespace flashprefill::cuda::attention {

// 16-byte global -> shared copy; copies zeros when !valid (src-size 0).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = cute::cast_smem_ptr_to_uint(smem);
  const int32_t src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

// One TMA box (64 x 1 x 64 of the (D, Hkv, total_k) tensor map) into shared memory; its bytes
// complete on `bar`.
__device__ __forceinline__ void tma_load_box(void* smem, const CUtensorMap* map, uint64_t* bar,
                                             int32_t col, int32_t head, int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(cute::cast_smem_ptr_to_uint(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(col),
      "r"(head), "r"(row)
      : "memory");
}

// One box of a 4-D tensor map at coordinates (c0, c1, c2, c3) into shared memory; its bytes
// complete on `bar`. The KV pair maps (64, total_k, D / 64, Hkv) take 64 x 128 x D/64 x 1 boxes:
// a whole stage operand.
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(cute::cast_smem_ptr_to_uint(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(c0),
      "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// One box of the 5-D Q map (64, g, Hkv, total_q, D / 64) at (0, 0, head, token, 0): a whole
// query tile, into shared memory (its bytes complete on `bar`) or into L2 only.
__device__ __forceinline__ void tma_load_q_tile(void* smem, const CUtensorMap* map, uint64_t* bar,
                                                int32_t head, int32_t token) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %3, %4, %5, %3}], [%2];\n" ::"r"(cute::cast_smem_ptr_to_uint(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(0),
      "r"(head), "r"(token)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_q_tile(const CUtensorMap* map, int32_t head,
                                                    int32_t token) {
  asm volatile(
      "cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %1, %2, %3, %1}];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(0), "r"(head), "r"(token)
      : "memory");
}

// First token of item w's query tile in the Q tensor map (g divides the 128 rows).
__device__ __forceinline__ int32_t q_tile_token(const AttentionParams& p, const WorkTile& w) {
  return int32_t(w.q_row0) + w.tile * (kTileRows / p.group);
}

// One 64 x 128 x D/64 box of a converted-means tensor map (64, rows, D / 64) into shared memory;
// its bytes complete on `bar`.
__device__ __forceinline__ void tma_load_mean_box(void* smem, const CUtensorMap* map,
                                                  uint64_t* bar, int32_t row) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %3}], [%2];\n" ::"r"(cute::cast_smem_ptr_to_uint(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(cute::cast_smem_ptr_to_uint(bar)), "r"(0),
      "r"(row)
      : "memory");
}

// Whether KV tile t is fetched by TMA: KV that the TMA maps cover (contiguous, or paged with
// pages of a multiple of 16 keys back to back) and every row of the tile inside the request (a
// partial last tile goes through cp.async, whose zero-fill keeps rows past the request, which may
// be another request's or unwritten memory, away from the tensor cores).
__device__ __forceinline__ bool tile_by_tma(const AttentionParams& p, int32_t len_kv, int32_t t) {
  return p.tma && t >= 0 && (t + 1) * kKvTile <= len_kv;
}

template <class Traits>
struct TileLoader {
  using Element = typename Traits::Element;
  static constexpr int kD = Traits::kHeadDim;
  static constexpr int kChunk = Traits::kChunk;
  static constexpr int kChunksPerRow = kD / kChunk;
  static constexpr int kThreads = Traits::kProducerThreads;

  const AttentionParams& p;
  const WorkTile& w;
  int32_t thread;  // 0 .. kProducerThreads - 1

  // Q tile: packed row r -> query r / g of head h g + r % g (Eq. 12-13). A thread copies one
  // 16-byte column chunk of every kRowStep-th row; (query, head in group) advance by constant
  // steps, so the tile costs one division per thread.
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

  // Q tile by TMA, issued by one thread; rows past the request read the next request's queries
  // or zeros, finite either way, and their outputs are never stored.
  template <class SmemQ>
  __device__ void tma_q(SmemQ& sQ, uint64_t* bar) const {
    tma_load_q_tile(&sQ(0, 0), &p.tma_q, bar, w.h, q_tile_token(p, w));
  }

  // The same box into L2 only, issued by one thread when the item is decoded: its Q load, which
  // waits for the previous item's last S = Q K^T, then reads L2.
  __device__ void prefetch_q() const {
    if (p.q_tma) tma_prefetch_q_tile(&p.tma_q, w.h, q_tile_token(p, w));
  }

  // Paged KV by cp.async: the K and V rows of one row of tile t per lane, as 32-bit row numbers
  // (page * cp_k_page_units + offset * cp_k_token_units; the row starts that many cp_k_unit
  // bytes past the head's K base, and V alike). A warp copies 16 rows of a tile
  // (kCpRowsPerWarp rows per iteration); lane l (mod 16) holds its l-th row's, looked up once
  // for the tile, and each iteration takes its row's by shuffle. Rows past the request hold 0
  // (harmless: their copies zero-fill).
  struct KvRows {
    uint32_t k;
    uint32_t v;
  };
  static constexpr int kCpRowStep = kThreads / kChunksPerRow;
  static constexpr int kCpRowsPerWarp = 32 / kChunksPerRow;
  static_assert(kCpRowsPerWarp * (kKvTile / kCpRowStep) == 16, "a warp copies 16 rows of a tile");
  __device__ KvRows paged_rows(int32_t t) const {
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

  // KV tile t: keys [64 t, 64 t + 64) of the request into rows [64 half, 64 half + 64) of stage
  // `stage`; t < 0 zero-fills them. A thread copies one 16-byte column chunk of every
  // kRowStep-th row, so its addresses advance by constant strides. Paged KV takes the lanes' row
  // numbers from paged_rows(t) (Eq. 22), looked up just before the tile's copies (both
  // tiles' lookups first, so that their latencies overlap, ran 0-3 % slower: H200, pages of 1,
  // 8, 100 keys).
  template <class SmemK, class SmemVt>
  __device__ void load_kv_tile(SmemK& sK, SmemVt& sVt, int32_t t, int half, int stage) const {
    static_assert(kThreads % kChunksPerRow == 0);
    constexpr int kRowStep = kCpRowStep;
    constexpr int kIters = kKvTile / kRowStep;
    const int r0 = thread / kChunksPerRow, col = (thread % kChunksPerRow) * kChunk;
    const int row0 = half * kKvTile + r0;
    Element* k_dst = &sK(row0, col, stage);
    Element* v_dst = &sVt(col, row0, stage);
    const int64_t k_dst_step = &sK(row0 + kRowStep, col, stage) - k_dst;
    const int64_t v_dst_step = &sVt(col, row0 + kRowStep, stage) - v_dst;
    if constexpr (Traits::kPaged) {
      // An iteration's chain is shuffle, multiply-add, copy: one 32-bit shuffle per operand and
      // one wide multiply-add of the row number by the byte unit (a kernel parameter) onto the
      // thread's column (H200, pages of 1, 8, 100 keys shuffled: 0.955-0.967x the time of
      // shuffling 64-bit addresses at D = 128, 0.92x at D = 64). Unrolled by four at D = 128
      // (by eight: slower, and the TMA paths' code spilled) and by two at D = 64 (0.97x one's).
      const KvRows rows = paged_rows(t);
      const int32_t rows_left = t >= 0 ? w.seq.len_kv - t * kKvTile : 0;
      const char* k = reinterpret_cast<const char*>(static_cast<const Element*>(p.k) +
                                                    int64_t(w.h) * p.k_stride_head + col);
      const char* v = reinterpret_cast<const char*>(static_cast<const Element*>(p.v) +
                                                    int64_t(w.h) * p.v_stride_head + col);
      constexpr int kUnroll = kD == 64 ? 2 : 4;
#pragma unroll kUnroll
      for (int i = 0; i < kIters; ++i) {
        const bool valid = r0 + i * kRowStep < rows_left;
        const int src = i * kCpRowsPerWarp + r0 % kCpRowsPerWarp;
        const uint32_t k_row = __shfl_sync(0xffffffffu, rows.k, src);
        const uint32_t v_row = __shfl_sync(0xffffffffu, rows.v, src);
        cp_async_16(k_dst + i * k_dst_step, k + uint64_t(k_row) * p.cp_k_unit, valid);
        cp_async_16(v_dst + i * v_dst_step, v + uint64_t(v_row) * p.cp_v_unit, valid);
      }
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

  __device__ bool tma_tile(int32_t t) const { return tile_by_tma(p, w.seq.len_kv, t); }

  // Row of the TMA maps where full KV tile t starts: the request's first row plus 64 t, or,
  // paged (whole-tile boxes: pages of a multiple of 64 keys), its page's first row plus its
  // offset in the page.
  __device__ int32_t tma_row(int32_t t) const {
    const int32_t key = t * kKvTile;
    if constexpr (Traits::kPaged) {
      return pool_row(w.k_addr.pages, p.page_div, key);
    } else {
      return int32_t(w.k_addr.row0) + key;
    }
  }

  // Paged KV by TMA in boxes smaller than a tile: a stage's full tiles come in boxes of
  // p.tma_box_rows rows, nb = 64 / tma_box_rows per tile. Box j < 2 nb (box j % nb of tile
  // j < nb ? tile0 : tile1) belongs to lane j / 4 of producer warp j % 4, so that the four
  // producer warps (one per SM sub-partition) issue a stage's boxes side by side.
  __device__ int box_of_thread() const {
    static_assert(kThreads == 128, "four producer warps");
    return (thread % 32) * 4 + thread / 32;
  }

  // This thread's box row in the TMA maps (0 when it has no box): the box's page, from the page
  // table, plus the box's offset in the page. Every box's page is looked up at once, before the
  // stage's buffer frees.
  __device__ int32_t paged_box_row(int32_t tile0, int32_t tile1) const {
    const int nb = kKvTile / p.tma_box_rows;
    const int lane = box_of_thread();
    const int32_t t = lane < nb ? tile0 : lane < 2 * nb ? tile1 : -1;
    if (!tma_tile(t)) return 0;
    return pool_row(w.k_addr.pages, p.page_div, t * kKvTile + (lane % nb) * p.tma_box_rows);
  }

  // This thread's box (paged_box_row) of the stage's full tiles, for tiles fetched by TMA
  // (tile_by_tma). Its bytes may land before thread 0 has expected them: the barrier's tx-count
  // may go below zero, and the stage cannot complete before thread 0's arrival.
  template <class SmemK, class SmemVt>
  __device__ void tma_kv_boxes(SmemK& sK, SmemVt& sVt, int32_t tile0, int32_t tile1, int32_t row,
                               int stage, uint64_t* bar) const {
    const int nb = kKvTile / p.tma_box_rows;
    const int lane = box_of_thread();
    const int half = lane < nb ? 0 : 1;
    if (lane >= 2 * nb || !tma_tile(half == 0 ? tile0 : tile1)) return;
    const int r = half * kKvTile + (lane % nb) * p.tma_box_rows;
    CUTE_UNROLL
    for (int c = 0; c < kD; c += Traits::kBoxCols) {
      tma_load_box(&sK(r, c, stage), &p.tma_k, bar, c, w.h, row);
      tma_load_box(&sVt(c, r, stage), &p.tma_v, bar, c, w.h, row);
    }
  }

  // KV tile t (from map row `row`, tma_row) by TMA into rows [64 half, 64 half + 64) of stage
  // `stage`; issued by one thread.
  template <class SmemK, class SmemVt>
  __device__ void tma_kv_tile(SmemK& sK, SmemVt& sVt, int32_t row, int half, int stage,
                              uint64_t* bar) const {
    CUTE_UNROLL
    for (int c = 0; c < kD; c += Traits::kBoxCols) {
      tma_load_box(&sK(half * kKvTile, c, stage), &p.tma_k, bar, c, w.h, row);
      tma_load_box(&sVt(c, half * kKvTile, stage), &p.tma_v, bar, c, w.h, row);
    }
  }

  // KV tiles t and t + 1 (from map row `row` of tile t; paged, rows back to back) by TMA into
  // stage `stage`, one box per operand; issued by one thread.
  template <class SmemK, class SmemVt>
  __device__ void tma_kv_pair(SmemK& sK, SmemVt& sVt, int32_t row, int stage, uint64_t* bar) const {
    tma_load_4d(&sK(0, 0, stage), &p.tma_k_pair, bar, 0, row, 0, w.h);
    tma_load_4d(&sVt(0, 0, stage), &p.tma_v_pair, bar, 0, row, 0, w.h);
  }

  // Mean window: rows [0, 128) of stage `stage` get the converted means of blocks first_block
  // ... first_block + 127 of this (request, KV head), one TMA box per operand; issued by one
  // thread. Rows past the head's blocks read the next head's means or zeros (finite either way;
  // their columns are masked by the bias).
  template <class SmemK, class SmemVt>
  __device__ void tma_mean_window(SmemK& sK, SmemVt& sVt, int32_t first_block, int stage,
                                  uint64_t* bar) const {
    const int32_t row = (w.b * p.heads_kv + w.h) * p.max_blocks + first_block;
    tma_load_mean_box(&sK(0, 0, stage), &p.tma_k_mean, bar, row);
    tma_load_mean_box(&sVt(0, 0, stage), &p.tma_v_mean, bar, row);
  }
};

}  // namespace flashprefill::cuda::attention
