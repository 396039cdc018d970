// Stage 1a: one CTA pools one (request, KV head, block) of K or V in a single pass with float32
// accumulation. Its warps take interleaved key rows, lanes read 16-byte vectors, and the warps'
// partial sums are combined in a fixed order, so the result is deterministic.
#include "cuda/index/pool.cuh"

#include "core/fast_divmod.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::index {
namespace {

constexpr int kPoolWarps = 4;
constexpr int kPoolThreads = kPoolWarps * 32;

template <typename T, int D>
struct PoolShape {
  static constexpr int kVec = 16 / sizeof(T);               // elements per 16-byte load
  static constexpr int kLanesPerRow = D / kVec;             // lanes covering one key row
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;    // key rows one warp load covers
  static_assert(kLanesPerRow <= 32 && 32 % kLanesPerRow == 0);
};

template <typename T>
__device__ __forceinline__ void store_rounded(T* dst, const float (&v)[16 / sizeof(T)]) {
  constexpr int kVec = 16 / sizeof(T);
  uint4 packed;
  T* e = reinterpret_cast<T*>(&packed);
#pragma unroll
  for (int i = 0; i < kVec; ++i) e[i] = round_to<T>(v[i]);
  *reinterpret_cast<uint4*>(dst) = packed;
}

// The divisors, taken once on the host: blockIdx.x = (b * Hkv + h) * max_blocks + J, and the
// page size of a paged cache.
struct PoolGrid {
  FastDivmod max_blocks, heads_kv, page_size;
};

template <typename T, int D>
__global__ void __launch_bounds__(kPoolThreads) pool_kernel(const PoolParams p, const PoolGrid grid) {
  using Shape = PoolShape<T, D>;
  constexpr int kVec = Shape::kVec;
  __shared__ __align__(16) float partial[kPoolWarps][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tensor = int(blockIdx.y);  // 0 = K, 1 = V
  const int32_t slot = int32_t(blockIdx.x);
  int32_t bh, block, b, h;
  grid.max_blocks.divmod(slot, bh, block);
  grid.heads_kv.divmod(bh, b, h);
  const BlockGeometry blocks{p.block_size, p.meta.len_kv(b)};
  if (block >= blocks.num_blocks()) return;

  float* mean = p.mean[tensor] + int64_t(slot) * D;
  T* rounded = tensor == 0 && p.k_rounded != nullptr
                   ? static_cast<T*>(p.k_rounded) + int64_t(slot) * D
                   : nullptr;
  const bool finisher = threadIdx.x < D / kVec;  // threads that write the block's mean
  const int out_col = threadIdx.x * kVec;
  float acc[kVec];
  if (p.all_pooled || (p.pooled_keys != nullptr && block < p.pooled_keys[b] / p.block_size)) {
    // Already pooled: keep the mean, refresh only its rounded copy.
    if (rounded == nullptr || !finisher) return;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = mean[out_col + i];
    store_rounded<T>(rounded + out_col, acc);
    return;
  }

  const int row = lane / Shape::kLanesPerRow;
  const int col = lane % Shape::kLanesPerRow * kVec;
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
  const T* base = static_cast<const T*>(p.kv[tensor]) + h * p.stride_head[tensor] + col;
  const KvAddress addr = p.meta.kv(b, p.stride_page[tensor], p.stride_token[tensor]);
  constexpr int kRowStep = kPoolWarps * Shape::kRowsPerPass;
  const int32_t first = blocks.begin(block) + warp * Shape::kRowsPerPass + row;
  const int32_t end = blocks.end(block);
  // Every row of the thread is first requested from L2 (no registers held, so the whole block
  // is in flight at once; the compiler keeps only a few loads outstanding otherwise), then
  // summed in row order. The layout is resolved outside the loops.
  auto pool_rows = [&](auto row_offset) {
    for (int32_t r = first; r < end; r += kRowStep) prefetch_l2(base + row_offset(r));
#pragma unroll 4
    for (int32_t r = first; r < end; r += kRowStep) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(base + row_offset(r)));
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += widen(e[i]);
    }
  };
  if (addr.paged) {
    pool_rows([&](int32_t r) {  // Eq. 22, the page by the precomputed page-size divisor
      int32_t page, in_page;
      grid.page_size.divmod(r, page, in_page);
      return int64_t(addr.pages[page]) * addr.stride_page + int64_t(in_page) * addr.stride_token;
    });
  } else {
    pool_rows([&](int32_t r) { return (addr.row0 + r) * addr.stride_token; });
  }
#pragma unroll
  for (int stride = Shape::kLanesPerRow; stride < 32; stride *= 2) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], stride);
  }
  if (row == 0) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) partial[warp][col + i] = acc[i];
  }
  __syncthreads();  // partials_ready
  if (!finisher) return;
  const float inv_count = 1.f / float(blocks.count(block));  // Eq. 5
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kPoolWarps; ++w) sum += partial[w][out_col + i];
    acc[i] = sum * inv_count;
  }
#pragma unroll
  for (int i = 0; i < kVec; i += 4)
    *reinterpret_cast<float4*>(mean + out_col + i) =
        make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
  if (rounded != nullptr) store_rounded<T>(rounded + out_col, acc);
}

template <typename T, int D>
cudaError_t launch(const PoolParams& p, cudaStream_t stream) {
  const int64_t slots = int64_t(p.batch) * p.num_heads_kv * p.max_blocks;
  if (slots == 0) return cudaSuccess;
  const PoolGrid grid{FastDivmod(p.max_blocks), FastDivmod(p.num_heads_kv),
                      FastDivmod(p.meta.paged ? p.meta.page_size : 1)};
  const dim3 ctas(unsigned(slots), p.mean[1] != nullptr ? 2u : 1u);
  pool_kernel<T, D><<<ctas, kPoolThreads, 0, stream>>>(p, grid);
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
