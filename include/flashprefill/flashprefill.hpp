// C++ conveniences over the C ABI: exceptions instead of status codes, and builders for the
// common problem layouts. Header-only; everything it calls is declared in flashprefill.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashprefill/flashprefill.h"

namespace flashprefill {

// Thrown for every status other than FP_OK, carrying the library's message.
class Error : public std::runtime_error {
 public:
  Error(fp_status status, const std::string& message)
      : std::runtime_error(std::string(fp_status_string(status)) + ": " + message),
        status_(status) {}
  fp_status status() const { return status_; }

 private:
  fp_status status_;
};

inline void check(fp_status status) {
  if (status != FP_OK) throw Error(status, fp_last_error_message());
}

inline fp_select_config default_config() {
  fp_select_config c;
  fp_select_config_default(&c);
  return c;
}

// Packed varlen q [total_q, Hq, D] against contiguous k, v [total_k, Hkv, D], all row-major.
inline fp_problem contiguous_problem(fp_device device, fp_dtype dtype, int32_t batch,
                                     int32_t heads_q, int32_t heads_kv, int32_t head_dim,
                                     const void* q, int64_t total_q, const int32_t* cu_seqlens_q,
                                     int32_t max_seqlen_q, const void* k, const void* v,
                                     int64_t total_k, const int32_t* cu_seqlens_k,
                                     int32_t max_seqlen_k) {
  fp_problem p{};
  p.device = device;
  p.dtype = dtype;
  p.batch_size = batch;
  p.num_heads_q = heads_q;
  p.num_heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.q = q;
  p.q_stride_token = int64_t(heads_q) * head_dim;
  p.q_stride_head = head_dim;
  p.total_q = total_q;
  p.cu_seqlens_q = cu_seqlens_q;
  p.max_seqlen_q = max_seqlen_q;
  p.kv_layout = FP_KV_CONTIGUOUS;
  p.k = k;
  p.v = v;
  p.k_stride_token = p.v_stride_token = int64_t(heads_kv) * head_dim;
  p.k_stride_head = p.v_stride_head = head_dim;
  p.total_k = total_k;
  p.cu_seqlens_k = cu_seqlens_k;
  p.max_seqlen_k = max_seqlen_k;
  return p;
}

// The same queries against a paged cache [num_pages, page_size, Hkv, D].
inline fp_problem paged_problem(fp_problem contiguous, const void* k_cache, const void* v_cache,
                                int32_t num_pages, int32_t page_size, const int32_t* page_table,
                                int32_t max_pages_per_seq, const int32_t* seqlens_k) {
  fp_problem p = contiguous;
  p.kv_layout = FP_KV_PAGED;
  p.k = k_cache;
  p.v = v_cache;
  p.k_stride_page = p.v_stride_page = int64_t(page_size) * p.k_stride_token;
  p.total_k = 0;
  p.cu_seqlens_k = nullptr;
  p.num_pages = num_pages;
  p.page_size = page_size;
  p.page_table = page_table;
  p.max_pages_per_seq = max_pages_per_seq;
  p.seqlens_k = seqlens_k;
  return p;
}

inline size_t prefill_workspace_size(const fp_problem& p, const fp_select_config& c) {
  size_t bytes = 0;
  check(fp_prefill_workspace_size(&p, &c, &bytes));
  return bytes;
}

inline void prefill(const fp_problem& p, const fp_select_config& c, const fp_output& out,
                    void* workspace, size_t workspace_bytes) {
  check(fp_prefill(&p, &c, &out, workspace, workspace_bytes));
}

inline void dense_attention(const fp_problem& p, const fp_output& out, void* workspace,
                            size_t workspace_bytes) {
  check(fp_dense_attention(&p, &out, workspace, workspace_bytes));
}

}  // namespace flashprefill
