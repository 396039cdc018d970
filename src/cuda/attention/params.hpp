// Kernel arguments of the attention operator: one flat struct, filled once on the host by
// attention.cu's make_launch from a validated ProblemInfo, passed by value to the kernel.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap (a plain 128-byte struct; no driver call happens here)

#include "core/fast_divmod.hpp"
#include "core/geometry.hpp"

namespace flashprefill::cuda::attention {

// The KV layout a kernel is compiled for: contiguous, paged, or paged with the run table
// (AttentionParams::tma_runs). Each is a kernel of its own, so that one layout's code costs the
// others nothing: one kernel for contiguous and paged KV ran contiguous KV about 1 % slower, and
// the run table's code ran pools that do not use it (pages of 64 and 128 keys) 1.5-2.7 % slower.
enum class KvLayout : int { kContiguous, kPaged, kPagedRuns };

// A descale tensor of e4m3 operands on the device (fp_problem's q/k/v_descale): c(b, h) =
// data[b * stride_batch + h * stride_head] for request b and KV head h; data NULL means 1.
struct Descale {
  const float* data = nullptr;
  int64_t stride_batch = 0, stride_head = 0;
};

struct AttentionParams {
  // TMA descriptors of K and V as 3-D tensors (D, Hkv, rows) with 64 x 1 x tma_box_rows boxes and
  // the 128-byte swizzle of the shared-memory stages (encoded by attention.cu). Contiguous KV:
  // rows = total_k, boxes of a whole 64-key tile. Paged KV whose pages hold a multiple of 16 keys
  // and lie back to back (page stride = page_size token strides): rows = num_pages * page_size,
  // boxes of gcd(page_size, 64) rows (each inside one page), each box's row found through the
  // page table. Other paged KV goes through cp.async and KvAddress; tma is false then.
  CUtensorMap tma_k{}, tma_v{};
  bool tma = false;
  int32_t tma_box_rows = kKvTile;
  // The same K and V as 4-D tensors (64, rows, D / 64, Hkv) in 64 x 128 x D/64 x 1 boxes: one
  // box fills a whole stage operand with two adjacent KV tiles (tma_pair when both encoded; for
  // paged KV, any pool whose pages lie back to back, and then only for tiles whose rows lie back
  // to back in the pool: found through the page table for whole-tile boxes, through the run
  // table below otherwise).
  CUtensorMap tma_k_pair{}, tma_v_pair{};
  bool tma_pair = false;
  // Paged pools whose pages lie back to back but do not come in whole-tile boxes (pages of fewer
  // than 64 keys, or not a multiple of 64): the run table, filled per call (schedule_prep.cu), has
  // one row of 1 + max_pairs entries per request b at pair_rows + b * (1 + max_pairs). Entry
  // 1 + q holds the pool row of key 128 q when keys [128 q, 128 q + 128) are all in the request
  // and lie back to back in the pool, else -1; such a pair of tiles then comes in one box of the
  // pair maps whatever the page size (tma_runs). Entry 0 is 1 when the request has any such
  // pair, else 0: the kernel reads the other entries only then.
  const int32_t* pair_rows = nullptr;
  int32_t max_pairs = 0;
  bool tma_runs = false;
  // Mean correction: the surrogate keys rho(k_mean), rho(v_mean) converted into the workspace
  // (means.cu), as 3-D tensors (64, batch * Hkv * max_blocks, D / 64) in 64 x 128 x D/64 boxes.
  CUtensorMap tma_k_mean{}, tma_v_mean{};

  // Q as a 5-D tensor (64, g, Hkv, total_q, D / 64) in 64 x g x 1 x (128 / g) x D/64 boxes (a
  // whole query tile), when g is a power of two (attention.cu); else q_tma is false and Q goes
  // through cp.async.
  CUtensorMap tma_q{};
  bool q_tma = false;

  // Queries [total_q, Hq, D] and lengths.
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  int64_t total_q = 0;
  const int32_t* cu_seqlens_q = nullptr;

  // Keys and values, contiguous or paged (Eq. 22).
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_stride_page = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_page = 0, v_stride_token = 0, v_stride_head = 0;
  bool paged = false;
  const int32_t* cu_seqlens_k = nullptr;  // contiguous
  const int32_t* seqlens_k = nullptr;     // paged
  const int32_t* page_table = nullptr;    // paged
  int32_t page_size = 1;
  int32_t max_pages_per_seq = 0;

  int32_t batch = 1;
  int32_t heads_kv = 1;
  int32_t group = 1;         // g = Hq / Hkv
  int32_t max_q_tiles = 0;   // query tiles per (request, KV head) reserved in the grid
  float scale_log2 = 0.f;    // softmax_scale * log2(e)

  // The CSR index (sparse mode); dense mode visits every causal tile.
  bool sparse = false;
  const int32_t* cu = nullptr;
  const int32_t* idx = nullptr;
  int64_t idx_capacity = 0;

  // Mean correction (Eq. 6).
  bool correction = false;
  const float* k_mean = nullptr;
  const float* v_mean = nullptr;
  int32_t block_size = 128;
  int32_t max_blocks = 0;

  // Output [total_q, Hq, D] and optional LSE [Hq, total_q].
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  bool out_vec16 = false;  // 16-byte aligned rows: the epilogue writes 8 elements per store
  float* lse = nullptr;

  // KV splitting (Eq. 18): with num_splits > 1 the kernel writes float partials
  // o_partial [num_splits, total_q, Hq, D] and lse_partial [num_splits, Hq, total_q].
  int32_t num_splits = 1;
  float* o_partial = nullptr;
  float* lse_partial = nullptr;

  // Persistent scheduling (scheduler.hpp): `ctas` resident CTAs claim items from work_counter;
  // tile_prefix[b] = query tiles of requests before b (batch + 1 entries). Both live in the
  // workspace and are written by prepare_schedule before every launch.
  int32_t ctas = 1;
  int32_t head_section = 1;  // KV heads per section of the work order (heuristics.hpp)
  int32_t lead_tiles = 0;    // tiles per request taken from every head first (heuristics.hpp)
  int32_t* work_counter = nullptr;
  int32_t* tile_prefix = nullptr;

  // page_size as a launch-time divisor, for the cp.async path's page lookups (paged_kv.hpp);
  // last in the struct, so that the other fields keep their constant-bank offsets.
  FastDivmod page_div;
  // Paged KV by cp.async (paged_kv.hpp): row j of page `page` starts cp_k_unit *
  // (page * cp_k_page_units + j * cp_k_token_units) bytes past the head's K base (unit: the two
  // strides' gcd in bytes; check_attention_support keeps every row number below 2^32), and V alike.
  // A lane's row then shuffles as one 32-bit value per operand.
  uint32_t cp_k_unit = 0, cp_k_page_units = 0, cp_k_token_units = 0;
  uint32_t cp_v_unit = 0, cp_v_page_units = 0, cp_v_token_units = 0;
  // The query tiles of this launch: I in [tile_begin, tile_begin + range_tiles) of every request
  // and KV head (fp_prefill's query-tile ranges; 0 and max_q_tiles for the whole problem). The
  // CSR numbers their segments (b Hkv + h) range_tiles + I - tile_begin.
  int32_t tile_begin = 0, range_tiles = 0;

  // e4m3 operands (Eq. 15): the descales of q, k and v per (request, KV head); the consumers
  // scale the logits of an item by c_q c_k and its output by c_v (16-bit operands read none).
  // For them v and tma_v hold the transposed V of transpose_v.cuh.
  Descale q_descale, k_descale, v_descale;
};

}  // namespace flashprefill::cuda::attention
