// GPU check of the index stage: the public C ABI with device = CPU (the reference) and device =
// CUDA on the same inputs, compared per docs/ALGORITHM.md (pooled means within bf16 rounding,
// identical CSR except blocks inside the near-threshold band), for bfloat16, float16 and FP8
// e4m3 q, k and v (descales per request and KV head, per tensor or none), the public pooling and
// FP_FLAG_MEANS_POOLED against it, plus CUDA-graph capture and replay, incremental pooling, and
// the errors bad inputs get. Fresh random inputs every run; every GPU output is poisoned first.
// Exit status 0 only when every case passes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "cuda/index/pool.cuh"
#include "flashprefill/flashprefill.h"
#include "reference/numerics.hpp"
#include "gpu_check.hpp"

namespace {

using flashprefill::BlockGeometry;
using flashprefill::SeqGeometry;

uint64_t seed() {
  static const uint64_t value = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  return value;
}

std::mt19937_64& rng() {
  static std::mt19937_64 gen(seed());
  return gen;
}

enum class Data { kRandom, kStructured };

// The descale factors of an e4m3 case's q, k and v (docs/ALGORITHM.md "FP8 e4m3"): none (NULL,
// c = 1), one per tensor (both strides 0), or one per (request, KV head) as FA3's [B, Hkv]
// tensors, or as their transpose [Hkv, B] (stride_batch 1).
enum class Descales { kNone, kPerTensor, kPerHead, kPerHeadTransposed };

struct Case {
  std::string name;
  std::vector<int32_t> len_q, len_kv;
  int32_t heads_q = 4, heads_kv = 1, head_dim = 128;
  fp_dtype dtype = FP_BFLOAT16;
  int32_t page_size = 0;  // 0 = contiguous KV
  Data data = Data::kStructured;
  fp_select_config config{};
  Descales descales = Descales::kPerHead;  // e4m3 cases only
};

bool is_e4m3(const Case& c) { return c.dtype == FP_FLOAT8_E4M3; }

// One tensor's descales: c(b, h) = factors[b * stride_batch + h * stride_head].
struct DescaleSet {
  std::vector<float> factors;
  int64_t stride_batch = 0, stride_head = 0;
  float at(int32_t b, int32_t h) const {
    return factors.empty() ? 1.f : factors[b * stride_batch + h * stride_head];
  }
};

// Host data of one case in the dtype's storage (2 or 1 bytes an element; e4m3 with its
// descales: stored value = round_e4m3(x / c)), and its device copies.
struct Problem {
  const Case& c;
  int32_t batch, max_q = 0, max_kv = 0, num_pages = 0, max_pages = 0;
  size_t elem;  // bytes per element
  std::vector<int32_t> cu_q{0}, cu_k{0}, seqlens_k, page_table;
  std::vector<uint8_t> q, k, v;  // q [total_q, Hq, D]; k, v [total_k or pages*ps, Hkv, D]
  DescaleSet descale[3];         // q, k, v (e4m3 only)
  DeviceBuffer<uint8_t> dq, dk, dv;
  DeviceBuffer<float> ddescale[3];
  DeviceBuffer<int32_t> dcu_q, dcu_k, dseqlens_k, dpage_table;

  explicit Problem(const Case& cs)
      : c(cs), batch(int32_t(cs.len_q.size())), elem(is_e4m3(cs) ? 1 : 2) {
    for (int32_t b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + c.len_q[b]);
      cu_k.push_back(cu_k.back() + c.len_kv[b]);
      seqlens_k.push_back(c.len_kv[b]);
      max_q = std::max(max_q, c.len_q[b]);
      max_kv = std::max(max_kv, c.len_kv[b]);
    }
    fill();
    if (c.page_size > 0) page();
    dq = DeviceBuffer<uint8_t>(q.size());
    dq.upload(q);
    upload_kv();
    for (int t = 0; t < 3; ++t)
      if (!descale[t].factors.empty()) {
        ddescale[t] = DeviceBuffer<float>(descale[t].factors.size());
        ddescale[t].upload(descale[t].factors);
      }
    dcu_q = DeviceBuffer<int32_t>(cu_q.size());
    dcu_q.upload(cu_q);
    dcu_k = DeviceBuffer<int32_t>(cu_k.size());
    dcu_k.upload(cu_k);
    dseqlens_k = DeviceBuffer<int32_t>(seqlens_k.size());
    dseqlens_k.upload(seqlens_k);
    if (!page_table.empty()) {
      dpage_table = DeviceBuffer<int32_t>(page_table.size());
      dpage_table.upload(page_table);
    }
  }

  // Element i of a tensor: stores x (the real value; e4m3: x / c, c = the descale of (b, h)),
  // and reads the stored value back, widened (e4m3: the e4m3 value, not dequantized).
  void put(std::vector<uint8_t>& t, size_t i, float x, float scale = 1.f) const {
    namespace ref = flashprefill::ref;
    if (is_e4m3(c)) {
      t[i] = ref::float_to_e4m3(x * (1.f / scale));
      return;
    }
    const uint16_t bits = c.dtype == FP_BFLOAT16 ? ref::float_to_bf16(x) : ref::float_to_fp16(x);
    std::memcpy(&t[2 * i], &bits, 2);
  }
  float get(const std::vector<uint8_t>& t, size_t i) const {
    namespace ref = flashprefill::ref;
    if (is_e4m3(c)) return ref::e4m3_to_float(t[i]);
    uint16_t bits;
    std::memcpy(&bits, &t[2 * i], 2);
    return c.dtype == FP_BFLOAT16 ? ref::bf16_to_float(bits) : ref::fp16_to_float(bits);
  }

  // Structured data: each KV head has a direction u; keys of block J carry strength s_J along
  // it and queries lean towards it, so block energies spread over orders of magnitude. e4m3:
  // quantized with descales from each (request, KV head)'s largest |x| (c = max|x| / 448 times
  // a random factor in [1, 4), so the heads' factors differ), as the case's Descales says.
  void fill() {
    const int32_t d = c.head_dim, hq = c.heads_q, hkv = c.heads_kv, g = hq / hkv;
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> uniform(-1.f, 1.5f);
    const bool structured = c.data == Data::kStructured;
    const float noise = structured ? 0.5f : 1.f;
    std::vector<float> dir(size_t(hkv) * d);
    for (auto& x : dir) x = normal(rng());
    const int32_t bs = 64;  // strengths vary per 64 keys, finer than any block
    std::vector<float> strength(size_t(hkv) * (max_kv / bs + 1));
    for (auto& s : strength) s = uniform(rng());
    std::vector<float> qf(size_t(cu_q.back()) * hq * d);
    for (int64_t t = 0; t < cu_q.back(); ++t)
      for (int32_t h = 0; h < hq; ++h)
        for (int32_t i = 0; i < d; ++i) {
          const float lean = structured ? 0.5f * dir[size_t(h / g) * d + i] : 0.f;
          qf[(size_t(t) * hq + h) * d + i] = noise * normal(rng()) + lean;
        }
    std::vector<float> kf(size_t(cu_k.back()) * hkv * d), vf(kf.size());
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t j = 0; j < c.len_kv[b]; ++j)
        for (int32_t h = 0; h < hkv; ++h) {
          const float s = structured ? strength[size_t(h) * (max_kv / bs + 1) + j / bs] : 0.f;
          for (int32_t i = 0; i < d; ++i) {
            const size_t at = (size_t(cu_k[b] + j) * hkv + h) * d + i;
            kf[at] = noise * normal(rng()) + s * dir[size_t(h) * d + i];
            vf[at] = normal(rng());
          }
        }
    if (is_e4m3(c)) {
      choose_descales(0, qf, cu_q, hq);
      choose_descales(1, kf, cu_k, hkv);
      choose_descales(2, vf, cu_k, hkv);
    }
    encode(0, qf, q, cu_q, hq);
    encode(1, kf, k, cu_k, hkv);
    encode(2, vf, v, cu_k, hkv);
  }

  // The descales of tensor t (0 = q, 1 = k, 2 = v) for its float values x, whose rows of
  // request b are cu[b] .. cu[b + 1], `heads` heads each (a KV head's group for q).
  void choose_descales(int t, const std::vector<float>& x, const std::vector<int32_t>& cu,
                       int32_t heads) {
    const int32_t hkv = c.heads_kv, group = heads / hkv, d = c.head_dim;
    DescaleSet& s = descale[t];
    if (c.descales == Descales::kNone) return;
    std::uniform_real_distribution<float> factor(1.f, 4.f);
    std::vector<float> amax(size_t(batch) * hkv, 0.f);
    for (int32_t b = 0; b < batch; ++b)
      for (int64_t r = cu[b]; r < cu[b + 1]; ++r)
        for (int32_t h = 0; h < heads; ++h)
          for (int32_t i = 0; i < d; ++i) {
            float& a = amax[size_t(b) * hkv + h / group];
            a = std::max(a, std::fabs(x[(size_t(r) * heads + h) * d + i]));
          }
    if (c.descales == Descales::kPerTensor) {
      const float all = *std::max_element(amax.begin(), amax.end());
      s.factors = {all > 0.f ? all / 448.f * factor(rng()) : 1.f};
      return;
    }
    const bool transposed = c.descales == Descales::kPerHeadTransposed;
    s.stride_batch = transposed ? 1 : hkv;
    s.stride_head = transposed ? batch : 1;
    s.factors.assign(size_t(batch) * hkv, 1.f);
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t h = 0; h < hkv; ++h) {
        const float a = amax[size_t(b) * hkv + h];
        s.factors[b * s.stride_batch + h * s.stride_head] =
            a > 0.f ? a / 448.f * factor(rng()) : 1.f;
      }
  }

  // Stores the float values x of tensor t into `out`, with the descale of each row's (request,
  // KV head).
  void encode(int t, const std::vector<float>& x, std::vector<uint8_t>& out,
              const std::vector<int32_t>& cu, int32_t heads) const {
    const int32_t group = heads / c.heads_kv, d = c.head_dim;
    out.assign(x.size() * elem, 0);
    for (int32_t b = 0; b < batch; ++b)
      for (int64_t r = cu[b]; r < cu[b + 1]; ++r)
        for (int32_t h = 0; h < heads; ++h) {
          const float scale = descale[t].at(b, h / group);
          for (int32_t i = 0; i < d; ++i) {
            const size_t at = (size_t(r) * heads + h) * d + i;
            put(out, at, x[at], scale);
          }
        }
  }

  // Fresh values for every stored element, layout and descales unchanged.
  void scramble() {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (auto* t : {&q, &k, &v})
      for (size_t i = 0; i < t->size() / elem; ++i)
        put(*t, i, is_e4m3(c) ? 64.f * normal(rng()) : normal(rng()));
  }

  // Moves the keys into shuffled pages; unused table entries hold out-of-range page ids.
  void page() {
    const int32_t ps = c.page_size;
    const size_t row = size_t(c.heads_kv) * c.head_dim * elem;  // bytes of one token
    for (int32_t b = 0; b < batch; ++b)
      max_pages = std::max<int32_t>(max_pages, int32_t((c.len_kv[b] + ps - 1) / ps));
    max_pages += 1;
    std::vector<int32_t> order;
    for (int32_t b = 0; b < batch; ++b) num_pages += (c.len_kv[b] + ps - 1) / ps;
    num_pages += 1;  // one spare page nobody uses
    for (int32_t i = 0; i < num_pages; ++i) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng());
    page_table.assign(size_t(batch) * max_pages, num_pages + 7);
    std::vector<uint8_t> kc(size_t(num_pages) * ps * row), vc(kc.size());
    for (size_t i = 0; i < kc.size() / elem; ++i) {  // rows no key maps to: poison for the pooling
      put(kc, i, 1e4f);
      put(vc, i, 1e4f);
    }
    int32_t next = 0;
    for (int32_t b = 0; b < batch; ++b)
      for (int32_t j = 0; j < c.len_kv[b]; ++j) {
        if (j % ps == 0) page_table[size_t(b) * max_pages + j / ps] = order[next++];
        const int32_t pg = page_table[size_t(b) * max_pages + j / ps];
        std::memcpy(&kc[(size_t(pg) * ps + j % ps) * row], &k[size_t(cu_k[b] + j) * row], row);
        std::memcpy(&vc[(size_t(pg) * ps + j % ps) * row], &v[size_t(cu_k[b] + j) * row], row);
      }
    k.swap(kc);
    v.swap(vc);
  }

  void upload_kv() {
    dk = DeviceBuffer<uint8_t>(k.size());
    dk.upload(k);
    dv = DeviceBuffer<uint8_t>(v.size());
    dv.upload(v);
  }

  // The problem on `device`: host pointers for the CPU, device copies for CUDA.
  fp_problem view(fp_device device, cudaStream_t stream = nullptr) const {
    const bool gpu = device == FP_DEVICE_CUDA;
    fp_problem p{};
    p.device = device;
    p.stream = stream;
    p.dtype = c.dtype;
    p.batch_size = batch;
    p.num_heads_q = c.heads_q;
    p.num_heads_kv = c.heads_kv;
    p.head_dim = c.head_dim;
    p.q = gpu ? static_cast<const void*>(dq.ptr) : q.data();
    p.q_stride_token = int64_t(c.heads_q) * c.head_dim;
    p.q_stride_head = c.head_dim;
    p.total_q = cu_q.back();
    p.cu_seqlens_q = gpu ? dcu_q.ptr : cu_q.data();
    p.max_seqlen_q = max_q;
    p.k = gpu ? static_cast<const void*>(dk.ptr) : k.data();
    p.v = gpu ? static_cast<const void*>(dv.ptr) : v.data();
    p.k_stride_token = p.v_stride_token = int64_t(c.heads_kv) * c.head_dim;
    p.k_stride_head = p.v_stride_head = c.head_dim;
    p.max_seqlen_k = max_kv;
    if (c.page_size > 0) {
      p.kv_layout = FP_KV_PAGED;
      p.k_stride_page = p.v_stride_page = int64_t(c.page_size) * c.heads_kv * c.head_dim;
      p.num_pages = num_pages;
      p.page_size = c.page_size;
      p.page_table = gpu ? dpage_table.ptr : page_table.data();
      p.max_pages_per_seq = max_pages;
      p.seqlens_k = gpu ? dseqlens_k.ptr : seqlens_k.data();
    } else {
      p.kv_layout = FP_KV_CONTIGUOUS;
      p.total_k = cu_k.back();
      p.cu_seqlens_k = gpu ? dcu_k.ptr : cu_k.data();
    }
    const float* factors[3];
    for (int t = 0; t < 3; ++t)
      factors[t] = descale[t].factors.empty() ? nullptr
                   : gpu                      ? ddescale[t].ptr
                                              : descale[t].factors.data();
    p.q_descale = factors[0];
    p.k_descale = factors[1];
    p.v_descale = factors[2];
    p.q_descale_stride_batch = descale[0].stride_batch;
    p.q_descale_stride_head = descale[0].stride_head;
    p.k_descale_stride_batch = descale[1].stride_batch;
    p.k_descale_stride_head = descale[1].stride_head;
    p.v_descale_stride_batch = descale[2].stride_batch;
    p.v_descale_stride_head = descale[2].stride_head;
    return p;
  }

  // Query row vector of packed row r of (b, h) as the scoring operand: widened (e4m3: q~).
  std::vector<float> query(int32_t b, int32_t h, int64_t r) const {
    const int32_t g = c.heads_q / c.heads_kv, d = c.head_dim;
    const int64_t token = cu_q[b] + r / g;
    const int32_t head = h * g + int32_t(r % g);
    std::vector<float> out(d);
    for (int32_t i = 0; i < d; ++i) out[i] = get(q, (size_t(token) * c.heads_q + head) * d + i);
    return out;
  }
  // rho of a pooled key mean of (b, h) (docs/ALGORITHM.md): the dtype's rounding, or e4m3
  // round_e4m3(mean * (1 / c_k)).
  float rho(float mean, int32_t b, int32_t h) const {
    namespace ref = flashprefill::ref;
    if (is_e4m3(c)) return ref::round_to_e4m3(mean * (1.f / descale[1].at(b, h)));
    return ref::round_to_dtype(mean, c.dtype);
  }
  // The factor of q~ . rho(k_mean) in the logits of (b, h): c_q c_k (1 unless e4m3).
  double logit_descale(int32_t b, int32_t h) const {
    return double(descale[0].at(b, h)) * descale[1].at(b, h);
  }
};

// Index buffers of one run: host for the CPU reference, device (poisoned) for CUDA.
struct HostIndex {
  std::vector<int32_t> cu, idx;
  std::vector<float> k_mean, v_mean;
};

struct GpuIndex {
  DeviceBuffer<int32_t> cu, idx;
  DeviceBuffer<float> k_mean, v_mean;
  DeviceBuffer<char> workspace;
  size_t workspace_bytes = 0;
  fp_index view{};
  GpuIndex(const fp_index_sizes& s, size_t ws)
      : cu(s.num_segments + 1), idx(std::max<int64_t>(s.idx_capacity, 1)),
        k_mean(std::max<int64_t>(s.mean_elements, 1)), v_mean(std::max<int64_t>(s.mean_elements, 1)),
        workspace(std::max<size_t>(ws, 1)), workspace_bytes(ws) {
    view = fp_index{cu.ptr, idx.ptr, k_mean.ptr, v_mean.ptr, s.idx_capacity};
  }
  void poison() {
    cu.poison();
    idx.poison();
    k_mean.poison();
    v_mean.poison();
    workspace.poison();
  }
  HostIndex download() const {
    return HostIndex{cu.download(), idx.download(), k_mean.download(), v_mean.download()};
  }
};

// fp_build_index on CUDA into poisoned buffers of sizes s, with the workspace it asks for
// (its size into *ws_out when given); the index and means as the host reads them back.
HostIndex run_cuda(const fp_problem& gp, const fp_select_config& config, const fp_index_sizes& s,
                   size_t* ws_out = nullptr) {
  size_t ws = 0;
  FP_OK_OR_DIE(fp_build_index_workspace_size(&gp, &config, &ws));
  GpuIndex gi(s, ws);
  gi.poison();
  FP_OK_OR_DIE(fp_build_index(&gp, &config, &gi.view, gi.workspace.ptr, ws));
  CUDA_OK(cudaDeviceSynchronize());
  if (ws_out != nullptr) *ws_out = ws;
  return gi.download();
}

HostIndex run_cpu(const Problem& pr, const fp_select_config& config, const fp_index_sizes& s) {
  const fp_problem p = pr.view(FP_DEVICE_CPU);
  HostIndex out{std::vector<int32_t>(s.num_segments + 1), std::vector<int32_t>(s.idx_capacity + 1),
                std::vector<float>(s.mean_elements + 1), std::vector<float>(s.mean_elements + 1)};
  fp_index index{out.cu.data(), out.idx.data(), out.k_mean.data(), out.v_mean.data(),
                 s.idx_capacity};
  size_t ws = 0;
  FP_OK_OR_DIE(fp_build_index_workspace_size(&p, &config, &ws));
  std::vector<char> workspace(ws + 1);
  FP_OK_OR_DIE(fp_build_index(&p, &config, &index, workspace.data(), ws));
  return out;
}

struct Result {
  bool ok = true;
  std::string detail;
  int64_t segments = 0, tiles = 0, band_blocks = 0;
  double max_mean_err = 0;
  void fail(const std::string& why) {
    if (ok) detail = why;
    ok = false;
  }
};

// R_J = E_J / E_max of one segment in float64 from the reference's pooled means, rounded by rho
// (e4m3: with the keys' descale, and the logits times c_q c_k).
std::vector<double> energy_ratios(const Problem& pr, const fp_select_config& config,
                                  const HostIndex& ref, int32_t max_blocks, int32_t b, int32_t h,
                                  int32_t tile) {
  const int32_t g = pr.c.heads_q / pr.c.heads_kv, d = pr.c.head_dim;
  const SeqGeometry seq{pr.c.len_q[b], pr.c.len_kv[b], g};
  const BlockGeometry blocks{config.block_size, seq.len_kv};
  const int32_t candidates = blocks.num_candidates(seq.pmax(tile));
  const double scale = 1.0 / std::sqrt(double(d)) * 1.4426950408889634 * pr.logit_descale(b, h);
  std::vector<float> kbar(size_t(candidates) * d);
  for (int32_t j = 0; j < candidates; ++j)
    for (int32_t i = 0; i < d; ++i)
      kbar[size_t(j) * d + i] =
          pr.rho(ref.k_mean[((size_t(b) * pr.c.heads_kv + h) * max_blocks + j) * d + i], b, h);
  std::vector<std::vector<double>> x;
  double m = -INFINITY;
  for (int64_t r = seq.tile_row_begin(tile); r < seq.tile_row_end(tile); ++r) {
    const std::vector<float> qr = pr.query(b, h, r);
    std::vector<double> row(candidates, -INFINITY);
    for (int32_t j = 0; j < candidates && blocks.begin(j) <= seq.position(r); ++j) {
      row[j] = flashprefill::ref::dot_f64(qr.data(), &kbar[size_t(j) * d], d) * scale;
      m = std::max(m, row[j]);
    }
    x.push_back(std::move(row));
  }
  std::vector<double> e(candidates, 0.0);
  for (const auto& row : x)
    for (int32_t j = 0; j < candidates; ++j)
      if (row[j] != -INFINITY) e[j] += std::exp2(row[j] - m);
  const double peak = *std::max_element(e.begin(), e.end());
  for (double& v : e) v /= peak;
  return e;
}

// Pooled means within 2^-8 relative (plus a float32 floor) over every block a request has.
void compare_means(const Problem& pr, const fp_select_config& config, const fp_index_sizes& s,
                   const std::vector<float>& want, const std::vector<float>& got,
                   const char* name, Result& res) {
  const int32_t d = pr.c.head_dim;
  for (int32_t b = 0; b < pr.batch; ++b) {
    const BlockGeometry blocks{config.block_size, pr.c.len_kv[b]};
    for (int32_t h = 0; h < pr.c.heads_kv; ++h)
      for (int32_t j = 0; j < blocks.num_blocks(); ++j)
        for (int32_t i = 0; i < d; ++i) {
          const size_t at = ((size_t(b) * pr.c.heads_kv + h) * s.max_blocks + j) * d + i;
          const double err = std::fabs(double(got[at]) - want[at]);
          res.max_mean_err = std::max(res.max_mean_err, err);
          if (!(err <= std::ldexp(std::fabs(want[at]), -8) + 1e-5)) {
            res.fail(std::string(name) + " differs at b=" + std::to_string(b) + " h=" +
                     std::to_string(h) + " J=" + std::to_string(j) + " d=" + std::to_string(i) +
                     ": " + std::to_string(got[at]) + " vs " + std::to_string(want[at]));
            return;
          }
        }
  }
}

void compare_index(const Problem& pr, const fp_select_config& config, const fp_index_sizes& s,
                   const HostIndex& ref, const HostIndex& gpu, Result& res) {
  const int32_t g = pr.c.heads_q / pr.c.heads_kv;
  const int32_t per_block = config.block_size / 64;
  if (gpu.cu[0] != 0) return res.fail("cu[0] != 0");
  for (int64_t seg = 0; seg < s.num_segments; ++seg) {
    const int32_t tile = int32_t(seg % s.max_q_tiles);
    const int32_t h = int32_t(seg / s.max_q_tiles % pr.c.heads_kv);
    const int32_t b = int32_t(seg / s.max_q_tiles / pr.c.heads_kv);
    const SeqGeometry seq{pr.c.len_q[b], pr.c.len_kv[b], g};
    const int32_t gb = gpu.cu[seg], ge = gpu.cu[seg + 1];
    const std::string where = "segment " + std::to_string(seg) + " (b=" + std::to_string(b) +
                              " h=" + std::to_string(h) + " I=" + std::to_string(tile) + ")";
    if (ge < gb || ge > s.idx_capacity) return res.fail("cu out of order at " + where);
    if (tile >= seq.num_q_tiles()) {
      if (ge != gb) return res.fail(where + " is past the request but lists tiles");
      continue;
    }
    ++res.segments;
    res.tiles += ge - gb;
    const int32_t causal = seq.causal_tiles(tile);
    for (int32_t i = gb; i < ge; ++i)
      if (gpu.idx[i] < 0 || gpu.idx[i] >= causal || (i > gb && gpu.idx[i] <= gpu.idx[i - 1]))
        return res.fail(where + " is not ascending inside [0, T_c)");
    std::set<int32_t> want_blocks, got_blocks;
    for (int32_t i = ref.cu[seg]; i < ref.cu[seg + 1]; ++i) want_blocks.insert(ref.idx[i] / per_block);
    for (int32_t i = gb; i < ge; ++i) got_blocks.insert(gpu.idx[i] / per_block);
    std::vector<int32_t> differ;
    std::set_symmetric_difference(want_blocks.begin(), want_blocks.end(), got_blocks.begin(),
                                  got_blocks.end(), std::back_inserter(differ));
    if (differ.empty()) {
      const bool same = std::equal(ref.idx.begin() + ref.cu[seg], ref.idx.begin() + ref.cu[seg + 1],
                                   gpu.idx.begin() + gb, gpu.idx.begin() + ge) &&
                        ref.cu[seg + 1] - ref.cu[seg] == ge - gb;
      if (!same) return res.fail(where + " lists the same blocks with different tiles");
      continue;
    }
    // Only blocks whose ratio lies within 1e-3 alpha of alpha may differ (docs/ALGORITHM.md).
    // e4m3: rho rounds a mean to e4m3, whose steps are 2^-4: a mean whose summation-order noise
    // straddles a rounding midpoint moves by a whole step on one side, and with it the ratio by
    // far more than the band. There a block may also differ when the GPU's decision is the one
    // its own means give (the means themselves are compared with the reference's above).
    const std::vector<double> ratio = energy_ratios(pr, config, ref, s.max_blocks, b, h, tile);
    std::vector<double> own_ratio;
    if (pr.elem == 1) own_ratio = energy_ratios(pr, config, gpu, s.max_blocks, b, h, tile);
    for (int32_t j : differ) {
      const double band = 1e-3 * config.alpha + 1e-5;
      const bool selected = got_blocks.count(j) != 0;
      const bool own = !own_ratio.empty() &&
                       (std::fabs(own_ratio[j] - config.alpha) <= band ||
                        (own_ratio[j] >= config.alpha) == selected);
      if (!(std::fabs(ratio[j] - config.alpha) <= band) && !own)
        return res.fail(where + " block " + std::to_string(j) + " (R = " +
                        std::to_string(ratio[j]) + ") is " +
                        (got_blocks.count(j) ? "selected" : "dropped") +
                        " on the GPU only");
      ++res.band_blocks;
    }
  }
}

// Whether two [B, Hkv, max_blocks, D] mean buffers agree bit for bit on every block of every
// request (the entries past a request's blocks are never written).
bool same_means(const Problem& pr, const fp_select_config& config, const fp_index_sizes& s,
                const std::vector<float>& a, const std::vector<float>& b) {
  const int32_t d = pr.c.head_dim;
  for (int32_t r = 0; r < pr.batch; ++r) {
    const BlockGeometry blocks{config.block_size, pr.c.len_kv[r]};
    for (int32_t h = 0; h < pr.c.heads_kv; ++h) {
      const size_t at = (size_t(r) * pr.c.heads_kv + h) * s.max_blocks * d;
      if (std::memcmp(&a[at], &b[at], size_t(blocks.num_blocks()) * d * sizeof(float)) != 0)
        return false;
    }
  }
  return true;
}

// fp_pool_kv into fresh buffers, then fp_build_index under FP_FLAG_MEANS_POOLED over them: the
// means and the index of fp_build_index pooling itself, bit for bit (the same kernels; under the
// flag the rounded key means are made again from the kept ones).
void compare_pooled_entry(const Problem& pr, const fp_select_config& config,
                          const fp_index_sizes& s, size_t ws, const HostIndex& built,
                          Result& res) {
  fp_problem gp = pr.view(FP_DEVICE_CUDA);
  GpuIndex gi(s, ws);
  gi.poison();
  FP_OK_OR_DIE(fp_pool_kv(&gp, &config, gi.k_mean.ptr, config.mean_correction ? gi.v_mean.ptr : nullptr,
                      nullptr));
  gp.flags |= FP_FLAG_MEANS_POOLED;
  FP_OK_OR_DIE(fp_build_index(&gp, &config, &gi.view, gi.workspace.ptr, ws));
  CUDA_OK(cudaDeviceSynchronize());
  const HostIndex got = gi.download();
  if (!same_means(pr, config, s, got.k_mean, built.k_mean) ||
      (config.mean_correction && !same_means(pr, config, s, got.v_mean, built.v_mean)))
    return res.fail("fp_pool_kv's means differ from fp_build_index's");
  const int64_t used = built.cu[s.num_segments];
  if (got.cu != built.cu ||
      !std::equal(built.idx.begin(), built.idx.begin() + used, got.idx.begin()))
    res.fail("fp_build_index under FP_FLAG_MEANS_POOLED differs from pooling itself");
}

Result check_case(const Case& c) {
  Result res;
  const Problem pr(c);
  const fp_problem gp = pr.view(FP_DEVICE_CUDA);
  fp_index_sizes s{};
  FP_OK_OR_DIE(fp_index_sizes_query(&gp, &c.config, &s));
  size_t ws = 0;
  const HostIndex gpu = run_cuda(gp, c.config, s, &ws);
  const HostIndex ref = run_cpu(pr, c.config, s);
  compare_means(pr, c.config, s, ref.k_mean, gpu.k_mean, "k_mean", res);
  if (c.config.mean_correction) compare_means(pr, c.config, s, ref.v_mean, gpu.v_mean, "v_mean", res);
  if (res.ok) compare_index(pr, c.config, s, ref, gpu, res);
  if (res.ok) compare_pooled_entry(pr, c.config, s, ws, gpu, res);
  return res;
}

// Captures fp_build_index in a CUDA graph, replays it over new keys, and compares with an
// eager call on the same keys: bit-identical index and means.
Result check_graph(const Case& c) {
  Result res;
  Problem pr(c);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const fp_problem gp = pr.view(FP_DEVICE_CUDA, stream);
  fp_index_sizes s{};
  FP_OK_OR_DIE(fp_index_sizes_query(&gp, &c.config, &s));
  size_t ws = 0;
  FP_OK_OR_DIE(fp_build_index_workspace_size(&gp, &c.config, &ws));
  GpuIndex captured(s, ws), eager(s, ws);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fp_status st = fp_build_index(&gp, &c.config, &captured.view, captured.workspace.ptr, ws);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  if (st != FP_OK) {
    res.fail(std::string("capture: ") + fp_last_error_message());
    return res;
  }
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {  // new inputs in the same buffers: the graph must pick them up
      pr.scramble();
      pr.dk.upload(pr.k);
      pr.dv.upload(pr.v);
      pr.dq.upload(pr.q);
    }
    captured.poison();
    eager.poison();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    FP_OK_OR_DIE(fp_build_index(&gp, &c.config, &eager.view, eager.workspace.ptr, ws));
    CUDA_OK(cudaStreamSynchronize(stream));
    const HostIndex a = captured.download(), b = eager.download();
    const int64_t used = b.cu[s.num_segments];
    res.segments = s.num_segments;
    res.tiles = used;
    if (a.cu != b.cu || !std::equal(a.idx.begin(), a.idx.begin() + used, b.idx.begin()) ||
        std::memcmp(a.k_mean.data(), b.k_mean.data(), 4 * s.mean_elements) != 0)
      res.fail("replay " + std::to_string(round) + " differs from the eager call");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  return res;
}

// Incremental pooling: pool a prefix, then only the blocks past it with pooled_keys; the result
// must equal pooling everything at once, bit for bit.
Result check_incremental(const Case& c, int32_t prefix) {
  namespace ix = flashprefill::cuda::index;
  Result res;
  const Problem pr(c);
  const int32_t bs = c.config.block_size;
  const int32_t max_blocks = (pr.max_kv + bs - 1) / bs;
  const size_t elems = size_t(pr.batch) * c.heads_kv * max_blocks * c.head_dim;
  DeviceBuffer<float> full_k(elems), full_v(elems), inc_k(elems), inc_v(elems);
  DeviceBuffer<uint16_t> full_r(elems), inc_r(elems);
  if (c.page_size == 0) {  // a shorter prefix keeps its rows only under paging
    res.fail("incremental check needs paged KV");
    return res;
  }
  std::vector<int32_t> prefix_len(pr.batch);
  for (int32_t b = 0; b < pr.batch; ++b) prefix_len[b] = std::min(prefix, c.len_kv[b]);
  DeviceBuffer<int32_t> dprefix(pr.batch);
  dprefix.upload(prefix_len);
  const fp_problem gp = pr.view(FP_DEVICE_CUDA);
  auto params = [&](float* k_mean, float* v_mean, void* rounded) {
    ix::PoolParams p;
    p.meta.cu_seqlens_q = pr.dcu_q.ptr;
    p.meta.group = c.heads_q / c.heads_kv;
    p.meta.paged = c.page_size > 0;
    p.meta.cu_seqlens_k = pr.dcu_k.ptr;
    p.meta.seqlens_k = pr.dseqlens_k.ptr;
    p.meta.page_table = pr.dpage_table.ptr;
    p.meta.max_pages_per_seq = pr.max_pages;
    p.meta.page_size = std::max(c.page_size, 1);
    p.batch = pr.batch;
    p.num_heads_kv = c.heads_kv;
    p.max_blocks = max_blocks;
    p.block_size = bs;
    p.kv[0] = gp.k;
    p.kv[1] = gp.v;
    for (int i = 0; i < 2; ++i) {
      p.stride_page[i] = gp.k_stride_page;
      p.stride_token[i] = gp.k_stride_token;
      p.stride_head[i] = gp.k_stride_head;
    }
    p.mean[0] = k_mean;
    p.mean[1] = v_mean;
    p.descale[0] = flashprefill::descale_of(gp, flashprefill::Fp8Tensor::kK);
    p.descale[1] = flashprefill::descale_of(gp, flashprefill::Fp8Tensor::kV);
    p.k_rounded = rounded;
    return p;
  };
  for (auto* buf : {&full_k, &full_v, &inc_k, &inc_v}) buf->poison();
  full_r.poison();
  inc_r.poison();
  CUDA_OK(ix::launch_pool(params(full_k.ptr, full_v.ptr, full_r.ptr), c.dtype, c.head_dim, nullptr));
  // Step 1: the prefix alone (as the first chunk of a chunked prefill would see it).
  DeviceBuffer<int32_t> dlen(pr.batch);
  dlen.upload(prefix_len);
  ix::PoolParams step1 = params(inc_k.ptr, inc_v.ptr, inc_r.ptr);
  step1.meta.seqlens_k = dlen.ptr;
  CUDA_OK(ix::launch_pool(step1, c.dtype, c.head_dim, nullptr));
  // Step 2: the whole sequence, keeping the complete blocks of the prefix.
  ix::PoolParams step2 = params(inc_k.ptr, inc_v.ptr, inc_r.ptr);
  step2.pooled_keys = dprefix.ptr;
  CUDA_OK(ix::launch_pool(step2, c.dtype, c.head_dim, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto fk = full_k.download(), ik = inc_k.download(), fv = full_v.download(),
             iv = inc_v.download();
  const auto fr = full_r.download(), ir = inc_r.download();
  for (int32_t b = 0; b < pr.batch; ++b) {
    const BlockGeometry blocks{bs, c.len_kv[b]};
    for (int32_t h = 0; h < c.heads_kv; ++h) {
      const size_t at = (size_t(b) * c.heads_kv + h) * max_blocks * c.head_dim;
      const size_t n = size_t(blocks.num_blocks()) * c.head_dim;
      if (std::memcmp(&fk[at], &ik[at], n * 4) || std::memcmp(&fv[at], &iv[at], n * 4) ||
          std::memcmp(&fr[at], &ir[at], n * 2))
        res.fail("incremental pooling differs for request " + std::to_string(b));
    }
    res.segments += blocks.num_blocks() - prefix_len[b] / bs;
  }
  return res;
}

// A case's index sizes and workspace on CUDA, with an index of them on each device (host: a
// 1 MiB workspace, more than the CPU asks for) for the error checks.
struct ErrorBuffers {
  fp_index_sizes s{};
  size_t ws = 0;
  GpuIndex gpu;
  HostIndex host;
  std::vector<char> host_ws;

  ErrorBuffers(const fp_problem& gp, const fp_select_config& config)
      : s(sizes(gp, config)), ws(workspace(gp, config)), gpu(s, ws),
        host{std::vector<int32_t>(s.num_segments + 1), std::vector<int32_t>(s.idx_capacity + 1),
             std::vector<float>(s.mean_elements + 1), std::vector<float>(s.mean_elements + 1)},
        host_ws(1 << 20) {}
  fp_index host_index() {
    return fp_index{host.cu.data(), host.idx.data(), host.k_mean.data(), host.v_mean.data(),
                    s.idx_capacity};
  }
  static fp_index_sizes sizes(const fp_problem& gp, const fp_select_config& config) {
    fp_index_sizes out{};
    FP_OK_OR_DIE(fp_index_sizes_query(&gp, &config, &out));
    return out;
  }
  static size_t workspace(const fp_problem& gp, const fp_select_config& config) {
    size_t out = 0;
    FP_OK_OR_DIE(fp_build_index_workspace_size(&gp, &config, &out));
    return out;
  }
};

// Bad inputs: the CUDA call must return the same status as the CPU call.
Result check_errors(const Case& c) {
  Result res;
  const Problem pr(c);
  struct Bad {
    const char* what;
    void (*apply)(fp_problem&, fp_select_config&, fp_index&);
  };
  const Bad bads[] = {
      {"alpha NaN", [](fp_problem&, fp_select_config& k, fp_index&) { k.alpha = NAN; }},
      {"alpha 1.5", [](fp_problem&, fp_select_config& k, fp_index&) { k.alpha = 1.5f; }},
      {"block_size 96", [](fp_problem&, fp_select_config& k, fp_index&) { k.block_size = 96; }},
      {"negative window", [](fp_problem&, fp_select_config& k, fp_index&) { k.window_tokens = -1; }},
      {"Hq % Hkv", [](fp_problem& p, fp_select_config&, fp_index&) { p.num_heads_q = 3; }},
      {"cu_seqlens_q NULL", [](fp_problem& p, fp_select_config&, fp_index&) { p.cu_seqlens_q = nullptr; }},
      {"k_mean NULL", [](fp_problem&, fp_select_config&, fp_index& i) { i.k_mean = nullptr; }},
      {"idx_capacity small", [](fp_problem&, fp_select_config&, fp_index& i) { i.idx_capacity -= 1; }},
      {"batch 0", [](fp_problem& p, fp_select_config&, fp_index&) { p.batch_size = 0; }},
  };
  const fp_problem gp0 = pr.view(FP_DEVICE_CUDA);
  ErrorBuffers buf(gp0, c.config);
  const size_t ws = buf.ws;
  GpuIndex& gi = buf.gpu;
  for (const Bad& bad : bads) {
    fp_problem cp = pr.view(FP_DEVICE_CPU), gp = pr.view(FP_DEVICE_CUDA);
    fp_select_config cc = c.config, gc = c.config;
    fp_index ci = buf.host_index();
    fp_index gx = gi.view;
    bad.apply(cp, cc, ci);
    bad.apply(gp, gc, gx);
    const fp_status a = fp_build_index(&cp, &cc, &ci, buf.host_ws.data(), buf.host_ws.size());
    const fp_status b = fp_build_index(&gp, &gc, &gx, gi.workspace.ptr, ws);
    ++res.segments;
    if (a != b || a == FP_OK)
      res.fail(std::string(bad.what) + ": CPU " + fp_status_string(a) + ", CUDA " +
               fp_status_string(b));
  }
  {  // a workspace one byte short
    const fp_status st = fp_build_index(&gp0, &c.config, &gi.view, gi.workspace.ptr, ws - 1);
    ++res.segments;
    if (st != FP_ERROR_WORKSPACE_TOO_SMALL) res.fail("short workspace accepted");
  }
  return res;
}

// What the index stage refuses of an e4m3 case (per-head descales): a descale factor that is not
// finite and > 0, which CUDA checks under FP_FLAG_VALIDATE_DEVICE_METADATA (copying the
// factors to the host) with the CPU's status and message. Under the flag valid factors build
// the index.
Result check_fp8_errors(const Case& c) {
  Result res;
  Problem pr(c);
  ErrorBuffers buf(pr.view(FP_DEVICE_CUDA), c.config);
  const size_t ws = buf.ws;
  GpuIndex& gi = buf.gpu;
  fp_index ci = buf.host_index();
  struct Outcome {
    fp_status status;
    std::string message;
  };
  auto build = [&](fp_device device) {  // the flag set on CUDA
    fp_problem p = pr.view(device);
    p.flags |= device == FP_DEVICE_CUDA ? FP_FLAG_VALIDATE_DEVICE_METADATA : 0u;
    const fp_status st =
        device == FP_DEVICE_CUDA
            ? fp_build_index(&p, &c.config, &gi.view, gi.workspace.ptr, ws)
            : fp_build_index(&p, &c.config, &ci, buf.host_ws.data(), buf.host_ws.size());
    return Outcome{st, fp_last_error_message()};
  };
  const char* names[3] = {"q_descale", "k_descale", "v_descale"};
  for (int t = 0; t < 3; ++t)
    for (float bad : {0.f, -1.f, NAN, INFINITY}) {
      DescaleSet& d = pr.descale[t];
      const size_t last =
          size_t((pr.batch - 1) * d.stride_batch + (c.heads_kv - 1) * d.stride_head);
      const float kept = d.factors[last];
      d.factors[last] = bad;
      pr.ddescale[t].upload(d.factors);
      const Outcome cpu = build(FP_DEVICE_CPU), gpu = build(FP_DEVICE_CUDA);
      ++res.segments;
      if (cpu.status != FP_ERROR_INVALID_ARGUMENT || gpu.status != cpu.status ||
          gpu.message != cpu.message || cpu.message.find(names[t]) == std::string::npos)
        res.fail(std::string(names[t]) + " = " + std::to_string(bad) + ": CPU " +
                 fp_status_string(cpu.status) + " (" + cpu.message + "), CUDA " +
                 fp_status_string(gpu.status) + " (" + gpu.message + ")");
      d.factors[last] = kept;
      pr.ddescale[t].upload(d.factors);
    }
  {
    const Outcome cpu = build(FP_DEVICE_CPU), gpu = build(FP_DEVICE_CUDA);
    ++res.segments;
    if (cpu.status != FP_OK || gpu.status != FP_OK)
      res.fail("valid descales under FP_FLAG_VALIDATE_DEVICE_METADATA: CPU " + cpu.message +
               ", CUDA " + gpu.message);
  }
  return res;
}

// A bfloat16 q over the e4m3 K/V on CUDA: the library quantizes q into its workspace, with the
// given c_q or, when q_descale is NULL, c_q = max|q| / 448 over each (request, KV head)'s group,
// and builds the index of that e4m3 problem. Both must equal, bit for bit, fp_build_index of the
// e4m3 q that the host quantizes the same way: with the given c_q that is the case's own q~ (q =
// bf16(c_q q~) rounds back to it: bf16's 2^-8 is far inside half an e4m3 step). fp_pool_kv reads
// no q, and the bf16 problem pools the same means.
Result check_q16_over_e4m3(const Case& c) {
  namespace ref = flashprefill::ref;
  Result res;
  const Problem pr(c);
  const int32_t hq = c.heads_q, hkv = c.heads_kv, g = hq / hkv, d = c.head_dim;
  std::vector<uint16_t> q16(pr.q.size());
  std::vector<float> given(size_t(pr.batch) * hkv), dynamic(given.size(), 0.f);
  std::vector<uint8_t> q8(pr.q.size());
  for (int32_t b = 0; b < pr.batch; ++b)
    for (int32_t h = 0; h < hkv; ++h) {
      given[size_t(b) * hkv + h] = pr.descale[0].at(b, h);
      float& m = dynamic[size_t(b) * hkv + h];
      for (int64_t t = pr.cu_q[b]; t < pr.cu_q[b + 1]; ++t)
        for (int32_t i = 0; i < g * d; ++i) {
          const size_t at = (size_t(t) * hq + h * g) * d + i;
          q16[at] = ref::float_to_bf16(given[size_t(b) * hkv + h] * ref::e4m3_to_float(pr.q[at]));
          m = std::max(m, std::fabs(ref::bf16_to_float(q16[at])));
        }
      m = m > 0.f ? m / 448.f : 1.f;
      const float inv = 1.f / m;
      for (int64_t t = pr.cu_q[b]; t < pr.cu_q[b + 1]; ++t)
        for (int32_t i = 0; i < g * d; ++i) {
          const size_t at = (size_t(t) * hq + h * g) * d + i;
          q8[at] = ref::float_to_e4m3(ref::bf16_to_float(q16[at]) * inv);
        }
    }
  DeviceBuffer<uint16_t> dq16(q16.size());
  dq16.upload(q16);
  DeviceBuffer<uint8_t> dq8(q8.size());
  dq8.upload(q8);
  DeviceBuffer<float> dgiven(given.size()), ddynamic(dynamic.size());
  dgiven.upload(given);
  ddynamic.upload(dynamic);
  auto with_c_q = [&](fp_problem p, const float* c_q) {
    p.q_descale = c_q;
    p.q_descale_stride_batch = hkv;
    p.q_descale_stride_head = 1;
    return p;
  };
  auto bf16_q = [&](const float* c_q) {
    fp_problem p = with_c_q(pr.view(FP_DEVICE_CUDA), c_q);
    p.dtype = FP_BFLOAT16;
    p.kv_dtype = FP_FLOAT8_E4M3;
    p.q = dq16.ptr;
    return p;
  };
  fp_index_sizes s{};
  {
    const fp_problem p = pr.view(FP_DEVICE_CUDA);
    FP_OK_OR_DIE(fp_index_sizes_query(&p, &c.config, &s));
  }
  auto build = [&](const fp_problem& p) { return run_cuda(p, c.config, s); };
  auto same = [&](const HostIndex& a, const HostIndex& b, const char* what) {
    ++res.segments;
    const int64_t used = a.cu[s.num_segments];
    if (a.cu != b.cu || !std::equal(a.idx.begin(), a.idx.begin() + used, b.idx.begin()))
      return res.fail(std::string(what) + ": the index differs from the e4m3 q's");
    if (!same_means(pr, c.config, s, a.k_mean, b.k_mean) ||
        (c.config.mean_correction && !same_means(pr, c.config, s, a.v_mean, b.v_mean)))
      res.fail(std::string(what) + ": the means differ from the e4m3 q's");
  };
  const HostIndex want_given = build(with_c_q(pr.view(FP_DEVICE_CUDA), dgiven.ptr));
  fp_problem e4m3_dynamic = with_c_q(pr.view(FP_DEVICE_CUDA), ddynamic.ptr);
  e4m3_dynamic.q = dq8.ptr;
  const HostIndex want_dynamic = build(e4m3_dynamic);
  same(want_given, build(bf16_q(dgiven.ptr)), "given c_q");
  same(want_dynamic, build(bf16_q(nullptr)), "dynamic c_q");
  {
    const fp_problem p = bf16_q(nullptr);
    GpuIndex gi(s, 0);
    gi.poison();
    FP_OK_OR_DIE(fp_pool_kv(&p, &c.config, gi.k_mean.ptr,
                        c.config.mean_correction ? gi.v_mean.ptr : nullptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    ++res.segments;
    if (!same_means(pr, c.config, s, gi.k_mean.download(), want_given.k_mean) ||
        (c.config.mean_correction &&
         !same_means(pr, c.config, s, gi.v_mean.download(), want_given.v_mean)))
      res.fail("fp_pool_kv on the bfloat16 q's problem: means differ");
  }
  return res;
}

fp_select_config config(int32_t block_size = 128, float alpha = 0.1f, int32_t sink = 256,
                        int32_t window = 512, int32_t recent = 1, int32_t correction = 1) {
  return fp_select_config{block_size, alpha, sink, window, recent, correction};
}

Case single(const char* name, int32_t len, int32_t hq, int32_t hkv, int32_t d, int32_t page,
            fp_dtype dtype = FP_BFLOAT16, Data data = Data::kStructured,
            Descales descales = Descales::kPerHead) {
  return Case{name, {len}, {len}, hq, hkv, d, dtype, page, data, config(), descales};
}

}  // namespace

// Usage: fp_gpu_index_check [small]. `small` keeps only the cases whose requests hold at most
// 8192 keys (the graph, incremental-pooling and error checks all do), so that compute-sanitizer
// runs it within its time limit.
int main(int argc, char** argv) {
  const bool small_only = argc > 1 && std::strcmp(argv[1], "small") == 0;
  if (argc > 2 || (argc == 2 && !small_only)) {
    std::fprintf(stderr, "usage: %s [small]\n", argv[0]);
    return 2;
  }
  if (!fp_cuda_available()) {
    std::printf("no usable sm_90 GPU: nothing checked\n");
    return 1;
  }
  std::vector<Case> cases = {
      single("L=1 g=1 D=64", 1, 2, 2, 64, 0),
      single("L=1 g=8 D=128 page=1", 1, 8, 1, 128, 1),
      single("L=127 g=1 D=64 page=16", 127, 2, 2, 64, 16, FP_FLOAT16),
      single("L=127 g=4 D=128", 127, 8, 2, 128, 0, FP_BFLOAT16, Data::kRandom),
      single("L=4097 g=4 D=128 page=100", 4097, 8, 2, 128, 100),
      single("L=4097 g=8 D=64 page=64", 4097, 8, 1, 64, 64, FP_FLOAT16),
      single("L=8192 g=8 D=128 page=16", 8192, 16, 2, 128, 16),
      single("L=8192 g=1 D=64", 8192, 2, 2, 64, 0, FP_BFLOAT16, Data::kRandom),
      single("L=32768 g=4 D=128 page=1", 32768, 4, 1, 128, 1),
      single("L=32768 g=1 D=64 page=100", 32768, 1, 1, 64, 100, FP_FLOAT16),
      single("L=131072 g=4 D=128", 131072, 4, 1, 128, 0),
      single("L=131072 g=8 D=64 page=64", 131072, 8, 1, 64, 64),
  };
  // Mixed batches with cached prefixes (L_q < L_kv), an empty request, other rule settings.
  cases.push_back(Case{"mixed B=5 g=4 D=128 page=64", {1, 300, 0, 1000, 2500},
                       {999, 300, 17, 5000, 2500}, 16, 4, 128, FP_BFLOAT16, 64,
                       Data::kStructured, config()});
  cases.push_back(Case{"mixed B=3 g=8 D=64 page=100 bs=256", {700, 64, 3000},
                       {9000, 4000, 3000}, 8, 1, 64, FP_FLOAT16, 100, Data::kStructured,
                       config(256, 0.3f, 0, 0, 0, 0)});
  cases.push_back(Case{"mixed B=4 g=1 D=128 contiguous alpha=0", {129, 1, 4096, 77},
                       {129, 2048, 8192, 77}, 2, 2, 128, FP_BFLOAT16, 0, Data::kStructured,
                       config(128, 0.f, 256, 512, 1, 1)});
  cases.push_back(Case{"mixed B=2 g=4 D=128 page=16 alpha=0.9 recent=3", {5000, 2000},
                       {20000, 2000}, 8, 2, 128, FP_BFLOAT16, 16, Data::kStructured,
                       config(192, 0.9f, 64, 128, 3, 1)});

  // FP8 e4m3 q, k and v (docs/ALGORITHM.md "FP8 e4m3"): descales per (request, KV head) as FA3's
  // [B, Hkv] (and transposed), per tensor, or none; GQA, partial blocks, cached prefixes.
  constexpr fp_dtype kE4m3 = FP_FLOAT8_E4M3;
  cases.push_back(single("e4m3 L=1 g=8 D=64 no descales", 1, 8, 1, 64, 0, kE4m3,
                         Data::kStructured, Descales::kNone));
  cases.push_back(single("e4m3 L=127 g=4 D=128", 127, 8, 2, 128, 0, kE4m3, Data::kRandom));
  cases.push_back(single("e4m3 L=4097 g=4 D=128 page=100", 4097, 8, 2, 128, 100, kE4m3));
  cases.push_back(single("e4m3 L=8192 g=8 D=64 page=16 per tensor", 8192, 16, 2, 64, 16, kE4m3,
                         Data::kStructured, Descales::kPerTensor));
  cases.push_back(single("e4m3 L=8192 g=1 D=128 page=1 [Hkv, B]", 8192, 2, 2, 128, 1, kE4m3,
                         Data::kRandom, Descales::kPerHeadTransposed));
  cases.push_back(single("e4m3 L=32768 g=4 D=128 page=64", 32768, 8, 2, 128, 64, kE4m3));
  cases.push_back(Case{"e4m3 mixed B=5 g=4 D=128 page=64", {1, 300, 0, 1000, 2500},
                       {999, 300, 17, 5000, 2500}, 16, 4, 128, kE4m3, 64, Data::kStructured,
                       config(), Descales::kPerHead});
  cases.push_back(Case{"e4m3 mixed B=3 g=8 D=64 contiguous bs=256 [Hkv, B]", {700, 64, 3000},
                       {9000, 4000, 3000}, 16, 2, 64, kE4m3, 0, Data::kStructured,
                       config(256, 0.3f, 0, 0, 0, 0), Descales::kPerHeadTransposed});
  cases.push_back(Case{"e4m3 mixed B=2 g=4 D=64 page=16 alpha=0.9 recent=3", {5000, 2000},
                       {20000, 2000}, 8, 2, 64, kE4m3, 16, Data::kStructured,
                       config(192, 0.9f, 64, 128, 3, 1), Descales::kPerHead});

  // Kept by index before the small filter: the graph and incremental checks below use them.
  const Case mixed = cases[12], long8k = cases[6], paged4k = cases[4];
  const Case e4m3_mixed = cases[22], e4m3_paged4k = cases[18];
  if (small_only) {
    std::erase_if(cases, [](const Case& c) {
      return *std::max_element(c.len_kv.begin(), c.len_kv.end()) > 8192;
    });
  }

  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, seed %llu%s\n", prop.name, (unsigned long long)seed(),
              small_only ? ", small cases only" : "");
  int failures = 0;
  std::printf("%-44s %8s %10s %8s %10s %s\n", "case", "segments", "tiles", "band", "mean_err", "result");
  auto report = [&](const std::string& name, const Result& r, double seconds) {
    failures += r.ok ? 0 : 1;
    std::printf("%-44s %8lld %10lld %8lld %10.2e %s (%.1fs)%s%s\n", name.c_str(),
                (long long)r.segments, (long long)r.tiles, (long long)r.band_blocks,
                r.max_mean_err, r.ok ? "PASS" : "FAIL", seconds, r.ok ? "" : ": ",
                r.detail.c_str());
    std::fflush(stdout);
  };
  auto timed = [&](const std::string& name, auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = fn();
    report(name, r, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  for (const Case& c : cases) timed(c.name, [&] { return check_case(c); });
  timed("graph capture + replay (mixed B=5)", [&] { return check_graph(mixed); });
  timed("graph capture + replay (L=8192)", [&] { return check_graph(long8k); });
  timed("incremental pooling (mixed B=5, prefix 1000)",
        [&] { return check_incremental(mixed, 1000); });
  timed("incremental pooling (L=8192 bs=128, prefix 4000)",
        [&] { return check_incremental(long8k, 4000); });
  timed("bad inputs: same status as the CPU", [&] { return check_errors(paged4k); });
  timed("graph capture + replay (e4m3 mixed B=5)", [&] { return check_graph(e4m3_mixed); });
  timed("incremental pooling (e4m3 mixed B=5, prefix 1000)",
        [&] { return check_incremental(e4m3_mixed, 1000); });
  timed("bad inputs: same status as the CPU (e4m3)", [&] { return check_errors(e4m3_paged4k); });
  timed("bad e4m3 descales", [&] { return check_fp8_errors(e4m3_paged4k); });
  timed("bfloat16 q over e4m3 K/V (paged), given and dynamic c_q",
        [&] { return check_q16_over_e4m3(e4m3_paged4k); });
  timed("bfloat16 q over e4m3 K/V (mixed B=5), given and dynamic c_q",
        [&] { return check_q16_over_e4m3(e4m3_mixed); });
  std::printf("%s: %d failing\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
