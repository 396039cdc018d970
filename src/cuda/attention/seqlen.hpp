// Varlen bookkeeping: a work item's (request, KV head, query tile, split) and the request's
// lengths, read from the device metadata (scheduler.hpp decides which items a CTA runs).
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
};

// Query tile `tile` of request b, KV head h, split `split`: the request's lengths and KV addressing.
__device__ inline WorkTile make_work(const AttentionParams& p, int32_t b, int32_t h, int32_t tile,
                                     int32_t split) {
  WorkTile w;
  w.b = b;
  w.h = h;
  w.tile = tile;
  w.split = split;
  w.q_row0 = p.cu_seqlens_q[b];
  w.seq.group = p.group;
  w.seq.len_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  int64_t row0 = 0;
  if (p.paged) {
    w.seq.len_kv = p.seqlens_k[b];
  } else {
    row0 = p.cu_seqlens_k[b];
    w.seq.len_kv = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  }
  const int32_t* pages = p.paged ? p.page_table + int64_t(b) * p.max_pages_per_seq : nullptr;
  w.k_addr = KvAddress{p.paged, row0, pages, p.page_size, p.k_stride_page, p.k_stride_token};
  w.v_addr = KvAddress{p.paged, row0, pages, p.page_size, p.v_stride_page, p.v_stride_token};
  return w;
}

}  // namespace flashprefill::cuda::attention
