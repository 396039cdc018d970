// The two backends of the C ABI behind one table: the CPU reference (reference/) and the CUDA
// path (cuda/backend.hpp). An entry point picks the backend once, from its validated problem's
// device (backend_for), and runs every stage and workspace query through it. Besides the
// validation (core/problem.cpp), only fp_prefill still asks for the device: its index ranges
// differ in layout (runs of segments on the CPU, query-tile ranges on CUDA; api.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/checked.hpp"
#include "core/problem.hpp"

namespace flashprefill {

struct Backend {
  // Workspace bytes of the index stage and of the attention stage (sparse or dense mode); an
  // overflowed Size when they do not fit in 64 bits.
  Size (*index_workspace)(const ProblemInfo& info, const fp_select_config& config);
  Size (*attention_workspace)(const ProblemInfo& info, const fp_select_config& config,
                              bool sparse);
  // The stages, on validated inputs and a workspace of the queried size.
  fp_status (*build_index)(const ProblemInfo& info, const fp_select_config& config,
                           const fp_index& index, void* workspace, size_t workspace_bytes);
  fp_status (*pool_kv)(const ProblemInfo& info, const fp_select_config& config, float* k_mean,
                       float* v_mean, const int32_t* pooled_keys);
  fp_status (*sparse_attention)(const ProblemInfo& info, const fp_select_config& config,
                                const fp_index& index, const fp_output& output, void* workspace,
                                size_t workspace_bytes);
  fp_status (*dense_attention)(const ProblemInfo& info, const fp_output& output,
                               void* workspace, size_t workspace_bytes);
};

const Backend& backend_for(const ProblemInfo& info);

}  // namespace flashprefill
