// The C ABI: validation, workspace accounting and dispatch to the CPU reference or CUDA backend.
#include <cmath>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/workload.hpp"
#include "cuda/backend.hpp"
#include "flashprefill/flashprefill.h"
#include "reference/reference.hpp"

using namespace flashprefill;

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Runs an entry point body, turning exceptions into statuses and clearing the old message.
template <typename Fn>
fp_status guarded(Fn&& fn) {
  clear_error();
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail(FP_ERROR_INTERNAL, "out of host memory");
  } catch (const std::exception& e) {
    return fail(FP_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  }
}

#define FP_TRY(expr)                     \
  do {                                   \
    if (fp_status _s = (expr); _s != FP_OK) return _s; \
  } while (0)

// Validates the problem (and the selection config) before running `fn(info, config)`.
template <typename Fn>
fp_status with_problem(const fp_problem* problem, const fp_select_config* config, Fn&& fn) {
  return guarded([&] {
    ProblemInfo info;
    FP_TRY(validate_problem(problem, &info));
    FP_TRY(validate_config(config, true));
    return fn(info, *config);
  });
}

fp_status check_workspace(const ProblemInfo& info, size_t need, const void* workspace,
                          size_t bytes) {
  const size_t align = info.p->device == FP_DEVICE_CUDA ? kAlign : 16;
  if (reinterpret_cast<uintptr_t>(workspace) % align != 0)
    return fail(FP_ERROR_INVALID_ARGUMENT,
                "workspace must be " + std::to_string(align) + "-byte aligned");
  if (bytes < need)
    return fail(FP_ERROR_WORKSPACE_TOO_SMALL, "workspace has " + std::to_string(bytes) +
                                                  " bytes but the call needs " +
                                                  std::to_string(need));
  if (need > 0 && workspace == nullptr) return fail(FP_ERROR_INVALID_ARGUMENT, "workspace is NULL");
  return FP_OK;
}

fp_status check_out_ptr(const void* p, const char* name) {
  return p ? FP_OK : fail(FP_ERROR_INVALID_ARGUMENT, std::string(name) + " is NULL");
}

size_t index_ws(const ProblemInfo& info, const fp_select_config& c) {
  return info.p->device == FP_DEVICE_CUDA ? cuda::build_index_workspace(info, c) : 0;
}

size_t attention_ws(const ProblemInfo& info, const fp_select_config& c, bool sparse) {
  return info.p->device == FP_DEVICE_CUDA ? cuda::attention_workspace(info, c, sparse) : 0;
}

// The index that fp_prefill keeps in its workspace, and the bytes it takes.
struct IndexStorage {
  size_t cu = 0, idx = 0, mean = 0;
  size_t total() const { return cu + idx + 2 * mean; }
};

IndexStorage index_storage(const ProblemInfo& info, const fp_select_config& c) {
  const fp_index_sizes s = index_sizes(info, c);
  return {align_up((s.num_segments + 1) * sizeof(int32_t)), align_up(s.idx_capacity * sizeof(int32_t)),
          align_up(s.mean_elements * sizeof(float))};
}

fp_status build_index_impl(const ProblemInfo& info, const fp_select_config& c, const fp_index& index,
                           void* ws, size_t bytes) {
  FP_TRY(validate_index_buffers(info, c, &index, false));
  FP_TRY(check_workspace(info, index_ws(info, c), ws, bytes));
  if (info.p->device == FP_DEVICE_CUDA) return cuda::build_index(info, c, index, ws, bytes);
  if ((info.p->flags & FP_FLAG_MEANS_POOLED) == 0)
    ref::pool(info, c, index.k_mean, c.mean_correction ? index.v_mean : nullptr);
  ref::score_and_select(info, c, index);
  return FP_OK;
}

fp_status sparse_attention_impl(const ProblemInfo& info, const fp_select_config& c,
                                const fp_index& index, const fp_output& out, void* ws,
                                size_t bytes) {
  FP_TRY(validate_index_buffers(info, c, &index, true));
  FP_TRY(validate_output(info, &out));
  FP_TRY(check_workspace(info, attention_ws(info, c, true), ws, bytes));
  if (info.p->device == FP_DEVICE_CUDA) return cuda::sparse_attention(info, c, index, out, ws, bytes);
  FP_TRY(ref::validate_index(info, index));
  ref::sparse_attention(info, c, index, out);
  return FP_OK;
}

}  // namespace

extern "C" {

const char* fp_version(void) { return "0.2.0"; }

const char* fp_status_string(fp_status status) {
  switch (status) {
    case FP_OK: return "ok";
    case FP_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FP_ERROR_UNSUPPORTED: return "unsupported";
    case FP_ERROR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FP_ERROR_CUDA: return "CUDA error";
    case FP_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* fp_last_error_message(void) { return last_error(); }

int fp_cuda_available(void) { return cuda::available() ? 1 : 0; }

void fp_select_config_default(fp_select_config* config) {
  if (config == nullptr) return;
  config->block_size = 128;
  config->alpha = 0.1f;
  config->sink_tokens = 256;
  config->window_tokens = 512;
  config->dense_recent_tiles = 1;
  config->mean_correction = 1;
}

fp_status fp_index_sizes_query(const fp_problem* problem, const fp_select_config* config,
                               fp_index_sizes* sizes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(sizes, "sizes"));
    *sizes = index_sizes(info, c);
    return FP_OK;
  });
}

fp_status fp_build_index_workspace_size(const fp_problem* problem, const fp_select_config* config,
                                        size_t* bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(bytes, "bytes"));
    *bytes = index_ws(info, c);
    return FP_OK;
  });
}

fp_status fp_build_index(const fp_problem* problem, const fp_select_config* config,
                         const fp_index* index, void* workspace, size_t workspace_bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(index, "index"));
    return build_index_impl(info, c, *index, workspace, workspace_bytes);
  });
}

fp_status fp_pool_kv(const fp_problem* problem, const fp_select_config* config, float* k_mean,
                     float* v_mean, const int32_t* pooled_keys) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    if (k_mean == nullptr) return fail(FP_ERROR_INVALID_ARGUMENT, "k_mean is NULL");
    const fp_problem& p = *info.p;
    if (pooled_keys != nullptr && info.has_host_metadata) {
      std::vector<int32_t> host(p.batch_size);
      if (p.device == FP_DEVICE_CUDA) {
        FP_TRY(cuda::copy_to_host(host.data(), pooled_keys, host.size() * sizeof(int32_t), p.stream));
      } else {
        std::copy(pooled_keys, pooled_keys + p.batch_size, host.begin());
      }
      for (int32_t b = 0; b < p.batch_size; ++b)
        if (host[b] < 0 || host[b] > info.len_kv[b])
          return fail(FP_ERROR_INVALID_ARGUMENT,
                      "pooled_keys[" + std::to_string(b) + "] = " + std::to_string(host[b]) +
                          " is outside [0, " + std::to_string(info.len_kv[b]) + "]");
    }
    if (p.device == FP_DEVICE_CUDA) return cuda::pool_kv(info, c, k_mean, v_mean, pooled_keys);
    ref::pool(info, c, k_mean, v_mean, pooled_keys);
    return FP_OK;
  });
}

fp_status fp_sparse_attention_workspace_size(const fp_problem* problem,
                                             const fp_select_config* config, size_t* bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(bytes, "bytes"));
    *bytes = attention_ws(info, c, true);
    return FP_OK;
  });
}

fp_status fp_sparse_attention(const fp_problem* problem, const fp_select_config* config,
                              const fp_index* index, const fp_output* output, void* workspace,
                              size_t workspace_bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(index, "index"));
    FP_TRY(check_out_ptr(output, "output"));
    return sparse_attention_impl(info, c, *index, *output, workspace, workspace_bytes);
  });
}

fp_status fp_prefill_workspace_size(const fp_problem* problem, const fp_select_config* config,
                                    size_t* bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(bytes, "bytes"));
    *bytes = index_storage(info, c).total() +
             std::max(index_ws(info, c), attention_ws(info, c, true));
    return FP_OK;
  });
}

fp_status fp_prefill(const fp_problem* problem, const fp_select_config* config,
                     const fp_output* output, void* workspace, size_t workspace_bytes) {
  return with_problem(problem, config, [&](const ProblemInfo& info, const fp_select_config& c) {
    FP_TRY(check_out_ptr(output, "output"));
    FP_TRY(validate_output(info, output));
    const IndexStorage st = index_storage(info, c);
    const size_t stage_ws = std::max(index_ws(info, c), attention_ws(info, c, true));
    FP_TRY(check_workspace(info, st.total() + stage_ws, workspace, workspace_bytes));
    char* base = static_cast<char*>(workspace);
    fp_index index{};
    index.cu = reinterpret_cast<int32_t*>(base);
    index.idx = reinterpret_cast<int32_t*>(base + st.cu);
    index.k_mean = reinterpret_cast<float*>(base + st.cu + st.idx);
    index.v_mean = reinterpret_cast<float*>(base + st.cu + st.idx + st.mean);
    index.idx_capacity = int64_t(st.idx / sizeof(int32_t));
    char* stage = base + st.total();
    const size_t stage_bytes = workspace_bytes - st.total();
    FP_TRY(build_index_impl(info, c, index, stage, stage_bytes));
    return sparse_attention_impl(info, c, index, *output, stage, stage_bytes);
  });
}

fp_status fp_dense_attention_workspace_size(const fp_problem* problem, size_t* bytes) {
  return guarded([&] {
    ProblemInfo info;
    FP_TRY(validate_problem(problem, &info));
    FP_TRY(check_out_ptr(bytes, "bytes"));
    fp_select_config c;
    fp_select_config_default(&c);
    *bytes = attention_ws(info, c, false);
    return FP_OK;
  });
}

fp_status fp_dense_attention(const fp_problem* problem, const fp_output* output, void* workspace,
                             size_t workspace_bytes) {
  return guarded([&] {
    ProblemInfo info;
    FP_TRY(validate_problem(problem, &info));
    FP_TRY(check_out_ptr(output, "output"));
    FP_TRY(validate_output(info, output));
    fp_select_config c;
    fp_select_config_default(&c);
    FP_TRY(check_workspace(info, attention_ws(info, c, false), workspace, workspace_bytes));
    if (info.p->device == FP_DEVICE_CUDA)
      return cuda::dense_attention(info, *output, workspace, workspace_bytes);
    ref::dense_attention(info, *output);
    return FP_OK;
  });
}

fp_status fp_index_density(const fp_problem* problem, const fp_select_config* config,
                           const fp_index* index, double* density) {
  return guarded([&] {
    FP_TRY(check_out_ptr(problem, "problem"));
    fp_problem host_view = *problem;
    host_view.flags |= FP_FLAG_VALIDATE_DEVICE_METADATA;  // lengths are needed on the host
    ProblemInfo info;
    FP_TRY(validate_problem(&host_view, &info));
    FP_TRY(validate_config(config, true));
    FP_TRY(check_out_ptr(index, "index"));
    FP_TRY(check_out_ptr(index->cu, "index->cu"));
    FP_TRY(check_out_ptr(density, "density"));
    const fp_index_sizes s = index_sizes(info, *config);
    std::vector<int32_t> cu(s.num_segments + 1);
    if (problem->device == FP_DEVICE_CUDA) {
      FP_TRY(cuda::copy_to_host(cu.data(), index->cu, cu.size() * sizeof(int32_t), problem->stream));
    } else {
      std::copy(index->cu, index->cu + cu.size(), cu.begin());
    }
    fp_index view = *index;
    view.cu = cu.data();
    *density = ref::index_density(info, view);
    return FP_OK;
  });
}

fp_status fp_demo_workload(int32_t seqlen, int32_t num_heads_q, int32_t num_heads_kv,
                           int32_t head_dim, uint64_t seed, float* q, float* k, float* v) {
  return guarded([&] {
    if (seqlen < 1 || num_heads_kv < 1 || num_heads_q % num_heads_kv != 0 || num_heads_q < 1 ||
        head_dim < 8)
      return fail(FP_ERROR_INVALID_ARGUMENT,
                  "the demo workload needs seqlen >= 1, head_dim >= 8 and num_heads_q a multiple "
                  "of num_heads_kv");
    if (!q || !k || !v) return fail(FP_ERROR_INVALID_ARGUMENT, "q, k and v must not be NULL");
    demo::make_workload({seqlen, num_heads_q, num_heads_kv, head_dim, seed}, q, k, v);
    return FP_OK;
  });
}

}  // extern "C"
