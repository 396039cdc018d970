// The CUDA index stage as the C ABI calls it: pool -> score and select -> CSR, three
// launches on the problem's stream, no host synchronization, scratch from the caller's workspace.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "core/checked.hpp"
#include "core/query_ranges.hpp"
#include "cuda/backend.hpp"
#include "cuda/prefill.hpp"
#include "cuda/index/csr.cuh"
#include "cuda/index/operand.cuh"
#include "cuda/index/pool.cuh"
#include "cuda/index/score_select.cuh"

namespace flashprefill::cuda {
namespace {

constexpr int64_t kAlign = 256;
constexpr double kLog2e = 1.4426950408889634;

// Workspace: rho(k_mean) as the scoring operand (16 bits: the dtype, or bfloat16 for e4m3;
// cuda/index/operand.cuh) | per-segment block bitmasks | per-segment tile counts,
// for the segments of `range_tiles` query tiles of every request and KV head (max_q_tiles: the
// whole index).
struct IndexWorkspace {
  size_t k_rounded = 0, mask = 0, counts = 0;
  int32_t mask_words = 0;
  Size bytes = 0;  // the total, checked

  IndexWorkspace(const ProblemInfo& info, const fp_select_config& config, int64_t range_tiles) {
    const fp_index_sizes s = index_sizes(info, config);
    const fp_problem& p = *info.p;
    const Size segments = Size(p.batch_size) * Size(p.num_heads_kv) * Size(range_tiles);
    mask_words = int32_t(ceil_div(s.max_blocks, 32));
    const Size k_bytes = (Size(s.mean_elements) * Size(index::kOperandBytes)).align_up(kAlign);
    const Size mask_bytes =
        (segments * Size(mask_words) * Size(int64_t(sizeof(uint32_t)))).align_up(kAlign);
    const Size count_bytes = (segments * Size(int64_t(sizeof(int32_t)))).align_up(kAlign);
    bytes = k_bytes + mask_bytes + count_bytes;
    k_rounded = size_t(k_bytes.value());
    mask = size_t(mask_bytes.value());
    counts = size_t(count_bytes.value());
  }
  size_t total() const { return bytes.bytes_or_max(); }
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

fp_status check_launch(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return FP_OK;
  return fail(FP_ERROR_CUDA, std::string("index stage: launching ") + what + " failed: " +
                                 cudaGetErrorString(err));
}

index::SeqMeta seq_meta(const ProblemInfo& info) {
  const fp_problem& p = *info.p;
  index::SeqMeta m;
  m.cu_seqlens_q = p.cu_seqlens_q;
  m.group = info.group;
  m.paged = p.kv_layout == FP_KV_PAGED;
  if (m.paged) {
    m.seqlens_k = p.seqlens_k;
    m.page_table = p.page_table;
    m.max_pages_per_seq = p.max_pages_per_seq;
    m.page_size = p.page_size;
  } else {
    m.cu_seqlens_k = p.cu_seqlens_k;
  }
  return m;
}

// The kernels read q, k and v in 16-byte vectors (of 8 16-bit or 16 e4m3 elements).
fp_status check_alignment(const ProblemInfo& info) {
  const fp_problem& p = *info.p;
  const int64_t q_vec = 16 / int64_t(dtype_size(info.fp8.q_dtype));
  const int64_t vec = 16 / int64_t(dtype_size(info.fp8.kv_dtype));
  const bool paged = p.kv_layout == FP_KV_PAGED;
  const bool ok = aligned16(p.q) && aligned16(p.k) && aligned16(p.v) &&
                  p.q_stride_token % q_vec == 0 && p.q_stride_head % q_vec == 0 &&
                  p.k_stride_token % vec == 0 && p.k_stride_head % vec == 0 &&
                  p.v_stride_token % vec == 0 && p.v_stride_head % vec == 0 &&
                  (!paged || (p.k_stride_page % vec == 0 && p.v_stride_page % vec == 0));
  if (ok) return FP_OK;
  return fail(FP_ERROR_UNSUPPORTED,
              "the CUDA index stage needs q, k and v 16-byte aligned, with every stride a "
              "multiple of 16 bytes");
}

// Pooling of every (request, KV head, block) of K (and V when v_mean is not null) into the
// float32 means, with the rounded copy of the key means when k_rounded is not null.
index::PoolParams pool_params(const ProblemInfo& info, const fp_select_config& config,
                              float* k_mean, float* v_mean, void* k_rounded) {
  const fp_problem& p = *info.p;
  index::PoolParams pool;
  pool.meta = seq_meta(info);
  pool.batch = p.batch_size;
  pool.num_heads_kv = p.num_heads_kv;
  pool.max_blocks = index_sizes(info, config).max_blocks;
  pool.block_size = config.block_size;
  pool.kv[0] = p.k;
  pool.kv[1] = p.v;
  pool.stride_page[0] = p.k_stride_page;
  pool.stride_page[1] = p.v_stride_page;
  pool.stride_token[0] = p.k_stride_token;
  pool.stride_token[1] = p.v_stride_token;
  pool.stride_head[0] = p.k_stride_head;
  pool.stride_head[1] = p.v_stride_head;
  pool.mean[0] = k_mean;
  pool.mean[1] = v_mean;
  pool.descale[0] = descale_of(p, Fp8Tensor::kK);
  pool.descale[1] = descale_of(p, Fp8Tensor::kV);
  pool.k_rounded = k_rounded;
  return pool;
}

}  // namespace

fp_status pool_kv(const ProblemInfo& info, const fp_select_config& config, float* k_mean,
                  float* v_mean, const int32_t* pooled_keys) {
  const fp_problem& p = *info.p;
  if (fp_status s = check_alignment(info); s != FP_OK) return s;
  index::PoolParams pool = pool_params(info, config, k_mean, v_mean, nullptr);
  pool.pooled_keys = pooled_keys;
  return check_launch(
      index::launch_pool(pool, info.fp8.kv_dtype, p.head_dim, static_cast<cudaStream_t>(p.stream)),
      "pool");
}

size_t build_index_workspace(const ProblemInfo& info, const fp_select_config& config) {
  return IndexWorkspace(info, config, info.max_q_tiles).total();
}

size_t range_index_workspace(const ProblemInfo& info, const fp_select_config& config,
                             int64_t range_tiles) {
  return IndexWorkspace(info, config, range_tiles).total();
}

fp_status prepare_index(const ProblemInfo& info, const fp_select_config& config,
                        const fp_index& index, int64_t range_tiles, void* workspace,
                        size_t workspace_bytes) {
  const fp_problem& p = *info.p;
  const fp_index_sizes sizes = index_sizes(info, config);
  const IndexWorkspace ws(info, config, range_tiles);
  if (workspace_bytes < ws.total())
    return fail(FP_ERROR_WORKSPACE_TOO_SMALL,
                "index stage: workspace has " + std::to_string(workspace_bytes) +
                    " bytes but needs " + std::to_string(ws.total()));
  if (fp_status s = check_alignment(info); s != FP_OK) return s;
  if (int64_t(info.group) * p.max_seqlen_q >= (int64_t(1) << 31))
    return fail(FP_ERROR_UNSUPPORTED,
                "index stage: (Hq / Hkv) * max_seqlen_q must stay below 2^31 packed rows");
  int device = 0, smem_limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return fail(FP_ERROR_CUDA, "index stage: cannot query the device");
  if (index::score_select_smem_bytes(p.head_dim, sizes.max_blocks) > size_t(smem_limit))
    return fail(FP_ERROR_UNSUPPORTED,
                "index stage: max_seqlen_k / block_size = " + std::to_string(sizes.max_blocks) +
                    " blocks do not fit the scoring kernel's shared memory");

  const bool means_pooled = (p.flags & FP_FLAG_MEANS_POOLED) != 0;
  index::PoolParams pool =
      pool_params(info, config, index.k_mean,
                  config.mean_correction && !means_pooled ? index.v_mean : nullptr, workspace);
  pool.all_pooled = means_pooled;
  return check_launch(
      index::launch_pool(pool, info.fp8.kv_dtype, p.head_dim, static_cast<cudaStream_t>(p.stream)),
      "pool");
}

fp_status select_range(const ProblemInfo& info, const fp_select_config& config,
                       const fp_index& index, int64_t range_tiles, void* workspace,
                       int32_t tile_begin, int32_t tiles) {
  const fp_problem& p = *info.p;
  const fp_index_sizes sizes = index_sizes(info, config);
  // Every tile the range's segments can list has a slot: the kernels never drop one.
  const QueryRangeShape shape{p.batch_size, p.num_heads_kv, sizes.max_q_tiles,
                              ceil_div(p.max_seqlen_k, kKvTile), sizes.idx_capacity};
  const Size need = range_entries(shape, tiles);
  if (tiles > range_tiles || !need.ok() || index.idx_capacity < need.value())
    return fail(FP_ERROR_INTERNAL, "index stage: a range of " + std::to_string(tiles) +
                                       " query tiles may list " + std::to_string(need.value()) +
                                       " tiles but the index holds " +
                                       std::to_string(index.idx_capacity));
  const IndexWorkspace ws(info, config, range_tiles);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  char* scratch = static_cast<char*>(workspace);
  auto* mask = reinterpret_cast<uint32_t*>(scratch + ws.k_rounded);
  auto* counts = reinterpret_cast<int32_t*>(scratch + ws.k_rounded + ws.mask);
  const index::SeqMeta meta = seq_meta(info);

  index::ScoreParams score;
  score.meta = meta;
  score.q = p.q;
  score.q_stride_token = p.q_stride_token;
  score.q_stride_head = p.q_stride_head;
  score.k_rounded = workspace;
  score.batch = p.batch_size;
  score.num_heads_kv = p.num_heads_kv;
  score.tile_begin = tile_begin;
  score.range_tiles = tiles;
  score.max_blocks = sizes.max_blocks;
  score.block_size = config.block_size;
  score.group = FastDivmod(info.group);
  score.block = FastDivmod(config.block_size);
  score.heads_kv = FastDivmod(p.num_heads_kv);
  score.scale_log2 = float(double(info.scale) * kLog2e);
  score.scale = info.scale;
  score.q_descale = descale_of(p, Fp8Tensor::kQ);
  score.k_descale = descale_of(p, Fp8Tensor::kK);
  score.alpha = config.alpha;
  score.rules = SelectRules{config.sink_tokens, config.window_tokens, config.dense_recent_tiles};
  score.mask_words = ws.mask_words;
  score.mask = mask;
  score.counts = counts;
  if (fp_status s = check_launch(
          index::launch_score_select(score, p.dtype, p.head_dim, stream),
          "score_select");
      s != FP_OK)
    return s;

  index::CsrParams csr;
  csr.meta = meta;
  csr.num_heads_kv = p.num_heads_kv;
  csr.tile_begin = tile_begin;
  csr.range_tiles = tiles;
  csr.max_blocks = sizes.max_blocks;
  csr.block_size = config.block_size;
  csr.num_segments = int64_t(p.batch_size) * p.num_heads_kv * tiles;
  csr.mask_words = ws.mask_words;
  csr.mask = mask;
  csr.counts = counts;
  csr.cu = index.cu;
  csr.idx = index.idx;
  csr.idx_capacity = index.idx_capacity;
  return check_launch(index::launch_csr(csr, stream), "csr");
}

fp_status build_index(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, void* workspace, size_t workspace_bytes) {
  if (fp_status s =
          prepare_index(info, config, index, info.max_q_tiles, workspace, workspace_bytes);
      s != FP_OK)
    return s;
  return select_range(info, config, index, info.max_q_tiles, workspace, 0, info.max_q_tiles);
}

}  // namespace flashprefill::cuda
