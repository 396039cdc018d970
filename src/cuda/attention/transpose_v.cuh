// The transpose step of e4m3 attention: FP8 wgmma reads its B operand K-major only, so P V needs
// V^T with the keys contiguous. This kernel writes V [total_k, Hkv, D] (contiguous KV, varlen)
// as Vt [Hkv, D, rows] before the attention kernel runs:
//
//   Vt[h][d][transposed_v_start(cu_k[b], b) + 32 c + s] = V[cu_k[b] + 32 c + fp8_slot_key(s)][h][d]
//
// for request b, 32-key group c and slot s < 32 (fp8.hpp), and 0 where the key is past the
// request. Every request's rows start at a multiple of 64 (a TMA box of the keys-innermost map
// starts at a 64-byte boundary: boxes starting elsewhere are refused as illegal instructions)
// with room for its last tile in full (zeros past its keys), so each tile of Vt is one TMA box
// of the map (rows, D, Hkv) (load_kv.hpp). rows = transposed_v_rows(total_k, batch).
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

namespace transpose_detail {

constexpr int kThreads = 256;

// One CTA per (KV tile t, request b, KV head h): the tile's 64 keys x kD bytes through shared
// memory, out in the slot order of fp8_slot_key.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    transpose_v_kernel(const uint8_t* v, int64_t stride_token, int64_t stride_head,
                       const int32_t* cu_k, uint8_t* vt, int64_t rows) {
  constexpr int kPitch = kD + 4;  // a row's bytes plus a word: distinct keys, distinct banks
  __shared__ alignas(16) uint8_t tile[kKvTile * kPitch];
  const int32_t t = blockIdx.x, b = blockIdx.y, h = blockIdx.z;
  const int32_t key0 = cu_k[b], len = cu_k[b + 1] - key0;
  if (t * kKvTile >= len) return;
  constexpr int kChunks = kKvTile * kD / 16;  // 16-byte chunks of the tile
  for (int i = threadIdx.x; i < kChunks; i += kThreads) {
    const int r = i / (kD / 16), col = (i % (kD / 16)) * 16;
    const int32_t j = t * kKvTile + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (j < len)
      x = *reinterpret_cast<const uint4*>(v + (key0 + j) * stride_token + h * stride_head + col);
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

}  // namespace transpose_detail

// V (e4m3 bytes, 16-byte aligned rows) -> Vt on `stream`; max_tiles >= ceil(L_kv(b) / 64) for
// every request.
template <int kD>
cudaError_t launch_transpose_v(const void* v, int64_t stride_token, int64_t stride_head,
                               const int32_t* cu_k, int32_t batch, int32_t heads_kv,
                               int32_t max_tiles, void* vt, int64_t rows, cudaStream_t stream) {
  const dim3 grid{unsigned(max_tiles), unsigned(batch), unsigned(heads_kv)};
  transpose_detail::transpose_v_kernel<kD><<<grid, transpose_detail::kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(v), stride_token, stride_head, cu_k, static_cast<uint8_t*>(vt),
      rows);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
