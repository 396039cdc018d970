// The attention stage's CUDA entry points (cuda/backend.hpp): what this kernel supports (checked
// by core/problem.cpp before anything runs), the workspace layout, and each call's launch:
// make_launch fills the complete AttentionParams (TMA descriptors, work layout, the scheduler's
// state, split partials and converted means carved out of the workspace), run launches.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <cutlass/numeric_types.h>

#include "cuda/attention/combine.hpp"
#include "cuda/attention/heuristics.hpp"
#include "cuda/attention/launch.hpp"
#include "cuda/attention/mean_correction.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/schedule_prep.hpp"
#include "cuda/attention/transpose_v.cuh"
#include "core/checked.hpp"
#include "cuda/backend.hpp"
#include "cuda/prefill.hpp"

namespace flashprefill::cuda {
namespace {

using attention::AttentionParams;

constexpr size_t kAlign = 256;
using attention::kElementBytes;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// An attribute of the current device, or `fallback` when the runtime cannot tell.
int device_attribute(cudaDeviceAttr attribute, int fallback) {
  int device = 0, n = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, attribute, device) != cudaSuccess)
    return fallback;
  return n;
}

int sm_count() {
  static const int count = device_attribute(cudaDevAttrMultiProcessorCount, 132);
  return count;
}

int l2_bytes() {
  static const int bytes = device_attribute(cudaDevAttrL2CacheSize, 50 << 20);
  return bytes;
}

int32_t num_splits(const ProblemInfo& info) { return attention::tuned_splits(info, sm_count()); }

struct PartialBytes {
  size_t o = 0, lse = 0;
};

// Bytes of one converted mean tensor (mean_correction.hpp) when mean correction is on, else 0.
size_t lowp_mean_bytes(const ProblemInfo& info, const fp_select_config& config, bool sparse) {
  if (!sparse || !config.mean_correction) return 0;
  const fp_problem& p = *info.p;
  const int32_t max_blocks = index_sizes(info, config).max_blocks;
  const int64_t rows = attention::converted_mean_rows(p.batch_size, p.num_heads_kv, max_blocks);
  if (info.fp8.on)  // e4m3: k as rows, v transposed in whole 32-block slot groups
    return align_up(size_t(std::max<int64_t>(rows, int64_t(p.batch_size) * p.num_heads_kv *
                                                       attention::e4m3_mean_vt_blocks(max_blocks))) *
                    size_t(p.head_dim));
  return align_up(size_t(rows) * size_t(p.head_dim) * size_t(kElementBytes));
}

PartialBytes partial_bytes(const ProblemInfo& info, int32_t splits) {
  if (splits <= 1) return {};
  const fp_problem& p = *info.p;
  const size_t rows = size_t(p.total_q) * size_t(p.num_heads_q);
  return {align_up(size_t(splits) * rows * size_t(p.head_dim) * sizeof(float)),
          align_up(size_t(splits) * rows * sizeof(float))};
}

// The most CTAs of a launch grid's y or z dimension.
constexpr int32_t kMaxGridRows = 65535;

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no libcuda link).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = []() -> EncodeTiled {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A tensor of `rank` dimensions (innermost first) in boxes of `box`, with the swizzle of the
// kernel's shared-memory stages: 16-bit elements in 128-byte swizzle rows unless told
// otherwise. Boxes past the tensor read zeros.
fp_status encode_map(CUtensorMap* map, const void* base, cuuint32_t rank, const cuuint64_t* dims,
                     const cuuint64_t* byte_strides, const cuuint32_t* box, const char* what,
                     CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT16,
                     CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr)
    return fail(FP_ERROR_CUDA, "the CUDA driver does not provide cuTensorMapEncodeTiled");
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, type, rank, const_cast<void*>(base), dims, byte_strides, box,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(FP_ERROR_CUDA, std::string("cuTensorMapEncodeTiled failed for ") + what +
                                   " (CUresult " + std::to_string(int(r)) + ")");
  return FP_OK;
}

// How Q and K rows lie in the stages (KernelTraits::AtomQK): bytes per element, the head-dim
// columns of one swizzle row (a box's innermost extent) and the swizzle. 16-bit operands: rows
// of 64 columns, 128 bytes; e4m3: the whole head dimension, 128 bytes at D = 128 and 64 bytes
// (the 64-byte swizzle) at D = 64.
struct RowFormat {
  int64_t bytes;
  uint32_t cols;
  CUtensorMapDataType type;
  CUtensorMapSwizzle swizzle;
};

constexpr RowFormat k16BitRows{kElementBytes, 64, CU_TENSOR_MAP_DATA_TYPE_UINT16,
                               CU_TENSOR_MAP_SWIZZLE_128B};

RowFormat row_format(const ProblemInfo& info) {
  if (!info.fp8.on) return k16BitRows;
  const int d = info.p->head_dim;
  return {1, uint32_t(d), CU_TENSOR_MAP_DATA_TYPE_UINT8,
          d == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B};
}

// K or V [rows, Hkv, D] as the 3-D tensor (D, Hkv, rows) in f.cols x 1 x box_rows boxes.
fp_status encode_kv_map(CUtensorMap* map, const void* base, const fp_problem& p, int64_t rows,
                        int32_t box_rows, int64_t stride_token, int64_t stride_head,
                        const char* what, const RowFormat& f) {
  // A single head's stride is never used (coordinate 0); give TMA a legal one.
  const int64_t head_stride = p.num_heads_kv > 1 ? stride_head : stride_token;
  const cuuint64_t dims[3] = {cuuint64_t(p.head_dim), cuuint64_t(p.num_heads_kv),
                              cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride * f.bytes),
                                 cuuint64_t(stride_token * f.bytes)};
  const cuuint32_t box[3] = {f.cols, 1, uint32_t(box_rows)};
  return encode_map(map, base, 3, dims, strides, box, what, f.type, f.swizzle);
}

// K or V [rows, Hkv, D] as the 4-D tensor (64, rows, D / 64, Hkv) in 64 x 128 x D/64 x 1
// boxes: dimensions ordered as a stage operand lies in shared memory (each 64-column half of the
// head dimension holds the stage's 128 keys), so one box fills it from two adjacent tiles.
fp_status encode_kv_pair_map(CUtensorMap* map, const void* base, const fp_problem& p, int64_t rows,
                             int64_t stride_token, int64_t stride_head, const char* what) {
  const int64_t head_stride = p.num_heads_kv > 1 ? stride_head : stride_token;
  const cuuint64_t dims[4] = {64, cuuint64_t(rows), cuuint64_t(p.head_dim / 64),
                              cuuint64_t(p.num_heads_kv)};
  const cuuint64_t strides[3] = {cuuint64_t(stride_token * kElementBytes), 64 * kElementBytes,
                                 cuuint64_t(head_stride * kElementBytes)};
  const cuuint32_t box[4] = {64, uint32_t(2 * kKvTile), uint32_t(p.head_dim / 64), 1};
  return encode_map(map, base, 4, dims, strides, box, what);
}

// Converted means [batch * Hkv * max_blocks, D] as the 3-D tensor (64, rows, D / 64) in
// 64 x 128 x D/64 boxes: one box fills a mean window's operand (128 blocks, each 64-column half
// of the head dimension holding them as a stage holds its keys).
fp_status encode_mean_map(CUtensorMap* map, const void* base, const AttentionParams& a, int d,
                          const char* what) {
  const cuuint64_t dims[3] = {
      64, cuuint64_t(attention::converted_mean_rows(a.batch, a.heads_kv, a.max_blocks)),
      cuuint64_t(d / 64)};
  const cuuint64_t strides[2] = {cuuint64_t(d * kElementBytes), 64 * kElementBytes};
  const cuuint32_t box[3] = {64, uint32_t(2 * kKvTile), uint32_t(d / 64)};
  return encode_map(map, base, 3, dims, strides, box, what);
}

// Q [total_q, Hq, D] as the 5-D tensor (c, g, Hkv, total_q, D / c), c = f.cols (64 for 16-bit
// operands, D for e4m3): a query tile (128 / g tokens of one KV head's g query heads, Eq. 12-13)
// is one c x g x 1 x (128 / g) x D/c box, whose rows land in packed-row order in each c-column
// part of the head dimension. Only when g divides the tile (a power of two up to 128) and the
// tile's token coordinate fits; otherwise the producer copies Q by cp.async.
fp_status encode_q_map(const fp_problem& p, int32_t group, const RowFormat& f, AttentionParams& a) {
  a.q_tma = false;
  if (group < 1 || group > kTileRows || (group & (group - 1)) != 0 ||
      p.total_q > INT32_MAX - kTileRows)
    return FP_OK;
  const int64_t head = p.q_stride_head > 0 ? p.q_stride_head : p.q_stride_token;
  const cuuint64_t dims[5] = {f.cols, cuuint64_t(group), cuuint64_t(p.num_heads_kv),
                              cuuint64_t(p.total_q), cuuint64_t(p.head_dim / f.cols)};
  const cuuint64_t strides[4] = {cuuint64_t(head * f.bytes), cuuint64_t(head * group * f.bytes),
                                 cuuint64_t(p.q_stride_token * f.bytes),
                                 cuuint64_t(f.cols * f.bytes)};
  const cuuint32_t box[5] = {f.cols, uint32_t(group), 1, uint32_t(kTileRows / group),
                             uint32_t(p.head_dim / f.cols)};
  if (fp_status s = encode_map(&a.tma_q, p.q, 5, dims, strides, box, "Q", f.type, f.swizzle);
      s != FP_OK)
    return s;
  a.q_tma = true;
  return FP_OK;
}

// Contiguous KV is fetched by TMA, and so is paged KV whose pages lie back to back (the pool is
// then one (D, Hkv, num_pages * page_size) tensor) and hold a multiple of 16 keys: a tile then
// comes in boxes of gcd(page_size, 64) rows, each inside one page and a whole number of 8-row
// swizzle atoms (one box per tile for pages of a multiple of 64 keys). Other paged KV, and
// tensors too long for 32-bit TMA coordinates, go through cp.async and the page table. Any pool
// whose pages lie back to back also gets the pair maps: with whole-tile boxes the kernel finds
// consecutive pairs through the page table itself, otherwise through the run table (tma_runs).
fp_status encode_kv_maps(const fp_problem& p, AttentionParams& a) {
  const RowFormat& f = k16BitRows;
  a.tma = false;
  a.tma_pair = false;
  a.tma_runs = false;
  a.tma_box_rows = kKvTile;
  const bool paged = p.kv_layout == FP_KV_PAGED;
  if (paged && !attention::paged_pool_back_to_back(p)) return FP_OK;
  const int64_t rows = paged ? int64_t(p.num_pages) * p.page_size : p.total_k;
  if (rows <= 0 || rows > INT32_MAX - kKvTile) return FP_OK;
  if (paged) a.tma_box_rows = attention::paged_tma_box_rows(p);  // 0: no boxes per tile
  if (a.tma_box_rows > 0) {
    if (fp_status s = encode_kv_map(&a.tma_k, p.k, p, rows, a.tma_box_rows, p.k_stride_token,
                                    p.k_stride_head, "K", f);
        s != FP_OK)
      return s;
    if (fp_status s = encode_kv_map(&a.tma_v, p.v, p, rows, a.tma_box_rows, p.v_stride_token,
                                    p.v_stride_head, "V", f);
        s != FP_OK)
      return s;
    a.tma = true;
  }
  // The pair maps only save TMA instructions: should a layout that the maps above accept be
  // refused in this dimension order, the 64 x 64 boxes load every tile (same results) and the
  // call reports no error. Paged, the kernel pairs two tiles only where their rows lie back to
  // back in the pool: inside one page, or in consecutive pages.
  a.tma_pair = encode_kv_pair_map(&a.tma_k_pair, p.k, p, rows, p.k_stride_token, p.k_stride_head,
                                  "K") == FP_OK &&
               encode_kv_pair_map(&a.tma_v_pair, p.v, p, rows, p.v_stride_token, p.v_stride_head,
                                  "V") == FP_OK;
  if (!a.tma_pair) clear_error();
  a.tma_runs = paged && a.tma_pair && a.tma_box_rows != kKvTile;
  return FP_OK;
}

// e4m3 operands (contiguous KV, or the copy gathered from a paged cache; every tile comes by
// TMA, KvLoader::tma_tile): K (a.k, its rows at a.k_stride_token) as (D, Hkv, key_rows) in
// whole-row boxes of 64 keys (row_format), and the transposed V that the transpose step writes
// into the workspace (transpose_v.cuh) as (vt_rows, D, Hkv) in 64 x D x 1 boxes with the 64-byte
// swizzle of KernelTraits::SmemLayoutVt. No pair maps. Without keys (key_rows = 0) nothing is
// encoded and run() launches nothing: no query can be attended then.
fp_status encode_e4m3_kv_maps(const ProblemInfo& info, int64_t key_rows, const void* vt,
                              int64_t vt_rows, AttentionParams& a) {
  const fp_problem& p = *info.p;
  a.tma = false;
  a.tma_pair = false;
  a.tma_runs = false;
  a.tma_box_rows = kKvTile;
  if (key_rows <= 0) return FP_OK;
  if (fp_status s = encode_kv_map(&a.tma_k, a.k, p, key_rows, kKvTile, a.k_stride_token,
                                  a.k_stride_head, "K", row_format(info));
      s != FP_OK)
    return s;
  const cuuint64_t dims[3] = {cuuint64_t(vt_rows), cuuint64_t(p.head_dim),
                              cuuint64_t(p.num_heads_kv)};
  const cuuint64_t strides[2] = {cuuint64_t(vt_rows), cuuint64_t(vt_rows) * cuuint64_t(p.head_dim)};
  const cuuint32_t box[3] = {uint32_t(kKvTile), uint32_t(p.head_dim), 1};
  if (fp_status s = encode_map(&a.tma_v, vt, 3, dims, strides, box, "the transposed V",
                               CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_64B);
      s != FP_OK)
    return s;
  a.tma = true;
  return FP_OK;
}

// e4m3 surrogate keys (launch_e4m3_means): the k means [rows, D] as (D, rows, 1) in boxes of a
// whole window (D x 128 blocks, the swizzle of K's rows), and the transposed v means
// [B * Hkv, D, e4m3_mean_vt_blocks] as (blocks, D, B * Hkv) in 64-block x D boxes, one per half
// of a window's V^T (the 64-byte swizzle of SmemLayoutVt).
fp_status encode_e4m3_mean_maps(const ProblemInfo& info, const void* k_means, const void* v_means,
                                AttentionParams& a) {
  const int d = info.p->head_dim;
  const RowFormat f = row_format(info);
  const cuuint64_t k_dims[3] = {cuuint64_t(d),
                                cuuint64_t(attention::converted_mean_rows(a.batch, a.heads_kv,
                                                                          a.max_blocks)),
                                1};
  const cuuint64_t k_strides[2] = {cuuint64_t(d), cuuint64_t(d)};
  const cuuint32_t k_box[3] = {uint32_t(d), uint32_t(2 * kKvTile), 1};
  if (fp_status s = encode_map(&a.tma_k_mean, k_means, 3, k_dims, k_strides, k_box, "the k means",
                               f.type, f.swizzle);
      s != FP_OK)
    return s;
  const int64_t blocks = attention::e4m3_mean_vt_blocks(a.max_blocks);
  const cuuint64_t v_dims[3] = {cuuint64_t(blocks), cuuint64_t(d),
                                cuuint64_t(int64_t(a.batch) * a.heads_kv)};
  const cuuint64_t v_strides[2] = {cuuint64_t(blocks), cuuint64_t(blocks) * cuuint64_t(d)};
  const cuuint32_t v_box[3] = {uint32_t(kKvTile), uint32_t(d), 1};
  return encode_map(&a.tma_v_mean, v_means, 3, v_dims, v_strides, v_box, "the v means",
                    CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_64B);
}

// Work items the persistent grid may number: every request's query tiles (at most
// ceil(g total_q / 128) + batch) times KV heads times splits.
int64_t max_items(const ProblemInfo& info, int32_t splits) {
  const fp_problem& p = *info.p;
  const int64_t tiles = std::min<int64_t>(
      ceil_div(int64_t(info.group) * p.total_q, kTileRows) + p.batch_size,
      int64_t(info.max_q_tiles) * p.batch_size);
  return tiles * p.num_heads_kv * splits;
}

// The attention kernel of this dtype, head dimension (128 or 64) and KV layout.
template <attention::KvLayout kLayout>
cudaError_t launch_kernel(const AttentionParams& a, bool bf16, int head_dim, cudaStream_t stream) {
  using attention::launch_attention;
  if (head_dim == 128)
    return bf16 ? launch_attention<cutlass::bfloat16_t, 128, kLayout>(a, stream)
                : launch_attention<cutlass::half_t, 128, kLayout>(a, stream);
  return bf16 ? launch_attention<cutlass::bfloat16_t, 64, kLayout>(a, stream)
              : launch_attention<cutlass::half_t, 64, kLayout>(a, stream);
}

// The e4m3 kernel (contiguous KV) of this head dimension (128 or 64), writing bf16 or fp16.
cudaError_t launch_e4m3_kernel(const AttentionParams& a, int head_dim, bool fp16_out,
                               cudaStream_t stream) {
  using attention::KvLayout;
  using attention::launch_attention;
  using E4m3 = cutlass::float_e4m3_t;
  using Half = cutlass::half_t;
  if (fp16_out)
    return head_dim == 128 ? launch_attention<E4m3, 128, KvLayout::kContiguous, Half>(a, stream)
                           : launch_attention<E4m3, 64, KvLayout::kContiguous, Half>(a, stream);
  return head_dim == 128 ? launch_attention<E4m3, 128, KvLayout::kContiguous>(a, stream)
                         : launch_attention<E4m3, 64, KvLayout::kContiguous>(a, stream);
}

// Bytes of the run table (paged KV; params.hpp pair_rows).
size_t pair_rows_bytes(const fp_problem& p) {
  const int32_t pairs = attention::paged_max_pairs(p);
  return pairs > 0 ? align_up(sizeof(int32_t) * size_t(p.batch_size) * size_t(1 + pairs)) : 0;
}

// e4m3 attention over a paged cache reads a contiguous copy of it, gathered into the workspace
// by the transpose step (transpose_v.cuh).
bool e4m3_gathered(const ProblemInfo& info) {
  return info.fp8.on && info.p->kv_layout == FP_KV_PAGED;
}

// Rows of the keys the e4m3 kernel reads: total_k of contiguous KV; of a paged cache, the
// gathered rows: total_k when given (a bound on the sum of seqlens_k), else batch_size times
// the most keys a request can hold.
int64_t e4m3_key_rows(const fp_problem& p) {
  if (p.kv_layout != FP_KV_PAGED) return p.total_k;
  if (p.total_k > 0) return p.total_k;
  const int64_t held = int64_t(std::max(p.max_pages_per_seq, 0)) * std::max(p.page_size, 0);
  return int64_t(p.batch_size) * std::max<int64_t>(0, std::min<int64_t>(p.max_seqlen_k, held));
}

// Rows of the transposed V of e4m3 operands (transpose_v.cuh).
int64_t transposed_v_rows(const fp_problem& p) {
  return attention::transposed_v_rows(e4m3_key_rows(p), p.batch_size);
}

// Workspace: [scheduler] [run table] [split partials: O, LSE] [converted k means] [converted v
// means] [e4m3 paged: first rows, gathered K] [transposed V (e4m3)], each part aligned. The size query and the call both lay it out
// here, from the same split count.
struct WorkspaceLayout {
  size_t schedule = 0, run_table = 0;
  PartialBytes partials;
  size_t mean = 0;  // per converted mean tensor
  size_t cu_k = 0;        // e4m3 paged: [B + 1] first rows of the gathered requests
  Size gathered_k = 0;    // e4m3 paged: key_rows * Hkv * D bytes
  Size transposed_v = 0;  // vt_rows * Hkv * D bytes: the 128 B rows it adds are not bounded

  // The other terms are bounded by the validated sizes (kMaxElements): only the sum can overflow.
  Size total() const {
    return Size(int64_t(schedule)) + Size(int64_t(run_table)) + Size(int64_t(partials.o)) +
           Size(int64_t(partials.lse)) + Size(int64_t(mean)) + Size(int64_t(mean)) +
           Size(int64_t(cu_k)) + gathered_k + transposed_v;
  }
};

WorkspaceLayout workspace_layout(const ProblemInfo& info, const fp_select_config& config,
                                 bool sparse, int32_t splits) {
  WorkspaceLayout w;
  w.schedule = align_up(attention::schedule_bytes(info.p->batch_size));
  w.run_table = pair_rows_bytes(*info.p);
  w.partials = partial_bytes(info, splits);
  w.mean = lowp_mean_bytes(info, config, sparse);
  const fp_problem& p = *info.p;
  if (e4m3_gathered(info)) {
    w.cu_k = align_up(sizeof(int32_t) * (size_t(p.batch_size) + 1));
    w.gathered_k =
        (Size(e4m3_key_rows(p)) * Size(p.num_heads_kv) * Size(p.head_dim)).align_up(kAlign);
  }
  if (info.fp8.on)
    w.transposed_v =
        (Size(transposed_v_rows(p)) * Size(p.num_heads_kv) * Size(p.head_dim)).align_up(kAlign);
  return w;
}

// One call's launch: the kernel's complete parameters, and where in the workspace the
// preparation kernels write the run table and the converted means.
struct AttentionLaunch {
  AttentionParams params;
  int32_t* run_table = nullptr;
  void* k_lowp = nullptr;
  void* v_lowp = nullptr;
  void* transposed_v = nullptr;  // e4m3
  int32_t* cu_k = nullptr;       // e4m3 paged: the gathered requests' first rows
  void* gathered_k = nullptr;    // e4m3 paged
};

// Everything the launch reads, in one place: the problem's tensors and lengths, the index (sparse
// mode: `index` given; dense: null), the output, the TMA descriptors, the work layout (splits,
// grid, work order) and the workspace carved as workspace_layout says. Launches nothing.
fp_status make_launch(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index* index, const fp_output& out, void* workspace,
                      AttentionLaunch* launch) {
  const fp_problem& p = *info.p;
  AttentionParams& a = launch->params;
  a = AttentionParams{};
  a.q = p.q;
  a.q_stride_token = p.q_stride_token;
  a.q_stride_head = p.q_stride_head;
  a.total_q = p.total_q;
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.k = p.k;
  a.v = p.v;
  a.k_stride_page = p.k_stride_page;
  a.k_stride_token = p.k_stride_token;
  a.k_stride_head = p.k_stride_head;
  a.v_stride_page = p.v_stride_page;
  a.v_stride_token = p.v_stride_token;
  a.v_stride_head = p.v_stride_head;
  a.paged = p.kv_layout == FP_KV_PAGED;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.seqlens_k = p.seqlens_k;
  a.page_table = p.page_table;
  a.page_size = a.paged ? p.page_size : 1;
  a.page_div = FastDivmod(a.page_size);
  if (a.paged) {  // check_attention_support: the row numbers fit in 32 bits
    const attention::PagedRowUnits k = attention::paged_row_units(p, false);
    const attention::PagedRowUnits v = attention::paged_row_units(p, true);
    a.cp_k_unit = uint32_t(k.unit);
    a.cp_k_page_units = uint32_t(k.page_units);
    a.cp_k_token_units = uint32_t(k.token_units);
    a.cp_v_unit = uint32_t(v.unit);
    a.cp_v_page_units = uint32_t(v.page_units);
    a.cp_v_token_units = uint32_t(v.token_units);
  }
  a.max_pages_per_seq = p.max_pages_per_seq;
  a.batch = p.batch_size;
  a.heads_kv = p.num_heads_kv;
  a.group = info.group;
  a.max_q_tiles = info.max_q_tiles;
  a.range_tiles = info.max_q_tiles;
  a.scale_log2 = info.scale * float(M_LOG2E);
  if (info.fp8.on) {  // the consumers read c_q c_k and c_v per item (Eq. 15)
    a.q_descale = {p.q_descale, p.q_descale_stride_batch, p.q_descale_stride_head};
    a.k_descale = {p.k_descale, p.k_descale_stride_batch, p.k_descale_stride_head};
    a.v_descale = {p.v_descale, p.v_descale_stride_batch, p.v_descale_stride_head};
  }
  a.out = out.out;
  a.out_stride_token = out.out_stride_token;
  a.out_stride_head = out.out_stride_head;
  a.out_vec16 = aligned16(out.out) && out.out_stride_token % 8 == 0 && out.out_stride_head % 8 == 0;
  a.lse = out.lse;
  if (index != nullptr) {
    a.sparse = true;
    a.cu = index->cu;
    a.idx = index->idx;
    a.idx_capacity = index->idx_capacity;
    a.correction = config.mean_correction != 0;
    a.k_mean = index->k_mean;
    a.v_mean = index->v_mean;
    a.block_size = config.block_size;
    a.max_blocks = index_sizes(info, config).max_blocks;
  }
  if (!info.fp8.on)  // e4m3: below, once the transposed V has its place in the workspace
    if (fp_status s = encode_kv_maps(p, a); s != FP_OK) return s;
  if (fp_status s = encode_q_map(p, info.group, row_format(info), a); s != FP_OK) return s;

  a.num_splits = num_splits(info);  // the items fit in 32 bits: check_attention_support
  a.ctas = int32_t(std::min<int64_t>(max_items(info, a.num_splits), sm_count()));
  a.head_section = attention::tuned_head_section(info, l2_bytes());
  a.lead_tiles = attention::tuned_lead_tiles(info, a.ctas, a.num_splits);

  const WorkspaceLayout w = workspace_layout(info, config, a.sparse, a.num_splits);
  char* part = static_cast<char*>(workspace);
  a.work_counter = reinterpret_cast<int32_t*>(part);
  a.tile_prefix = a.work_counter + 1;
  part += w.schedule;
  launch->run_table = reinterpret_cast<int32_t*>(part);
  part += w.run_table;
  if (a.num_splits > 1) {
    a.o_partial = reinterpret_cast<float*>(part);
    a.lse_partial = reinterpret_cast<float*>(part + w.partials.o);
  }
  part += w.partials.o + w.partials.lse;
  a.max_pairs = attention::paged_max_pairs(p);
  a.tma_runs = a.tma_runs && a.max_pairs > 0;
  if (a.tma_runs) a.pair_rows = launch->run_table;
  if (a.correction && a.max_q_tiles > 0 && p.total_q > 0) {
    launch->k_lowp = part;
    launch->v_lowp = part + w.mean;
    if (info.fp8.on) {
      if (fp_status s = encode_e4m3_mean_maps(info, launch->k_lowp, launch->v_lowp, a); s != FP_OK)
        return s;
    } else {
      if (fp_status s = encode_mean_map(&a.tma_k_mean, launch->k_lowp, a, p.head_dim, "the k means");
          s != FP_OK)
        return s;
      if (fp_status s = encode_mean_map(&a.tma_v_mean, launch->v_lowp, a, p.head_dim, "the v means");
          s != FP_OK)
        return s;
    }
  }
  part += 2 * w.mean;
  if (e4m3_gathered(info)) {  // the kernel reads the gathered copy as contiguous KV
    launch->cu_k = reinterpret_cast<int32_t*>(part);
    part += w.cu_k;
    launch->gathered_k = part;
    part += size_t(w.gathered_k.value());
    a.paged = false;
    a.cu_seqlens_k = launch->cu_k;
    a.seqlens_k = nullptr;
    a.page_table = nullptr;
    a.k = launch->gathered_k;
    a.k_stride_token = int64_t(p.num_heads_kv) * p.head_dim;
    a.k_stride_head = p.head_dim;
  }
  if (info.fp8.on) {
    launch->transposed_v = part;
    a.v = part;  // the kernel reads V^T (kernel_traits.hpp); the transpose reads p.v
    if (fp_status s = encode_e4m3_kv_maps(info, e4m3_key_rows(p), part, transposed_v_rows(p), a);
        s != FP_OK)
      return s;
  }
  return FP_OK;
}

// e4m3: V -> the transposed V in the workspace (transpose_v.cuh), and a paged cache's K -> the
// gathered K, on the call's stream before the kernel. A CTA per KV tile of the longest request
// (at most key_rows keys), request and KV head; none when no request has a key.
cudaError_t launch_transpose(const ProblemInfo& info, const AttentionLaunch& launch,
                             cudaStream_t stream) {
  const fp_problem& p = *info.p;
  const int64_t tiles = ceil_div(std::min<int64_t>(p.max_seqlen_k, e4m3_key_rows(p)), kKvTile);
  if (tiles <= 0) return cudaSuccess;
  attention::KvSource src;
  src.k = static_cast<const uint8_t*>(p.k);
  src.v = static_cast<const uint8_t*>(p.v);
  src.k_stride_token = p.k_stride_token;
  src.k_stride_head = p.k_stride_head;
  src.v_stride_token = p.v_stride_token;
  src.v_stride_head = p.v_stride_head;
  if (e4m3_gathered(info)) {
    src.k_stride_page = p.k_stride_page;
    src.v_stride_page = p.v_stride_page;
    src.page_table = p.page_table;
    src.max_pages_per_seq = p.max_pages_per_seq;
    src.page_size = p.page_size;
    src.k_out = static_cast<uint8_t*>(launch.gathered_k);
  }
  auto* transpose = p.head_dim == 128 ? &attention::launch_transpose_v<128>
                                      : &attention::launch_transpose_v<64>;
  return transpose(src, launch.params.cu_seqlens_k, p.batch_size, p.num_heads_kv, int32_t(tiles),
                   launch.transposed_v, transposed_v_rows(p), stream);
}

// The launches of one call, on its parameters: the converted means, the run table, the
// scheduler's state and the attention kernel, and the split combine. With `select`, the query
// tiles are launched in ranges of `range_tiles`, each selected into the index by `select` first;
// the split partials are combined once, after the last range.
fp_status run(const ProblemInfo& info, const AttentionLaunch& launch, int32_t range_tiles = 0,
              const RangeSelect* select = nullptr) {
  const fp_problem& p = *info.p;
  AttentionParams a = launch.params;
  if (a.max_q_tiles == 0 || p.total_q == 0) return FP_OK;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (e4m3_gathered(info) && a.tma) {  // the gathered rows, which the means and kernel read
    if (const cudaError_t e = attention::launch_paged_cu_k(
            p.seqlens_k, p.batch_size, p.max_seqlen_k, e4m3_key_rows(p), launch.cu_k, stream);
        e != cudaSuccess)
      return fail(FP_ERROR_CUDA, std::string("paged KV gather failed: ") + cudaGetErrorString(e));
  }
  if (a.correction) {
    const cudaError_t e =
        info.fp8.on
            ? attention::launch_e4m3_means(a, p.head_dim, launch.k_lowp, launch.v_lowp, stream)
            : attention::launch_lowp_means(a, p.dtype, p.head_dim, launch.k_lowp, launch.v_lowp,
                                           stream);
    if (e != cudaSuccess)
      return fail(FP_ERROR_CUDA, std::string("mean conversion failed: ") + cudaGetErrorString(e));
  }
  if (a.tma_runs) {
    if (const cudaError_t e = attention::launch_pair_rows(a, launch.run_table, stream);
        e != cudaSuccess)
      return fail(FP_ERROR_CUDA,
                  std::string("run table preparation failed: ") + cudaGetErrorString(e));
  }
  const bool e4m3 = info.fp8.on;
  if (e4m3) {
    if (!a.tma) return FP_OK;  // no keys (encode_e4m3_kv_maps)
    if (const cudaError_t e = launch_transpose(info, launch, stream); e != cudaSuccess)
      return fail(FP_ERROR_CUDA, std::string("V transpose failed: ") + cudaGetErrorString(e));
  }
  const bool bf16 = p.dtype == FP_BFLOAT16;
  using attention::KvLayout;
  const int64_t width = select != nullptr ? range_tiles : a.max_q_tiles;
  cudaError_t err = cudaSuccess;
  for (int64_t begin = 0; begin < a.max_q_tiles && err == cudaSuccess; begin += width) {
    a.tile_begin = int32_t(begin);
    a.range_tiles = int32_t(std::min<int64_t>(width, a.max_q_tiles - begin));
    if (select != nullptr)
      if (fp_status s = (*select)(a.tile_begin, a.range_tiles); s != FP_OK) return s;
    if (const cudaError_t e = attention::launch_prepare_schedule(a, stream); e != cudaSuccess)
      return fail(FP_ERROR_CUDA,
                  std::string("scheduler preparation failed: ") + cudaGetErrorString(e));
    err = e4m3         ? launch_e4m3_kernel(a, p.head_dim, info.fp8.out_dtype == FP_FLOAT16,
                                            stream)
          : !a.paged   ? launch_kernel<KvLayout::kContiguous>(a, bf16, p.head_dim, stream)
          : a.tma_runs ? launch_kernel<KvLayout::kPagedRuns>(a, bf16, p.head_dim, stream)
                       : launch_kernel<KvLayout::kPaged>(a, bf16, p.head_dim, stream);
  }
  if (err == cudaSuccess && a.num_splits > 1) {
    attention::launch_combine(a, e4m3 ? info.fp8.out_dtype : p.dtype, p.head_dim, stream);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess)
    return fail(FP_ERROR_CUDA, std::string("attention launch failed: ") + cudaGetErrorString(err));
  return FP_OK;
}

fp_status launch_attention(const ProblemInfo& info, const fp_select_config& config,
                           const fp_index* index, const fp_output& output, void* workspace) {
  AttentionLaunch launch;
  if (fp_status s = make_launch(info, config, index, output, workspace, &launch); s != FP_OK)
    return s;
  return run(info, launch);
}

}  // namespace

// 16-byte copies need 16-byte aligned rows; the epilogue stores element pairs; the cp.async
// paged path numbers a pool's rows in 32 bits (heuristics.hpp); the scheduler numbers its work
// items in 32 bits; e4m3 operands: the transposed V's rows take 32-bit TMA coordinates and the
// transpose a grid row per request and KV head. The dtype, head dimension and what the e4m3
// kernel computes are checked with the problem (core/problem.cpp).
fp_status check_attention_support(const ProblemInfo& info, const fp_output& out,
                                  const fp_index* means) {
  const fp_problem& p = *info.p;
  const bool paged = p.kv_layout == FP_KV_PAGED;
  const int64_t strides[] = {p.q_stride_token, p.q_stride_head, p.k_stride_token, p.k_stride_head,
                             p.v_stride_token, p.v_stride_head,
                             paged ? p.k_stride_page : 0, paged ? p.v_stride_page : 0};
  for (const int64_t s : strides)
    if (s % 8 != 0)
      return fail(FP_ERROR_UNSUPPORTED, "CUDA attention needs q/k/v strides that are multiples of 8");
  if (paged && !info.fp8.on && !attention::paged_rows_fit_32_bits(p))  // e4m3: 64-bit gather
    return fail(FP_ERROR_UNSUPPORTED,
                "CUDA attention: a paged K/V pool spans more than 2^32 rows of gcd(page stride, "
                "token stride)");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v))
    return fail(FP_ERROR_UNSUPPORTED, "CUDA attention needs 16-byte aligned q, k and v");
  if (out.out_stride_token % 2 != 0 || out.out_stride_head % 2 != 0 ||
      reinterpret_cast<uintptr_t>(out.out) % 4 != 0)
    return fail(FP_ERROR_UNSUPPORTED, "CUDA attention needs even output strides");
  if (means != nullptr && (!aligned16(means->k_mean) || !aligned16(means->v_mean)))
    return fail(FP_ERROR_UNSUPPORTED, "CUDA mean correction needs 16-byte aligned k_mean/v_mean");
  if (const int64_t items = max_items(info, num_splits(info));
      items > INT32_MAX - int64_t(sm_count()))
    return fail(FP_ERROR_UNSUPPORTED, "CUDA attention numbers at most 2^31 work items (query tiles x "
                                      "KV heads x splits); this problem has up to " +
                                          std::to_string(items));
  if (info.fp8.on) {
    if (const int64_t rows = transposed_v_rows(p); rows > INT32_MAX - kKvTile)
      return fail(FP_ERROR_UNSUPPORTED,
                  std::string("CUDA FP8 attention: the transposed V has ") +
                      (paged ? "the gathered keys (total_k when given, else batch_size * "
                               "max_seqlen_k)"
                             : "total_k") +
                      " + 128 * batch_size rows (rounded up to 16), " + std::to_string(rows) +
                      ", more than 2^31 - 65");
    if (p.batch_size > kMaxGridRows || p.num_heads_kv > kMaxGridRows)
      return fail(FP_ERROR_UNSUPPORTED,
                  "CUDA FP8 attention takes at most 65535 requests and 65535 KV heads (the V "
                  "transpose's grid), got " + std::to_string(p.batch_size) + " and " +
                      std::to_string(p.num_heads_kv));
  }
  return FP_OK;
}

size_t attention_workspace(const ProblemInfo& info, const fp_select_config& config, bool sparse) {
  return workspace_layout(info, config, sparse, num_splits(info)).total().bytes_or_max();
}

fp_status sparse_attention(const ProblemInfo& info, const fp_select_config& config,
                           const fp_index& index, const fp_output& output, void* workspace,
                           size_t) {
  return launch_attention(info, config, &index, output, workspace);
}

// The support check ran with the rest of fp_prefill's validation (core/problem.cpp); the
// index's means lie in the workspace, aligned.
fp_status sparse_attention_in_ranges(const ProblemInfo& info, const fp_select_config& config,
                                     const fp_index& index, const fp_output& output,
                                     void* workspace, int32_t range_tiles,
                                     const RangeSelect& select) {
  if (range_tiles < 1)
    return fail(FP_ERROR_INTERNAL, "prefill stage: a query-tile range needs at least one tile");
  AttentionLaunch launch;
  if (fp_status s = make_launch(info, config, &index, output, workspace, &launch); s != FP_OK)
    return s;
  return run(info, launch, range_tiles, &select);
}

fp_status dense_attention(const ProblemInfo& info, const fp_output& output, void* workspace,
                          size_t) {
  fp_select_config dense{};  // dense mode reads no selection
  return launch_attention(info, dense, nullptr, output, workspace);
}

}  // namespace flashprefill::cuda
