// The scheduler's per-call preparation: one CTA scans the requests' query-tile counts.
#include "core/work_order.hpp"
#include "cuda/attention/schedule_prep.hpp"

namespace flashprefill::cuda::attention {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ int32_t inclusive_warp_scan(int32_t x, int lane) {
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int32_t y = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += y;
  }
  return x;
}

// tile_prefix[b + 1] = sum of request_tiles (core/work_order.hpp) of requests 0 ... b.
__global__ void __launch_bounds__(kThreads) prepare_schedule_kernel(const AttentionParams p) {
  __shared__ int32_t warp_sums[kWarps];
  __shared__ int32_t carry;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    *p.work_counter = 0;
    p.tile_prefix[0] = 0;
    carry = 0;
  }
  __syncthreads();
  for (int32_t base = 0; base < p.batch; base += kThreads) {
    const int32_t b = base + int32_t(threadIdx.x);
    int32_t tiles = 0;
    if (b < p.batch)
      tiles = request_tiles(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.group, p.max_q_tiles);
    const int32_t x = inclusive_warp_scan(tiles, lane);
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) warp_sums[lane] = inclusive_warp_scan(warp_sums[lane], lane);
    __syncthreads();
    const int32_t inclusive = carry + x + (warp > 0 ? warp_sums[warp - 1] : 0);
    if (b < p.batch) p.tile_prefix[b + 1] = inclusive;
    __syncthreads();  // every thread has read carry and warp_sums
    if (threadIdx.x == kThreads - 1) carry = inclusive;
  }
}

}  // namespace

cudaError_t launch_prepare_schedule(AttentionParams& p, void* workspace, cudaStream_t stream) {
  p.work_counter = static_cast<int32_t*>(workspace);
  p.tile_prefix = p.work_counter + 1;
  prepare_schedule_kernel<<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
