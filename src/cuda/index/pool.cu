// Stage 1a: one CTA pools one (request, KV head, block) of K or V in a single pass with float32
// accumulation. Its warps take interleaved key rows, lanes read 16-byte vectors, and the warps'
// partial sums are combined in a fixed order, so the result is deterministic. e4m3 K/V are
// summed as stored (exactly widened) and the sum is scaled by the descale once.
#include "cuda/index/pool.cuh"

#include "core/fast_divmod.hpp"
#include "cuda/index/operand.cuh"
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

// The N stored elements of a 16-byte vector, widened exactly.
template <typename T, int N>
__device__ __forceinline__ void widen_vector(const uint4& raw, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16);
  if constexpr (IndexTypes<T>::kE4m3) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float four[4];
      widen_e4m3x4(words[w], four);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[4 * w + i] = four[i];
    }
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = widen(e[i]);
  }
}

// rho of N consecutive key means into the scoring operand, in 16-byte stores.
template <typename T, int N>
__device__ __forceinline__ void store_rounded(typename IndexTypes<T>::Operand* dst,
                                              const float (&v)[N], float inv_c) {
  using Operand = typename IndexTypes<T>::Operand;
  constexpr int kPerStore = 16 / sizeof(Operand);
  static_assert(N % kPerStore == 0);
#pragma unroll
  for (int s = 0; s < N / kPerStore; ++s) {
    uint4 packed;
    Operand* e = reinterpret_cast<Operand*>(&packed);
#pragma unroll
    for (int i = 0; i < kPerStore; ++i) e[i] = mean_operand<T>(v[s * kPerStore + i], inv_c);
    *reinterpret_cast<uint4*>(dst + s * kPerStore) = packed;
  }
}

// The divisors, taken once on the host: blockIdx.x = (b * Hkv + h) * max_blocks + J, and the
// page size of a paged cache.
struct PoolGrid {
  FastDivmod max_blocks, heads_kv, page_size;
};

template <typename T, int D>
__global__ void __launch_bounds__(kPoolThreads) pool_kernel(const PoolParams p, const PoolGrid grid) {
  using Shape = PoolShape<T, D>;
  using Operand = typename IndexTypes<T>::Operand;
  constexpr bool kE4m3 = IndexTypes<T>::kE4m3;
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
  Operand* rounded = tensor == 0 && p.k_rounded != nullptr
                         ? static_cast<Operand*>(p.k_rounded) + int64_t(slot) * D
                         : nullptr;
  // e4m3: the tensor's descale c (1 / c for rho, as the reference computes it); 1 otherwise.
  const float descale = kE4m3 ? p.descale[tensor](b, h) : 1.f;
  const float inv_descale = kE4m3 ? 1.f / descale : 1.f;
  const bool finisher = threadIdx.x < D / kVec;  // threads that write the block's mean
  const int out_col = threadIdx.x * kVec;
  float acc[kVec];
  if (p.all_pooled || (p.pooled_keys != nullptr && block < p.pooled_keys[b] / p.block_size)) {
    // Already pooled: keep the mean, refresh only its rounded copy.
    if (rounded == nullptr || !finisher) return;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = mean[out_col + i];
    store_rounded<T>(rounded + out_col, acc, inv_descale);
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
      float x[kVec];
      widen_vector<T>(__ldg(reinterpret_cast<const uint4*>(base + row_offset(r))), x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += x[i];
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
    if constexpr (kE4m3) sum *= descale;  // the sum of the dequantized c * x
    acc[i] = sum * inv_count;
  }
#pragma unroll
  for (int i = 0; i < kVec; i += 4)
    *reinterpret_cast<float4*>(mean + out_col + i) =
        make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
  if (rounded != nullptr) store_rounded<T>(rounded + out_col, acc, inv_descale);
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

cudaError_t launch_pool(const PoolParams& params, fp_dtype kv_dtype, int32_t head_dim,
                        cudaStream_t stream) {
  return dispatch_index_types(kv_dtype, head_dim, [&]<typename T, int D>() {
    return launch<T, D>(params, stream);
  });
}

}  // namespace flashprefill::cuda::index
