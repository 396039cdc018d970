// How many ways to split each query tile's KV iterations (Eq. 18). Decided from shapes alone,
// so the workspace size never depends on device data: split only when the query tiles cannot
// fill the GPU (short-query batches, chunked prefill) and every split keeps enough KV tiles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/geometry.hpp"
#include "core/problem.hpp"

namespace flashprefill::cuda::attention {

inline constexpr int64_t kElementBytes = 2;  // bf16 / fp16 operands
inline constexpr int kMaxSplits = 16;
inline constexpr int kMinTilesPerSplit = 8;
inline constexpr int64_t kMaxPartialBytes = int64_t(1) << 30;

inline int32_t choose_splits(const ProblemInfo& info, int num_sms) {
  const fp_problem& p = *info.p;
  const int64_t work_tiles = int64_t(p.num_heads_kv) *
                             ceil_div(int64_t(info.group) * p.total_q, kTileRows);
  if (work_tiles >= 2 * int64_t(num_sms)) return 1;
  const int64_t kv_tiles = ceil_div(p.max_seqlen_k, kKvTile);
  int64_t splits = ceil_div(2 * int64_t(num_sms), std::max<int64_t>(work_tiles, 1));
  splits = std::min<int64_t>(splits, kv_tiles / kMinTilesPerSplit);
  splits = std::min<int64_t>(splits, kMaxSplits);
  const int64_t bytes_per_split =
      p.total_q * p.num_heads_q * (int64_t(p.head_dim) + 1) * int64_t(sizeof(float));
  splits = std::min<int64_t>(splits, kMaxPartialBytes / std::max<int64_t>(bytes_per_split, 1));
  return int32_t(std::max<int64_t>(splits, 1));
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
      std::max<int64_t>(2 * int64_t(p.max_seqlen_k) * p.head_dim * kElementBytes, 1);
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

}  // namespace flashprefill::cuda::attention
