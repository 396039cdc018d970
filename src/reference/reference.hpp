// The CPU reference of every stage (docs/ALGORITHM.md), mirroring the GPU pipeline stage for
// stage: pool -> score and select -> CSR, then sparse attention with mean correction. Inputs are
// validated by the caller; every function works on host memory.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/problem.hpp"

namespace flashprefill::ref {

// Runs fn(i) for i in [0, n) on every hardware thread; order of completion is irrelevant.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

// The packed query rows of segment (b, h, tile), widened to float32: [rows, D].
struct QueryTile {
  int32_t rows = 0;
  std::vector<float> q;           // [rows, D]
  std::vector<int32_t> position;  // absolute position of each row
};
QueryTile load_query_tile(const ProblemInfo& info, int32_t b, int32_t h, int32_t tile);

// Stage 1a (Eq. 5): k_mean (and v_mean if not NULL), [B, Hkv, max_blocks, D] float32. With
// pooled_keys (host, [B]), blocks below pooled_keys[b] / block_size keep their means.
void pool(const ProblemInfo& info, const fp_select_config& config, float* k_mean, float* v_mean,
          const int32_t* pooled_keys = nullptr);

// B * Hkv * max_q_tiles.
int64_t num_segments(const ProblemInfo& info);
// The most tiles segment s can list: its query tile's causal tiles (0 past the request's tiles).
int32_t max_selected(const ProblemInfo& info, int64_t s);

// Stage 1b-c (Eq. 19-20 and the CSR) for the segments [s0, s1) (s1 < 0: all): reads
// index.k_mean, writes index.cu[0, s1 - s0] (cu[i] is the offset of segment s0 + i) and
// index.idx, which must hold the sum of max_selected over the range.
void score_and_select(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, int64_t s0 = 0, int64_t s1 = -1);

// Checks a (possibly foreign) index against the CSR rules in two passes, so that nothing is read
// before it is checked: every cu entry (cu[0] = 0, non-decreasing, within idx_capacity, empty
// segments past a request's tiles), then the tiles idx[0, cu[num_segments]) of each segment.
// cu and idx are host arrays.
fp_status validate_index_offsets(const ProblemInfo& info, const int32_t* cu, int64_t idx_capacity);
fp_status validate_index_tiles(const ProblemInfo& info, const int32_t* cu, const int32_t* idx);

double index_density(const ProblemInfo& info, const fp_index& index);

// Stage 2 (Eq. 4, 6) for the segments [s0, s1) (s1 < 0: all), index.cu numbered from s0 as
// score_and_select writes it; float64 accumulation; mean correction when config.mean_correction.
void sparse_attention(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, const fp_output& output, int64_t s0 = 0,
                      int64_t s1 = -1);

// Exact causal attention, float64 accumulation.
void dense_attention(const ProblemInfo& info, const fp_output& output);

}  // namespace flashprefill::ref
