#include "core/problem.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "core/checked.hpp"
#include "cuda/backend.hpp"
#include "reference/reference.hpp"

namespace flashprefill {
namespace {

thread_local std::string g_last_error;

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

constexpr uint32_t kKnownFlags = FP_FLAG_VALIDATE_DEVICE_METADATA | FP_FLAG_MEANS_POOLED;

fp_status invalid(std::string message) { return fail(FP_ERROR_INVALID_ARGUMENT, std::move(message)); }
fp_status unsupported(std::string message) { return fail(FP_ERROR_UNSUPPORTED, std::move(message)); }

// The stored value of an enum field, read as an integer: callers through the C ABI (C, ctypes)
// may store any int there, and loading an out-of-range value as the C++ enum is undefined.
template <typename E>
int32_t enum_bits(const E& field) {
  static_assert(sizeof(E) == sizeof(int32_t));
  int32_t bits;
  std::memcpy(&bits, &field, sizeof bits);
  return bits;
}

// Whether a strided tensor is addressable: no two elements alias (with dims sorted by stride,
// each stride steps over the whole extent of the dims inside it) and it spans at most
// kMaxElements elements. Dims of extent 0 or 1 take any stride.
enum class Strides { kOk, kOverlap, kTooLarge };

template <size_t N>
Strides strided_layout(std::array<std::pair<int64_t, int64_t>, N> dims /* (stride, extent) */) {
  std::sort(dims.begin(), dims.end());
  Size span = 1;
  for (auto [stride, extent] : dims) {
    if (extent <= 1) continue;
    if (!span.ok()) return Strides::kTooLarge;
    if (stride < span.value()) return Strides::kOverlap;
    span = Size(stride) * Size(extent);
  }
  return span.fits(kMaxElements) ? Strides::kOk : Strides::kTooLarge;
}

// `what()` describes the strides; it is formatted only for the error, since every call of every
// entry point checks its tensors.
template <typename What>
fp_status check_strides(const char* name, Strides layout, What&& what) {
  if (layout == Strides::kOverlap)
    return invalid(format("%s strides %s overlap", name, what().c_str()));
  if (layout == Strides::kTooLarge)
    return invalid(format("%s strides %s span more than 2^48 elements", name, what().c_str()));
  return FP_OK;
}

fp_status check_rows(const char* name, const void* data, int64_t rows, int64_t stride_token,
                     int64_t stride_head, int32_t heads, int32_t dim) {
  if (rows > 0 && data == nullptr) return invalid(format("%s is NULL", name));
  if (stride_token < 1 || stride_head < 1)
    return invalid(format("%s strides must be positive (token %lld, head %lld)", name,
                          (long long)stride_token, (long long)stride_head));
  return check_strides(
      name,
      strided_layout(std::array<std::pair<int64_t, int64_t>, 3>{
          {{stride_token, rows}, {stride_head, heads}, {1, dim}}}),
      [&] {
        return format("(token %lld, head %lld) for %lld rows of %d heads of dim %d",
                      (long long)stride_token, (long long)stride_head, (long long)rows, heads, dim);
      });
}

fp_status check_cu_seqlens(const char* name, const std::vector<int32_t>& cu, int64_t total) {
  if (cu[0] != 0) return invalid(format("%s[0] must be 0, got %d", name, cu[0]));
  for (size_t b = 0; b + 1 < cu.size(); ++b)
    if (cu[b + 1] < cu[b])
      return invalid(format("%s must be non-decreasing: %s[%zu] = %d > %s[%zu] = %d", name, name,
                            b, cu[b], name, b + 1, cu[b + 1]));
  if (cu.back() != total)
    return invalid(format("%s[batch_size] = %d but the total is %lld", name, cu.back(),
                          (long long)total));
  return FP_OK;
}

fp_status load_metadata(const fp_problem& p, ProblemInfo* info) {
  const int32_t B = p.batch_size;
  const size_t entries = size_t(B) + 1;  // cu_seqlens_*: [B + 1]
  if (fp_status s = host_copy(p, p.cu_seqlens_q, entries, info->cu_q); s != FP_OK) return s;
  if (fp_status s = check_cu_seqlens("cu_seqlens_q", info->cu_q, p.total_q); s != FP_OK) return s;
  info->len_kv.assign(B, 0);
  info->kv_row0.assign(B, 0);
  if (p.kv_layout == FP_KV_CONTIGUOUS) {
    std::vector<int32_t> cu_k;
    if (fp_status s = host_copy(p, p.cu_seqlens_k, entries, cu_k); s != FP_OK) return s;
    if (fp_status s = check_cu_seqlens("cu_seqlens_k", cu_k, p.total_k); s != FP_OK) return s;
    for (int32_t b = 0; b < B; ++b) {
      info->len_kv[b] = cu_k[b + 1] - cu_k[b];
      info->kv_row0[b] = cu_k[b];
    }
  } else {
    if (fp_status s = host_copy(p, p.seqlens_k, B, info->len_kv); s != FP_OK) return s;
    if (fp_status s = host_copy(p, p.page_table, size_t(B) * p.max_pages_per_seq, info->page_table);
        s != FP_OK)
      return s;
    int64_t keys = 0;
    for (int32_t b = 0; b < B; ++b) {
      const int32_t len = info->len_kv[b];
      if (len < 0) return invalid(format("seqlens_k[%d] = %d is negative", b, len));
      keys += len;
      // total_k, when given, bounds the keys gathered into the workspace (CUDA FP8 attention)
      if (p.total_k > 0 && keys > p.total_k)
        return invalid(format("the paged requests hold %lld keys up to request %d, more than "
                              "total_k = %lld (0 leaves it unbounded)",
                              (long long)keys, b, (long long)p.total_k));
      const int64_t pages = ceil_div(len, p.page_size);
      if (pages > p.max_pages_per_seq)
        return invalid(format("request %d has %d keys and needs %lld pages of %d, but "
                              "max_pages_per_seq is %d",
                              b, len, (long long)pages, p.page_size, p.max_pages_per_seq));
      for (int64_t i = 0; i < pages; ++i) {
        const int32_t page = info->page_table[size_t(b) * p.max_pages_per_seq + i];
        if (page < 0 || page >= p.num_pages)
          return invalid(format("page_table[%d][%lld] = %d is outside [0, num_pages = %d)", b,
                                (long long)i, page, p.num_pages));
      }
    }
  }
  for (int32_t b = 0; b < B; ++b) {
    const int32_t lq = info->len_q(b), lk = info->len_kv[b];
    if (lq > p.max_seqlen_q)
      return invalid(format("request %d has %d queries > max_seqlen_q = %d", b, lq, p.max_seqlen_q));
    if (lk > p.max_seqlen_k)
      return invalid(format("request %d has %d keys > max_seqlen_k = %d", b, lk, p.max_seqlen_k));
    if (lq > lk)
      return invalid(format("request %d has more queries (%d) than keys (%d); keys must include "
                            "the new tokens",
                            b, lq, lk));
  }
  info->has_host_metadata = true;
  return FP_OK;
}

// The most keys one request can hold: max_seqlen_k, total_k (contiguous) or
// max_pages_per_seq * page_size (paged), whichever is least.
int64_t key_bound(const fp_problem& p) {
  const int64_t held = enum_bits(p.kv_layout) == FP_KV_CONTIGUOUS
                           ? p.total_k
                           : int64_t(std::max(p.max_pages_per_seq, 0)) * std::max(p.page_size, 0);
  return std::max<int64_t>(0, std::min<int64_t>(p.max_seqlen_k, held));
}

// fp_attention_tuning: each field 0 (the heuristic) or a value in its range.
fp_status validate_tuning(const fp_problem& p) {
  const fp_attention_tuning& t = p.tuning;
  if (t.num_splits < 0 || t.num_splits > FP_MAX_SPLITS)
    return invalid(format("tuning.num_splits must lie in [0, %d] (0: the heuristic), got %d",
                          FP_MAX_SPLITS, t.num_splits));
  if (t.head_section < 0 || t.head_section > p.num_heads_kv)
    return invalid(format("tuning.head_section must lie in [0, num_heads_kv = %d] (0: the "
                          "heuristic), got %d",
                          p.num_heads_kv, t.head_section));
  if (t.lead_tiles < 0)
    return invalid(format("tuning.lead_tiles must be >= 0 (0: the heuristic), got %d",
                          t.lead_tiles));
  return FP_OK;
}

// An FP8 problem (k and v e4m3) on CUDA, per entry point. The index stage (fp_build_index,
// fp_pool_kv) and the attention calls (fp_dense_attention, fp_sparse_attention, fp_prefill and
// their size queries) run the e4m3 kernels, which take e4m3 q, k and v, or a bf16/fp16 q over
// e4m3 K/V (quantized to e4m3 in the workspace first, cuda/quantize/quantize_q.hpp),
// contiguous or paged KV (a paged cache gathered into the workspace), a bfloat16 or float16
// output and e4m3 rows of whole 16-byte chunks (a bf16/fp16 q: of 8 elements). The index size and density
// queries launch nothing and take any FP8 problem. Checked before the device is, so that every
// build refuses alike.
fp_status check_cuda_fp8(const fp_problem& p, const Fp8Info& fp8, Entry entry) {
  const bool paged = p.kv_layout == FP_KV_PAGED;
  struct Operand {
    const char* name;
    int64_t token, head, page;
  };
  const Operand q{"q", p.q_stride_token, p.q_stride_head, 0};
  const Operand kv[] = {{"k", p.k_stride_token, p.k_stride_head, paged ? p.k_stride_page : 0},
                        {"v", p.v_stride_token, p.v_stride_head, paged ? p.v_stride_page : 0}};
  auto chunks = [](const Operand& t, int64_t elements) -> fp_status {
    if (t.token % elements == 0 && t.head % elements == 0 && t.page % elements == 0) return FP_OK;
    return unsupported(format("FP8 e4m3 on CUDA: the kernels read rows in 16-byte chunks; %s "
                              "strides must be multiples of %lld elements, got (token %lld, head "
                              "%lld%s)",
                              t.name, (long long)elements, (long long)t.token,
                              (long long)t.head,
                              t.page != 0 ? format(", page %lld", (long long)t.page).c_str()
                                          : ""));
  };
  switch (entry) {
    case Entry::kIndexSizes:
    case Entry::kIndexDensity:
    case Entry::kPoolKv:
      return FP_OK;
    case Entry::kBuildIndex:
      if (fp8.quantize_q && (p.batch_size > 65535 || p.num_heads_kv > 65535))
        return unsupported(format("FP8 e4m3 on CUDA: q is quantized by a grid row per request "
                                  "and KV head, at most 65535 of each, got %d and %d",
                                  p.batch_size, p.num_heads_kv));
      if (fp8.quantize_q && reinterpret_cast<uintptr_t>(p.q) % 16 != 0)
        return unsupported("FP8 e4m3 on CUDA: a bf16/fp16 q over e4m3 K/V is read in 16-byte "
                           "chunks and must be 16-byte aligned");
      return fp8.quantize_q ? chunks(q, 8) : FP_OK;
    case Entry::kPrefill:
    case Entry::kSparseAttention:
    case Entry::kDenseAttention:
      break;
  }
  if (fp_status s = chunks(q, fp8.quantize_q ? 8 : 16); s != FP_OK) return s;
  for (const Operand& t : kv)
    if (fp_status s = chunks(t, 16); s != FP_OK) return s;
  return FP_OK;
}

}  // namespace

fp_status host_copy(const fp_problem& p, const int32_t* src, size_t count,
                    std::vector<int32_t>& out) {
  out.resize(count);
  if (count == 0) return FP_OK;
  if (p.device == FP_DEVICE_CPU) {
    std::memcpy(out.data(), src, count * sizeof(int32_t));
    return FP_OK;
  }
  return cuda::copy_to_host(out.data(), src, count * sizeof(int32_t), p.stream);
}

fp_problem clamp_bounds(const fp_problem& problem, bool keys) {
  fp_problem p = problem;
  if (p.total_q >= 0 && p.max_seqlen_q > p.total_q) p.max_seqlen_q = int32_t(p.total_q);
  if (keys && p.max_seqlen_k > 0) p.max_seqlen_k = int32_t(key_bound(p));
  return p;
}

fp_status fail(fp_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

void clear_error() { g_last_error.clear(); }

const char* last_error() { return g_last_error.c_str(); }

size_t dtype_size(fp_dtype dtype) {
  return dtype == FP_FLOAT32 ? 4 : dtype == FP_FLOAT8_E4M3 ? 1 : 2;
}

const char* dtype_name(fp_dtype dtype) {
  switch (dtype) {
    case FP_FLOAT32: return "float32";
    case FP_BFLOAT16: return "bfloat16";
    case FP_FLOAT16: return "float16";
    case FP_FLOAT8_E4M3: return "float8_e4m3";
  }
  return "unknown";
}

KvAddress ProblemInfo::kv_address(int32_t b, bool value) const {
  KvAddress a;
  a.paged = p->kv_layout == FP_KV_PAGED;
  a.stride_token = value ? p->v_stride_token : p->k_stride_token;
  if (a.paged) {
    a.pages = page_table.data() + size_t(b) * p->max_pages_per_seq;
    a.page_size = p->page_size;
    a.stride_page = value ? p->v_stride_page : p->k_stride_page;
  } else {
    a.row0 = kv_row0[b];
  }
  return a;
}

fp_status validate_problem(const fp_problem* problem, ProblemInfo* info, Entry entry) {
  if (problem == nullptr) return invalid("problem is NULL");
  const fp_problem& p = *problem;
  info->p = problem;
  if (const int32_t d = enum_bits(p.device); d != FP_DEVICE_CPU && d != FP_DEVICE_CUDA)
    return invalid(format("unknown device %d", d));
  if (const int32_t d = enum_bits(p.dtype);
      d != FP_FLOAT32 && d != FP_BFLOAT16 && d != FP_FLOAT16 && d != FP_FLOAT8_E4M3)
    return invalid(format("unknown dtype %d", d));
  if (const uint32_t unknown = p.flags & ~kKnownFlags; unknown != 0)
    return invalid(format("unknown problem flags 0x%x", unsigned(unknown)));
  // Read once as an integer; reported where the KV checks begin, after q's.
  const int32_t layout = enum_bits(p.kv_layout);
  const bool layout_known = layout == FP_KV_CONTIGUOUS || layout == FP_KV_PAGED;
  if (p.batch_size < 1) return invalid(format("batch_size must be >= 1, got %d", p.batch_size));
  if (p.num_heads_q < 1 || p.num_heads_kv < 1)
    return invalid(format("num_heads_q (%d) and num_heads_kv (%d) must be >= 1", p.num_heads_q,
                          p.num_heads_kv));
  if (p.num_heads_q % p.num_heads_kv != 0)
    return invalid(format("num_heads_q (%d) must be a multiple of num_heads_kv (%d)",
                          p.num_heads_q, p.num_heads_kv));
  if (p.head_dim < 1 || p.head_dim > 512)
    return invalid(format("head_dim %d is outside [1, 512]", p.head_dim));
  if (fp_status s = validate_fp8_fields(p, &info->fp8); s != FP_OK) return s;
  if (fp_status s = validate_tuning(p); s != FP_OK) return s;
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale < 0.f)
    return invalid(format("softmax_scale must be finite and >= 0 (0 = 1/sqrt(D)), got %g",
                          double(p.softmax_scale)));
  // The kernels keep raw scores and put the mean windows' ln |B_J| into their units, divided by
  // the scale: outside [2^-64, 2^64] that quotient or the scaled scores leave float32's range.
  if (p.softmax_scale != 0.f && (p.softmax_scale < 0x1p-64f || p.softmax_scale > 0x1p64f))
    return invalid(format("softmax_scale %g is outside [2^-64, 2^64] (5.4e-20 .. 1.8e+19; 0 = "
                          "1/sqrt(D))",
                          double(p.softmax_scale)));
  if (p.total_q < 0 || p.max_seqlen_q < 0 || p.max_seqlen_k < 0)
    return invalid("total_q, max_seqlen_q and max_seqlen_k must be >= 0");
  if (p.cu_seqlens_q == nullptr) return invalid("cu_seqlens_q is NULL");
  if (fp_status s = check_rows("q", p.q, p.total_q, p.q_stride_token, p.q_stride_head,
                               p.num_heads_q, p.head_dim);
      s != FP_OK)
    return s;
  if (!layout_known) return invalid(format("unknown kv_layout %d", layout));
  if (p.kv_layout == FP_KV_CONTIGUOUS) {
    if (p.total_k < 0) return invalid("total_k must be >= 0");
    if (p.cu_seqlens_k == nullptr) return invalid("cu_seqlens_k is NULL");
    for (int value = 0; value < 2; ++value) {
      const char* name = value ? "v" : "k";
      if (fp_status s = check_rows(name, value ? p.v : p.k, p.total_k,
                                   value ? p.v_stride_token : p.k_stride_token,
                                   value ? p.v_stride_head : p.k_stride_head, p.num_heads_kv,
                                   p.head_dim);
          s != FP_OK)
        return s;
    }
  } else if (p.kv_layout == FP_KV_PAGED) {
    if (p.page_size < 1) return invalid(format("page_size must be >= 1, got %d", p.page_size));
    if (p.num_pages < 1) return invalid(format("num_pages must be >= 1, got %d", p.num_pages));
    if (p.max_pages_per_seq < 1)
      return invalid(format("max_pages_per_seq must be >= 1, got %d", p.max_pages_per_seq));
    if (p.page_table == nullptr) return invalid("page_table is NULL");
    if (p.seqlens_k == nullptr) return invalid("seqlens_k is NULL");
    for (int value = 0; value < 2; ++value) {
      const char* name = value ? "v_cache" : "k_cache";
      const void* data = value ? p.v : p.k;
      const int64_t sp = value ? p.v_stride_page : p.k_stride_page;
      const int64_t st = value ? p.v_stride_token : p.k_stride_token;
      const int64_t sh = value ? p.v_stride_head : p.k_stride_head;
      if (data == nullptr) return invalid(format("%s is NULL", name));
      if (sp < 1 || st < 1 || sh < 1)
        return invalid(format("%s strides must be positive (page %lld, token %lld, head %lld)",
                              name, (long long)sp, (long long)st, (long long)sh));
      if (fp_status s = check_strides(
              name,
              strided_layout(std::array<std::pair<int64_t, int64_t>, 4>{
                  {{sp, p.num_pages}, {st, p.page_size}, {sh, p.num_heads_kv}, {1, p.head_dim}}}),
              [&] {
                return format("(page %lld, token %lld, head %lld)", (long long)sp, (long long)st,
                              (long long)sh);
              });
          s != FP_OK)
        return s;
    }
  }
  if (p.device == FP_DEVICE_CUDA) {
    if (info->fp8.on)
      if (fp_status s = check_cuda_fp8(p, info->fp8, entry); s != FP_OK) return s;
    if (!cuda::available())
      return fail(FP_ERROR_UNSUPPORTED,
                  "device is FP_DEVICE_CUDA but this build has no CUDA backend or no sm_90 GPU "
                  "is present");
    if (p.dtype == FP_FLOAT32)
      return fail(FP_ERROR_UNSUPPORTED, "the CUDA path takes bfloat16 or float16, not float32");
    if (p.head_dim != 64 && p.head_dim != 128)
      return fail(FP_ERROR_UNSUPPORTED,
                  format("the CUDA path supports head_dim 64 and 128, got %d", p.head_dim));
  }
  info->group = p.num_heads_q / p.num_heads_kv;
  info->scale = p.softmax_scale > 0.f ? p.softmax_scale : 1.f / std::sqrt(float(p.head_dim));
  // Counts the kernels keep in 32 bits are checked before they are narrowed.
  const int64_t q_tiles = ceil_div(int64_t(info->group) * p.max_seqlen_q, kTileRows);
  if (q_tiles > INT32_MAX)
    return fail(FP_ERROR_UNSUPPORTED,
                format("ceil((Hq / Hkv) * max_seqlen_q / 128) = %lld query tiles per request do not "
                       "fit in 32 bits (max_seqlen_q is taken as at most total_q)",
                       (long long)q_tiles));
  info->max_q_tiles = int32_t(q_tiles);
  if (!(Size(p.batch_size) * Size(p.num_heads_kv) * Size(q_tiles)).fits(kMaxElements))
    return fail(FP_ERROR_UNSUPPORTED,
                format("B * Hkv * max_q_tiles = %d * %d * %lld index segments exceed 2^48",
                       p.batch_size, p.num_heads_kv, (long long)q_tiles));
  const bool host_metadata =
      p.device == FP_DEVICE_CPU || (p.flags & FP_FLAG_VALIDATE_DEVICE_METADATA) != 0;
  if (!host_metadata) return FP_OK;
  if (fp_status s = load_metadata(p, info); s != FP_OK) return s;
  // The sizes follow from the lengths alone: no descale factor is read, nor q for the dynamic c_q.
  if (entry == Entry::kIndexSizes) return FP_OK;
  return load_fp8_scales(p, info->cu_q, &info->fp8);
}

fp_status validate_config(const fp_select_config* config, bool need_block_size) {
  if (config == nullptr) return invalid("config is NULL");
  const fp_select_config& c = *config;
  if (need_block_size && (c.block_size < kKvTile || c.block_size % kKvTile != 0))
    return invalid(format("block_size must be a positive multiple of 64, got %d", c.block_size));
  if (std::isnan(c.alpha) || c.alpha < 0.f || c.alpha > 1.f)
    return invalid(format("alpha must lie in [0, 1], got %g", double(c.alpha)));
  if (c.sink_tokens < 0 || c.window_tokens < 0 || c.dense_recent_tiles < 0)
    return invalid(format("sink_tokens (%d), window_tokens (%d) and dense_recent_tiles (%d) must "
                          "be >= 0",
                          c.sink_tokens, c.window_tokens, c.dense_recent_tiles));
  if (c.mean_correction != 0 && c.mean_correction != 1)
    return invalid(format("mean_correction must be 0 or 1, got %d", c.mean_correction));
  return FP_OK;
}

namespace {

// The index sizes of docs/ALGORITHM.md in checked arithmetic.
struct IndexSizeTerms {
  Size num_segments = 0, max_blocks = 0, idx_capacity = 0, mean_elements = 0;
};

IndexSizeTerms index_size_terms(const ProblemInfo& info, const fp_select_config& config) {
  const fp_problem& p = *info.p;
  IndexSizeTerms s;
  const Size heads = Size(p.batch_size) * Size(p.num_heads_kv);
  s.num_segments = heads * Size(info.max_q_tiles);
  s.max_blocks = div_up(Size(p.max_seqlen_k), config.block_size);
  // Query tiles over all requests: ceil(g * total_q / 128) + B, and at most B * max_q_tiles.
  const Size tiles = div_up(Size(info.group) * Size(p.total_q), kTileRows) + Size(p.batch_size);
  const Size all_tiles = Size(p.batch_size) * Size(info.max_q_tiles);
  const Size tiles_bound = tiles.ok() && tiles.value() < all_tiles.value() ? tiles : all_tiles;
  s.idx_capacity = Size(p.num_heads_kv) * tiles_bound * div_up(Size(key_bound(p)), kKvTile);
  s.mean_elements = heads * s.max_blocks * Size(p.head_dim);
  return s;
}

}  // namespace

fp_index_sizes index_sizes(const ProblemInfo& info, const fp_select_config& config) {
  const IndexSizeTerms t = index_size_terms(info, config);
  fp_index_sizes s{};
  s.max_q_tiles = info.max_q_tiles;
  s.num_segments = t.num_segments.value();
  s.max_blocks = int32_t(t.max_blocks.value());
  s.idx_capacity = t.idx_capacity.value();
  s.mean_elements = t.mean_elements.value();
  return s;
}

fp_status check_index_sizes(const ProblemInfo& info, const fp_select_config& config) {
  const IndexSizeTerms t = index_size_terms(info, config);
  const struct {
    const char* name;
    Size size;
  } terms[] = {{"index segments (B * Hkv * max_q_tiles)", t.num_segments},
               {"index entries (idx_capacity)", t.idx_capacity},
               {"block-mean elements (B * Hkv * max_blocks * D)", t.mean_elements}};
  for (const auto& term : terms)
    if (!term.size.fits(kMaxElements))
      return fail(FP_ERROR_UNSUPPORTED,
                  format("the problem needs %s %s, more than 2^48", term.name,
                         term.size.ok() ? std::to_string(term.size.value()).c_str()
                                        : "beyond 2^63"));
  return FP_OK;
}

fp_status validate_index_buffers(const ProblemInfo& info, const fp_select_config& config,
                                 const fp_index* index, bool for_attention) {
  if (index == nullptr) return invalid("index is NULL");
  const fp_index_sizes s = index_sizes(info, config);
  if (!for_attention && s.idx_capacity >= (int64_t(1) << 31))
    return fail(FP_ERROR_UNSUPPORTED,
                format("the index would need %lld entries, more than int32 offsets address",
                       (long long)s.idx_capacity));
  if (index->cu == nullptr) return invalid("index->cu is NULL");
  if (index->idx == nullptr && s.idx_capacity > 0) return invalid("index->idx is NULL");
  if (!for_attention && index->idx_capacity < s.idx_capacity)
    return invalid(format("index->idx_capacity is %lld but the problem needs %lld",
                          (long long)index->idx_capacity, (long long)s.idx_capacity));
  const bool need_means = !for_attention || config.mean_correction;
  if (need_means && index->k_mean == nullptr && s.mean_elements > 0)
    return invalid("index->k_mean is NULL");
  if (config.mean_correction && index->v_mean == nullptr && s.mean_elements > 0)
    return invalid("index->v_mean is NULL but mean_correction is on");
  return FP_OK;
}

fp_status validate_output(const ProblemInfo& info, const fp_output* output) {
  if (output == nullptr) return invalid("output is NULL");
  const fp_problem& p = *info.p;
  return check_rows("out", output->out, p.total_q, output->out_stride_token,
                    output->out_stride_head, p.num_heads_q, p.head_dim);
}

fp_status require(const void* ptr, const char* name) {
  return ptr ? FP_OK : invalid(format("%s is NULL", name));
}

fp_status validate_attention(const ProblemInfo& info, const fp_select_config* config,
                             const fp_index* index, const fp_output* output) {
  if (index != nullptr)
    if (fp_status s = validate_index_buffers(info, *config, index, true); s != FP_OK) return s;
  if (fp_status s = validate_output(info, output); s != FP_OK) return s;
  if (info.p->device != FP_DEVICE_CUDA) return FP_OK;
  const bool means = index != nullptr && config->mean_correction;
  return cuda::check_attention_support(info, *output, means ? index : nullptr);
}

fp_status validate_given_index(const ProblemInfo& info, const fp_index& index,
                               std::vector<int32_t>* host_cu) {
  if (!info.has_host_metadata) return FP_OK;
  const fp_problem& p = *info.p;
  std::vector<int32_t> cu, idx;
  if (fp_status s = host_copy(p, index.cu, size_t(ref::num_segments(info)) + 1, cu); s != FP_OK)
    return s;
  if (fp_status s = ref::validate_index_offsets(info, cu.data(), index.idx_capacity); s != FP_OK)
    return s;
  if (cu.back() > 0 && index.idx == nullptr) return invalid("index->idx is NULL");
  if (fp_status s = host_copy(p, index.idx, size_t(cu.back()), idx); s != FP_OK) return s;
  if (fp_status s = ref::validate_index_tiles(info, cu.data(), idx.data()); s != FP_OK) return s;
  if (host_cu != nullptr) *host_cu = std::move(cu);
  return FP_OK;
}

fp_status validate_pooled_keys(const ProblemInfo& info, const int32_t* pooled_keys) {
  if (pooled_keys == nullptr || !info.has_host_metadata) return FP_OK;
  std::vector<int32_t> keys;
  if (fp_status s = host_copy(*info.p, pooled_keys, size_t(info.p->batch_size), keys); s != FP_OK)
    return s;
  for (int32_t b = 0; b < info.p->batch_size; ++b)
    if (keys[b] < 0 || keys[b] > info.len_kv[b])
      return invalid(format("pooled_keys[%d] = %d is outside [0, %d]", b, keys[b],
                            info.len_kv[b]));
  return FP_OK;
}

fp_status validate_workspace(const ProblemInfo& info, size_t need, const void* workspace,
                             size_t bytes) {
  const size_t align = info.p->device == FP_DEVICE_CUDA ? 256 : 16;
  if (reinterpret_cast<uintptr_t>(workspace) % align != 0)
    return invalid(format("workspace must be %zu-byte aligned", align));
  if (bytes < need)
    return fail(FP_ERROR_WORKSPACE_TOO_SMALL,
                format("workspace has %zu bytes but the call needs %zu", bytes, need));
  if (need > 0 && workspace == nullptr) return invalid("workspace is NULL");
  return FP_OK;
}

}  // namespace flashprefill
