// The CUDA backend as the C ABI sees it. Inputs arrive validated (core/problem.hpp); metadata
// (cu_seqlens, seqlens_k, page_table) is on the device and is read only by kernels. Nothing here
// allocates or synchronizes the host: every call is CUDA-graph capturable.
#pragma once

#include <cstddef>

#include "core/problem.hpp"

namespace flashprefill::cuda {

// True when this build has CUDA and device 0 is sm_90.
bool available();

// Synchronous copy of problem metadata for FP_FLAG_VALIDATE_DEVICE_METADATA (the one place that
// synchronizes the host, and only when the caller asks for it).
fp_status copy_to_host(void* dst, const void* src, size_t bytes, void* stream);

// Workspace sizes in bytes, SIZE_MAX when the size does not fit in 64 bits.
size_t build_index_workspace(const ProblemInfo& info, const fp_select_config& config);
fp_status build_index(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, void* workspace, size_t workspace_bytes);
// Incremental pooling of fp_pool_kv; pooled_keys is a device array or nullptr.
fp_status pool_kv(const ProblemInfo& info, const fp_select_config& config, float* k_mean,
                  float* v_mean, const int32_t* pooled_keys);

// What the attention kernel supports beyond the validated problem (core/problem.cpp calls it for
// every CUDA attention call, before anything runs): strides of multiples of 8 elements, 16-byte
// aligned q, k and v, a paged pool whose rows are numbered in 32 bits, element-pair output
// stores, work items numbered in 32 bits; `means` (null without mean correction): 16-byte
// aligned k_mean and v_mean.
fp_status check_attention_support(const ProblemInfo& info, const fp_output& output,
                                  const fp_index* means);

size_t attention_workspace(const ProblemInfo& info, const fp_select_config& config, bool sparse);
// config.mean_correction selects the correction; index.k_mean / v_mean hold the pooled means.
fp_status sparse_attention(const ProblemInfo& info, const fp_select_config& config,
                           const fp_index& index, const fp_output& output, void* workspace,
                           size_t workspace_bytes);
fp_status dense_attention(const ProblemInfo& info, const fp_output& output, void* workspace,
                          size_t workspace_bytes);

// fp_prefill in query-tile ranges of `range_tiles` tiles (docs/ALGORITHM.md, "Sizes and the
// prefill workspace"): pools into index.k_mean / v_mean, then selects each range into index.cu
// (B Hkv range_tiles + 1 offsets) and index.idx (idx_capacity entries, at least what a range can
// list) and attends it. prefill_workspace is the scratch beside the index.
size_t prefill_workspace(const ProblemInfo& info, const fp_select_config& config,
                         int64_t range_tiles);
fp_status prefill(const ProblemInfo& info, const fp_select_config& config, const fp_index& index,
                  int32_t range_tiles, const fp_output& output, void* workspace,
                  size_t workspace_bytes);

}  // namespace flashprefill::cuda
