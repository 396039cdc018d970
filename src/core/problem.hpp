// Validation of the public structs and the derived quantities every backend needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "core/geometry.hpp"
#include "flashprefill/flashprefill.h"

namespace flashprefill {

// Records `message` as this thread's last error and returns `status`.
fp_status fail(fp_status status, std::string message);
void clear_error();
const char* last_error();

size_t dtype_size(fp_dtype dtype);
const char* dtype_name(fp_dtype dtype);

// A validated problem. Host copies of the length metadata are present when the problem is on
// the CPU or when FP_FLAG_VALIDATE_DEVICE_METADATA asked for them on CUDA.
struct ProblemInfo {
  const fp_problem* p = nullptr;
  int32_t group = 1;
  float scale = 1.f;
  int32_t max_q_tiles = 0;
  bool has_host_metadata = false;
  std::vector<int32_t> cu_q;        // [B + 1]
  std::vector<int32_t> len_kv;      // [B]
  std::vector<int64_t> kv_row0;     // contiguous: cu_seqlens_k[b]
  std::vector<int32_t> page_table;  // paged: [B * max_pages_per_seq]
  Fp8Info fp8;                      // dtypes of q, k/v and out; FP8 descale factors

  int32_t len_q(int32_t b) const { return cu_q[b + 1] - cu_q[b]; }
  SeqGeometry seq(int32_t b) const { return SeqGeometry{len_q(b), len_kv[b], group}; }
  KvAddress kv_address(int32_t b, bool value) const;
};

fp_status validate_problem(const fp_problem* problem, ProblemInfo* info);
fp_status validate_config(const fp_select_config* config, bool need_block_size);

fp_index_sizes index_sizes(const ProblemInfo& info, const fp_select_config& config);
// Checks that the index's buffers are present (v_mean only with correction).
fp_status validate_index_buffers(const ProblemInfo& info, const fp_select_config& config,
                                 const fp_index* index, bool for_attention);
fp_status validate_output(const ProblemInfo& info, const fp_output* output);

}  // namespace flashprefill
