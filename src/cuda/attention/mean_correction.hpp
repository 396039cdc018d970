// Mean correction (Eq. 6), every piece of it: the blocks fully visible to a query tile and the
// windows of kWindowBlocks blocks that cover them (traversal.hpp walks them after the exact
// tiles), the surrogate keys rho(k_mean), rho(v_mean) converted once per call into the workspace
// (launch_lowp_means, mean_correction.cu) and fetched by TMA like a pair of KV tiles, the column
// biases ln |B_J| (or -inf for listed and invisible blocks) that the producer writes beside each
// window, and their addition to the raw scores by the consumers (shift_means).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "core/geometry.hpp"
#include "cuda/attention/barriers.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/ptx.cuh"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::attention {

// --- The surrogate keys, converted per call (host side and mean_correction.cu) ---

// Rows of one converted mean tensor: one per (request, KV head, block slot).
__host__ __device__ inline int64_t converted_mean_rows(int32_t batch, int32_t heads_kv,
                                                       int32_t max_blocks) {
  return int64_t(batch) * heads_kv * max_blocks;
}

// Converts p.k_mean / p.v_mean (float) to the operand dtype with the rounding docs/ALGORITHM.md
// prescribes. k_out / v_out: [batch, heads_kv, max_blocks, head_dim] in `dtype`; blocks past a
// request's last block are written as zeros, so no unwritten mean can reach the tensor cores.
cudaError_t launch_lowp_means(const AttentionParams& p, fp_dtype dtype, int head_dim, void* k_out,
                              void* v_out, cudaStream_t stream);

// e4m3 surrogate keys (docs/ALGORITHM.md "FP8 e4m3": rho rounds a mean to e4m3 with its
// tensor's descale, round_e4m3(mean / c(b, h)), the descales p.k_descale / p.v_descale on the
// device): k_out as launch_lowp_means lays it out; v_out transposed as the kernel's V^T,
// [batch * heads_kv, head_dim, e4m3_mean_vt_blocks(max_blocks)], each 32-block group in the slot
// order of fp8_slot_key (fp8.hpp), zeros past a request's blocks.
cudaError_t launch_e4m3_means(const AttentionParams& p, int head_dim, void* k_out, void* v_out,
                              cudaStream_t stream);

// Block columns of one (request, KV head) of the transposed e4m3 v means: whole 32-block slot
// groups, a multiple of 16 bytes (the TMA map's stride).
__host__ __device__ inline int64_t e4m3_mean_vt_blocks(int32_t max_blocks) {
  return (int64_t(max_blocks) + 31) / 32 * 32;
}

// --- Window bookkeeping (the traversal's correction iterations) ---

// Each correction iteration covers this many consecutive candidate blocks, one per stage column.
inline constexpr int kWindowBlocks = 2 * kKvTile;

// Blocks with end_J - 1 <= pmin(I) of item w's query tile, capped at p.max_blocks: the
// candidates of its mean correction.
__device__ __forceinline__ int32_t count_visible_blocks(const AttentionParams& p,
                                                        const WorkTile& w) {
  const BlockGeometry blocks{p.block_size, w.seq.len_kv};
  const int32_t pmin = w.seq.pmin(w.tile);
  int32_t n = (pmin + 1) / p.block_size;
  if (n < blocks.num_blocks() && fully_visible(blocks, n, pmin)) ++n;
  return n < p.max_blocks ? n : p.max_blocks;
}

// Correction iterations for `visible` candidate blocks.
__device__ __forceinline__ int32_t window_count(int32_t visible) {
  return int32_t(ceil_div(visible, kWindowBlocks));
}

// --- Producer: the window's surrogate keys and column biases ---

// Window `first_block`: rows [0, 128) of stage `stage` get the converted means of blocks
// first_block ... first_block + 127 of item w's (request, KV head), one TMA box per operand;
// issued by one thread. Rows past the head's blocks read the next head's means or zeros (finite
// either way; their columns are masked by the bias).
// e4m3 (kE4m3): the k means as the stage's 128 keys in one box of the map (D, rows, 1); the v
// means from their transposed layout (e4m3_mean_vt_blocks), one 64-block x D box per half of the
// stage's V^T.
template <bool kE4m3 = false, class SmemK, class SmemVt>
__device__ __forceinline__ void tma_mean_window(const AttentionParams& p, const WorkTile& w,
                                                SmemK& sK, SmemVt& sVt, int32_t first_block,
                                                int stage, uint64_t* bar) {
  const int32_t head = w.b * p.heads_kv + w.h;
  const int32_t row = head * p.max_blocks + first_block;
  tma_load_3d(&sK(0, 0, stage), &p.tma_k_mean, bar, 0, row, 0);
  if constexpr (kE4m3) {
    tma_load_3d(&sVt(0, 0, stage), &p.tma_v_mean, bar, first_block, 0, head);
    const int32_t half = kKvTile;  // (a copy: the tensor's operator() takes references)
    tma_load_3d(&sVt(0, half, stage), &p.tma_v_mean, bar, first_block + half, 0, head);
  } else {
    tma_load_3d(&sVt(0, 0, stage), &p.tma_v_mean, bar, 0, row, 0);
  }
}

// Bias of column c of a mean window (block j = first_block + c): ln |B_J| in raw-score units
// (the softmax applies the scale) for a block fully visible to the tile and listed by no CSR
// entry of the segment (Eq. 6), else -inf. The producer warpgroup first writes every column as if
// unlisted, then, after a warpgroup barrier, strikes the blocks its share of the segment's
// entries falls in. Called by all kWindowBlocks producer threads. `trav` is the item's
// Traversal (traversal.hpp), read in place: its CSR segment is
// [csr_end - num_exact, csr_end), its candidates visible_blocks.
template <class Traversal>
__device__ inline void window_bias(const AttentionParams& p, const Traversal& trav,
                                   const BlockGeometry& blocks, int32_t first_block, float* bias,
                                   int thread) {
  constexpr int kThreads = kWindowBlocks;
  const int32_t j = first_block + thread;
  bias[thread] = j < trav.visible_blocks ? log2f(float(blocks.count(j))) / p.scale_log2 : -INFINITY;
  producer_sync();
  for (int64_t e = trav.csr_end - trav.num_exact + thread; e < trav.csr_end; e += kThreads) {
    const int32_t t = p.idx[e];
    if (t < 0) continue;
    const int32_t jt = blocks.block_of_tile(t);
    // A tile past the request's last block lists nothing (end_tile <= t).
    if (jt >= first_block && jt < first_block + kThreads && t < blocks.end_tile(jt))
      bias[jt - first_block] = -INFINITY;
  }
}

// --- Consumer: the log |B_J| shift ---

// Mean window: column c is a surrogate key with logit q . k_mean * scale + ln |B_J| (Eq. 6);
// shift[c] = log2 |B_J| / scale_log2 (raw-score units of 16-bit operands), or -inf for blocks
// without a surrogate. s and coord are (row, col) views of one thread's S fragment. e4m3
// (kE4m3): the raw scores are q~ . k~, whose logits carry c_q c_k as well (Eq. 15), so the
// shift takes `unit` = 1 / (c_q c_k) of the item.
template <bool kE4m3 = false, class Scores, class Coords>
__device__ __forceinline__ void shift_means(Scores& s, const Coords& coord, const float* shift,
                                            float unit = 1.f) {
  using cute::size;
  CUTE_UNROLL
  for (int m = 0; m < size<0>(s); ++m) {
    CUTE_UNROLL
    for (int n = 0; n < size<1>(s); ++n) {
      if constexpr (kE4m3) s(m, n) += shift[cute::get<1>(coord(m, n))] * unit;
      else s(m, n) += shift[cute::get<1>(coord(m, n))];
    }
  }
}

}  // namespace flashprefill::cuda::attention
