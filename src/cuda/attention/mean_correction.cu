// Mean correction's per-call conversion (mean_correction.hpp): the float block means to the
// operand dtype, one 8-element chunk per thread.
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "core/geometry.hpp"
#include "cuda/attention/mean_correction.hpp"

namespace flashprefill::cuda::attention {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;

template <class Element>
__global__ void __launch_bounds__(kThreads)
    lowp_means_kernel(const __grid_constant__ AttentionParams p, int head_dim, Element* k_out,
                      Element* v_out) {
  const int chunks_per_row = head_dim / kChunk;
  const int64_t rows = converted_mean_rows(p.batch, p.heads_kv, p.max_blocks);
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * chunks_per_row) return;
  const int64_t row = i / chunks_per_row;
  const int col = int(i % chunks_per_row) * kChunk;
  const int32_t b = int32_t(row / (int64_t(p.heads_kv) * p.max_blocks));
  const int32_t j = int32_t(row % p.max_blocks);
  const int32_t len_kv =
      p.paged ? p.seqlens_k[b] : p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  const bool pooled = j < BlockGeometry{p.block_size, len_kv}.num_blocks();
  cutlass::NumericArrayConverter<Element, float, kChunk> convert;
  const int64_t offset = row * head_dim + col;
  cutlass::Array<float, kChunk> k, v;
  k.fill(0.f);
  v.fill(0.f);
  if (pooled) {
    const float4* ks = reinterpret_cast<const float4*>(p.k_mean + offset);
    const float4* vs = reinterpret_cast<const float4*>(p.v_mean + offset);
    reinterpret_cast<float4*>(k.data())[0] = ks[0];
    reinterpret_cast<float4*>(k.data())[1] = ks[1];
    reinterpret_cast<float4*>(v.data())[0] = vs[0];
    reinterpret_cast<float4*>(v.data())[1] = vs[1];
  }
  *reinterpret_cast<cutlass::Array<Element, kChunk>*>(k_out + offset) = convert(k);
  *reinterpret_cast<cutlass::Array<Element, kChunk>*>(v_out + offset) = convert(v);
}

}  // namespace

cudaError_t launch_lowp_means(const AttentionParams& p, fp_dtype dtype, int head_dim, void* k_out,
                              void* v_out, cudaStream_t stream) {
  const int64_t chunks = converted_mean_rows(p.batch, p.heads_kv, p.max_blocks) * (head_dim / kChunk);
  if (chunks == 0) return cudaSuccess;
  const unsigned grid = unsigned((chunks + kThreads - 1) / kThreads);
  if (dtype == FP_BFLOAT16)
    lowp_means_kernel<cutlass::bfloat16_t><<<grid, kThreads, 0, stream>>>(
        p, head_dim, static_cast<cutlass::bfloat16_t*>(k_out),
        static_cast<cutlass::bfloat16_t*>(v_out));
  else
    lowp_means_kernel<cutlass::half_t><<<grid, kThreads, 0, stream>>>(
        p, head_dim, static_cast<cutlass::half_t*>(k_out), static_cast<cutlass::half_t*>(v_out));
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
