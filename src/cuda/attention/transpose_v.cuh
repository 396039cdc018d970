// The transpose step of e4m3 attention: FP8 wgmma reads its B operand K-major only, so P V needs
// V^T with the keys contiguous. This kernel writes V [keys, Hkv, D] (contiguous KV, varlen, or a
// paged cache) as Vt [Hkv, D, rows] before the attention kernel runs:
//
//   Vt[h][d][transposed_v_start(cu_k[b], b) + 32 c + s] = V(b, 32 c + fp8_slot_key(s))[h][d]
//
// for request b, 32-key group c and slot s < 32 (fp8.hpp), and 0 where the key is past the
// request. Every request's rows start at a multiple of 64 (a TMA box of the keys-innermost map
// starts at a 64-byte boundary: boxes starting elsewhere are refused as illegal instructions)
// with room for its last tile in full (zeros past its keys), so each tile of Vt is one TMA box
// of the map (rows, D, Hkv) (load_kv.hpp). rows = transposed_v_rows(keys, batch).
//
// A paged cache is gathered as well: request b's keys go to rows cu_k[b] ... of a contiguous K
// [keys, Hkv, D] (row stride Hkv D), cu_k the prefix sums of seqlens_k (paged_cu_k), so that the
// attention kernel reads both operands as it reads contiguous KV.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/geometry.hpp"
#include "cuda/attention/fp8.hpp"

namespace flashprefill::cuda::attention {

// Rows of the transposed V: request b's keys from row transposed_v_start (fp8.hpp), in rows of
// 16-byte multiples (the TMA map's stride).
inline int64_t transposed_v_rows(int64_t total_k, int32_t batch) {
  return (total_k + 2 * int64_t(kKvTile) * batch + 15) / 16 * 16;
}

// Where request b's key j lies in K and V: rows cu_k[b] + j of contiguous KV, or the paged
// cache's page_table[b * max_pages_per_seq + j / page_size], row j % page_size. Paged, k_out
// receives the gathered K.
struct KvSource {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  const int32_t* page_table = nullptr;  // null: contiguous
  int32_t max_pages_per_seq = 0, page_size = 1;
  uint8_t* k_out = nullptr;  // paged: the gathered K [keys, Hkv, D]
};

namespace transpose_detail {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;

// Element offset of request b's key j, head h, in a tensor of these strides.
__device__ __forceinline__ int64_t key_offset(const KvSource& s, int32_t b, int32_t j, int32_t h,
                                              int64_t key0, int64_t stride_page,
                                              int64_t stride_token, int64_t stride_head) {
  if (s.page_table == nullptr) return (key0 + j) * stride_token + h * stride_head;
  const int32_t page = s.page_table[int64_t(b) * s.max_pages_per_seq + j / s.page_size];
  return page * stride_page + (j % s.page_size) * stride_token + h * stride_head;
}

// One CTA per (KV tile t, request b, KV head h): the tile's 64 keys x kD bytes through shared
// memory, out in the slot order of fp8_slot_key (and, paged, the tile's K rows gathered).
template <int kD>
__global__ void __launch_bounds__(kThreads)
    transpose_v_kernel(const KvSource src, const int32_t* cu_k, int32_t heads_kv, uint8_t* vt,
                       int64_t rows) {
  constexpr int kPitch = kD + 4;  // a row's bytes plus a word: distinct keys, distinct banks
  __shared__ alignas(16) uint8_t tile[kKvTile * kPitch];
  const int32_t t = blockIdx.x, b = blockIdx.y, h = blockIdx.z;
  const int64_t key0 = cu_k[b];
  const int32_t len = int32_t(cu_k[b + 1] - key0);
  if (t * kKvTile >= len) return;
  constexpr int kChunks = kKvTile * kD / 16;  // 16-byte chunks of the tile
  for (int i = threadIdx.x; i < kChunks; i += kThreads) {
    const int r = i / (kD / 16), col = (i % (kD / 16)) * 16;
    const int32_t j = t * kKvTile + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (j < len) {
      x = *reinterpret_cast<const uint4*>(
          src.v + key_offset(src, b, j, h, key0, src.v_stride_page, src.v_stride_token,
                             src.v_stride_head) + col);
      if (src.page_table != nullptr)
        *reinterpret_cast<uint4*>(src.k_out + ((key0 + j) * heads_kv + h) * kD + col) =
            *reinterpret_cast<const uint4*>(
                src.k + key_offset(src, b, j, h, key0, src.k_stride_page, src.k_stride_token,
                                   src.k_stride_head) + col);
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(&tile[r * kPitch + col]);
    dst[0] = x.x;
    dst[1] = x.y;
    dst[2] = x.z;
    dst[3] = x.w;
  }
  __syncthreads();
  uint8_t* out = vt + int64_t(h) * kD * rows + transposed_v_start(key0, b) + t * kKvTile;
  for (int i = threadIdx.x; i < kKvTile * kD; i += kThreads) {
    const int d = i / kKvTile, s = i % kKvTile;
    const int key = s / 32 * 32 + fp8_slot_key(s % 32);
    out[int64_t(d) * rows + s] = tile[key * kPitch + d];
  }
}

// cu_k[0] = 0, cu_k[b + 1] = cu_k[b] + min(seqlens_k[b], max_len), each sum capped at `keys`
// (the gathered rows: a request past them keeps only the keys that fit, so nothing is written
// beyond the workspace). One CTA, the requests in rounds of kScanThreads.
__global__ void __launch_bounds__(kScanThreads)
    paged_cu_k_kernel(const int32_t* seqlens_k, int32_t batch, int32_t max_len, int64_t keys,
                      int32_t* cu_k) {
  __shared__ int64_t sums[kScanThreads];
  int64_t carry = 0;
  if (threadIdx.x == 0) cu_k[0] = 0;
  for (int32_t base = 0; base < batch; base += kScanThreads) {
    const int32_t b = base + int32_t(threadIdx.x);
    int64_t x = b < batch ? min(max(seqlens_k[b], 0), max_len) : 0;
    sums[threadIdx.x] = x;
    __syncthreads();
    for (int step = 1; step < kScanThreads; step *= 2) {  // inclusive scan (Hillis-Steele)
      const int64_t add = threadIdx.x >= step ? sums[threadIdx.x - step] : 0;
      __syncthreads();
      sums[threadIdx.x] += add;
      __syncthreads();
    }
    x = carry + sums[threadIdx.x];
    if (b < batch) cu_k[b + 1] = int32_t(min(x, keys));
    carry += sums[kScanThreads - 1];
    __syncthreads();
  }
}

}  // namespace transpose_detail

// V (e4m3 bytes, 16-byte aligned rows) -> Vt on `stream` (paged: and K -> src.k_out); cu_k the
// requests' first rows (paged: paged_cu_k's); max_tiles >= ceil(L_kv(b) / 64) for every request.
template <int kD>
cudaError_t launch_transpose_v(const KvSource& src, const int32_t* cu_k, int32_t batch,
                               int32_t heads_kv, int32_t max_tiles, void* vt, int64_t rows,
                               cudaStream_t stream) {
  const dim3 grid{unsigned(max_tiles), unsigned(batch), unsigned(heads_kv)};
  transpose_detail::transpose_v_kernel<kD><<<grid, transpose_detail::kThreads, 0, stream>>>(
      src, cu_k, heads_kv, static_cast<uint8_t*>(vt), rows);
  return cudaGetLastError();
}

// The first gathered row of every request of a paged cache (and the end of the last), in
// cu_k [batch + 1]: the prefix sums of seqlens_k, each length at most max_len and every sum at
// most `keys`, on `stream`.
inline cudaError_t launch_paged_cu_k(const int32_t* seqlens_k, int32_t batch, int32_t max_len,
                                     int64_t keys, int32_t* cu_k, cudaStream_t stream) {
  transpose_detail::paged_cu_k_kernel<<<1, transpose_detail::kScanThreads, 0, stream>>>(
      seqlens_k, batch, max_len, keys, cu_k);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
