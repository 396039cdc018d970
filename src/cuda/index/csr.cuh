// Stage 1c: the CSR index in one launch. Each CTA owns a contiguous run of segments: it sums the
// tile counts of the segments before its run (so no separate device-wide scan is launched),
// scans its own counts into the offsets `cu`, and expands each segment's block bitmask into
// ascending 64-token tile ids, one warp per segment.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/index/seq_meta.cuh"

namespace flashprefill::cuda::index {

struct CsrParams {
  SeqMeta meta;
  int32_t num_heads_kv = 0, max_blocks = 0, block_size = 128;
  // The segments of the query tiles I in [tile_begin, tile_begin + range_tiles) of every request
  // and KV head, numbered (b Hkv + h) range_tiles + I - tile_begin: num_segments = B Hkv
  // range_tiles (the whole index: tile_begin = 0, range_tiles = max_q_tiles).
  int32_t tile_begin = 0, range_tiles = 0;
  int64_t num_segments = 0;
  int32_t mask_words = 0;
  const uint32_t* mask = nullptr;   // [num_segments, mask_words] from score_select
  const int32_t* counts = nullptr;  // [num_segments] selected tiles per segment
  int32_t* cu = nullptr;            // [num_segments + 1]: cu[0] = 0, cu[s + 1] = cu[s] + counts[s]
  // [idx_capacity]. select_range refuses a capacity below the most tiles the segments can list
  // (the problem's idx_capacity, or a range's entries), so no write is ever dropped; the kernel
  // still never writes past it.
  int32_t* idx = nullptr;
  int64_t idx_capacity = 0;
};

cudaError_t launch_csr(const CsrParams& params, cudaStream_t stream);

}  // namespace flashprefill::cuda::index
