// The query-tile ranges in which the CUDA fp_prefill builds and consumes its index
// (docs/ALGORITHM.md, "Sizes and the prefill workspace"). A range holds the query tiles
// I in [I0, I0 + w) of every request and KV head; its segments are numbered
// (b Hkv + h) w + I - I0 and list at most T = ceil(max_seqlen_k / 64) tiles each. Everything
// here is host arithmetic on the shapes the host knows (B, Hkv, max_q_tiles, the key bound), so
// the host sizes every range without reading device metadata.
#pragma once

#include <cstdint>

#include "core/checked.hpp"

namespace flashprefill {

// The index entries a range may hold when the size query chooses its width: up to 2^25 (128 MiB
// of int32), or one tile's worth of segments when that is more.
inline constexpr int64_t kRangeEntries = int64_t(1) << 25;
// Offsets into a range's index are int32.
inline constexpr int64_t kRangeEntryLimit = int64_t(1) << 31;

struct QueryRangeShape {
  int64_t batch = 0, heads_kv = 0;
  int64_t max_q_tiles = 0;   // per request and KV head
  int64_t kv_tiles = 0;      // T: tiles a segment may list
  int64_t idx_capacity = 0;  // the whole index's bound (docs/ALGORITHM.md, "Stage 1c")
};

// Segments of a range of w tiles: B Hkv w.
inline Size range_segments(const QueryRangeShape& s, int64_t w) {
  return Size(s.batch) * Size(s.heads_kv) * Size(w);
}

// Entries a range of w tiles may list: min(B Hkv w T, idx_capacity).
inline Size range_entries(const QueryRangeShape& s, int64_t w) {
  const Size bound = range_segments(s, w) * Size(s.kv_tiles);
  return bound.ok() && bound.value() < s.idx_capacity ? bound : Size(s.idx_capacity);
}

// The width the size query asks for: the widest range (at most max_q_tiles) whose entries stay
// within max(kRangeEntries, the entries of a one-tile range); 1 when there are no tiles.
inline int64_t default_range_tiles(const QueryRangeShape& s) {
  if (s.max_q_tiles <= 1) return 1;
  const Size one = range_entries(s, 1);
  const int64_t budget = one.ok() && one.value() > kRangeEntries ? one.value() : kRangeEntries;
  if (range_entries(s, s.max_q_tiles).fits(budget)) return s.max_q_tiles;
  const Size per_tile = range_segments(s, 1) * Size(s.kv_tiles);  // >= 1 here
  if (!per_tile.ok() || per_tile.value() == 0) return 1;
  const int64_t w = budget / per_tile.value();
  return w < 1 ? 1 : (w > s.max_q_tiles ? s.max_q_tiles : w);
}

// Ranges of w tiles that cover max_q_tiles.
inline int64_t range_count(const QueryRangeShape& s, int64_t w) {
  return s.max_q_tiles == 0 ? 0 : (s.max_q_tiles + w - 1) / w;
}

}  // namespace flashprefill
