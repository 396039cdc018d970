// Split combine: O = sum_k e^(lse_k - lse) O_k, lse = ln sum_k e^(lse_k). One warp per
// (token, query head) row; splits that saw no key carry lse_k = -inf and weigh nothing.
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cutlass/numeric_types.h>

#include "cuda/attention/combine.hpp"

namespace flashprefill::cuda::attention {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    combine_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kPerLane = kHeadDim / 32;
  const int64_t heads_q = int64_t(p.heads_kv) * p.group;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.total_q * heads_q) return;
  const int64_t token = row / heads_q, head = row % heads_q;
  const int lane = threadIdx.x % 32;

  float lse_max = -INFINITY;
  for (int k = 0; k < p.num_splits; ++k)
    lse_max = fmaxf(lse_max, p.lse_partial[(k * heads_q + head) * p.total_q + token]);
  float acc[kPerLane] = {};
  float weight_sum = 0.f;
  if (lse_max != -INFINITY) {
    for (int k = 0; k < p.num_splits; ++k) {
      const float weight = expf(p.lse_partial[(k * heads_q + head) * p.total_q + token] - lse_max);
      weight_sum += weight;
      const float* part = p.o_partial + ((k * p.total_q + token) * heads_q + head) * kHeadDim;
      for (int i = 0; i < kPerLane; ++i) acc[i] += weight * part[lane * kPerLane + i];
    }
  }
  const float inv = weight_sum > 0.f ? 1.f / weight_sum : 0.f;
  Element* out = static_cast<Element*>(p.out) + token * p.out_stride_token +
                 head * p.out_stride_head + lane * kPerLane;
  for (int i = 0; i < kPerLane; ++i) out[i] = Element(acc[i] * inv);
  if (p.lse != nullptr && lane == 0)
    p.lse[head * p.total_q + token] = weight_sum > 0.f ? lse_max + logf(weight_sum) : -INFINITY;
}

template <class Element>
void launch_typed(const AttentionParams& p, int head_dim, cudaStream_t stream) {
  const int64_t rows = p.total_q * int64_t(p.heads_kv) * p.group;
  const dim3 grid(unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  if (head_dim == 128)
    combine_kernel<Element, 128><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  else
    combine_kernel<Element, 64><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
}

}  // namespace

void launch_combine(const AttentionParams& p, fp_dtype dtype, int head_dim, cudaStream_t stream) {
  if (dtype == FP_BFLOAT16)
    launch_typed<cutlass::bfloat16_t>(p, head_dim, stream);
  else
    launch_typed<cutlass::half_t>(p, head_dim, stream);
}

}  // namespace flashprefill::cuda::attention
