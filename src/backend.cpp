#include "backend.hpp"

#include "cuda/backend.hpp"
#include "cuda/quantize/quantize_q.hpp"
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

// The CUDA stages see a bf16/fp16 q over an e4m3 cache as the e4m3 problem of its quantized q
// (cuda/quantize/quantize_q.hpp): the sizes add the quantized q's bytes, the stages quantize q
// into the front of the workspace first. fp_pool_kv reads no q.
cuda::E4m3Problem e4m3_sizes(const ProblemInfo& info) {
  cuda::E4m3Problem e;
  cuda::e4m3_problem(info, nullptr, &e);
  return e;
}

Size front_bytes(const ProblemInfo& info) { return Size(int64_t(cuda::quantized_q_bytes(info))); }

constexpr Backend kCuda{
    .index_workspace =
        [](const ProblemInfo& info, const fp_select_config& c) {
          if (!info.fp8.quantize_q) return cuda_bytes(cuda::build_index_workspace(info, c));
          return front_bytes(info) +
                 cuda_bytes(cuda::build_index_workspace(e4m3_sizes(info).info, c));
        },
    .attention_workspace =
        [](const ProblemInfo& info, const fp_select_config& c, bool sparse) {
          if (!info.fp8.quantize_q) return cuda_bytes(cuda::attention_workspace(info, c, sparse));
          return front_bytes(info) +
                 cuda_bytes(cuda::attention_workspace(e4m3_sizes(info).info, c, sparse));
        },
    .build_index =
        [](const ProblemInfo& info, const fp_select_config& c, const fp_index& index, void* ws,
           size_t bytes) {
          return cuda::with_e4m3_q(info, ws, bytes,
                                   [&](const ProblemInfo& e4m3, void* rest, size_t left) {
                                     return cuda::build_index(e4m3, c, index, rest, left);
                                   });
        },
    .pool_kv =
        [](const ProblemInfo& info, const fp_select_config& c, float* k_mean, float* v_mean,
           const int32_t* pooled_keys) {
          if (!info.fp8.quantize_q) return cuda::pool_kv(info, c, k_mean, v_mean, pooled_keys);
          const cuda::E4m3Problem e4m3 = e4m3_sizes(info);
          return cuda::pool_kv(e4m3.info, c, k_mean, v_mean, pooled_keys);
        },
    .sparse_attention =
        [](const ProblemInfo& info, const fp_select_config& c, const fp_index& index,
           const fp_output& out, void* ws, size_t bytes) {
          return cuda::with_e4m3_q(info, ws, bytes,
                                   [&](const ProblemInfo& e4m3, void* rest, size_t left) {
                                     return cuda::sparse_attention(e4m3, c, index, out, rest,
                                                                   left);
                                   });
        },
    .dense_attention =
        [](const ProblemInfo& info, const fp_output& out, void* ws, size_t bytes) {
          return cuda::with_e4m3_q(info, ws, bytes,
                                   [&](const ProblemInfo& e4m3, void* rest, size_t left) {
                                     return cuda::dense_attention(e4m3, out, rest, left);
                                   });
        },
};

}  // namespace

const Backend& backend_for(const ProblemInfo& info) {
  return info.p->device == FP_DEVICE_CUDA ? kCuda : kCpu;
}

}  // namespace flashprefill
