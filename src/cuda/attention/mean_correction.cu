// Mean correction's per-call conversion (mean_correction.hpp): the float block means to the
// operand dtype, one 8-element chunk per thread; e4m3 with the descales, the v means transposed.
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include "core/geometry.hpp"
#include "cuda/attention/fp8.hpp"
#include "cuda/attention/mean_correction.hpp"

namespace flashprefill::cuda::attention {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;

// Thread i's 8-element chunk of the means [batch * Hkv * max_blocks, D]: its row (request b, KV
// head h, block j), its first column and element offset, and whether the block holds keys (a
// block past the request's last is zeros). False for threads past the last chunk.
struct MeanChunk {
  int64_t row = 0, offset = 0;
  int col = 0;
  int32_t b = 0, h = 0, j = 0;
  bool pooled = false;
};

__device__ __forceinline__ bool mean_chunk(const AttentionParams& p, int head_dim, MeanChunk& c) {
  const int chunks_per_row = head_dim / kChunk;
  const int64_t rows = converted_mean_rows(p.batch, p.heads_kv, p.max_blocks);
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * chunks_per_row) return false;
  c.row = i / chunks_per_row;
  c.col = int(i % chunks_per_row) * kChunk;
  const int64_t head = c.row / p.max_blocks;
  c.b = int32_t(head / p.heads_kv);
  c.h = int32_t(head % p.heads_kv);
  c.j = int32_t(c.row % p.max_blocks);
  const int32_t len_kv =
      p.paged ? p.seqlens_k[c.b] : p.cu_seqlens_k[c.b + 1] - p.cu_seqlens_k[c.b];
  c.pooled = c.j < BlockGeometry{p.block_size, len_kv}.num_blocks();
  c.offset = c.row * head_dim + c.col;
  return true;
}

template <class Element>
__global__ void __launch_bounds__(kThreads)
    lowp_means_kernel(const __grid_constant__ AttentionParams p, int head_dim, Element* k_out,
                      Element* v_out) {
  MeanChunk c;
  if (!mean_chunk(p, head_dim, c)) return;
  const int64_t offset = c.offset;
  cutlass::NumericArrayConverter<Element, float, kChunk> convert;
  cutlass::Array<float, kChunk> k, v;
  k.fill(0.f);
  v.fill(0.f);
  if (c.pooled) {
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

// The key slot that holds key k (0 <= k < 32) of a 32-key group: the inverse of fp8_slot_key.
__device__ __forceinline__ int32_t fp8_key_slot(int32_t k) {
  const int32_t h = k / 16, a = (k % 16) / 8, t = (k % 8) / 2, c = k % 2;
  return 16 * h + 4 * t + 2 * a + c;
}

// One thread per (request, KV head, block, 8-element chunk): the k chunk as a row of k_out, the
// v chunk into 8 rows of its head's transposed v_out, at the block's slot column.
__global__ void __launch_bounds__(kThreads)
    e4m3_means_kernel(const __grid_constant__ AttentionParams p, int head_dim, uint8_t* k_out,
                      uint8_t* v_out) {
  MeanChunk c;
  if (!mean_chunk(p, head_dim, c)) return;
  const bool pooled = c.pooled;
  const int col = c.col;
  const int32_t j = c.j;
  const int64_t head = c.row / p.max_blocks;
  const float inv_k = 1.f / descale_at(p.k_descale, c.b, c.h);
  const float inv_v = 1.f / descale_at(p.v_descale, c.b, c.h);
  const int64_t offset = c.offset;
  uint32_t k_words[2];
  uint8_t v_bytes[kChunk];
  for (int e = 0; e < kChunk; e += 2) {
    float k0 = 0.f, k1 = 0.f, v0 = 0.f, v1 = 0.f;
    if (pooled) {
      k0 = p.k_mean[offset + e] * inv_k;
      k1 = p.k_mean[offset + e + 1] * inv_k;
      v0 = p.v_mean[offset + e] * inv_v;
      v1 = p.v_mean[offset + e + 1] * inv_v;
    }
    const uint32_t kk = e4m3x2_from_floats(k0, k1), vv = e4m3x2_from_floats(v0, v1);
    if (e % 4 == 0) k_words[e / 4] = kk;
    else k_words[e / 4] |= kk << 16;
    v_bytes[e] = uint8_t(vv);
    v_bytes[e + 1] = uint8_t(vv >> 8);
  }
  *reinterpret_cast<uint2*>(k_out + offset) = make_uint2(k_words[0], k_words[1]);
  const int64_t columns = e4m3_mean_vt_blocks(p.max_blocks);
  uint8_t* vt = v_out + head * head_dim * columns + j / 32 * 32 + fp8_key_slot(j % 32);
  for (int e = 0; e < kChunk; ++e) vt[int64_t(col + e) * columns] = v_bytes[e];
}

}  // namespace

cudaError_t launch_e4m3_means(const AttentionParams& p, int head_dim, void* k_out, void* v_out,
                              cudaStream_t stream) {
  const int64_t chunks = converted_mean_rows(p.batch, p.heads_kv, p.max_blocks) * (head_dim / kChunk);
  if (chunks == 0) return cudaSuccess;
  // Slot columns past max_blocks (to the group's end) are read by the windows: zeros.
  const int64_t vt_bytes = int64_t(p.batch) * p.heads_kv * head_dim * e4m3_mean_vt_blocks(p.max_blocks);
  if (cudaError_t e = cudaMemsetAsync(v_out, 0, size_t(vt_bytes), stream); e != cudaSuccess) return e;
  const unsigned grid = unsigned((chunks + kThreads - 1) / kThreads);
  e4m3_means_kernel<<<grid, kThreads, 0, stream>>>(p, head_dim, static_cast<uint8_t*>(k_out),
                                                   static_cast<uint8_t*>(v_out));
  return cudaGetLastError();
}

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
