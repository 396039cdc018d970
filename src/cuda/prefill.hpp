// The pieces of the CUDA fp_prefill that builds and consumes its index in query-tile ranges
// (docs/ALGORITHM.md, "Sizes and the prefill workspace"): the index stage split into its
// once-per-call part (checks and pooling) and its per-range part (scoring, selection and the CSR
// of one range), and the attention stage that runs a range loop around its launch. Every piece
// only enqueues work on the problem's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/problem.hpp"

namespace flashprefill::cuda {

// Index-stage scratch for ranges of up to `range_tiles` query tiles: rho(k_mean), and the block
// masks and tile counts of B Hkv range_tiles segments. SIZE_MAX when it does not fit.
size_t range_index_workspace(const ProblemInfo& info, const fp_select_config& config,
                             int64_t range_tiles);

// Checks what the index kernels support and pools k_mean / v_mean (and rho(k_mean) into the
// scratch) for the whole problem.
fp_status prepare_index(const ProblemInfo& info, const fp_select_config& config,
                        const fp_index& index, int64_t range_tiles, void* workspace,
                        size_t workspace_bytes);

// Scores, selects and writes the CSR of the query tiles [tile_begin, tile_begin + tiles) (tiles
// <= range_tiles) of every request and KV head into index.cu (B Hkv tiles + 1 offsets, segment
// (b Hkv + h) tiles + I - tile_begin) and index.idx, whose idx_capacity must hold every tile
// those segments can list. Reads the scratch that prepare_index filled.
fp_status select_range(const ProblemInfo& info, const fp_select_config& config,
                       const fp_index& index, int64_t range_tiles, void* workspace,
                       int32_t tile_begin, int32_t tiles);

// Called before each range's attention launch to select the range [tile_begin, tile_begin +
// tiles) into the index.
using RangeSelect = std::function<fp_status(int32_t tile_begin, int32_t tiles)>;

// Sparse attention of the whole problem in ranges of `range_tiles` query tiles: the block means
// are converted once, then each range is selected by `select` and attended, and split partials
// (if any) are combined once at the end. The output is the one of a single range.
fp_status sparse_attention_in_ranges(const ProblemInfo& info, const fp_select_config& config,
                                     const fp_index& index, const fp_output& output,
                                     void* workspace, int32_t range_tiles,
                                     const RangeSelect& select);

}  // namespace flashprefill::cuda
