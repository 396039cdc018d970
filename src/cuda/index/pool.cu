// Stage 1a: one warp pools one (request, KV head, block) of K or V in a single pass with float32
// accumulation; lanes read 16-byte vectors of consecutive key rows.
#include "cuda/index/pool.cuh"

#include "cuda/index/ptx.cuh"

namespace flashprefill::cuda::index {
namespace {

constexpr int kPoolWarps = 8;
constexpr int kPoolThreads = kPoolWarps * 32;

template <typename T, int D>
struct PoolShape {
  static constexpr int kVec = 16 / sizeof(T);               // elements per 16-byte load
  static constexpr int kLanesPerRow = D / kVec;             // lanes covering one key row
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;    // key rows one warp load covers
  static_assert(kLanesPerRow <= 32 && 32 % kLanesPerRow == 0);
};

template <typename T, int D>
__global__ void __launch_bounds__(kPoolThreads) pool_kernel(const PoolParams p) {
  using Shape = PoolShape<T, D>;
  constexpr int kVec = Shape::kVec;
  const int lane = threadIdx.x % 32;
  const int64_t unit = int64_t(blockIdx.x) * kPoolWarps + threadIdx.x / 32;
  const int64_t per_tensor = int64_t(p.batch) * p.num_heads_kv * p.max_blocks;
  const int tensor = int(unit / per_tensor);
  if (tensor >= (p.mean[1] != nullptr ? 2 : 1)) return;
  const int64_t slot = unit % per_tensor;  // (b * Hkv + h) * max_blocks + J
  const int32_t block = int32_t(slot % p.max_blocks);
  const int32_t b = int32_t(slot / p.max_blocks / p.num_heads_kv);
  const int32_t h = int32_t(slot / p.max_blocks % p.num_heads_kv);
  const BlockGeometry blocks{p.block_size, p.meta.len_kv(b)};
  if (block >= blocks.num_blocks()) return;

  float* mean = p.mean[tensor] + slot * D;
  T* rounded = tensor == 0 && p.k_rounded != nullptr ? static_cast<T*>(p.k_rounded) + slot * D
                                                     : nullptr;
  const int row = lane / Shape::kLanesPerRow;
  const int col = lane % Shape::kLanesPerRow * kVec;
  float acc[kVec];
  const bool kept = p.pooled_keys != nullptr && block < p.pooled_keys[b] / p.block_size;
  if (kept) {
    if (rounded == nullptr || row != 0) return;
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      const float4 m = *reinterpret_cast<const float4*>(mean + col + i);
      acc[i] = m.x;
      acc[i + 1] = m.y;
      acc[i + 2] = m.z;
      acc[i + 3] = m.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
    const T* base = static_cast<const T*>(p.kv[tensor]) + h * p.stride_head[tensor] + col;
    const KvAddress addr = p.meta.kv(b, p.stride_page[tensor], p.stride_token[tensor]);
#pragma unroll 4
    for (int32_t j = blocks.begin(block) + row; j < blocks.end(block); j += Shape::kRowsPerPass) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(base + addr.offset(j)));
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += widen(e[i]);
    }
#pragma unroll
    for (int stride = Shape::kLanesPerRow; stride < 32; stride *= 2) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], stride);
    }
    if (row != 0) return;
    const float inv_count = 1.f / float(blocks.count(block));  // Eq. 5
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] *= inv_count;
#pragma unroll
    for (int i = 0; i < kVec; i += 4)
      *reinterpret_cast<float4*>(mean + col + i) =
          make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
  }
  if (rounded != nullptr) {
    uint4 packed;
    T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int i = 0; i < kVec; ++i) e[i] = round_to<T>(acc[i]);
    *reinterpret_cast<uint4*>(rounded + col) = packed;
  }
}

template <typename T, int D>
cudaError_t launch(const PoolParams& p, cudaStream_t stream) {
  const int64_t units =
      int64_t(p.batch) * p.num_heads_kv * p.max_blocks * (p.mean[1] != nullptr ? 2 : 1);
  if (units == 0) return cudaSuccess;
  const int64_t grid = (units + kPoolWarps - 1) / kPoolWarps;
  pool_kernel<T, D><<<dim3(unsigned(grid)), kPoolThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_pool(const PoolParams& params, fp_dtype dtype, int32_t head_dim,
                        cudaStream_t stream) {
  const bool bf16 = dtype == FP_BFLOAT16;
  if (head_dim == 64)
    return bf16 ? launch<__nv_bfloat16, 64>(params, stream) : launch<__half, 64>(params, stream);
  return bf16 ? launch<__nv_bfloat16, 128>(params, stream) : launch<__half, 128>(params, stream);
}

}  // namespace flashprefill::cuda::index
