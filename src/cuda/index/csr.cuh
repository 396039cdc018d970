// Stage 1c: the CSR index. A device-wide scan turns per-segment tile counts into the offsets
// `cu`; an emit pass expands each segment's block bitmask into ascending 64-token tile ids.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/index/seq_meta.cuh"

namespace flashprefill::cuda::index {

struct EmitParams {
  SeqMeta meta;
  int32_t num_heads_kv = 0, max_q_tiles = 0, max_blocks = 0, block_size = 128;
  int64_t num_segments = 0;
  int32_t mask_words = 0;
  const uint32_t* mask = nullptr;   // [num_segments, mask_words] from score_select
  const int32_t* counts = nullptr;  // [num_segments]
  const int32_t* cu = nullptr;      // [num_segments + 1] from launch_scan
  int32_t* idx = nullptr;           // [idx_capacity]
  int64_t idx_capacity = 0;
};

// cu[0] = 0, cu[s + 1] = counts[0] + ... + counts[s].
cudaError_t launch_scan(const int32_t* counts, int32_t* cu, int64_t num_segments,
                        cudaStream_t stream);

cudaError_t launch_emit(const EmitParams& params, cudaStream_t stream);

}  // namespace flashprefill::cuda::index
