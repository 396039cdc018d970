// Stage 1c. The scan is one CTA walking the counts in 4096-entry steps (the segment count is
// small next to the scoring work); the emit pass gives each segment one warp.
#include "cuda/index/csr.cuh"

namespace flashprefill::cuda::index {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kScanPerThread = 4;
constexpr int kEmitWarps = 8;
constexpr uint32_t kFullMask = 0xffffffffu;

__global__ void __launch_bounds__(kScanThreads) scan_kernel(const int32_t* counts, int32_t* cu,
                                                            int64_t n) {
  __shared__ int32_t warp_totals[kScanThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int32_t carry = 0;
  if (tid == 0) cu[0] = 0;
  for (int64_t base = 0; base < n; base += int64_t(kScanThreads) * kScanPerThread) {
    const int64_t first = base + int64_t(tid) * kScanPerThread;
    int32_t v[kScanPerThread];
    int32_t sum = 0;
#pragma unroll
    for (int i = 0; i < kScanPerThread; ++i) {
      v[i] = first + i < n ? counts[first + i] : 0;
      sum += v[i];
    }
    int32_t inclusive = sum;  // warp-inclusive scan of the thread sums
#pragma unroll
    for (int s = 1; s < 32; s *= 2) {
      const int32_t up = __shfl_up_sync(kFullMask, inclusive, s);
      if (lane >= s) inclusive += up;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();  // warp_totals_ready
    if (warp == 0) {
      int32_t t = warp_totals[lane];
#pragma unroll
      for (int s = 1; s < 32; s *= 2) {
        const int32_t up = __shfl_up_sync(kFullMask, t, s);
        if (lane >= s) t += up;
      }
      warp_totals[lane] = t;
    }
    __syncthreads();  // warp_offsets_ready
    int32_t running = carry + (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - sum;
#pragma unroll
    for (int i = 0; i < kScanPerThread; ++i) {
      running += v[i];
      if (first + i < n) cu[first + i + 1] = running;
    }
    carry += warp_totals[kScanThreads / 32 - 1];
    __syncthreads();  // step_done: warp_totals may be rewritten
  }
}

__global__ void __launch_bounds__(kEmitWarps * 32) emit_kernel(const EmitParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t segment = int64_t(blockIdx.x) * kEmitWarps + threadIdx.x / 32;
  if (segment >= p.num_segments || p.counts[segment] == 0) return;
  const int32_t tile = int32_t(segment % p.max_q_tiles);
  const int32_t b = int32_t(segment / p.max_q_tiles / p.num_heads_kv);
  const SeqGeometry seq = p.meta.seq(b);
  const BlockGeometry blocks{p.block_size, seq.len_kv};
  const int32_t candidates = min(blocks.num_candidates(seq.pmax(tile)), p.max_blocks);
  const int32_t causal_tiles = seq.causal_tiles(tile);
  const int32_t tiles_per_block = p.block_size / kKvTile;
  const uint32_t* mask = p.mask + segment * p.mask_words;
  // Every selected block but the last candidate holds tiles_per_block tiles, so a block's
  // first slot is its rank among the selected blocks times tiles_per_block.
  int64_t slot = p.cu[segment];
  for (int32_t word = 0; word * 32 < candidates; ++word) {
    const uint32_t bits = mask[word];
    if (bits >> lane & 1u) {
      const int32_t block = word * 32 + lane;
      const int32_t first = blocks.first_tile(block);
      const int32_t end = min(blocks.end_tile(block), causal_tiles);
      int64_t out = slot + int64_t(__popc(bits & ((1u << lane) - 1u))) * tiles_per_block;
      for (int32_t t = first; t < end && out < p.idx_capacity; ++t, ++out) p.idx[out] = t;
    }
    slot += int64_t(__popc(bits)) * tiles_per_block;
  }
}

}  // namespace

cudaError_t launch_scan(const int32_t* counts, int32_t* cu, int64_t num_segments,
                        cudaStream_t stream) {
  scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, cu, num_segments);
  return cudaGetLastError();
}

cudaError_t launch_emit(const EmitParams& params, cudaStream_t stream) {
  if (params.num_segments == 0) return cudaSuccess;
  const int64_t grid = (params.num_segments + kEmitWarps - 1) / kEmitWarps;
  emit_kernel<<<dim3(unsigned(grid)), kEmitWarps * 32, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::index
