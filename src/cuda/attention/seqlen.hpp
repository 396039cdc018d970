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

// Requests one after another, and inside a request the tiles with more causal work first (tile
// ids descend, KV heads innermost): the CTAs resident at a time then belong to one request and
// walk the same KV heads together, so its K/V stay in L2 across them.
__device__ inline WorkTile decode_work(const AttentionParams& p, int32_t linear, int32_t split) {
  WorkTile w;
  const int32_t per_request = p.max_q_tiles * p.heads_kv;
  w.b = linear / per_request;
  const int32_t rest = linear % per_request;
  w.tile = p.max_q_tiles - 1 - rest / p.heads_kv;
  w.h = rest % p.heads_kv;
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
