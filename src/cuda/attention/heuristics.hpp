// Host decisions of the CUDA attention stage, made from shapes and strides alone. Which paged
// pools TMA reads, and in boxes of how many rows. How many ways to split each query tile's KV
// iterations (Eq. 18), so that the workspace size never depends on device data: split only when
// the query tiles cannot fill the GPU (short-query batches, chunked prefill) and every split
// keeps enough KV tiles. The work order's head sections and lead tiles. The problem's
// fp_attention_tuning overrides the last three (the tuned_* functions at the end).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/geometry.hpp"
#include "core/problem.hpp"

namespace flashprefill::cuda::attention {

// Paged KV by TMA takes boxes of gcd(page_size, 64) rows, each inside one page. A box must hold
// whole 8-row atoms of the 128-byte swizzle to land where the stage layout expects it; boxes of
// 8 rows (32 per tile) ran slower than cp.async (H200, dense 32K: 2.12x contiguous against
// 1.92x), so TMA starts at 16.
inline constexpr int kTmaMinBoxRows = 16;

// Whether a paged K/V pool's pages lie back to back (page stride = page_size token strides, K
// and V), so that the pool is one (D, Hkv, num_pages * page_size) tensor.
inline bool paged_pool_back_to_back(const fp_problem& p) {
  return p.k_stride_page == int64_t(p.page_size) * p.k_stride_token &&
         p.v_stride_page == int64_t(p.page_size) * p.v_stride_token;
}

// Rows per TMA box of a paged K/V pool (p.kv_layout == FP_KV_PAGED, validated): gcd(page_size,
// 64) when the pages lie back to back and that gcd is at least kTmaMinBoxRows; 0 when the pool's
// tiles go through cp.async and the page table (back-to-back pools may still read runs of 128
// keys by TMA: params.hpp tma_runs).
inline int32_t paged_tma_box_rows(const fp_problem& p) {
  const int32_t rows = std::gcd(p.page_size, kKvTile);
  return rows >= kTmaMinBoxRows && paged_pool_back_to_back(p) ? rows : 0;
}

// Entries of the run table (AttentionParams::pair_rows) per request: one per 128 keys.
inline int32_t paged_max_pairs(const fp_problem& p) {
  return p.kv_layout == FP_KV_PAGED
             ? int32_t((int64_t(p.max_seqlen_k) + 2 * kKvTile - 1) / (2 * kKvTile))
             : 0;
}

inline constexpr int64_t kElementBytes = 2;  // bf16 / fp16 operands

// Bytes of one Q/K/V element: 1 for e4m3 operands (the FP8 kernel), else kElementBytes.
inline int64_t operand_bytes(const ProblemInfo& info) { return info.fp8.on ? 1 : kElementBytes; }

// The cp.async paged path numbers a pool's rows in 32 bits: row j of page `page` lies
// unit * (page * page_units + j * token_units) bytes past the head's base, unit being the gcd of
// the page and token strides in bytes (AttentionParams::cp_k_unit). K (v = false) or V.
struct PagedRowUnits {
  int64_t unit, page_units, token_units;
};

inline PagedRowUnits paged_row_units(const fp_problem& p, bool v) {
  const int64_t page = (v ? p.v_stride_page : p.k_stride_page) * kElementBytes;
  const int64_t token = (v ? p.v_stride_token : p.k_stride_token) * kElementBytes;
  const int64_t unit = std::gcd(page, token);
  return {unit, unit > 0 ? page / unit : 0, unit > 0 ? token / unit : 0};
}

// Whether every row of a paged pool (validated strides and sizes) has a number below 2^32, K
// and V; the CUDA attention stage rejects pools that do not (8 TiB per operand for NHD pools
// with token strides of 1024 elements; 64 GiB at the least, a unit being 16 bytes or more).
inline bool paged_rows_fit_32_bits(const fp_problem& p) {
  for (const bool v : {false, true}) {
    const PagedRowUnits u = paged_row_units(p, v);
    if (u.unit <= 0) return false;
    const int64_t last_row =
        (int64_t(p.num_pages) - 1) * u.page_units + (int64_t(p.page_size) - 1) * u.token_units;
    if (last_row > int64_t(UINT32_MAX)) return false;
  }
  return true;
}

inline constexpr int kMaxSplits = FP_MAX_SPLITS;
inline constexpr int kMinTilesPerSplit = 8;
inline constexpr int64_t kMaxPartialBytes = int64_t(1) << 30;
// The split model below: an item's own cost (its first and last stages' unoverlapped work, the
// epilogue, the wait for the next item) in stages, and how much longer than the best modeled
// makespan the fewest splits may be (every split also costs the combine kernel's pass).
inline constexpr int64_t kItemFixedStages = 2;
inline constexpr double kSplitTolerance = 1.03;

// The modeled time of a problem with `work_tiles` query tiles of `stages` two-tile KV stages each,
// split `splits` ways, on `num_sms` CTAs: the items run in waves of num_sms, each item its share
// of the stages plus its own cost.
inline int64_t split_makespan(int64_t work_tiles, int64_t stages, int64_t splits, int num_sms) {
  return ceil_div(work_tiles * splits, std::max<int64_t>(num_sms, 1)) *
         (ceil_div(stages, splits) + kItemFixedStages);
}

// A batch whose query tiles fill the GPU twice over is never split (its causal items differ in
// length, and the heaviest-first dynamic order balances them). Below that, the items of a short
// chunk against a long cached prefix all have about the same length, so they run in waves: the
// fewest splits whose makespan is within kSplitTolerance of the best win, among those the caps
// allow (kMinTilesPerSplit KV tiles of the longest request per split, kMaxSplits, and
// kMaxPartialBytes of float partials). On the H200 this picks the fastest split count of a
// sweep over 1-16 for every chunk shape measured (docs/PERF.md, "Chunked prefill").
inline int32_t choose_splits(const ProblemInfo& info, int num_sms) {
  const fp_problem& p = *info.p;
  const int64_t work_tiles = int64_t(p.num_heads_kv) *
                             ceil_div(int64_t(info.group) * p.total_q, kTileRows);
  if (work_tiles >= 2 * int64_t(num_sms)) return 1;
  const int64_t kv_tiles = ceil_div(p.max_seqlen_k, kKvTile);
  int64_t cap = std::min<int64_t>(kv_tiles / kMinTilesPerSplit, kMaxSplits);
  const int64_t bytes_per_split =
      p.total_q * p.num_heads_q * (int64_t(p.head_dim) + 1) * int64_t(sizeof(float));
  cap = std::min<int64_t>(cap, kMaxPartialBytes / std::max<int64_t>(bytes_per_split, 1));
  cap = std::max<int64_t>(cap, 1);
  const int64_t stages = ceil_div(kv_tiles, 2);
  int64_t best = split_makespan(work_tiles, stages, 1, num_sms);
  for (int64_t s = 2; s <= cap; ++s)
    best = std::min(best, split_makespan(work_tiles, stages, s, num_sms));
  for (int64_t s = 1; s < cap; ++s)
    if (double(split_makespan(work_tiles, stages, s, num_sms)) <= kSplitTolerance * double(best))
      return int32_t(s);
  return int32_t(cap);
}

// KV heads per section of the work order (core/work_order.hpp): as many heads as have their K
// and V, at the longest KV length, fit in kL2Share of the L2 cache together, at least one. The
// SMs then work on the tiles of those heads only, and a KV block is fetched from HBM about once
// however many of its head's query tiles read it (sparse tiles pick scattered blocks, so without
// this their reads mostly miss once all heads are in flight).
inline constexpr double kL2Share = 0.5;

inline int32_t choose_head_section(const ProblemInfo& info, int64_t l2_bytes) {
  const fp_problem& p = *info.p;
  const int64_t head_bytes =
      std::max<int64_t>(2 * int64_t(p.max_seqlen_k) * p.head_dim * operand_bytes(info), 1);
  const int64_t fit = int64_t(double(l2_bytes) * kL2Share) / head_bytes;
  return int32_t(std::clamp<int64_t>(fit, 1, std::max(p.num_heads_kv, 1)));
}

// Tiles per request taken from every KV head before the head sections (core/work_order.hpp): one
// wave of the grid, so that the longest items of all heads (a forced-dense recent tile, the tiles
// with the most causal keys) start at once instead of when their section comes up.
inline int32_t choose_lead_tiles(int32_t ctas, int32_t heads_kv, int32_t splits) {
  const int64_t per_tile = std::max<int64_t>(int64_t(heads_kv) * splits, 1);
  return int32_t(ceil_div(int64_t(std::max(ctas, 1)), per_tile));
}

// The values a call uses: the problem's fp_attention_tuning where a field is set (validated by
// core/problem.cpp: within its range), else the heuristic. The workspace query and the launch
// both call these, so they see the same split count.
inline int32_t tuned_splits(const ProblemInfo& info, int num_sms) {
  const int32_t forced = info.p->tuning.num_splits;
  return forced > 0 ? forced : choose_splits(info, num_sms);
}

inline int32_t tuned_head_section(const ProblemInfo& info, int64_t l2_bytes) {
  const int32_t forced = info.p->tuning.head_section;
  return forced > 0 ? forced : choose_head_section(info, l2_bytes);
}

inline int32_t tuned_lead_tiles(const ProblemInfo& info, int32_t ctas, int32_t splits) {
  const int32_t forced = info.p->tuning.lead_tiles;
  return forced > 0 ? forced : choose_lead_tiles(ctas, info.p->num_heads_kv, splits);
}

}  // namespace flashprefill::cuda::attention
