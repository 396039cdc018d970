// GPU check of the attention operator through the public C ABI: every CUDA result is compared
// against the CPU reference on the same index (device=CPU vs device=CUDA) and, for exact
// attention, against float32 attention. Outputs are poisoned first, inputs are fresh random
// data each run (the seed is printed). Exit status 0 when every check passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "flashprefill/flashprefill.h"
#include "gpu_check.hpp"

namespace {

using flashprefill::SeqGeometry;

constexpr double kTolerance = 1e-2;  // relative L2, docs/ALGORITHM.md
constexpr double kLseTolerance = 2e-2;

std::mt19937_64 rng;
int failures = 0, checks = 0;

uint16_t to_half_bits(float x, fp_dtype dt) {
  uint16_t h;
  if (dt == FP_BFLOAT16) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x);
    std::memcpy(&h, &b, 2);
  } else {
    const __half b = __float2half_rn(x);
    std::memcpy(&h, &b, 2);
  }
  return h;
}
float from_half_bits(uint16_t h, fp_dtype dt) {
  if (dt == FP_BFLOAT16) {
    __nv_bfloat16 b;
    std::memcpy(&b, &h, 2);
    return __bfloat162float(b);
  }
  __half b;
  std::memcpy(&b, &h, 2);
  return __half2float(b);
}

struct Geometry {
  std::string name;
  fp_dtype dtype = FP_BFLOAT16;
  int head_dim = 128, heads_q = 8, heads_kv = 2;
  std::vector<int> len_q, len_kv;
  int block_size = 128;
  bool cpu_dense = true;  // the CPU dense reference is affordable
};

// Host inputs: q [total_q, Hq, D], k / v [total_k, Hkv, D] in the dtype (raw bits) and widened.
struct Inputs {
  Geometry g;
  std::vector<int32_t> cu_q, cu_k;
  int64_t total_q = 0, total_k = 0;
  std::vector<uint16_t> q, k, v;
  std::vector<float> qf, kf, vf;
};

Inputs make_inputs(const Geometry& g) {
  Inputs in;
  in.g = g;
  const int B = int(g.len_q.size()), D = g.head_dim;
  in.cu_q.assign(B + 1, 0);
  in.cu_k.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    in.cu_q[b + 1] = in.cu_q[b] + g.len_q[b];
    in.cu_k[b + 1] = in.cu_k[b] + g.len_kv[b];
  }
  in.total_q = in.cu_q[B];
  in.total_k = in.cu_k[B];
  // Structure: every fifth 128-key block shares a direction with the queries, so that the
  // index stage has blocks to prefer and to drop.
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> u(D);
  for (auto& x : u) x = 0.7f * normal(rng);
  auto fill = [&](std::vector<uint16_t>& bits, std::vector<float>& wide, int64_t rows, int heads,
                  bool queries) {
    bits.resize(size_t(rows) * heads * D);
    wide.resize(bits.size());
    for (int64_t r = 0; r < rows; ++r) {
      int64_t pos = r;
      if (!queries) {
        const int b = int(std::upper_bound(in.cu_k.begin(), in.cu_k.end(), int32_t(r)) -
                          in.cu_k.begin()) - 1;
        pos = r - in.cu_k[b];
      }
      const bool heavy = queries || (pos / 128) % 5 == 0;
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t i = (size_t(r) * heads + h) * D + d;
          const float x = normal(rng) + (heavy ? u[d] : 0.f);
          bits[i] = to_half_bits(x, g.dtype);
          wide[i] = from_half_bits(bits[i], g.dtype);
        }
    }
  };
  fill(in.q, in.qf, in.total_q, g.heads_q, true);
  fill(in.k, in.kf, in.total_k, g.heads_kv, false);
  in.v.resize(in.k.size());
  in.vf.resize(in.k.size());
  for (size_t i = 0; i < in.v.size(); ++i) {
    in.v[i] = to_half_bits(normal(rng), g.dtype);
    in.vf[i] = from_half_bits(in.v[i], g.dtype);
  }
  return in;
}

int max_of(const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// The CPU problem (contiguous, host pointers); `wide` selects float32 copies of the inputs.
fp_problem cpu_problem(const Inputs& in, bool wide) {
  const Geometry& g = in.g;
  fp_problem p{};
  p.device = FP_DEVICE_CPU;
  p.dtype = wide ? FP_FLOAT32 : g.dtype;
  p.batch_size = int32_t(g.len_q.size());
  p.num_heads_q = g.heads_q;
  p.num_heads_kv = g.heads_kv;
  p.head_dim = g.head_dim;
  p.q = wide ? static_cast<const void*>(in.qf.data()) : in.q.data();
  p.q_stride_token = int64_t(g.heads_q) * g.head_dim;
  p.q_stride_head = g.head_dim;
  p.total_q = in.total_q;
  p.cu_seqlens_q = in.cu_q.data();
  p.max_seqlen_q = max_of(g.len_q);
  p.kv_layout = FP_KV_CONTIGUOUS;
  p.k = wide ? static_cast<const void*>(in.kf.data()) : in.k.data();
  p.v = wide ? static_cast<const void*>(in.vf.data()) : in.v.data();
  p.k_stride_token = p.v_stride_token = int64_t(g.heads_kv) * g.head_dim;
  p.k_stride_head = p.v_stride_head = g.head_dim;
  p.max_seqlen_k = max_of(g.len_kv);
  p.total_k = in.total_k;
  p.cu_seqlens_k = in.cu_k.data();
  return p;
}

// A paged layout: pages of page_size keys in shuffled order; with gaps, one poisoned token
// between pages (the kernel cannot read the pool as one tensor); mostly in order, the pages in
// order except that some trade places with another (runs of consecutive pages, which the
// kernel may read as one box, broken at random; make_device).
struct Paging {
  int page_size = 0;  // 0: contiguous
  bool gaps = false;
  bool mostly_in_order = false;
  bool alternating = false;  // even requests' pages in order, odd requests' shuffled
  int v_pad = 0;  // poisoned elements after each V page (K's pages stay back to back): V's
                  // page stride then shares only a 16-byte unit with its token stride
  std::string name() const {
    return std::to_string(page_size) + (gaps ? " with gaps" : "") +
           (mostly_in_order ? " mostly in order" : "") +
           (alternating ? " in order and shuffled by request" : "") +
           (v_pad ? " V padded by " + std::to_string(v_pad) : "");
  }
};

// Device copies of the inputs, contiguous or paged.
struct DeviceInputs {
  DeviceBuffer<uint16_t> q, k, v;
  DeviceBuffer<int32_t> cu_q, cu_k, seqlens_k, page_table;
  fp_problem p{};
};

void make_device(const Inputs& in, const Paging& paging, DeviceInputs& dev) {
  const Geometry& g = in.g;
  const int B = int(g.len_q.size()), D = g.head_dim, Hkv = g.heads_kv;
  dev.p = cpu_problem(in, false);
  dev.p.device = FP_DEVICE_CUDA;
  dev.q.upload(in.q);
  dev.cu_q.upload(in.cu_q);
  dev.p.q = dev.q.ptr;
  dev.p.cu_seqlens_q = dev.cu_q.ptr;
  const bool gaps = paging.gaps;
  const int page_size = paging.page_size;
  if (page_size == 0) {
    dev.k.upload(in.k);
    dev.v.upload(in.v);
    dev.cu_k.upload(in.cu_k);
    dev.p.k = dev.k.ptr;
    dev.p.v = dev.v.ptr;
    dev.p.cu_seqlens_k = dev.cu_k.ptr;
    return;
  }
  int max_pages = 1, num_pages = 2;  // two spare pages that no request uses
  int even_pages = 0;                // pages of the even requests
  for (int b = 0; b < B; ++b) {
    const int n = int(flashprefill::ceil_div(g.len_kv[b], page_size));
    max_pages = std::max(max_pages, n + 1);
    num_pages += n;
    if (b % 2 == 0) even_pages += n;
  }
  std::vector<int32_t> order(num_pages);
  std::iota(order.begin(), order.end(), 0);
  int next_even = 0, next_odd = even_pages;  // alternating: cursors into order
  if (paging.alternating) {
    // The even requests take the pool's first pages in order (one run each), the odd ones the
    // rest shuffled: in one batch, requests with runs and without.
    std::shuffle(order.begin() + even_pages, order.end(), rng);
  } else if (paging.mostly_in_order) {
    // One page in max(4, 256 / page_size) trades places: about every 256 keys at small pages,
    // so that runs of 128 consecutive keys both occur and break.
    const uint32_t one_in = uint32_t(std::max(4, 256 / page_size));
    for (int i = 0; i < num_pages; ++i)
      if (rng() % one_in == 0) std::swap(order[i], order[rng() % num_pages]);
  } else {
    std::shuffle(order.begin(), order.end(), rng);
  }
  std::vector<int32_t> table(size_t(B) * max_pages, -1);  // unused entries must not be read
  const size_t page_elems = size_t(page_size + (gaps ? 1 : 0)) * Hkv * D;
  const size_t v_page_elems = page_elems + size_t(paging.v_pad);
  std::vector<uint16_t> kp(page_elems * num_pages, 0xFFFF), vp(v_page_elems * num_pages, 0xFFFF);
  int next = 0;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < g.len_kv[b]; ++j) {
      if (j % page_size == 0)
        table[size_t(b) * max_pages + j / page_size] =
            order[!paging.alternating ? next++ : b % 2 == 0 ? next_even++ : next_odd++];
      const int32_t page = table[size_t(b) * max_pages + j / page_size];
      const size_t in_page = size_t(j % page_size) * Hkv * D;
      const size_t src = size_t(in.cu_k[b] + j) * Hkv * D;
      std::copy_n(in.k.begin() + src, Hkv * D, kp.begin() + size_t(page) * page_elems + in_page);
      std::copy_n(in.v.begin() + src, Hkv * D, vp.begin() + size_t(page) * v_page_elems + in_page);
    }
  std::vector<int32_t> lens(g.len_kv.begin(), g.len_kv.end());
  dev.k.upload(kp);
  dev.v.upload(vp);
  dev.seqlens_k.upload(lens);
  dev.page_table.upload(table);
  dev.p.kv_layout = FP_KV_PAGED;
  dev.p.k = dev.k.ptr;
  dev.p.v = dev.v.ptr;
  dev.p.k_stride_page = int64_t(page_elems);
  dev.p.v_stride_page = int64_t(v_page_elems);
  dev.p.cu_seqlens_k = nullptr;
  dev.p.total_k = 0;
  dev.p.num_pages = num_pages;
  dev.p.page_size = page_size;
  dev.p.page_table = dev.page_table.ptr;
  dev.p.max_pages_per_seq = max_pages;
  dev.p.seqlens_k = dev.seqlens_k.ptr;
}

// A host index: CSR + pooled means.
struct HostIndex {
  std::vector<int32_t> cu, idx;
  std::vector<float> k_mean, v_mean;
  fp_index view() {
    return fp_index{cu.data(), idx.data(), k_mean.data(), v_mean.data(), int64_t(idx.size())};
  }
};

HostIndex build_cpu_index(const Inputs& in, const fp_select_config& config) {
  const fp_problem p = cpu_problem(in, false);
  fp_index_sizes sizes;
  FP_OK_OR_DIE(fp_index_sizes_query(&p, &config, &sizes));
  HostIndex ix;
  ix.cu.assign(sizes.num_segments + 1, 0);
  ix.idx.assign(std::max<int64_t>(sizes.idx_capacity, 1), 0);
  ix.k_mean.assign(std::max<int64_t>(sizes.mean_elements, 1), 0.f);
  ix.v_mean.assign(ix.k_mean.size(), 0.f);
  size_t ws = 0;
  FP_OK_OR_DIE(fp_build_index_workspace_size(&p, &config, &ws));
  std::vector<char> workspace(ws + 1);
  fp_index view = ix.view();
  FP_OK_OR_DIE(fp_build_index(&p, &config, &view, workspace.data(), ws));
  return ix;
}

// Replaces the CSR by random ascending subsets of the causal tiles, keeping the means.
void randomize_csr(const Inputs& in, HostIndex& ix, double density) {
  const Geometry& g = in.g;
  const int B = int(g.len_q.size()), group = g.heads_q / g.heads_kv;
  const int max_q_tiles = int(flashprefill::ceil_div(int64_t(group) * max_of(g.len_q), 128));
  std::bernoulli_distribution keep(density);
  std::vector<int32_t> idx;
  std::fill(ix.cu.begin(), ix.cu.end(), 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < g.heads_kv; ++h)
      for (int I = 0; I < max_q_tiles; ++I) {
        const int64_t s = flashprefill::segment_id(b, h, I, g.heads_kv, max_q_tiles);
        const SeqGeometry seq{g.len_q[b], g.len_kv[b], group};
        if (I < seq.num_q_tiles())
          for (int t = 0; t < seq.causal_tiles(I); ++t)
            if (keep(rng)) idx.push_back(t);
        ix.cu[s + 1] = int32_t(idx.size());
      }
  std::copy(idx.begin(), idx.end(), ix.idx.begin());
}

struct Result {
  std::vector<float> out;  // widened, [total_q, Hq, D]
  std::vector<float> lse;  // [Hq, total_q]
};

Result widen(const std::vector<uint16_t>& bits, std::vector<float> lse, fp_dtype dt) {
  Result r;
  r.out.resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) r.out[i] = from_half_bits(bits[i], dt);
  r.lse = std::move(lse);
  return r;
}

// fp_sparse_attention (index != nullptr) or fp_dense_attention on the CPU.
Result run_cpu(const Inputs& in, const fp_select_config* config, HostIndex* ix, bool wide) {
  const fp_problem p = cpu_problem(in, wide);
  const size_t n = size_t(in.total_q) * in.g.heads_q * in.g.head_dim;
  std::vector<float> lse(size_t(in.g.heads_q) * in.total_q + 1);
  fp_output o{};
  o.out_stride_token = int64_t(in.g.heads_q) * in.g.head_dim;
  o.out_stride_head = in.g.head_dim;
  o.lse = lse.data();
  std::vector<uint16_t> bits(wide ? 0 : n + 1);
  std::vector<float> wide_out(wide ? n + 1 : 0);
  o.out = wide ? static_cast<void*>(wide_out.data()) : bits.data();
  if (ix) {
    fp_index view = ix->view();
    FP_OK_OR_DIE(fp_sparse_attention(&p, config, &view, &o, nullptr, 0));
  } else {
    FP_OK_OR_DIE(fp_dense_attention(&p, &o, nullptr, 0));
  }
  lse.resize(lse.size() - 1);
  if (wide) {
    wide_out.resize(n);
    return Result{wide_out, lse};
  }
  bits.resize(n);
  return widen(bits, lse, in.g.dtype);
}

// The same call on the GPU with poisoned output and LSE, under `tuning` (zero: the heuristics).
// out_pad > 0 spaces the output's heads out_pad elements apart (rows no longer 16-byte aligned:
// the epilogue's element-pair stores).
Result run_gpu(const Inputs& in, const DeviceInputs& dev, const fp_select_config* config,
               HostIndex* ix, fp_attention_tuning tuning, int out_pad = 0) {
  fp_problem p = dev.p;
  p.tuning = tuning;
  const size_t n = size_t(in.total_q) * in.g.heads_q * in.g.head_dim;
  const int64_t head_stride = in.g.head_dim + out_pad;
  const size_t stored = size_t(in.total_q) * in.g.heads_q * size_t(head_stride);
  DeviceBuffer<uint16_t> out(std::max<size_t>(stored, 1));
  DeviceBuffer<float> lse(std::max<size_t>(size_t(in.g.heads_q) * in.total_q, 1));
  CUDA_OK(cudaMemset(out.ptr, 0xFF, out.count * 2));  // NaN in bf16 and fp16
  CUDA_OK(cudaMemset(lse.ptr, 0xFF, lse.count * 4));
  fp_output o{};
  o.out = out.ptr;
  o.out_stride_token = int64_t(in.g.heads_q) * head_stride;
  o.out_stride_head = head_stride;
  o.lse = lse.ptr;
  size_t ws = 0;
  DeviceBuffer<int32_t> cu, idx;
  DeviceBuffer<float> km, vm;
  if (ix) {
    FP_OK_OR_DIE(fp_sparse_attention_workspace_size(&p, config, &ws));
    cu.upload(ix->cu);
    idx.upload(ix->idx);
    km.upload(ix->k_mean);
    vm.upload(ix->v_mean);
  } else {
    FP_OK_OR_DIE(fp_dense_attention_workspace_size(&p, &ws));
  }
  DeviceBuffer<char> workspace(ws);
  if (ix) {
    fp_index view{cu.ptr, idx.ptr, km.ptr, vm.ptr, int64_t(ix->idx.size())};
    FP_OK_OR_DIE(fp_sparse_attention(&p, config, &view, &o, workspace.ptr, ws));
  } else {
    FP_OK_OR_DIE(fp_dense_attention(&p, &o, workspace.ptr, ws));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> padded = out.download();
  std::vector<float> l = lse.download();
  std::vector<uint16_t> bits(n);
  for (size_t row = 0; row < n / size_t(in.g.head_dim); ++row)
    std::copy_n(padded.begin() + ptrdiff_t(row * size_t(head_stride)), in.g.head_dim,
                bits.begin() + ptrdiff_t(row * size_t(in.g.head_dim)));
  l.resize(size_t(in.g.heads_q) * in.total_q);
  return widen(bits, l, in.g.dtype);
}

void compare(const std::string& what, const Result& got, const Result& want) {
  double num = 0, den = 0, lse_err = 0;
  size_t nan = 0, lse_mismatch = 0;
  for (size_t i = 0; i < got.out.size(); ++i) {
    if (!std::isfinite(got.out[i])) {
      ++nan;
      continue;
    }
    const double d = double(got.out[i]) - want.out[i];
    num += d * d;
    den += double(want.out[i]) * want.out[i];
  }
  for (size_t i = 0; i < got.lse.size(); ++i) {
    const float a = got.lse[i], b = want.lse[i];
    if (std::isnan(a) || (std::isinf(a) != std::isinf(b))) {
      ++lse_mismatch;
      continue;
    }
    if (std::isfinite(a)) lse_err = std::max(lse_err, double(std::fabs(a - b)));
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const bool ok = nan == 0 && lse_mismatch == 0 && rel <= kTolerance && lse_err <= kLseTolerance;
  ++checks;
  if (!ok) ++failures;
  std::printf("%-4s %-64s rel_l2 %.2e  lse_err %.1e  nonfinite %zu  lse_bad %zu\n",
              ok ? "ok" : "FAIL", what.c_str(), rel, lse_err, nan, lse_mismatch);
  std::fflush(stdout);
}

// Float32 exact attention on the GPU, one warp per (token, query head): the reference for
// lengths where the CPU would take minutes.
template <int D>
__global__ void float_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                const int32_t* cu_q, const int32_t* cu_k, int Hq, int Hkv,
                                bool bf16, float scale, int64_t total_q, float* out, float* lse) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= total_q * Hq) return;
  const int64_t token = row / Hq;
  const int head = int(row % Hq), kv_head = head / (Hq / Hkv);
  int b = 0;
  while (cu_q[b + 1] <= token) ++b;
  const int len_q = cu_q[b + 1] - cu_q[b], len_kv = cu_k[b + 1] - cu_k[b];
  const int pos = len_kv - len_q + int(token - cu_q[b]);
  auto load = [&](const uint16_t* p) {
    return bf16 ? __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p))
                : __half2float(*reinterpret_cast<const __half*>(p));
  };
  float qr[D], acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    qr[d] = load(q + (token * Hq + head) * D + d) * scale;
    acc[d] = 0.f;
  }
  float mx = -INFINITY, sum = 0.f;
  for (int j = lane; j <= pos; j += 32) {
    const int64_t kr = (int64_t(cu_k[b] + j) * Hkv + kv_head) * D;
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < D; ++d) s += qr[d] * load(k + kr + d);
    const float m2 = fmaxf(mx, s), f = expf(mx - m2), e = expf(s - m2);
    sum = sum * f + e;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * f + e * load(v + kr + d);
    mx = m2;
  }
  float gmax = mx;
  for (int o = 16; o > 0; o >>= 1) gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, o));
  const float f = mx == -INFINITY ? 0.f : expf(mx - gmax);
  float total = sum * f;
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
#pragma unroll
  for (int d = 0; d < D; ++d) {
    float a = acc[d] * f;
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) out[(token * Hq + head) * D + d] = a / total;
  }
  if (lane == 0) lse[int64_t(head) * total_q + token] = gmax + logf(total);
}

Result run_gpu_float_reference(const Inputs& in, DeviceInputs& dev) {
  const Geometry& g = in.g;
  const size_t n = size_t(in.total_q) * g.heads_q * g.head_dim;
  DeviceBuffer<float> out(n), lse(size_t(g.heads_q) * in.total_q);
  DeviceBuffer<int32_t> cu_k;
  cu_k.upload(in.cu_k);
  const DeviceBuffer<uint16_t>& k = dev.k;  // contiguous in this use
  const int64_t rows = in.total_q * g.heads_q;
  const unsigned blocks = unsigned((rows + 3) / 4);
  const float scale = 1.f / std::sqrt(float(g.head_dim));
  const bool bf16 = g.dtype == FP_BFLOAT16;
  if (g.head_dim == 64)
    float_attention<64><<<blocks, 128>>>(dev.q.ptr, k.ptr, dev.v.ptr, dev.cu_q.ptr, cu_k.ptr,
                                         g.heads_q, g.heads_kv, bf16, scale, in.total_q, out.ptr,
                                         lse.ptr);
  else
    float_attention<128><<<blocks, 128>>>(dev.q.ptr, k.ptr, dev.v.ptr, dev.cu_q.ptr, cu_k.ptr,
                                          g.heads_q, g.heads_kv, bf16, scale, in.total_q, out.ptr,
                                          lse.ptr);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  return Result{out.download(), lse.download()};
}

fp_select_config config_with(double alpha, bool correction, int block_size) {
  fp_select_config c;
  fp_select_config_default(&c);
  c.alpha = float(alpha);
  c.mean_correction = correction ? 1 : 0;
  c.block_size = block_size;
  return c;
}

// Every check of one geometry; pagings lists the paged layouts to run besides contiguous. Pages
// of a multiple of 16 keys that lie back to back go through TMA, in boxes of gcd(page size, 64)
// rows (pairs of tiles in one box where their rows are consecutive); the others through cp.async.
void check_geometry(const Geometry& g, const std::vector<Paging>& pagings, bool full) {
  const Inputs in = make_inputs(g);
  DeviceInputs dev;
  make_device(in, Paging{}, dev);
  const std::string tag = g.name + (g.dtype == FP_BFLOAT16 ? " bf16" : " fp16") + " D" +
                          std::to_string(g.head_dim) + " g" + std::to_string(g.heads_q / g.heads_kv);

  // Exact attention: dense mode vs the CPU (float64 accumulation) and float32 attention.
  const fp_attention_tuning heuristic{};
  const Result gpu_dense = run_gpu(in, dev, nullptr, nullptr, heuristic);
  if (g.cpu_dense) {
    compare(tag + " dense vs cpu", gpu_dense, run_cpu(in, nullptr, nullptr, false));
    compare(tag + " dense vs float32", gpu_dense, run_cpu(in, nullptr, nullptr, true));
  } else {
    compare(tag + " dense vs gpu float32", gpu_dense, run_gpu_float_reference(in, dev));
  }
  compare(tag + " dense split 3 vs 1", run_gpu(in, dev, nullptr, nullptr, {3, 0, 0}), gpu_dense);
  compare(tag + " dense, head sections of 1, 1 lead tile",
          run_gpu(in, dev, nullptr, nullptr, {0, 1, 1}), gpu_dense);
  compare(tag + " dense, heads 2 elements apart", run_gpu(in, dev, nullptr, nullptr, heuristic, 2),
          gpu_dense);

  // alpha = 0 selects everything: sparse mode equals exact attention.
  if (full) {
    fp_select_config c0 = config_with(0.0, false, g.block_size);
    HostIndex all = build_cpu_index(in, c0);
    compare(tag + " alpha=0 sparse vs dense", run_gpu(in, dev, &c0, &all, heuristic), gpu_dense);
  }

  // Structured index with and without mean correction, random index, splits.
  for (const bool correction : {false, true}) {
    const fp_select_config c = config_with(full ? 0.1 : 0.0, correction, g.block_size);
    const std::string ct = correction ? " corr" : " nocorr";
    HostIndex ix;
    if (full) {
      ix = build_cpu_index(in, c);
      compare(tag + " alpha=0.1" + ct, run_gpu(in, dev, &c, &ix, heuristic), run_cpu(in, &c, &ix, false));
    } else {
      ix = build_cpu_index(in, config_with(1.0, correction, g.block_size));
    }
    HostIndex rnd = ix;
    randomize_csr(in, rnd, full ? 0.3 : 0.05);
    const Result cpu_rnd = run_cpu(in, &c, &rnd, false);
    const Result gpu_rnd = run_gpu(in, dev, &c, &rnd, heuristic);
    compare(tag + " random index" + ct, gpu_rnd, cpu_rnd);
    compare(tag + " random index" + ct + " split 4", run_gpu(in, dev, &c, &rnd, {4, 0, 0}), cpu_rnd);
    for (const Paging& paging : pagings) {
      DeviceInputs paged;
      make_device(in, paging, paged);
      const std::string pt = paging.name();
      compare(tag + " random index" + ct + " paged " + pt, run_gpu(in, paged, &c, &rnd, heuristic),
              cpu_rnd);
      if (!correction)
        compare(tag + " dense paged " + pt, run_gpu(in, paged, nullptr, nullptr, heuristic), gpu_dense);
    }
  }
}

// The CUDA stage's own limits (beyond the API's validation): each call fails with
// FP_ERROR_UNSUPPORTED and a message naming the limit, and writes nothing.
void check_unsupported(const Geometry& g) {
  const Inputs in = make_inputs(g);
  DeviceInputs dev;
  make_device(in, Paging{16, true}, dev);
  const size_t n = size_t(in.total_q) * g.heads_q * g.head_dim;
  DeviceBuffer<uint16_t> out(n);
  CUDA_OK(cudaMemset(out.ptr, 0xFF, n * 2));
  fp_output o{};
  o.out = out.ptr;
  o.out_stride_token = int64_t(g.heads_q) * g.head_dim;
  o.out_stride_head = g.head_dim;
  struct Case {
    const char* what;
    void (*edit)(fp_problem&);
    const char* message;  // a part of fp_last_error_message()
  };
  const Case cases[] = {
      // A pool of 2^28 pages: K's (17 tokens apart, the gap) and V's (16 tokens and 8 elements
      // apart, a 16-byte unit) last row numbers both pass 2^32 (the pool is never read).
      {"paged pool past 2^32 rows",
       [](fp_problem& p) {
         p.v_stride_page = int64_t(p.page_size) * p.v_stride_token + 8;
         p.num_pages = 1 << 28;
       },
       "2^32"},
      {"stride not a multiple of 8", [](fp_problem& p) { p.q_stride_token += 4; }, "multiples of 8"},
      {"q not 16-byte aligned",
       [](fp_problem& p) { p.q = static_cast<const uint16_t*>(p.q) + 4; }, "16-byte aligned"},
  };
  for (const Case& c : cases) {
    fp_problem p = dev.p;
    c.edit(p);
    size_t ws = 0;
    fp_status s = fp_dense_attention_workspace_size(&p, &ws);
    DeviceBuffer<char> workspace(std::max<size_t>(ws, 1));
    if (s == FP_OK) s = fp_dense_attention(&p, &o, workspace.ptr, ws);
    CUDA_OK(cudaDeviceSynchronize());
    const std::string message = fp_last_error_message();
    const std::vector<uint16_t> written = out.download();
    const bool untouched =
        std::all_of(written.begin(), written.end(), [](uint16_t x) { return x == 0xFFFF; });
    const bool ok = s == FP_ERROR_UNSUPPORTED && message.find(c.message) != std::string::npos &&
                    untouched;
    ++checks;
    if (!ok) ++failures;
    std::printf("%-4s unsupported: %-51s %s: %s\n", ok ? "ok" : "FAIL", c.what,
                fp_status_string(s), message.c_str());
  }
}

Geometry geometry(std::string name, fp_dtype dt, int D, int hq, int hkv, std::vector<int> lq,
                  std::vector<int> lkv, int block_size = 128) {
  Geometry g;
  g.name = std::move(name);
  g.dtype = dt;
  g.head_dim = D;
  g.heads_q = hq;
  g.heads_kv = hkv;
  g.len_q = std::move(lq);
  g.len_kv = std::move(lkv);
  g.block_size = block_size;
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 0;
  if (!start_check(argc, argv, seed)) return 2;
  rng.seed(seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const bool small_only = argc > 2 && std::strcmp(argv[2], "small") == 0;
  const fp_dtype bf = FP_BFLOAT16, hf = FP_FLOAT16;

  check_geometry(geometry("L1", bf, 128, 4, 1, {1}, {1}), {{1}}, true);
  check_geometry(geometry("L129", hf, 64, 6, 2, {129}, {129}),
                 {{8}, {16}, {64}, {128}, {1, false, true}, {16, false, true}, {64, false, true}},
                 true);
  check_unsupported(geometry("L129", hf, 64, 6, 2, {129}, {129}));
  if (!small_only) {
    check_geometry(geometry("L63", bf, 128, 8, 2, {63}, {63}), {{16}}, true);
    check_geometry(geometry("L4097 bs256", bf, 128, 8, 2, {4097}, {4097}, 256), {}, true);
    check_geometry(geometry("L4097", hf, 128, 4, 4, {4097}, {4097}), {{64, false, true}}, true);
    check_geometry(geometry("mixed+prefix", bf, 128, 8, 2, {1, 100, 700, 0, 257},
                            {1000, 165, 700, 64, 2000}),
                   {{1}, {1, false, true}, {1, false, false, true}, {8}, {8, false, true}, {16},
                    {16, false, false, true}, {32}, {32, false, true}, {48}, {64}, {64, true},
                    {64, false, true}, {100}, {100, false, true}, {100, false, false, true},
                    {128}, {128, false, true}, {192}, {1, false, false, false, 8},
                    {100, false, false, false, 8}, {64, false, false, false, 8}},
                   true);
    check_geometry(geometry("mixed+prefix", hf, 64, 10, 2, {33, 0, 300}, {3000, 5, 301}),
                   {{1}, {16}, {16, false, true}, {96}, {100}, {64, false, true}}, true);
    check_geometry(geometry("chunked", bf, 128, 8, 2, {256, 300}, {8192, 5000}),
                   {{1, false, true}, {1, false, false, true}, {16}, {16, false, true}, {32},
                    {16, true}, {256}, {64, false, true}},
                   true);
    Geometry big = geometry("L100003", bf, 64, 2, 1, {100003}, {100003});
    big.cpu_dense = false;
    check_geometry(big, {}, false);
  }
  std::printf("%s: %d of %d checks passed\n", failures ? "FAIL" : "PASS", checks - failures, checks);
  return failures ? 1 : 0;
}
