// How many ways to split each query tile's KV iterations (Eq. 18). Decided from shapes alone,
// so the workspace size never depends on device data: split only when the query tiles cannot
// fill the GPU (short-query batches, chunked prefill) and every split keeps enough KV tiles.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/geometry.hpp"
#include "core/problem.hpp"

namespace flashprefill::cuda::attention {

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

}  // namespace flashprefill::cuda::attention
