// The persistent grid's tile scheduler. Work items are numbered as core/work_order.hpp says:
// request by request, inside a request from the query tile with the most causal work down to the
// least, KV heads and then splits innermost. Only tiles that exist are numbered (tile_prefix,
// written by prepare_schedule each call), so a varlen batch of unequal lengths claims no empty
// items. A launch may cover a range of query tiles (AttentionParams::tile_begin, range_tiles):
// items then number the range's tiles, decoded relative to tile_begin.
//
// A CTA starts on item blockIdx.x and then claims gridDim.x + atomicAdd(counter, 1) near the end
// of each item, so items are taken in order by whichever SM frees first: the SMs working at one
// time hold a window of consecutive items (one request's K/V heads, good for L2), and the
// lightest tiles of the last request run last. One producer thread decodes each claimed item
// (lengths, CSR segment, split range) into a shared-memory slot of a two-slot ring; every
// thread reads the slot after work_full and arrives on work_empty once it holds its copy.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

#include "core/work_order.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

// A CTA claims its next item when at most this many KV iterations (about half as many stages)
// of its current item are left to fetch: early enough to hide the claim and the decode, late
// enough that a claimed item never waits long behind the current one.
inline constexpr int kClaimAheadIterations = 8;

struct ScheduledWork {
  WorkTile w;
  Traversal trav;
  int32_t valid = 0;  // 0: no items are left, the CTA stops
};

// Claimed items grow monotonically per CTA, so the request search starts at the last request,
// and the last request's tile range is kept: most items need no tile_prefix load (one L2 round
// trip less on the decoder's path). The decoder lives in shared memory (thread 0 only), so its
// state takes no producer register across the stage loop.
struct ItemDecoder {
  RequestCursor cursor;
  int32_t total_items = -1;  // read on first use (written by prepare_schedule)

  __device__ void decode(const AttentionParams& p, int32_t item, ScheduledWork& out) {
    if (total_items < 0) total_items = p.tile_prefix[p.batch] * p.heads_kv * p.num_splits;
    if (item >= total_items) {
      out.valid = 0;
      return;
    }
    cursor.seek(p.tile_prefix, p.batch, item / (p.heads_kv * p.num_splits));
    const WorkCoord c =
        decode_in_request(cursor.request, cursor.first, cursor.next - cursor.first, p.heads_kv,
                          p.head_section, p.lead_tiles, p.num_splits, item);
    // The CSR offsets are loaded before make_work's loads and stores, so they and the lengths
    // are in flight together: one L2 round trip instead of two on the decoder's path.
    int64_t cu_begin = 0, cu_end = 0;
    if (p.sparse) {
      const int64_t s = segment_id(c.b, c.h, c.tile, p.heads_kv, p.range_tiles);
      cu_begin = p.cu[s];
      cu_end = p.cu[s + 1];
    }
    out.w = make_work(p, c.b, c.h, p.tile_begin + c.tile, c.split);
    out.trav = Traversal::make(p, out.w, cu_begin, cu_end);
    out.valid = 1;
  }
};

}  // namespace flashprefill::cuda::attention
