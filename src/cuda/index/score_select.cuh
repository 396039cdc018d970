// Stage 1b: fused scoring and selection (Eq. 19-20). For each CSR segment (b, h, I) a CTA makes
// one pass over the pooled keys with tensor-core products, keeps the running tile maximum
// online, and writes the segment's selected blocks as a bitmask plus its selected-tile count.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/fast_divmod.hpp"
#include "core/fp8.hpp"
#include "core/geometry.hpp"
#include "cuda/index/seq_meta.cuh"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::index {

struct ScoreParams {
  SeqMeta meta;
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  // rho(k_mean) [B, Hkv, max_blocks, D] in the scoring operand type (cuda/index/operand.cuh)
  const void* k_rounded = nullptr;
  int32_t batch = 0, num_heads_kv = 0, max_blocks = 0, block_size = 128;
  // The query tiles scored: I in [tile_begin, tile_begin + range_tiles) of every request and KV
  // head (tile_begin = 0 and range_tiles = max_q_tiles for the whole index); segment (b, h, I) is
  // row (b Hkv + h) range_tiles + I - tile_begin of mask and counts.
  int32_t tile_begin = 0, range_tiles = 0;
  // Divisors fixed for the launch: g (packed row -> query, head), block_size (position ->
  // block) and Hkv (unit -> request, head).
  FastDivmod group, block, heads_kv;
  float scale_log2 = 0.f;           // softmax_scale * log2(e)
  // e4m3 q: the descales of q and k on the device; x_rJ takes c_q c_k of its (request, KV head)
  // as the reference does, (scale * (c_q c_k)) * log2(e) in float32. Unread for 16-bit q.
  float scale = 0.f;                // softmax_scale
  Descale q_descale, k_descale;
  float alpha = 0.f;
  SelectRules rules;
  int32_t mask_words = 0;           // 32-bit words of block bits per segment
  uint32_t* mask = nullptr;         // [B Hkv range_tiles, mask_words], bit J of a segment = selected
  int32_t* counts = nullptr;        // [B Hkv range_tiles] selected 64-token tiles, clipped to T_c
};

// Dynamic shared memory of one CTA; launch_score_select refuses more than the device allows.
size_t score_select_smem_bytes(int32_t head_dim, int32_t max_blocks);

// For q of dtype bf16, fp16 or e4m3 (with e4m3 keys) and head_dim 64/128.
cudaError_t launch_score_select(const ScoreParams& params, fp_dtype dtype, int32_t head_dim,
                                cudaStream_t stream);

}  // namespace flashprefill::cuda::index
