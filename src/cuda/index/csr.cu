// Stage 1c. One launch builds the whole CSR. CTA c owns segments [c * per_cta, (c + 1) * per_cta):
// it reduces the counts of every earlier segment to its first offset (the redundant reads are
// bounded by capping the grid at kMaxCtas, at most num_segments counts per CTA), scans its own
// counts in steps of kThreads into `cu`, and gives each segment of a step one warp to expand the
// bitmask into tile ids.
#include "cuda/index/csr.cuh"

#include <algorithm>

namespace flashprefill::cuda::index {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int64_t kMaxCtas = 512;
constexpr uint32_t kFullMask = 0xffffffffu;

// Inclusive sum scan of one value per thread across the CTA; `total` gets the CTA's sum. The
// caller synchronizes before the next call rewrites warp_totals.
__device__ __forceinline__ int32_t block_inclusive_scan(int32_t v, int32_t* warp_totals,
                                                        int32_t& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t inclusive = v;
#pragma unroll
  for (int s = 1; s < 32; s *= 2) {
    const int32_t up = __shfl_up_sync(kFullMask, inclusive, s);
    if (lane >= s) inclusive += up;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();  // warp_totals_ready
  if (warp == 0) {
    int32_t t = lane < kWarps ? warp_totals[lane] : 0;
#pragma unroll
    for (int s = 1; s < kWarps; s *= 2) {
      const int32_t up = __shfl_up_sync(kFullMask, t, s);
      if (lane >= s) t += up;
    }
    if (lane < kWarps) warp_totals[lane] = t;
  }
  __syncthreads();  // warp_offsets_ready
  total = warp_totals[kWarps - 1];
  return inclusive + (warp > 0 ? warp_totals[warp - 1] : 0);
}

// One warp writes segment `segment`'s tile ids from slot `slot` on.
__device__ __forceinline__ void emit_segment(const CsrParams& p, int64_t segment, int64_t slot) {
  const int lane = threadIdx.x % 32;
  const int32_t tile = p.tile_begin + int32_t(segment % p.range_tiles);
  const int32_t b = int32_t(segment / p.range_tiles / p.num_heads_kv);
  const SeqGeometry seq = p.meta.seq(b);
  const BlockGeometry blocks{p.block_size, seq.len_kv};
  const int32_t candidates = min(blocks.num_candidates(seq.pmax(tile)), p.max_blocks);
  const int32_t causal_tiles = seq.causal_tiles(tile);
  const int32_t tiles_per_block = p.block_size / kKvTile;
  const uint32_t* mask = p.mask + segment * p.mask_words;
  // Every selected block but the last candidate holds tiles_per_block tiles, so a block's
  // first slot is its rank among the selected blocks times tiles_per_block.
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

__global__ void __launch_bounds__(kThreads) csr_kernel(const CsrParams p, int64_t per_cta) {
  __shared__ int32_t warp_totals[kWarps];
  __shared__ int32_t step_offsets[kThreads], step_counts[kThreads];
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t first = int64_t(blockIdx.x) * per_cta;
  const int64_t last = std::min(first + per_cta, p.num_segments);

  // The first step's counts load together with the prefix.
  int32_t count = first + tid < last ? p.counts[first + tid] : 0;
  int32_t before = 0;
#pragma unroll 4
  for (int64_t s = tid; s < first; s += kThreads) before += p.counts[s];
  int32_t base;
  block_inclusive_scan(before, warp_totals, base);
  if (blockIdx.x == 0 && tid == 0) p.cu[0] = 0;

  for (int64_t step = first; step < last; step += kThreads) {
    const int64_t segment = step + tid;
    if (step != first) count = segment < last ? p.counts[segment] : 0;
    __syncthreads();  // step_consumed: warp_totals and the step arrays may be rewritten
    int32_t total;
    const int32_t inclusive = block_inclusive_scan(count, warp_totals, total);
    if (segment < last) p.cu[segment + 1] = base + inclusive;
    step_offsets[tid] = base + inclusive - count;
    step_counts[tid] = count;
    base += total;
    __syncthreads();  // step_offsets_ready
    const int n = int(std::min<int64_t>(kThreads, last - step));
    for (int i = warp; i < n; i += kWarps)
      if (step_counts[i] != 0) emit_segment(p, step + i, step_offsets[i]);
  }
}

}  // namespace

cudaError_t launch_csr(const CsrParams& params, cudaStream_t stream) {
  const int64_t per_cta =
      std::max<int64_t>(kWarps, (params.num_segments + kMaxCtas - 1) / kMaxCtas);
  // One CTA even without segments: it writes cu[0].
  const int64_t grid = std::max<int64_t>(1, (params.num_segments + per_cta - 1) / per_cta);
  csr_kernel<<<dim3(unsigned(grid)), kThreads, 0, stream>>>(params, per_cta);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::index
