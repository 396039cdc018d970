// Per-request lengths and KV addressing as the index-stage kernels read them from the device
// metadata of a validated problem (cu_seqlens_q, cu_seqlens_k or seqlens_k, page_table).
#pragma once

#include <cstdint>

#include "core/geometry.hpp"

namespace flashprefill::cuda::index {

struct SeqMeta {
  const int32_t* cu_seqlens_q = nullptr;  // [B + 1]
  const int32_t* cu_seqlens_k = nullptr;  // [B + 1], contiguous KV
  const int32_t* seqlens_k = nullptr;     // [B], paged KV
  const int32_t* page_table = nullptr;    // [B, max_pages_per_seq], paged KV
  int32_t max_pages_per_seq = 0;
  int32_t page_size = 1;
  int32_t group = 1;                      // g = Hq / Hkv
  bool paged = false;

  __device__ __forceinline__ int32_t len_q(int32_t b) const {
    return cu_seqlens_q[b + 1] - cu_seqlens_q[b];
  }
  __device__ __forceinline__ int32_t len_kv(int32_t b) const {
    return paged ? seqlens_k[b] : cu_seqlens_k[b + 1] - cu_seqlens_k[b];
  }
  __device__ __forceinline__ SeqGeometry seq(int32_t b) const {
    return SeqGeometry{len_q(b), len_kv(b), group};
  }
  // Eq. 22 addressing of request b's keys, in elements of a K or V buffer.
  __device__ __forceinline__ KvAddress kv(int32_t b, int64_t stride_page,
                                          int64_t stride_token) const {
    KvAddress a;
    a.paged = paged;
    a.stride_token = stride_token;
    if (paged) {
      a.pages = page_table + int64_t(b) * max_pages_per_seq;
      a.page_size = page_size;
      a.stride_page = stride_page;
    } else {
      a.row0 = cu_seqlens_k[b];
    }
    return a;
  }
};

}  // namespace flashprefill::cuda::index
