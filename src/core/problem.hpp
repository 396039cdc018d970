// Validation of the public structs and the derived quantities every backend needs: every check
// of a C ABI call's inputs lives here (the CUDA kernels' own limits through
// cuda::check_attention_support), run before any backend does work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "core/geometry.hpp"
#include "flashprefill/flashprefill.h"

namespace flashprefill {

// The most elements any tensor, index or workspace part may span (2^48): sizes derived from a
// problem stay far from 64-bit overflow after any small factor (bytes, splits, alignment).
inline constexpr int64_t kMaxElements = int64_t(1) << 48;

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

// A copy of the problem with max_seqlen_q lowered to total_q and, when `keys`, max_seqlen_k to
// the most keys a request can hold (total_k, or max_pages_per_seq * page_size): bounds above what
// the call can see only inflate its sizes. max_seqlen_k also sets the k_mean / v_mean layout that
// callers keep across chunked-prefill calls, so it is lowered only where the means are internal.
fp_problem clamp_bounds(const fp_problem& problem, bool keys);

// The C ABI call a problem is validated for (each workspace size query as its call): on CUDA,
// what the library computes of an FP8 problem depends on it.
enum class Entry {
  kIndexSizes,       // fp_index_sizes_query
  kBuildIndex,       // fp_build_index
  kPoolKv,           // fp_pool_kv
  kSparseAttention,  // fp_sparse_attention
  kPrefill,          // fp_prefill
  kDenseAttention,   // fp_dense_attention
  kIndexDensity,     // fp_index_density
};

fp_status validate_problem(const fp_problem* problem, ProblemInfo* info, Entry entry);
fp_status validate_config(const fp_select_config* config, bool need_block_size);

// The index sizes; valid once check_index_sizes returned FP_OK for the same problem and config.
fp_index_sizes index_sizes(const ProblemInfo& info, const fp_select_config& config);
// Every index size (segments, entries, mean elements) fits kMaxElements, computed without wrap.
fp_status check_index_sizes(const ProblemInfo& info, const fp_select_config& config);
// Checks that the index's buffers are present (v_mean only with correction).
fp_status validate_index_buffers(const ProblemInfo& info, const fp_select_config& config,
                                 const fp_index* index, bool for_attention);
fp_status validate_output(const ProblemInfo& info, const fp_output* output);

// `name` is NULL: the error naming it.
fp_status require(const void* ptr, const char* name);

// Copies `count` int32 of the problem's metadata (device memory on CUDA: one host
// synchronization) into `out`.
fp_status host_copy(const fp_problem& p, const int32_t* src, size_t count,
                    std::vector<int32_t>& out);

// An attention call's inputs beyond the problem: the index's buffers (sparse mode: config and
// index given; dense: both null), the output, and on CUDA what the kernel supports of them.
fp_status validate_attention(const ProblemInfo& info, const fp_select_config* config,
                             const fp_index* index, const fp_output* output);

// A caller's index against the CSR rules, cu entirely before any idx entry is read; on CUDA only
// with host metadata (FP_FLAG_VALIDATE_DEVICE_METADATA: both are copied to the host). host_cu,
// when given, receives the host copy of cu of a checked index.
fp_status validate_given_index(const ProblemInfo& info, const fp_index& index,
                               std::vector<int32_t>* host_cu = nullptr);

// fp_pool_kv's pooled_keys (NULL, or [B] with 0 <= pooled_keys[b] <= L_kv(b)), checked when the
// lengths are on the host.
fp_status validate_pooled_keys(const ProblemInfo& info, const int32_t* pooled_keys);

// A workspace of `bytes` at `workspace` for a call that needs `need`: aligned (256 bytes on
// CUDA, 16 on the CPU), large enough, and present when anything is needed.
fp_status validate_workspace(const ProblemInfo& info, size_t need, const void* workspace,
                             size_t bytes);

}  // namespace flashprefill
