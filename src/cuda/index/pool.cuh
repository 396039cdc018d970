// Stage 1a: block means of K and V (Eq. 5), read straight from contiguous or paged KV.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/fp8.hpp"
#include "cuda/index/seq_meta.cuh"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::index {

struct PoolParams {
  SeqMeta meta;
  int32_t batch = 0, num_heads_kv = 0, max_blocks = 0, block_size = 128;
  // [0] = K, [1] = V: the buffer, its strides in elements, and its float32 means
  // [B, Hkv, max_blocks, D]; mean[1] == nullptr leaves V alone.
  const void* kv[2] = {nullptr, nullptr};
  int64_t stride_page[2] = {0, 0}, stride_token[2] = {0, 0}, stride_head[2] = {0, 0};
  float* mean[2] = {nullptr, nullptr};
  // e4m3 K/V: the descales c_k ([0]) and c_v ([1]) on the device; the means are those of the
  // dequantized keys and values, c * e4m3 value (Eq. 5). Unread for 16-bit K/V.
  Descale descale[2];
  // rho(k_mean), the operand of the scoring products (cuda/index/operand.cuh: in the 16-bit
  // dtype, or round_e4m3(k_mean * (1 / c_k)) in bfloat16 for e4m3 keys); may be nullptr.
  void* k_rounded = nullptr;
  // Incremental pooling: optional [B] device array, keys of request b already pooled. Blocks
  // J < pooled_keys[b] / block_size keep their means (only k_rounded is refreshed from them);
  // the rest, the partial block holding the boundary included, are pooled from K and V.
  const int32_t* pooled_keys = nullptr;
  // FP_FLAG_MEANS_POOLED: every block is already pooled; only k_rounded is refreshed.
  bool all_pooled = false;
};

// Launches the pooling kernel for K/V of kv_dtype bf16, fp16 or e4m3 and head_dim 64/128.
cudaError_t launch_pool(const PoolParams& params, fp_dtype kv_dtype, int32_t head_dim,
                        cudaStream_t stream);

}  // namespace flashprefill::cuda::index
