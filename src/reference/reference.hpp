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

// Stage 1b-c (Eq. 19-20 and the CSR): reads index.k_mean, writes index.cu and index.idx.
void score_and_select(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index);

// Checks a (possibly foreign) index against the CSR rules; FP_OK or an error.
fp_status validate_index(const ProblemInfo& info, const fp_index& index);

double index_density(const ProblemInfo& info, const fp_index& index);

// Stage 2 (Eq. 4, 6): float32 accumulation; mean correction when config.mean_correction.
void sparse_attention(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, const fp_output& output);

// Exact causal attention, float64 accumulation.
void dense_attention(const ProblemInfo& info, const fp_output& output);

}  // namespace flashprefill::ref
