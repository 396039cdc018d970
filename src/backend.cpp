#include "backend.hpp"

#include "cuda/backend.hpp"
#include "reference/reference.hpp"

namespace flashprefill {
namespace {

// The CUDA backend's sizes: SIZE_MAX (cuda/backend.hpp) reads as an overflowed Size.
Size cuda_bytes(size_t bytes) { return Size(bytes == SIZE_MAX ? -1 : int64_t(bytes)); }

constexpr Backend kCpu{
    .index_workspace = [](const ProblemInfo&, const fp_select_config&) { return Size(0); },
    .attention_workspace = [](const ProblemInfo&, const fp_select_config&,
                              bool) { return Size(0); },
    .build_index =
        [](const ProblemInfo& info, const fp_select_config& c, const fp_index& index, void*,
           size_t) {
          if ((info.p->flags & FP_FLAG_MEANS_POOLED) == 0)
            ref::pool(info, c, index.k_mean, c.mean_correction ? index.v_mean : nullptr);
          ref::score_and_select(info, c, index);
          return FP_OK;
        },
    .pool_kv =
        [](const ProblemInfo& info, const fp_select_config& c, float* k_mean, float* v_mean,
           const int32_t* pooled_keys) {
          ref::pool(info, c, k_mean, v_mean, pooled_keys);
          return FP_OK;
        },
    .sparse_attention =
        [](const ProblemInfo& info, const fp_select_config& c, const fp_index& index,
           const fp_output& out, void*, size_t) {
          ref::sparse_attention(info, c, index, out);
          return FP_OK;
        },
    .dense_attention =
        [](const ProblemInfo& info, const fp_output& out, void*, size_t) {
          ref::dense_attention(info, out);
          return FP_OK;
        },
};

constexpr Backend kCuda{
    .index_workspace =
        [](const ProblemInfo& info, const fp_select_config& c) {
          return cuda_bytes(cuda::build_index_workspace(info, c));
        },
    .attention_workspace =
        [](const ProblemInfo& info, const fp_select_config& c, bool sparse) {
          return cuda_bytes(cuda::attention_workspace(info, c, sparse));
        },
    .build_index = cuda::build_index,
    .pool_kv = cuda::pool_kv,
    .sparse_attention = cuda::sparse_attention,
    .dense_attention = cuda::dense_attention,
};

}  // namespace

const Backend& backend_for(const ProblemInfo& info) {
  return info.p->device == FP_DEVICE_CUDA ? kCuda : kCpu;
}

}  // namespace flashprefill
