// The order in which the CUDA attention kernel's persistent grid takes its work items
// (docs/ALGORITHM.md, "Work units"), as plain arithmetic shared by the kernel's scheduler and the
// CPU tests. Items are numbered request by request; inside a request from the query tile with the
// most causal keys down (tile ids descending), KV heads and then splits innermost:
//   item = ((tile_prefix[b] + (tiles_b - 1 - tile)) * heads_kv + h) * splits + split.
// tile_prefix[b] is the number of query tiles of the requests before b (batch + 1 entries), so
// only tiles that exist are numbered.
#pragma once

#include <cstdint>

#include "core/geometry.hpp"

namespace flashprefill {

// Query tiles a request contributes: its PackGQA tiles, at most the max_q_tiles every request
// reserves in the index's segment layout.
FP_HD int32_t request_tiles(int32_t len_q, int32_t group, int32_t max_q_tiles) {
  SeqGeometry seq;
  seq.len_q = len_q;
  seq.group = group;
  const int32_t tiles = seq.num_q_tiles();
  return tiles < max_q_tiles ? tiles : max_q_tiles;
}

struct WorkCoord {
  int32_t b = 0, h = 0, tile = 0, split = 0;
};

// Item `item` (< tile_prefix[batch] * heads_kv * splits) to its coordinates. `request` is a
// request at or before the item's (0 always works); it is advanced to the item's request, so a
// caller whose items only grow searches from where it left off.
FP_HD WorkCoord decode_work_item(const int32_t* tile_prefix, int32_t batch, int32_t heads_kv,
                                 int32_t splits, int32_t item, int32_t& request) {
  const int32_t per_tile = heads_kv * splits;
  const int32_t linear = item / per_tile, rest = item - linear * per_tile;
  // The last request whose first tile is at or before `linear` (an empty request shares its
  // prefix with its successor and is passed over).
  int32_t lo = request, hi = batch - 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (tile_prefix[mid] <= linear) lo = mid;
    else hi = mid - 1;
  }
  request = lo;
  const int32_t first = tile_prefix[lo], tiles = tile_prefix[lo + 1] - first;
  WorkCoord c;
  c.b = lo;
  c.tile = tiles - 1 - (linear - first);
  c.h = rest / splits;
  c.split = rest - c.h * splits;
  return c;
}

}  // namespace flashprefill
