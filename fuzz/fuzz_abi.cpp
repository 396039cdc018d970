// libFuzzer target over the C ABI (CPU path, built with ASan and UBSan by scripts/fuzz.sh).
// Each input decodes into a problem (contiguous or paged KV, varlen requests, GQA, any dtype, padded
// strides, loose or tight bounds), a selection config and at most one corruption of a field or a
// metadata entry. Every buffer is real and sized from the declared fields, so the library may read
// whatever they promise. Checks: every call returns FP_OK or an error with a message; a problem
// without corruption succeeds; a successful call writes every output element (finite, LSE
// included); dense attention matches an independent float64 attention; at alpha = 0 the prefill
// matches dense; fp_build_index + fp_sparse_attention match fp_prefill bit for bit; a corrupted
// foreign index is rejected or, when still valid, attended.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flashprefill/flashprefill.h"

namespace {

constexpr int64_t kMaxBufferElements = int64_t(1) << 22;
constexpr size_t kMaxWorkspace = size_t(64) << 20;

[[noreturn]] void crash(const char* what) {
  std::fprintf(stderr, "fuzz_abi: %s (last message: %s)\n", what, fp_last_error_message());
  std::abort();
}

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  int32_t below(int32_t n) { return int32_t(u8() % uint32_t(n)); }
  int32_t i32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | u8();
    return int32_t(v);
  }
  int64_t i64() { return int64_t(uint64_t(uint32_t(i32())) << 32 | uint32_t(i32())); }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
};

size_t element_bytes(fp_dtype t) { return t == FP_FLOAT32 ? 4 : 2; }

// m / 16 for |m| <= 32: exact in float32, bfloat16 and float16.
float value_of(uint64_t& state) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return float(int32_t(state >> 58) - 32) / 16.f;
}

uint16_t half_bits(float x) {
  if (x == 0.f) return 0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000, exp = ((u >> 23) & 0xff) - 112, mant = (u >> 13) & 0x3ff;
  return uint16_t(sign | exp << 10 | mant);
}

float half_value(uint16_t h) {
  if ((h & 0x7fff) == 0) return 0.f;
  const uint32_t u = uint32_t(h & 0x8000) << 16 | (((h >> 10) & 0x1f) + 112) << 23 | (h & 0x3ffu) << 13;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A tensor buffer of `elements` values of the dtype, every element an exact m / 16.
struct Tensor {
  fp_dtype dtype;
  std::vector<unsigned char> bytes;
  Tensor(fp_dtype t, int64_t elements, uint64_t seed) : dtype(t), bytes(size_t(elements) * element_bytes(t)) {
    for (int64_t i = 0; i < elements; ++i) {
      const float x = value_of(seed);
      uint32_t u;
      std::memcpy(&u, &x, 4);
      if (t == FP_FLOAT32) std::memcpy(&bytes[size_t(i) * 4], &x, 4);
      else {
        const uint16_t h = t == FP_BFLOAT16 ? uint16_t(u >> 16) : half_bits(x);
        std::memcpy(&bytes[size_t(i) * 2], &h, 2);
      }
    }
  }
  float at(int64_t i) const {
    if (dtype == FP_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes[size_t(i) * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[size_t(i) * 2], 2);
    if (dtype == FP_FLOAT16) return half_value(h);
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// Elements a strided tensor spans: 1 + sum (extent - 1) * stride, or -1 when it is not a buffer
// this harness allocates (non-positive strides or extents beyond the cap).
int64_t span(std::initializer_list<std::pair<int64_t, int64_t>> dims) {
  int64_t n = 1;
  for (auto [stride, extent] : dims) {
    if (extent <= 0) return 0;
    if (extent == 1) continue;  // any stride
    if (stride < 1 || stride > kMaxBufferElements || extent > kMaxBufferElements) return -1;
    n += (extent - 1) * stride;
    if (n > kMaxBufferElements) return -1;
  }
  return n;
}

struct Case {
  fp_problem p{};
  fp_select_config c{};
  std::vector<int32_t> lq, lk;  // the lengths the metadata describes before any corruption
  std::vector<int32_t> cu_q, cu_k, seqlens, table;
  int corruption = 0;
};

bool decode(Bytes& in, Case& k) {
  fp_problem& p = k.p;
  const int32_t B = 1 + in.below(3), hkv = 1 + in.below(2), g = 1 + in.below(4);
  const int32_t dims[] = {1, 8, 16, 33, 1, 8, 16, 64};
  p.device = FP_DEVICE_CPU;
  p.dtype = fp_dtype(in.below(3));
  p.batch_size = B;
  p.num_heads_q = hkv * g;
  p.num_heads_kv = hkv;
  p.head_dim = dims[in.below(8)];
  p.softmax_scale = in.below(4) == 0 ? 0.05f * float(1 + in.below(40)) : 0.f;
  k.cu_q = {0};
  k.cu_k = {0};
  for (int32_t b = 0; b < B; ++b) {
    const int32_t lq = in.below(4) == 0 ? 0 : in.below(72);
    const int32_t lk = lq + (in.below(3) == 0 ? 0 : in.below(110));
    k.lq.push_back(lq);
    k.lk.push_back(lk);
    k.cu_q.push_back(k.cu_q.back() + lq);
    k.cu_k.push_back(k.cu_k.back() + lk);
    k.seqlens.push_back(lk);
  }
  int32_t max_q = 0, max_k = 0;
  for (int32_t b = 0; b < B; ++b) {
    max_q = std::max(max_q, k.lq[b]);
    max_k = std::max(max_k, k.lk[b]);
  }
  const int32_t pad = in.below(3) * 8;  // extra elements between heads and between tokens
  p.q_stride_head = p.head_dim + pad;
  p.q_stride_token = int64_t(p.num_heads_q) * p.q_stride_head + pad;
  p.total_q = k.cu_q.back();
  p.max_seqlen_q = in.below(4) == 0 ? INT32_MAX - in.below(3) : max_q + in.below(2) * in.below(200);
  p.max_seqlen_k = in.below(4) == 0 ? INT32_MAX - in.below(3) : max_k + in.below(2) * in.below(200);
  p.k_stride_head = p.v_stride_head = p.head_dim + pad;
  p.k_stride_token = p.v_stride_token = int64_t(hkv) * p.k_stride_head;
  if (in.below(2) == 0) {
    p.kv_layout = FP_KV_CONTIGUOUS;
    p.total_k = k.cu_k.back();
  } else {
    p.kv_layout = FP_KV_PAGED;
    p.page_size = 1 + in.below(70);
    int32_t pages = 0, width = 1;
    for (int32_t lk : k.lk) width = std::max(width, (lk + p.page_size - 1) / p.page_size);
    p.max_pages_per_seq = width + in.below(2);
    p.num_pages = 1;  // a spare page
    for (int32_t lk : k.lk) p.num_pages += (lk + p.page_size - 1) / p.page_size;
    k.table.assign(size_t(B) * p.max_pages_per_seq, -1);
    const int32_t shift = in.u8();  // pages in a rotated order
    for (int32_t b = 0; b < B; ++b)
      for (int32_t i = 0; i < (k.lk[b] + p.page_size - 1) / p.page_size; ++i)
        k.table[size_t(b) * p.max_pages_per_seq + i] = (pages++ + shift) % p.num_pages;
    p.k_stride_page = p.v_stride_page = int64_t(p.page_size) * p.k_stride_token + in.below(2) * 8;
  }
  fp_select_config& c = k.c;
  fp_select_config_default(&c);
  c.block_size = 64 * (1 + in.below(3));
  c.alpha = in.below(3) == 0 ? 0.f : float(in.below(101)) / 100.f;
  c.sink_tokens = in.below(4) * 64;
  c.window_tokens = in.below(4) * 64;
  c.dense_recent_tiles = in.below(3);
  c.mean_correction = in.below(2);
  // At most one corruption: a field or a metadata entry set to a fuzzed value.
  k.corruption = in.below(4) == 0 ? 1 + in.below(16) : 0;
  const int32_t value = in.below(2) ? in.below(300) - 20 : in.i32();
  auto entry = [&](std::vector<int32_t>& v) {
    if (!v.empty()) v[size_t(in.below(int32_t(std::min<size_t>(v.size(), 255))))] = value;
  };
  switch (k.corruption) {
    case 1: entry(k.cu_q); break;
    case 2: entry(p.kv_layout == FP_KV_PAGED ? k.seqlens : k.cu_k); break;
    case 3: entry(k.table); break;
    case 4: p.max_seqlen_q = value; break;
    case 5: p.max_seqlen_k = value; break;
    case 6: p.q_stride_token = in.i64(); break;
    case 7: p.k_stride_head = value; break;
    case 8: p.flags = uint32_t(in.i32()); break;
    case 9: p.total_q = value; break;
    case 10: p.page_size = value; break;
    case 11: p.num_pages = value; break;
    case 12: c.block_size = value; break;
    case 13: c.sink_tokens = value; c.window_tokens = in.i32(); break;
    case 14: std::memcpy(&c.alpha, &value, 4); break;
    case 15: p.num_heads_q = value; break;
    case 16: p.v_stride_page = in.i64(); break;
  }
  p.cu_seqlens_q = k.cu_q.data();
  if (p.kv_layout == FP_KV_CONTIGUOUS) {
    p.cu_seqlens_k = k.cu_k.data();
  } else {
    p.seqlens_k = k.seqlens.data();
    p.page_table = k.table.data();
  }
  return true;
}

// Exact causal attention in float64 over the problem as declared (only for uncorrupted cases).
std::vector<double> exact_attention(const Case& k, const Tensor& q, const Tensor& kt, const Tensor& vt) {
  const fp_problem& p = k.p;
  const int32_t D = p.head_dim, g = p.num_heads_q / p.num_heads_kv;
  const double scale = p.softmax_scale > 0 ? p.softmax_scale : 1.0 / std::sqrt(double(D));
  std::vector<double> out(size_t(p.total_q) * p.num_heads_q * D);
  auto kv_offset = [&](int32_t b, int32_t j, int32_t h, bool value) {
    const int64_t head = int64_t(h) * (value ? p.v_stride_head : p.k_stride_head);
    if (p.kv_layout == FP_KV_CONTIGUOUS) return (k.cu_k[b] + int64_t(j)) * p.k_stride_token + head;
    const int32_t page = k.table[size_t(b) * p.max_pages_per_seq + j / p.page_size];
    return page * (value ? p.v_stride_page : p.k_stride_page) + (j % p.page_size) * p.k_stride_token + head;
  };
  for (int32_t b = 0; b < p.batch_size; ++b)
    for (int32_t h = 0; h < p.num_heads_q; ++h) {
      std::vector<float> keys(size_t(k.lk[b]) * D), values(keys.size());
      for (int32_t j = 0; j < k.lk[b]; ++j)
        for (int32_t d = 0; d < D; ++d) {
          keys[size_t(j) * D + d] = kt.at(kv_offset(b, j, h / g, false) + d);
          values[size_t(j) * D + d] = vt.at(kv_offset(b, j, h / g, true) + d);
        }
      for (int32_t i = 0; i < k.lq[b]; ++i) {
        const int32_t pos = k.lk[b] - k.lq[b] + i;
        const int64_t qrow = (k.cu_q[b] + int64_t(i)) * p.q_stride_token + h * p.q_stride_head;
        std::vector<double> s(pos + 1);
        double m = -INFINITY, sum = 0;
        for (int32_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < D; ++d) dot += double(q.at(qrow + d)) * keys[size_t(j) * D + d];
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double* o = &out[((k.cu_q[b] + size_t(i)) * p.num_heads_q + h) * D];
        for (int32_t j = 0; j <= pos; ++j) {
          const double w = std::exp(s[j] - m);
          sum += w;
          for (int32_t d = 0; d < D; ++d) o[d] += w * values[size_t(j) * D + d];
        }
        for (int32_t d = 0; d < D; ++d) o[d] /= sum;
      }
    }
  return out;
}

// Output buffer with padded strides, poisoned; after a successful call every element must be
// finite (and the LSE too).
struct OutputBuffer {
  const fp_problem& p;
  Tensor data;
  std::vector<float> lse;
  fp_output view{};
  OutputBuffer(const fp_problem& problem, int64_t elements, int64_t stride_token, int64_t stride_head)
      : p(problem), data(problem.dtype, elements, 0) {
    std::memset(data.bytes.data(), 0xff, data.bytes.size());  // NaN in every dtype
    lse.assign(size_t(std::max<int64_t>(problem.total_q, 0)) * size_t(std::max(problem.num_heads_q, 0)),
               NAN);
    view = fp_output{data.bytes.data(), stride_token, stride_head, lse.data()};
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for (int64_t t = 0; t < p.total_q; ++t)
      for (int32_t h = 0; h < p.num_heads_q; ++h)
        for (int32_t d = 0; d < p.head_dim; ++d) {
          const float x = data.at(t * view.out_stride_token + h * view.out_stride_head + d);
          if (!std::isfinite(x)) crash("a successful call left an output element unwritten");
          v.push_back(x);
        }
    // NaN is the poison; -inf is a row that sees no key (docs/ALGORITHM.md: O = 0, lse = -inf),
    // which a foreign index can make.
    for (float x : lse) {
      if (std::isnan(x)) crash("a successful call left an LSE element unwritten");
      if (x == INFINITY) crash("a successful call wrote an LSE of +inf");
    }
    return v;
  }
};

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

void expect(fp_status s, bool must_succeed, const char* call) {
  if (s != FP_OK && fp_last_error_message()[0] == '\0') crash("an error without a message");
  if (s != FP_OK && must_succeed) {
    std::fprintf(stderr, "fuzz_abi: %s failed on a valid problem\n", call);
    crash("a valid problem was refused");
  }
}

std::vector<unsigned char>* workspace_for(fp_status s, size_t bytes, std::vector<unsigned char>& ws) {
  if (s != FP_OK || bytes > kMaxWorkspace) return nullptr;
  ws.assign(bytes + 16, 0);
  return &ws;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  Case k;
  if (!decode(in, k)) return 0;
  fp_problem& p = k.p;
  // Buffers as the declared fields describe them. Where they cannot be allocated (non-positive
  // or huge strides, huge extents) only the size queries run, which read no tensor data.
  const bool valid = k.corruption == 0;
  const int64_t heads_q = std::max(p.num_heads_q, 0), dim = std::max(p.head_dim, 0);
  const int64_t kv_head = std::max(p.k_stride_head, p.v_stride_head);
  const int64_t q_span = span({{p.q_stride_token, p.total_q}, {p.q_stride_head, heads_q}, {1, dim}});
  const int64_t kv_span =
      p.kv_layout == FP_KV_CONTIGUOUS
          ? span({{p.k_stride_token, p.total_k}, {kv_head, p.num_heads_kv}, {1, dim}})
          : span({{std::max(p.k_stride_page, p.v_stride_page), p.num_pages},
                  {p.k_stride_token, p.page_size}, {kv_head, p.num_heads_kv}, {1, dim}});
  const int64_t out_head = std::max<int64_t>(dim, 1) + 8 * in.below(2);
  const int64_t out_token = std::max<int64_t>(heads_q, 1) * out_head;
  const int64_t out_span = span({{out_token, p.total_q}, {out_head, heads_q}, {1, dim}});
  if (q_span < 0 || kv_span < 0 || out_span < 0 || heads_q * std::max<int64_t>(p.total_q, 0) > kMaxBufferElements) {
    if (valid) crash("the harness built an unallocatable valid problem");
    static float placeholder[1];
    p.q = p.k = p.v = placeholder;
    size_t bytes;
    fp_index_sizes sizes;
    expect(fp_dense_attention_workspace_size(&p, &bytes), false, "size query");
    expect(fp_prefill_workspace_size(&p, &k.c, &bytes), false, "size query");
    expect(fp_build_index_workspace_size(&p, &k.c, &bytes), false, "size query");
    expect(fp_sparse_attention_workspace_size(&p, &k.c, &bytes), false, "size query");
    expect(fp_index_sizes_query(&p, &k.c, &sizes), false, "size query");
    return 0;
  }
  const uint64_t seed = uint64_t(in.u8()) + 1;
  const Tensor q(p.dtype, std::max<int64_t>(q_span, 1), seed);
  const Tensor kt(p.dtype, std::max<int64_t>(kv_span, 1), seed * 3);
  const Tensor vt(p.dtype, std::max<int64_t>(kv_span, 1), seed * 7);
  p.q = q.bytes.data();
  p.k = kt.bytes.data();
  p.v = vt.bytes.data();

  std::vector<unsigned char> ws;
  size_t bytes = 0;
  fp_status s = fp_dense_attention_workspace_size(&p, &bytes);
  expect(s, valid, "fp_dense_attention_workspace_size");
  OutputBuffer dense(p, std::max<int64_t>(out_span, 1), out_token, out_head);
  std::vector<double> dense_values;
  if (auto* w = workspace_for(s, bytes, ws)) {
    s = fp_dense_attention(&p, &dense.view, w->data(), bytes);
    expect(s, valid, "fp_dense_attention");
    if (s == FP_OK) dense_values = dense.values();
    if (s == FP_OK && valid) {
      const double tol = p.dtype == FP_FLOAT32 ? 1e-5 : 1e-2;
      if (rel_l2(dense_values, exact_attention(k, q, kt, vt)) > tol) crash("dense attention is not exact attention");
    }
  }

  s = fp_prefill_workspace_size(&p, &k.c, &bytes);
  expect(s, valid, "fp_prefill_workspace_size");
  OutputBuffer prefill(p, std::max<int64_t>(out_span, 1), out_token, out_head);
  std::vector<double> prefill_values;
  if (auto* w = workspace_for(s, bytes, ws)) {
    s = fp_prefill(&p, &k.c, &prefill.view, w->data(), bytes);
    expect(s, valid, "fp_prefill");
    if (s == FP_OK) prefill_values = prefill.values();
    if (s == FP_OK && k.c.alpha == 0.f && !dense_values.empty()) {
      const double tol = p.dtype == FP_FLOAT32 ? 1e-5 : 1e-2;
      if (rel_l2(prefill_values, dense_values) > tol) crash("prefill at alpha = 0 is not dense attention");
    }
  }

  // The two stages with the caller's index, then the same index corrupted in one entry.
  fp_index_sizes sizes{};
  s = fp_index_sizes_query(&p, &k.c, &sizes);
  expect(s, valid, "fp_index_sizes_query");
  if (s != FP_OK || sizes.idx_capacity > kMaxBufferElements || sizes.mean_elements > kMaxBufferElements ||
      sizes.num_segments > kMaxBufferElements)
    return 0;
  std::vector<int32_t> cu(size_t(sizes.num_segments) + 1), idx(size_t(std::max<int64_t>(sizes.idx_capacity, 1)));
  std::vector<float> k_mean(size_t(std::max<int64_t>(sizes.mean_elements, 1))), v_mean(k_mean.size());
  fp_index index{cu.data(), idx.data(), k_mean.data(), v_mean.data(), sizes.idx_capacity};
  s = fp_build_index_workspace_size(&p, &k.c, &bytes);
  expect(s, valid, "fp_build_index_workspace_size");
  auto* w = workspace_for(s, bytes, ws);
  if (w == nullptr) return 0;
  s = fp_build_index(&p, &k.c, &index, w->data(), bytes);
  expect(s, valid, "fp_build_index");
  if (s != FP_OK) return 0;
  OutputBuffer staged(p, std::max<int64_t>(out_span, 1), out_token, out_head);
  s = fp_sparse_attention_workspace_size(&p, &k.c, &bytes);
  expect(s, valid, "fp_sparse_attention_workspace_size");
  if ((w = workspace_for(s, bytes, ws)) == nullptr) return 0;
  s = fp_sparse_attention(&p, &k.c, &index, &staged.view, w->data(), bytes);
  expect(s, valid, "fp_sparse_attention");
  if (s == FP_OK && !prefill_values.empty() && staged.values() != prefill_values)
    crash("fp_build_index + fp_sparse_attention differ from fp_prefill");
  double density = 0;
  expect(fp_index_density(&p, &k.c, &index, &density), valid, "fp_index_density");
  // Chunked prefill: pooling again from pooled_keys[b] on, then selecting under
  // FP_FLAG_MEANS_POOLED, gives the same index.
  std::vector<int32_t> pooled(size_t(p.batch_size));
  for (size_t b = 0; b < pooled.size(); ++b)
    pooled[b] = b < k.lk.size() ? in.below(2) * in.below(k.lk[b] + 1) : 0;
  if (in.below(8) == 0 && !pooled.empty()) pooled[0] = in.i32();
  s = fp_pool_kv(&p, &k.c, k_mean.data(), k.c.mean_correction ? v_mean.data() : nullptr, pooled.data());
  expect(s, false, "fp_pool_kv");
  if (s == FP_OK && (p.flags & FP_FLAG_MEANS_POOLED) == 0) {
    const std::vector<int32_t> cu0 = cu, idx0 = idx;
    fp_problem pooled_problem = p;
    pooled_problem.flags |= FP_FLAG_MEANS_POOLED;
    s = fp_build_index(&pooled_problem, &k.c, &index, w->data(), ws.size() - 16);
    expect(s, valid, "fp_build_index (means pooled)");
    if (s == FP_OK && (cu != cu0 || idx != idx0)) crash("the index over re-pooled means differs");
  }
  if (in.below(2) == 0) {
    const int32_t value = in.below(2) ? in.below(40) - 4 : in.i32();
    if (in.below(2) == 0) cu[size_t(in.i32() & 0x7fffffff) % cu.size()] = value;
    else idx[size_t(in.i32() & 0x7fffffff) % idx.size()] = value;
    index.idx_capacity = sizes.idx_capacity - in.below(3);  // never more than idx holds
    OutputBuffer foreign(p, std::max<int64_t>(out_span, 1), out_token, out_head);
    s = fp_sparse_attention(&p, &k.c, &index, &foreign.view, w->data(), bytes);
    expect(s, false, "fp_sparse_attention");
    if (s == FP_OK) foreign.values();
    expect(fp_index_density(&p, &k.c, &index, &density), false, "fp_index_density");
  }
  return 0;
}
