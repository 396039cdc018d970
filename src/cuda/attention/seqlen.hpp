// Varlen bookkeeping: which (request, KV head, query tile, split) a CTA owns and the request's
// lengths, read from the device metadata by every thread of the CTA.
#pragma once

#include <cstdint>

#include "core/geometry.hpp"
#include "cuda/attention/params.hpp"

namespace flashprefill::cuda::attention {

struct WorkTile {
  int32_t b = 0, h = 0, tile = 0, split = 0;
  int64_t q_row0 = 0;  // cu_seqlens_q[b]
  SeqGeometry seq;
  KvAddress k_addr, v_addr;

  __device__ bool empty() const { return tile >= seq.num_q_tiles(); }
};

// Tiles with more causal work come first: tile ids descend across the grid, so the longest
// tiles of every (request, head) start in the first wave.
__device__ inline WorkTile decode_work(const AttentionParams& p, int32_t linear, int32_t split) {
  WorkTile w;
  const int32_t heads = p.batch * p.heads_kv;
  w.tile = p.max_q_tiles - 1 - linear / heads;
  const int32_t bh = linear % heads;
  w.b = bh / p.heads_kv;
  w.h = bh % p.heads_kv;
  w.split = split;
  w.q_row0 = p.cu_seqlens_q[w.b];
  w.seq.group = p.group;
  w.seq.len_q = p.cu_seqlens_q[w.b + 1] - p.cu_seqlens_q[w.b];
  int64_t row0 = 0;
  if (p.paged) {
    w.seq.len_kv = p.seqlens_k[w.b];
  } else {
    row0 = p.cu_seqlens_k[w.b];
    w.seq.len_kv = p.cu_seqlens_k[w.b + 1] - p.cu_seqlens_k[w.b];
  }
  const int32_t* pages = p.paged ? p.page_table + int64_t(w.b) * p.max_pages_per_seq : nullptr;
  w.k_addr = KvAddress{p.paged, row0, pages, p.page_size, p.k_stride_page, p.k_stride_token};
  w.v_addr = KvAddress{p.paged, row0, pages, p.page_size, p.v_stride_page, p.v_stride_token};
  return w;
}

}  // namespace flashprefill::cuda::attention
