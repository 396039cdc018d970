// The scheduler's per-call preparation: one CTA scans the requests' query-tile counts.
#include "core/paged_runs.hpp"
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

// tile_prefix[b + 1] = sum over requests 0 ... b of their tiles in the launch's range
// (range_request_tiles, core/work_order.hpp).
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
      tiles = range_request_tiles(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.group,
                                  p.max_q_tiles, p.tile_begin, p.range_tiles);
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

constexpr int kPairThreads = 256;

// One CTA per request, one thread per 128 keys at a time: entry 1 + q is the pool row of key
// 128 q when all 128 keys from there are in the request and each lies one row after the one
// before (checked once per page the pair touches), else -1; entry 0 says whether any is not -1.
__global__ void __launch_bounds__(kPairThreads) pair_rows_kernel(const AttentionParams p,
                                                                 int32_t* pair_rows) {
  const int32_t b = int32_t(blockIdx.x);
  int32_t* const row = pair_rows + int64_t(b) * (1 + p.max_pairs);
  const int32_t* const pages = p.page_table + int64_t(b) * p.max_pages_per_seq;
  const int32_t len = p.seqlens_k[b];
  int any = 0;
  for (int32_t q = int32_t(threadIdx.x); q < p.max_pairs; q += kPairThreads) {
    const int32_t run = pair_run_row(pages, p.page_size, q * kPairKeys, len);
    row[1 + q] = run;
    any |= run >= 0;
  }
  any = __syncthreads_or(any);
  if (threadIdx.x == 0) row[0] = any;
}

}  // namespace

cudaError_t launch_pair_rows(const AttentionParams& p, int32_t* pair_rows, cudaStream_t stream) {
  pair_rows_kernel<<<unsigned(p.batch), kPairThreads, 0, stream>>>(p, pair_rows);
  return cudaGetLastError();
}

cudaError_t launch_prepare_schedule(const AttentionParams& p, cudaStream_t stream) {
  prepare_schedule_kernel<<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
