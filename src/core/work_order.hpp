// The order in which the CUDA attention kernel's persistent grid takes its work items
// (docs/ALGORITHM.md, "Work units"), as plain arithmetic shared by the kernel's scheduler and the
// CPU tests. Items are numbered request by request, each request in two phases:
//  - lead: its `lead` heaviest query tiles (the most causal keys: tile ids descending) of every KV
//    head, tile by tile, KV heads and then splits innermost. One wave of the grid starts on the
//    longest items of all heads at once (a forced-dense recent tile can take half a sparse call).
//  - sections: the other tiles, with the KV heads cut into sections of `section` consecutive heads
//    (the last one may be shorter) whose K and V fit in L2 together; inside a section tile by tile
//    from the heaviest down, the section's KV heads and then splits innermost. The SMs working at
//    one time then read the KV of a few heads only, and each KV block fetched from HBM is reused
//    from L2 by the other tiles of its head, dense or sparse.
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

// Query tiles of a request inside the range [tile_begin, tile_begin + range_tiles).
FP_HD int32_t range_request_tiles(int32_t len_q, int32_t group, int32_t max_q_tiles,
                                  int32_t tile_begin, int32_t range_tiles) {
  const int32_t tiles = request_tiles(len_q, group, max_q_tiles) - tile_begin;
  return tiles <= 0 ? 0 : (tiles < range_tiles ? tiles : range_tiles);
}

struct WorkCoord {
  int32_t b = 0, h = 0, tile = 0, split = 0;
};

// The request of query tile `linear` (counted over the batch): the last request whose first tile
// is at or before it (an empty request shares its prefix with its successor and is passed over).
// The search starts at `request`, which must be at or before the answer.
FP_HD int32_t find_request(const int32_t* tile_prefix, int32_t batch, int32_t linear,
                           int32_t request) {
  int32_t lo = request, hi = batch - 1;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (tile_prefix[mid] <= linear) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Item `item` of request b, whose tiles are first .. first + tiles - 1 over the batch
// (tile_prefix[b] and tile_prefix[b + 1] - tile_prefix[b]), to its coordinates.
FP_HD WorkCoord decode_in_request(int32_t b, int32_t first, int32_t tiles, int32_t heads_kv,
                                  int32_t section, int32_t lead, int32_t splits, int32_t item) {
  const int32_t per_tile = heads_kv * splits;
  // Offset inside the request (< tiles * per_tile, so 32-bit like `item`).
  int32_t local = item - first * per_tile;
  const int32_t leading = lead < tiles ? lead : tiles;
  WorkCoord c;
  c.b = b;
  if (local < leading * per_tile) {  // lead phase: every head
    const int32_t rank = local / per_tile, rest = local - rank * per_tile;
    c.tile = tiles - 1 - rank;
    c.h = rest / splits;
    c.split = rest - c.h * splits;
    return c;
  }
  local -= leading * per_tile;
  const int32_t rest_tiles = tiles - leading;
  const int32_t per_section = rest_tiles * section * splits;  // items of a full section
  const int32_t s = local / per_section;
  const int32_t heads_s = heads_kv - s * section < section ? heads_kv - s * section : section;
  const int32_t in_section = local - s * per_section;
  const int32_t per_tile_s = heads_s * splits;
  const int32_t rank = in_section / per_tile_s, rest = in_section - rank * per_tile_s;
  c.tile = rest_tiles - 1 - rank;
  c.h = s * section + rest / splits;
  c.split = rest - (rest / splits) * splits;
  return c;
}

// The request of a caller whose query tiles (`linear`) only grow, with that request's tile range
// kept: a tile inside the range needs no tile_prefix load (the kernel's decoder, scheduler.hpp).
struct RequestCursor {
  int32_t request = 0;
  int32_t first = 0, next = 0;  // tile_prefix[request], tile_prefix[request + 1]

  FP_HD void seek(const int32_t* tile_prefix, int32_t batch, int32_t linear) {
    if (linear < next) return;  // still inside the request (linear >= first: tiles only grow)
    request = find_request(tile_prefix, batch, linear, request);
    first = tile_prefix[request];
    next = tile_prefix[request + 1];
  }
};

// Item `item` (< tile_prefix[batch] * heads_kv * splits) to its coordinates; 1 <= section <=
// heads_kv, lead >= 0. `request` is a request at or before the item's (0 always works); it is
// advanced to the item's request, so a caller whose items only grow searches from where it left
// off.
FP_HD WorkCoord decode_work_item(const int32_t* tile_prefix, int32_t batch, int32_t heads_kv,
                                 int32_t section, int32_t lead, int32_t splits, int32_t item,
                                 int32_t& request) {
  RequestCursor cursor;
  cursor.request = request;  // next = 0: the first seek searches and loads
  cursor.seek(tile_prefix, batch, item / (heads_kv * splits));
  request = cursor.request;
  return decode_in_request(request, cursor.first, cursor.next - cursor.first, heads_kv, section,
                           lead, splits, item);
}

}  // namespace flashprefill
