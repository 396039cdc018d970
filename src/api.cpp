// The C ABI: each entry point validates its inputs (core/problem.hpp), picks the backend of its
// problem's device once (backend.hpp), accounts for the workspace and runs the stages.
#include <algorithm>
#include <cmath>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/checked.hpp"
#include "core/problem.hpp"
#include "core/query_ranges.hpp"
#include "core/workload.hpp"
#include "backend.hpp"
#include "cuda/backend.hpp"
#include "flashprefill/flashprefill.h"
#include "reference/reference.hpp"

using namespace flashprefill;

namespace {

constexpr size_t kAlign = 256;

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

// How an entry point views its problem: as given; with the key bound clamped too (clamp_bounds),
// for the calls that keep the block means in their own workspace; or with the lengths copied to
// the host whatever the flags say, for the calls that read them there.
enum class View { kAsGiven, kInternalMeans, kHostLengths };

// Validates the problem for `entry` (and the selection config, and that the index sizes fit),
// picks the backend of its device, and runs `fn(info, config, backend)`.
template <typename Fn>
fp_status with_problem(Entry entry, const fp_problem* problem, const fp_select_config* config,
                       Fn&& fn, View view = View::kAsGiven) {
  return guarded([&] {
    FP_TRY(require(problem, "problem"));
    fp_problem seen = clamp_bounds(*problem, view == View::kInternalMeans);
    if (view == View::kHostLengths) seen.flags |= FP_FLAG_VALIDATE_DEVICE_METADATA;
    ProblemInfo info;
    FP_TRY(validate_problem(&seen, &info, entry));
    FP_TRY(validate_config(config, true));
    FP_TRY(check_index_sizes(info, *config));
    return fn(info, *config, backend_for(info));
  });
}

// with_problem for the dense calls, which take no selection config (the attention stage reads
// none of it in dense mode).
template <typename Fn>
fp_status with_dense_problem(const fp_problem* problem, Fn&& fn) {
  return guarded([&] {
    FP_TRY(require(problem, "problem"));
    const fp_problem clamped = clamp_bounds(*problem, true);
    ProblemInfo info;
    FP_TRY(validate_problem(&clamped, &info, Entry::kDenseAttention));
    fp_select_config c;
    fp_select_config_default(&c);
    return fn(info, c, backend_for(info));
  });
}

// A byte count, or the error that it does not fit in 64 bits.
fp_status checked_bytes(Size bytes, const char* what, size_t* out) {
  if (!bytes.ok())
    return fail(FP_ERROR_UNSUPPORTED, std::string("the ") + what + " size does not fit in 64 bits");
  *out = size_t(bytes.value());
  return FP_OK;
}

// The CUDA prefill stage's size: SIZE_MAX (cuda/backend.hpp) reads as an overflowed Size.
Size backend_bytes(size_t bytes) { return Size(bytes == SIZE_MAX ? -1 : int64_t(bytes)); }

Size aligned_ints(Size count) { return (count * Size(sizeof(int32_t))).align_up(kAlign); }

// The index that fp_prefill keeps in its workspace: [cu][k_mean][v_mean][idx], then `stage`
// bytes of backend scratch (docs/ALGORITHM.md, "Sizes and the prefill workspace"). idx holds the
// range of query tiles being selected and attended. On the CPU a range is a run of segments: the
// size query asks for kRangeSegments segments of the longest request's tiles, and any workspace
// with room for one segment runs. On CUDA a range is `range_tiles` query tiles of every request
// and KV head (core/query_ranges.hpp), sized from the shapes alone; cu numbers its segments only.
struct IndexStorage {
  Size cu = 0, mean = 0, idx = 0, stage = 0;
  int64_t range_tiles = 0;  // CUDA
  int64_t entries = 0;      // index entries idx holds
  Size fixed() const { return cu + mean + mean; }
  Size total() const { return fixed() + idx; }
  Size workspace() const { return total() + stage; }
};

constexpr int64_t kRangeSegments = 256;

QueryRangeShape range_shape(const ProblemInfo& info, const fp_select_config& c) {
  const fp_index_sizes s = index_sizes(info, c);
  return {info.p->batch_size, info.p->num_heads_kv, s.max_q_tiles,
          ceil_div(info.p->max_seqlen_k, kKvTile), s.idx_capacity};
}

// The storage of a CUDA prefill in ranges of `range_tiles` query tiles.
IndexStorage cuda_storage(const ProblemInfo& info, const fp_select_config& c, int64_t range_tiles) {
  const fp_index_sizes s = index_sizes(info, c);
  const QueryRangeShape shape = range_shape(info, c);
  IndexStorage st;
  st.range_tiles = range_tiles;
  st.cu = aligned_ints(range_segments(shape, range_tiles) + Size(1));
  st.mean = (Size(s.mean_elements) * Size(sizeof(float))).align_up(kAlign);
  const Size entries = range_entries(shape, range_tiles);
  st.entries = entries.value();
  st.idx = entries.fits(kRangeEntryLimit - 1) ? aligned_ints(entries) : Size(-1);
  st.stage = backend_bytes(cuda::prefill_workspace(info, c, range_tiles));
  return st;
}

IndexStorage cpu_storage(const ProblemInfo& info, const fp_select_config& c, bool minimal) {
  const fp_index_sizes s = index_sizes(info, c);
  IndexStorage st;
  st.cu = aligned_ints(Size(s.num_segments) + 1);
  st.mean = (Size(s.mean_elements) * Size(sizeof(float))).align_up(kAlign);
  const int64_t kv_tiles = ceil_div(info.p->max_seqlen_k, kKvTile);  // >= any segment's tiles
  st.entries = std::min(s.idx_capacity, (minimal ? 1 : kRangeSegments) * kv_tiles);
  st.idx = aligned_ints(st.entries);
  return st;
}

// The widest CUDA range whose storage fits `bytes` (at least 1 tile, at most max_q_tiles).
IndexStorage widest_cuda_storage(const ProblemInfo& info, const fp_select_config& c, size_t bytes) {
  auto fits = [&](int64_t w) {
    const Size need = cuda_storage(info, c, w).workspace();
    return need.ok() && uint64_t(need.value()) <= bytes;
  };
  int64_t lo = 1, hi = std::max<int64_t>(1, info.max_q_tiles);  // fits(lo) holds
  if (fits(hi)) return cuda_storage(info, c, hi);  // one range: no search
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return cuda_storage(info, c, lo);
}

// The workspace fp_prefill asks for (or, with `minimal`, the least it runs with), and the
// storage in it.
fp_status prefill_workspace(const ProblemInfo& info, const fp_select_config& c, bool minimal,
                            size_t* bytes, IndexStorage* storage) {
  if (info.p->flags & FP_FLAG_MEANS_POOLED)
    return fail(FP_ERROR_INVALID_ARGUMENT,
                "fp_prefill pools the means itself: FP_FLAG_MEANS_POOLED applies to fp_build_index");
  if (info.p->device == FP_DEVICE_CPU) {
    *storage = cpu_storage(info, c, minimal);
    return checked_bytes(storage->workspace(), "prefill workspace", bytes);
  }
  const QueryRangeShape shape = range_shape(info, c);
  const Size one_tile = range_entries(shape, 1);
  if (!one_tile.fits(kRangeEntryLimit - 1))
    return fail(FP_ERROR_UNSUPPORTED,
                "the CUDA prefill needs up to " +
                    (one_tile.ok() ? std::to_string(one_tile.value()) : std::string("> 2^63")) +
                    " index entries for one query tile of every request and KV head, more than "
                    "int32 offsets address");
  *storage = cuda_storage(info, c, minimal ? 1 : default_range_tiles(shape));
  return checked_bytes(storage->workspace(), "prefill workspace", bytes);
}

fp_status build_index_impl(const ProblemInfo& info, const fp_select_config& c,
                           const Backend& backend, const fp_index& index, void* ws,
                           size_t bytes) {
  FP_TRY(validate_index_buffers(info, c, &index, false));
  size_t need = 0;
  FP_TRY(checked_bytes(backend.index_workspace(info, c), "index workspace", &need));
  FP_TRY(validate_workspace(info, need, ws, bytes));
  return backend.build_index(info, c, index, ws, bytes);
}

// The caller's index, validated before it is read.
fp_status sparse_attention_impl(const ProblemInfo& info, const fp_select_config& c,
                                const Backend& backend, const fp_index& index,
                                const fp_output& out, void* ws, size_t bytes) {
  FP_TRY(validate_attention(info, &c, &index, &out));
  size_t need = 0;
  FP_TRY(checked_bytes(backend.attention_workspace(info, c, true), "attention workspace", &need));
  FP_TRY(validate_workspace(info, need, ws, bytes));
  FP_TRY(validate_given_index(info, index));
  return backend.sparse_attention(info, c, index, out, ws, bytes);
}

// fp_prefill on the CPU: pool once, then select and attend the segments in ranges whose largest
// possible selection fits the index entries the workspace holds.
void prefill_cpu(const ProblemInfo& info, const fp_select_config& c, const fp_output& out,
                 const fp_index& index) {
  ref::pool(info, c, index.k_mean, c.mean_correction ? index.v_mean : nullptr);
  const int64_t segments = ref::num_segments(info);
  for (int64_t s0 = 0; s0 < segments;) {
    int64_t s1 = s0, entries = 0;
    while (s1 < segments && entries + ref::max_selected(info, s1) <= index.idx_capacity)
      entries += ref::max_selected(info, s1++);
    fp_index range = index;
    range.cu = index.cu + s0;
    ref::score_and_select(info, c, range, s0, s1);
    ref::sparse_attention(info, c, range, out, s0, s1);
    s0 = s1;
  }
}

}  // namespace

extern "C" {

#define FP_STRINGIFY(x) #x
#define FP_VERSION_STRING(major, minor, patch) \
  FP_STRINGIFY(major) "." FP_STRINGIFY(minor) "." FP_STRINGIFY(patch)

const char* fp_version(void) {
  return FP_VERSION_STRING(FP_VERSION_MAJOR, FP_VERSION_MINOR, FP_VERSION_PATCH);
}

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
  return with_problem(
      Entry::kIndexSizes, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend&) {
        FP_TRY(require(sizes, "sizes"));
        *sizes = index_sizes(info, c);
        return FP_OK;
      });
}

fp_status fp_build_index_workspace_size(const fp_problem* problem, const fp_select_config* config,
                                        size_t* bytes) {
  return with_problem(
      Entry::kBuildIndex, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend& backend) {
        FP_TRY(require(bytes, "bytes"));
        return checked_bytes(backend.index_workspace(info, c), "index workspace", bytes);
      });
}

fp_status fp_build_index(const fp_problem* problem, const fp_select_config* config,
                         const fp_index* index, void* workspace, size_t workspace_bytes) {
  return with_problem(
      Entry::kBuildIndex, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend& backend) {
        FP_TRY(require(index, "index"));
        return build_index_impl(info, c, backend, *index, workspace, workspace_bytes);
      });
}

fp_status fp_pool_kv(const fp_problem* problem, const fp_select_config* config, float* k_mean,
                     float* v_mean, const int32_t* pooled_keys) {
  return with_problem(
      Entry::kPoolKv, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend& backend) {
        FP_TRY(require(k_mean, "k_mean"));
        FP_TRY(validate_pooled_keys(info, pooled_keys));
        return backend.pool_kv(info, c, k_mean, v_mean, pooled_keys);
      });
}

fp_status fp_sparse_attention_workspace_size(const fp_problem* problem,
                                             const fp_select_config* config, size_t* bytes) {
  return with_problem(
      Entry::kSparseAttention, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend& backend) {
        FP_TRY(require(bytes, "bytes"));
        return checked_bytes(backend.attention_workspace(info, c, true), "attention workspace",
                             bytes);
      });
}

fp_status fp_sparse_attention(const fp_problem* problem, const fp_select_config* config,
                              const fp_index* index, const fp_output* output, void* workspace,
                              size_t workspace_bytes) {
  return with_problem(
      Entry::kSparseAttention, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend& backend) {
        FP_TRY(require(index, "index"));
        FP_TRY(require(output, "output"));
        return sparse_attention_impl(info, c, backend, *index, *output, workspace, workspace_bytes);
      });
}

fp_status fp_prefill_workspace_size(const fp_problem* problem, const fp_select_config* config,
                                    size_t* bytes) {
  return with_problem(
      Entry::kPrefill, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend&) {
        FP_TRY(require(bytes, "bytes"));
        IndexStorage st;
        return prefill_workspace(info, c, false, bytes, &st);
      },
      View::kInternalMeans);
}

fp_status fp_prefill(const fp_problem* problem, const fp_select_config* config,
                     const fp_output* output, void* workspace, size_t workspace_bytes) {
  return with_problem(
      Entry::kPrefill, problem, config,
      [&](const ProblemInfo& info, const fp_select_config& c, const Backend&) {
        FP_TRY(require(output, "output"));
        FP_TRY(validate_attention(info, nullptr, nullptr, output));
        size_t need = 0;
        IndexStorage st;
        FP_TRY(prefill_workspace(info, c, true, &need, &st));
        FP_TRY(validate_workspace(info, need, workspace, workspace_bytes));
        if (info.p->device == FP_DEVICE_CUDA) st = widest_cuda_storage(info, c, workspace_bytes);
        char* base = static_cast<char*>(workspace);
        const size_t cu = size_t(st.cu.value()), mean = size_t(st.mean.value());
        fp_index index{};
        index.cu = reinterpret_cast<int32_t*>(base);
        index.k_mean = reinterpret_cast<float*>(base + cu);
        index.v_mean = reinterpret_cast<float*>(base + cu + mean);
        index.idx = reinterpret_cast<int32_t*>(base + cu + 2 * mean);
        if (info.p->device == FP_DEVICE_CPU) {  // every byte past the means holds index entries
          const size_t entries = (workspace_bytes - size_t(st.fixed().value())) / sizeof(int32_t);
          index.idx_capacity = std::min<int64_t>(index_sizes(info, c).idx_capacity, int64_t(entries));
          prefill_cpu(info, c, *output, index);
          return FP_OK;
        }
        index.idx_capacity = st.entries;
        char* stage = base + st.total().value();
        return cuda::prefill(info, c, index, int32_t(st.range_tiles), *output, stage,
                             workspace_bytes - size_t(st.total().value()));
      },
      View::kInternalMeans);
}

fp_status fp_dense_attention_workspace_size(const fp_problem* problem, size_t* bytes) {
  return with_dense_problem(problem, [&](const ProblemInfo& info, const fp_select_config& c,
                                         const Backend& backend) {
    FP_TRY(require(bytes, "bytes"));
    return checked_bytes(backend.attention_workspace(info, c, false), "attention workspace",
                         bytes);
  });
}

fp_status fp_dense_attention(const fp_problem* problem, const fp_output* output, void* workspace,
                             size_t workspace_bytes) {
  return with_dense_problem(problem, [&](const ProblemInfo& info, const fp_select_config& c,
                                         const Backend& backend) {
    FP_TRY(require(output, "output"));
    FP_TRY(validate_attention(info, nullptr, nullptr, output));
    size_t need = 0;
    FP_TRY(checked_bytes(backend.attention_workspace(info, c, false), "attention workspace",
                         &need));
    FP_TRY(validate_workspace(info, need, workspace, workspace_bytes));
    return backend.dense_attention(info, *output, workspace, workspace_bytes);
  });
}

fp_status fp_index_density(const fp_problem* problem, const fp_select_config* config,
                           const fp_index* index, double* density) {
  return with_problem(
      Entry::kIndexDensity, problem, config,
      [&](const ProblemInfo& info, const fp_select_config&, const Backend&) {
        FP_TRY(require(index, "index"));
        FP_TRY(require(index->cu, "index->cu"));
        FP_TRY(require(density, "density"));
        std::vector<int32_t> cu;
        FP_TRY(validate_given_index(info, *index, &cu));
        fp_index view = *index;
        view.cu = cu.data();
        *density = ref::index_density(info, view);
        return FP_OK;
      },
      View::kHostLengths);
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
