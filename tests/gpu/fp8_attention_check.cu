// GPU check of the e4m3 attention (Eq. 15; docs/KERNEL.md "FP8 e4m3") through the C ABI:
// fp_dense_attention, and fp_sparse_attention over a random index, on random e4m3 Q/K/V with
// descales per (request, KV head) in device memory (c = max |x| / 448 over the request's rows of
// the KV head; the heads' magnitudes differ, so do their descales) or one per tensor (strides 0);
// fresh data each run, the seed printed. Each output, poisoned first, is compared against the CPU
// FP8 reference (the library on the CPU, dtype FP_FLOAT8_E4M3, the same descales) and against
// float32 attention on the dequantized inputs, beside the library's bf16 operator on the same
// dequantized inputs. The dense calls validate their metadata on the host
// (FP_FLAG_VALIDATE_DEVICE_METADATA: the device descales are copied and checked), the sparse
// ones do not. Then: a CUDA graph of the dense call replayed over new descales against the eager
// call, a zero descale refused, and one 32K timing case, fp_dense_attention in e4m3 (the V
// transpose and the kernel) against bf16 (CUDA events, median). Exit status 0 when every check
// passes.
// Usage: fp_gpu_fp8_check [seed [small]] ("small": three shapes, no graph or timing, for
// sanitizers); fp_gpu_fp8_check seed stress N [density]: N rounds of one shape's dense and sparse
// calls, nothing compared, every call that runs past 3 s reported (exit 1), one past 60 s hung.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/geometry.hpp"
#include "flashprefill/flashprefill.h"
#include "gpu_check.hpp"

namespace {

using flashprefill::ceil_div;
using flashprefill::kTileRows;

constexpr double kFp8Tolerance = 2e-2;   // GPU FP8 against the CPU FP8 reference (ALGORITHM.md)
constexpr double kExactTolerance = 3e-2; // FP8 against float32 attention on the dequantized inputs
// LSE, absolute: log(1 + 2^-4), the bound of rounding every P~ to e4m3 (relative error <= 2^-4
// each in e4m3's normal range, so the denominator's sum moves by at most that factor;
// docs/ALGORITHM.md "FP8 e4m3"). Measured up to 2.2e-2, the CPU FP8 reference's own distance
// from float32 attention on rows with few keys.
const double kLseTolerance = std::log1p(0.0625);
constexpr float kE4m3Max = 448.f;

std::mt19937_64 rng;
int failures = 0, checks = 0;

float e4m3_value(uint8_t bits) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) {
      __nv_fp8_e4m3 x;
      x.__x = uint8_t(b);
      t[size_t(b)] = float(x);
    }
    return t;
  }();
  return table[bits];
}
uint8_t e4m3_bits(float x) { return __nv_fp8_e4m3(x).__x; }  // round to nearest, satfinite
uint16_t bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t h;
  std::memcpy(&h, &b, 2);
  return h;
}
float bf16_value(uint16_t h) {
  __nv_bfloat16 b;
  std::memcpy(&b, &h, 2);
  return __bfloat162float(b);
}

struct Shape {
  std::string name;
  int head_dim, heads_q, heads_kv;
  std::vector<int> len_q, len_kv;
  bool per_head;  // descales per (request, KV head), else one per tensor
};

int max_of(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

// The magnitude of request b's KV head h in the random inputs (q: its query heads): 0.5, 1,
// 1.5 or 2, so that the descales of one request's heads differ.
float magnitude(int b, int h) { return 0.5f * float(1 + (3 * b + h) % 4); }

// One e4m3 tensor [rows, heads, D] with its descales: bits = round_e4m3(x / c(b, h)), value =
// c(b, h) * e4m3, for request b and KV head h of the row and head.
struct Quantized {
  std::vector<uint8_t> bits;
  std::vector<float> c;      // [B * Hkv], c(b, h) at b * Hkv + h (all equal: per tensor)
  std::vector<float> row_c;  // [rows * heads]: the c of each (row, head)
  float value(size_t i) const { return row_c[i / head_dim] * e4m3_value(bits[i]); }
  int head_dim = 0;
};

// Random normal data (fast: a cheaper uniform one, for the timing case) of request b's rows
// cu[b] .. cu[b + 1], scaled by magnitude(b, KV head), quantized per (request, KV head) or per
// tensor. `group`: query heads per KV head (1 for k and v).
Quantized quantize_random(const std::vector<int32_t>& cu, int heads, int group, int D,
                          bool per_head, bool fast) {
  const int B = int(cu.size()) - 1, heads_kv = heads / group;
  const size_t rows = size_t(cu[B]);
  std::vector<float> x(rows * heads * D);
  if (fast) {
    uint64_t s = rng() | 1;
    for (float& v : x) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      v = float(int64_t(s >> 40) - (int64_t(1) << 23)) * (1.7f / float(1 << 23));
    }
  } else {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& v : x) v = normal(rng);
  }
  std::vector<float> amax(size_t(B) * heads_kv, 0.f);
  for (int b = 0; b < B; ++b)
    for (size_t t = size_t(cu[b]); t < size_t(cu[b + 1]); ++t)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < D; ++d) {
          float& v = x[(t * heads + h) * D + d];
          v *= magnitude(b, h / group);
          float& m = amax[size_t(b) * heads_kv + (per_head ? h / group : 0)];
          m = std::max(m, std::fabs(v));
        }
  Quantized q;
  q.head_dim = D;
  q.c.resize(amax.size());
  for (size_t i = 0; i < amax.size(); ++i) {
    const float m = per_head ? amax[i] : amax[0];
    q.c[i] = m > 0.f ? m / kE4m3Max : 1.f;
  }
  q.bits.resize(x.size());
  q.row_c.resize(rows * heads);
  for (int b = 0; b < B; ++b)
    for (size_t t = size_t(cu[b]); t < size_t(cu[b + 1]); ++t)
      for (int h = 0; h < heads; ++h) {
        const float c = q.c[size_t(b) * heads_kv + h / group];
        q.row_c[t * heads + h] = c;
        const float inv = 1.f / c;
        for (int d = 0; d < D; ++d) {
          const size_t i = (t * heads + h) * D + d;
          q.bits[i] = e4m3_bits(std::clamp(x[i] * inv, -kE4m3Max, kE4m3Max));
        }
      }
  return q;
}

struct Inputs {
  Shape shape;
  std::vector<int32_t> cu_q, cu_k;
  int64_t total_q = 0, total_k = 0;
  Quantized q, k, v;  // [total, heads, D]
};

Inputs make_inputs(const Shape& s, bool fast) {
  const int D = s.head_dim, g = s.heads_q / s.heads_kv;
  Inputs in;
  in.shape = s;
  const int B = int(s.len_q.size());
  in.cu_q.assign(B + 1, 0);
  in.cu_k.assign(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    in.cu_q[b + 1] = in.cu_q[b] + s.len_q[b];
    in.cu_k[b + 1] = in.cu_k[b] + s.len_kv[b];
  }
  in.total_q = in.cu_q[B];
  in.total_k = in.cu_k[B];
  in.q = quantize_random(in.cu_q, s.heads_q, g, D, s.per_head, fast);
  in.k = quantize_random(in.cu_k, s.heads_kv, 1, D, s.per_head, fast);
  in.v = quantize_random(in.cu_k, s.heads_kv, 1, D, s.per_head, fast);
  return in;
}

// Where a descale tensor's factors lie: [B, Hkv] per (request, KV head), or one float with
// strides 0 (FA3's descales, as the C ABI takes them).
struct DescaleLayout {
  int64_t stride_batch = 0, stride_head = 0;
  size_t count = 1;
};

DescaleLayout descale_layout(const Shape& s) {
  if (!s.per_head) return {};
  return {s.heads_kv, 1, s.len_q.size() * size_t(s.heads_kv)};
}

float softmax_scale(int D) { return 1.f / std::sqrt(float(D)); }

// The causal FLOPs of Q K^T and P V (2 each per visible (query, key) pair and head dim).
double causal_flops(const Inputs& in) {
  const int D = in.shape.head_dim;
  double pairs = 0;
  for (size_t b = 0; b < in.shape.len_q.size(); ++b) {
    const double lq = in.shape.len_q[b], offset = in.shape.len_kv[b] - lq;
    pairs += lq * offset + lq * (lq + 1) / 2;
  }
  return 4.0 * D * in.shape.heads_q * pairs;
}

// A CSR index of selected 64-key tiles (docs/ALGORITHM.md): random ascending subsets of every
// query tile's causal tiles, each kept with probability `density`.
struct Csr {
  std::vector<int32_t> cu, idx;
  bool correction = false;              // mean correction over the blocks the index leaves out
  std::vector<float> k_mean, v_mean;    // with it: the block means (pool_means)
};

int32_t max_q_tiles(const Shape& s) {
  return int32_t(ceil_div(int64_t(s.heads_q / s.heads_kv) * max_of(s.len_q), kTileRows));
}

Csr random_csr(const Shape& s, double density) {
  const int B = int(s.len_q.size()), g = s.heads_q / s.heads_kv, tiles = max_q_tiles(s);
  std::bernoulli_distribution keep(density);
  Csr c;
  c.cu.assign(size_t(B) * s.heads_kv * tiles + 1, 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < s.heads_kv; ++h)
      for (int I = 0; I < tiles; ++I) {
        const flashprefill::SeqGeometry seq{s.len_q[b], s.len_kv[b], g};
        if (I < seq.num_q_tiles())
          for (int t = 0; t < seq.causal_tiles(I); ++t)
            if (keep(rng)) c.idx.push_back(t);
        c.cu[size_t(flashprefill::segment_id(b, h, I, s.heads_kv, tiles)) + 1] =
            int32_t(c.idx.size());
      }
  return c;
}

// Waits for the work queued on `stream`; a kernel that has not finished after hang_seconds counts
// as hung: the check says so and exits (a hung kernel cannot be recovered). The stress mode
// (main) also reports calls that run past slow_seconds, and how long they took.
double hang_seconds = 30, slow_seconds = 0;
int slow_calls = 0;
void finish(const char* what, cudaStream_t stream = nullptr) {
  cudaEvent_t done;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(done, stream));
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  bool slow = false;
  cudaError_t e;
  while ((e = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (seconds() > hang_seconds) {
      // _Exit flushes nothing, and a piped stdout is fully buffered.
      std::printf("FAIL: %s has not finished after %.0f s (hung)\n", what, hang_seconds);
      std::fflush(stdout);
      std::_Exit(1);
    }
    if (slow_seconds > 0 && !slow && seconds() > slow_seconds) {
      slow = true;
      ++slow_calls;
      std::printf("\nSLOW: %s still running after %.0f s\n", what, slow_seconds);
      std::fflush(stdout);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (slow) std::printf("SLOW: %s finished after %.1f s\n", what, seconds());
  CUDA_OK(e);
  CUDA_OK(cudaEventDestroy(done));
}

struct Result {
  std::vector<float> out;  // [total_q, Hq, D]
  std::vector<float> lse;  // [Hq, total_q]
};

std::vector<float> bf16_values(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_value(bits[i]);
  return f;
}

// ---- References through the C ABI -------------------------------------------------------------

fp_problem base_problem(const Inputs& in) {
  const Shape& s = in.shape;
  const int D = s.head_dim;
  fp_problem p{};
  p.batch_size = int32_t(s.len_q.size());
  p.num_heads_q = s.heads_q;
  p.num_heads_kv = s.heads_kv;
  p.head_dim = D;
  p.q_stride_token = int64_t(s.heads_q) * D;
  p.q_stride_head = D;
  p.total_q = in.total_q;
  p.max_seqlen_q = max_of(s.len_q);
  p.kv_layout = FP_KV_CONTIGUOUS;
  p.k_stride_token = p.v_stride_token = int64_t(s.heads_kv) * D;
  p.k_stride_head = p.v_stride_head = D;
  p.max_seqlen_k = max_of(s.len_kv);
  p.total_k = in.total_k;
  return p;
}

fp_output output_of(const Inputs& in, void* out, float* lse) {
  const int D = in.shape.head_dim;
  fp_output o{};
  o.out = out;
  o.out_stride_token = int64_t(in.shape.heads_q) * D;
  o.out_stride_head = D;
  o.lse = lse;
  return o;
}

// fp_dense_attention, or fp_sparse_attention over csr (with its mean correction), on the CPU.
void cpu_attend(const fp_problem& p, const fp_output& o, const Csr* csr) {
  if (!csr) {
    FP_OK_OR_DIE(fp_dense_attention(&p, &o, nullptr, 0));
    return;
  }
  fp_select_config config;
  fp_select_config_default(&config);
  config.mean_correction = csr->correction;
  fp_index_sizes sizes;
  FP_OK_OR_DIE(fp_index_sizes_query(&p, &config, &sizes));
  std::vector<int32_t> cu = csr->cu, idx = csr->idx;
  idx.resize(std::max<size_t>(idx.size(), 1));
  std::vector<float> k_mean(size_t(std::max<int64_t>(sizes.mean_elements, 1)), 0.f);
  const fp_index index{cu.data(), idx.data(),
                       csr->correction ? const_cast<float*>(csr->k_mean.data()) : k_mean.data(),
                       csr->correction ? const_cast<float*>(csr->v_mean.data()) : nullptr,
                       int64_t(csr->idx.size())};
  FP_OK_OR_DIE(fp_sparse_attention(&p, &config, &index, &o, nullptr, 0));
}

// c_q, c_k and c_v as the problem reads them: three descale_layout tensors back to back.
std::vector<float> descale_values(const Inputs& in) {
  const size_t n = descale_layout(in.shape).count;
  std::vector<float> all;
  for (const Quantized* x : {&in.q, &in.k, &in.v})
    all.insert(all.end(), x->c.begin(), x->c.begin() + ptrdiff_t(n));
  return all;
}

// The e4m3 problem of `in` on `device` (q, k and v e4m3, bf16 output): its tensors, lengths and
// descales (descale_values) at the given pointers of that device.
fp_problem fp8_problem(const Inputs& in, fp_device device, const void* q, const void* k,
                       const void* v, const int32_t* cu_q, const int32_t* cu_k,
                       const float* descales) {
  fp_problem p = base_problem(in);
  p.device = device;
  p.dtype = FP_FLOAT8_E4M3;
  p.out_dtype = FP_BFLOAT16;
  p.q = q;
  p.k = k;
  p.v = v;
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_k = cu_k;
  const DescaleLayout l = descale_layout(in.shape);
  p.q_descale = descales;
  p.k_descale = descales + l.count;
  p.v_descale = descales + 2 * l.count;
  p.q_descale_stride_batch = p.k_descale_stride_batch = p.v_descale_stride_batch = l.stride_batch;
  p.q_descale_stride_head = p.k_descale_stride_head = p.v_descale_stride_head = l.stride_head;
  return p;
}

// The CPU FP8 reference (Eq. 15, the same stages), bf16 output: cpu_variant of e4m3 q/k/v over
// contiguous KV.
Result cpu_fp8(const Inputs& in, const Csr* csr);

// The index with mean correction: the block means of the e4m3 problem, pooled by the library
// on the CPU (float32 means of the dequantized K/V), which every reference and the CUDA call read.
Csr with_correction(const Inputs& in, Csr c) {
  const std::vector<float> descales = descale_values(in);
  const fp_problem p = fp8_problem(in, FP_DEVICE_CPU, in.q.bits.data(), in.k.bits.data(),
                                   in.v.bits.data(), in.cu_q.data(), in.cu_k.data(),
                                   descales.data());
  fp_select_config config;
  fp_select_config_default(&config);
  fp_index_sizes sizes;
  FP_OK_OR_DIE(fp_index_sizes_query(&p, &config, &sizes));
  c.correction = true;
  c.k_mean.assign(size_t(std::max<int64_t>(sizes.mean_elements, 1)), 0.f);
  c.v_mean.assign(c.k_mean.size(), 0.f);
  FP_OK_OR_DIE(fp_pool_kv(&p, &config, c.k_mean.data(), c.v_mean.data(), nullptr));
  return c;
}

std::vector<float> dequantized(const Quantized& x) {
  std::vector<float> f(x.bits.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = x.value(i);
  return f;
}

// Float32 attention on the dequantized inputs (the CPU's exact path), over csr when given.
Result cpu_exact(const Inputs& in, const Csr* csr) {
  const std::vector<float> q = dequantized(in.q), k = dequantized(in.k), v = dequantized(in.v);
  fp_problem p = base_problem(in);
  p.device = FP_DEVICE_CPU;
  p.dtype = FP_FLOAT32;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.cu_seqlens_q = in.cu_q.data();
  p.cu_seqlens_k = in.cu_k.data();
  Result r;
  r.out.resize(q.size());
  r.lse.resize(size_t(in.total_q) * in.shape.heads_q);
  const fp_output o = output_of(in, r.out.data(), r.lse.data());
  cpu_attend(p, o, csr);
  return r;
}

// The library's bf16 dense attention on CUDA over the dequantized inputs rounded to bf16.
struct Bf16Run {
  DeviceBuffer<uint16_t> q, k, v, out;
  DeviceBuffer<int32_t> cu_q, cu_k;
  DeviceBuffer<float> lse;
  DeviceBuffer<char> workspace;
  fp_problem p{};
  fp_output o{};

  explicit Bf16Run(const Inputs& in) {
    auto upload = [](DeviceBuffer<uint16_t>& d, const Quantized& x) {
      std::vector<uint16_t> h(x.bits.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = bf16_bits(x.value(i));
      d.upload(h);
    };
    upload(q, in.q);
    upload(k, in.k);
    upload(v, in.v);
    cu_q.upload(in.cu_q);
    cu_k.upload(in.cu_k);
    out.resize(in.q.bits.size());
    lse.resize(size_t(in.total_q) * in.shape.heads_q);
    p = base_problem(in);
    p.device = FP_DEVICE_CUDA;
    p.dtype = FP_BFLOAT16;
    p.q = q.ptr;
    p.k = k.ptr;
    p.v = v.ptr;
    p.cu_seqlens_q = cu_q.ptr;
    p.cu_seqlens_k = cu_k.ptr;
    o = output_of(in, out.ptr, lse.ptr);
    size_t ws = 0;
    FP_OK_OR_DIE(fp_dense_attention_workspace_size(&p, &ws));
    workspace.resize(std::max<size_t>(ws, 1));
  }
  void attend() { FP_OK_OR_DIE(fp_dense_attention(&p, &o, workspace.ptr, workspace.count)); }
  Result result() {
    finish("the bf16 library call");
    return {bf16_values(out.download()), lse.download()};
  }
};

// ---- The e4m3 attention through the C ABI -----------------------------------------------------

// fp_dense_attention, or fp_sparse_attention over csr (with its mean correction), on CUDA: e4m3 Q/K/V,
// device descales and lengths, bf16 output; the problem's flags and stream as given.
struct Fp8Call {
  DeviceBuffer<uint8_t> q, k, v;
  DeviceBuffer<int32_t> cu_q, cu_k, cu, idx;
  DeviceBuffer<float> k_mean, v_mean;  // with mean correction
  DeviceBuffer<float> descales;  // descale_values
  DeviceBuffer<uint16_t> out;    // bf16 [total_q, Hq, D]
  DeviceBuffer<float> lse;       // [Hq, total_q]
  DeviceBuffer<char> workspace;
  fp_problem p{};
  fp_output o{};
  fp_select_config config{};
  fp_index index{};
  bool sparse = false;

  Fp8Call(const Inputs& in, const Csr* csr, uint32_t flags, cudaStream_t stream = nullptr) {
    q.upload(in.q.bits);
    k.upload(in.k.bits);
    v.upload(in.v.bits);
    cu_q.upload(in.cu_q);
    cu_k.upload(in.cu_k);
    descales.upload(descale_values(in));
    out.resize(in.q.bits.size());
    lse.resize(size_t(in.total_q) * in.shape.heads_q);
    p = fp8_problem(in, FP_DEVICE_CUDA, q.ptr, k.ptr, v.ptr, cu_q.ptr, cu_k.ptr, descales.ptr);
    p.flags = flags;
    p.stream = stream;
    o = output_of(in, out.ptr, lse.ptr);
    fp_select_config_default(&config);
    config.mean_correction = csr != nullptr && csr->correction;
    size_t ws = 0;
    if (csr) {
      sparse = true;
      cu.upload(csr->cu);
      idx.upload(csr->idx);
      if (idx.count == 0) idx.resize(1);
      if (csr->correction) {
        k_mean.upload(csr->k_mean);
        v_mean.upload(csr->v_mean);
      }
      index = fp_index{cu.ptr, idx.ptr, csr->correction ? k_mean.ptr : nullptr,
                       csr->correction ? v_mean.ptr : nullptr, int64_t(csr->idx.size())};
      FP_OK_OR_DIE(fp_sparse_attention_workspace_size(&p, &config, &ws));
    } else {
      FP_OK_OR_DIE(fp_dense_attention_workspace_size(&p, &ws));
    }
    workspace.resize(std::max<size_t>(ws, 1));
  }
  fp_status call() {
    return sparse ? fp_sparse_attention(&p, &config, &index, &o, workspace.ptr, workspace.count)
                  : fp_dense_attention(&p, &o, workspace.ptr, workspace.count);
  }
  void attend() { FP_OK_OR_DIE(call()); }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(p.stream); }
  // New descale values (descale_values' layout) into the same device buffer, on the call's
  // stream.
  void write_descales(const std::vector<float>& d) {
    CUDA_OK(cudaMemcpyAsync(descales.ptr, d.data(), descales.count * sizeof(float),
                            cudaMemcpyHostToDevice, stream()));
    CUDA_OK(cudaStreamSynchronize(stream()));
  }
  void poison() {
    CUDA_OK(cudaMemsetAsync(out.ptr, 0xFF, out.count * 2, stream()));  // bf16 NaN
    CUDA_OK(cudaMemsetAsync(lse.ptr, 0xFF, lse.count * 4, stream()));
  }
  Result result() {
    finish(sparse ? "the sparse fp8 call" : "the dense fp8 call", stream());
    return {bf16_values(out.download()), lse.download()};
  }
};

// One poisoned call: dense with its metadata (and so its descales) validated on the host,
// sparse without (the CUDA-graph capturable form).
Result run_fp8(const Inputs& in, const Csr* csr) {
  Fp8Call call(in, csr, csr ? 0u : FP_FLAG_VALIDATE_DEVICE_METADATA);
  call.poison();
  call.attend();
  return call.result();
}

// ---- Comparison -------------------------------------------------------------------------------

struct Errors {
  double rel_l2 = 0, max_abs = 0, lse = 0;
  size_t nonfinite = 0, lse_bad = 0;
};

// Rows are (token, query head) pairs; `rows` empty means all of them.
Errors errors(const Result& got, const Result& want, const Inputs& in,
              const std::vector<int64_t>& rows = {}) {
  const int D = in.shape.head_dim, heads_q = in.shape.heads_q;
  const int64_t total_q = in.total_q;
  Errors e;
  double num = 0, den = 0;
  auto row = [&](int64_t r) {
    for (int d = 0; d < D; ++d) {
      const size_t i = size_t(r) * D + d;
      if (!std::isfinite(got.out[i])) {
        ++e.nonfinite;
        continue;
      }
      const double diff = double(got.out[i]) - want.out[i];
      num += diff * diff;
      den += double(want.out[i]) * want.out[i];
      e.max_abs = std::max(e.max_abs, std::fabs(diff));
    }
    const size_t l = size_t(r % heads_q) * size_t(total_q) + size_t(r / heads_q);
    const float a = got.lse[l], b = want.lse[l];
    if (std::isnan(a) || std::isinf(a) != std::isinf(b)) ++e.lse_bad;
    else if (std::isfinite(a)) e.lse = std::max(e.lse, double(std::fabs(a - b)));
  };
  if (rows.empty()) {
    for (int64_t r = 0; r < total_q * heads_q; ++r) row(r);
  } else {
    for (int64_t r : rows) row(r);
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

void report(const std::string& what, const Errors& e, double tolerance, bool checked = true) {
  const bool ok = e.nonfinite == 0 && e.lse_bad == 0 && e.rel_l2 <= tolerance &&
                  e.lse <= kLseTolerance;
  if (checked) {
    ++checks;
    if (!ok) ++failures;
  }
  std::printf("%-5s %-58s rel_l2 %.2e (<= %.0e)  max_abs %.2e  lse_err %.1e  nonfinite %zu  "
              "lse_bad %zu\n",
              checked ? (ok ? "PASS" : "FAIL") : "info", what.c_str(), e.rel_l2, tolerance,
              e.max_abs, e.lse, e.nonfinite, e.lse_bad);
}

void check_shape(const Shape& s) {
  const Inputs in = make_inputs(s, false);
  std::string lens;
  for (size_t b = 0; b < s.len_q.size(); ++b)
    lens += (b ? "," : "") + std::to_string(s.len_q[b]) + "/" + std::to_string(s.len_kv[b]);
  const std::string name = s.name + ": D " + std::to_string(s.head_dim) + ", Hq " +
                           std::to_string(s.heads_q) + " / Hkv " +
                           std::to_string(s.heads_kv) + " q/kv " + lens;
  // The descales' range (per (request, KV head)) or value (per tensor).
  auto range = [&](const Quantized& x) {
    const auto [lo, hi] = std::minmax_element(x.c.begin(), x.c.end());
    char text[48];
    if (s.per_head) std::snprintf(text, sizeof text, "%.3g .. %.3g", double(*lo), double(*hi));
    else std::snprintf(text, sizeof text, "%.3g", double(*lo));
    return std::string(text);
  };
  std::printf("-- %s, descales %s: c_q %s, c_k %s, c_v %s\n", name.c_str(),
              s.per_head ? "per (request, KV head)" : "per tensor", range(in.q).c_str(),
              range(in.k).c_str(), range(in.v).c_str());
  const Result fp8 = run_fp8(in, nullptr);
  const Result ref8 = cpu_fp8(in, nullptr);
  const Result exact = cpu_exact(in, nullptr);
  Bf16Run bf16(in);
  bf16.attend();
  const Result b16 = bf16.result();
  report("  dense: fp8 library vs CPU FP8 reference", errors(fp8, ref8, in),
         kFp8Tolerance);
  report("  dense: fp8 library vs float32 on dequantized inputs",
         errors(fp8, exact, in), kExactTolerance);
  report("  dense: CPU FP8 reference vs float32 (for scale)",
         errors(ref8, exact, in), kExactTolerance, false);
  report("  dense: bf16 library vs float32 (for scale)",
         errors(b16, exact, in), kExactTolerance, false);
  // Sparse mode over a random index of 30 % of the causal tiles, against both references on
  // the same index.
  const Csr csr = random_csr(s, 0.3);
  const Result sparse = run_fp8(in, &csr);
  report("  sparse 30 %: fp8 library vs CPU FP8 reference",
         errors(sparse, cpu_fp8(in, &csr), in), kFp8Tolerance);
  report("  sparse 30 %: fp8 library vs float32, same index",
         errors(sparse, cpu_exact(in, &csr), in), kExactTolerance);
  // The same index with mean correction over the blocks it leaves out (the means pooled on the
  // CPU): the e4m3 surrogate keys against the CPU FP8 reference's, and float32 ones.
  const Csr corrected = with_correction(in, csr);
  const Result sparse_corrected = run_fp8(in, &corrected);
  report("  sparse 30 %, mean correction: fp8 library vs CPU FP8 reference",
         errors(sparse_corrected, cpu_fp8(in, &corrected), in), kFp8Tolerance);
  report("  sparse 30 %, mean correction: fp8 library vs float32, same index",
         errors(sparse_corrected, cpu_exact(in, &corrected), in), kExactTolerance);
}

// A pass/fail line of its own.
void verdict(bool ok, const std::string& what) {
  ++checks;
  if (!ok) ++failures;
  std::printf("%-5s %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

bool same_bits(const Fp8Call& a, const Fp8Call& b) {
  return a.out.download() == b.out.download() && a.lse.download() == b.lse.download();
}

// The dense call captured in a CUDA graph (no host metadata: nothing synchronizes, nothing is
// allocated), replayed against the eager call, then again over new descales written into the
// same device buffer: the kernel reads them when it runs, so the replay follows them.
void check_graph(const Shape& s) {
  const Inputs in = make_inputs(s, false);
  std::printf("-- CUDA graph: %s\n", s.name.c_str());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Fp8Call captured(in, nullptr, 0, stream), eager(in, nullptr, 0, stream);
  captured.attend();  // first calls outside the capture: the kernels' one-time attributes
  eager.attend();
  finish("the eager fp8 calls", stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fp_status status = captured.call();
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  verdict(status == FP_OK,
          std::string("  capture: ") + (status == FP_OK ? "ok" : fp_last_error_message()));
  if (status != FP_OK) return;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {  // new descales, every factor halved or doubled, in the same buffers
      std::vector<float> d = descale_values(in);
      for (size_t i = 0; i < d.size(); ++i) d[i] *= i % 2 ? 2.f : 0.5f;
      captured.write_descales(d);
      eager.write_descales(d);
    }
    captured.poison();
    eager.poison();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    eager.attend();
    finish("the graph replay", stream);
    verdict(same_bits(captured, eager), round == 0
                ? "  graph replay equals the eager call, bit for bit"
                : "  replay over new device descales equals the eager call, bit for bit");
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

// A zero device descale under FP_FLAG_VALIDATE_DEVICE_METADATA: refused by name, nothing run.
void check_bad_descale(const Shape& s) {
  const Inputs in = make_inputs(s, false);
  std::printf("-- a zero descale: %s\n", s.name.c_str());
  Fp8Call call(in, nullptr, FP_FLAG_VALIDATE_DEVICE_METADATA);
  std::vector<float> d = descale_values(in);
  const size_t at = d.size() - 1;  // c_v of the last (request, KV head)
  d[at] = 0.f;
  call.write_descales(d);
  call.poison();
  const fp_status status = call.call();
  const std::string message = fp_last_error_message();
  const Result r = call.result();
  const bool untouched =
      std::all_of(r.out.begin(), r.out.end(), [](float x) { return std::isnan(x); });
  verdict(status == FP_ERROR_INVALID_ARGUMENT &&
              message.find("v_descale[request") != std::string::npos &&
              message.find("must be finite and > 0") != std::string::npos && untouched,
          "  refused (" + message + "), output untouched");
}

// ---- Paged KV, a bf16 q over the e4m3 cache, KV splits and fp_prefill ------------------------

// How a call lays out the problem of check_shape's e4m3 inputs.
struct Variant {
  std::string name;
  int page_size = 0;       // > 0: paged KV, pages of this many keys in a shuffled pool
  bool bf16_q = false;     // a bfloat16 q (the dequantized q in bf16) over the e4m3 cache
  bool dynamic_q = false;  // with bf16_q: q_descale NULL (c_q = max|q| / 448, the library's)
  int splits = 0;          // tuning.num_splits (0: the heuristic)
  bool bound_keys = false; // paged: total_k given (the sum of seqlens_k), else 0 (unbounded)
  bool fp16 = false;       // with bf16_q: the q in float16, and a float16 output
  float q_scale = 1.f;     // with bf16_q: q times this (1e-37: max|q| below 448 FLT_MIN, so the
                           // dynamic c_q is held at FLT_MIN), every fourth entry 0
};

// The 16-bit output of a variant as floats.
std::vector<float> out_values(const std::vector<uint16_t>& bits, bool fp16) {
  if (!fp16) return bf16_values(bits);
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    __half h;
    std::memcpy(&h, &bits[i], 2);
    f[i] = __half2float(h);
  }
  return f;
}

// The host tensors of a variant: the bf16 q, the paged pools and their table.
struct Layout {
  std::vector<uint16_t> q16;
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<int32_t> page_table, seqlens_k;
  int32_t num_pages = 0, max_pages = 0;
};

Layout make_layout(const Inputs& in, const Variant& var) {
  Layout l;
  if (var.bf16_q) {
    l.q16.resize(in.q.bits.size());
    for (size_t i = 0; i < l.q16.size(); ++i) {
      if (!var.fp16) {
        l.q16[i] = bf16_bits(var.q_scale == 1.f ? in.q.value(i)
                             : i % 4 == 0        ? 0.f
                                                 : in.q.value(i) * var.q_scale);
        continue;
      }
      const __half h = __float2half_rn(in.q.value(i));
      std::memcpy(&l.q16[i], &h, 2);
    }
  }
  if (var.page_size > 0) {
    const int P = var.page_size, B = int(in.shape.len_kv.size());
    const size_t row = size_t(in.shape.heads_kv) * in.shape.head_dim;
    for (int b = 0; b < B; ++b) {
      l.max_pages = std::max(l.max_pages, int32_t(ceil_div(in.shape.len_kv[b], P)));
      l.num_pages += int32_t(ceil_div(in.shape.len_kv[b], P));
      l.seqlens_k.push_back(in.shape.len_kv[b]);
    }
    l.num_pages += 3;  // pages no request holds
    std::vector<int32_t> order(size_t(l.num_pages));
    for (int32_t i = 0; i < l.num_pages; ++i) order[size_t(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);
    l.page_table.assign(size_t(B) * std::max(l.max_pages, 1), 0);
    l.k_pool.assign(size_t(l.num_pages) * P * row, 0x7f);  // NaN where no key lies
    l.v_pool.assign(l.k_pool.size(), 0x7f);
    size_t next = 0;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < in.shape.len_kv[b]; ++j) {
        if (j % P == 0) l.page_table[size_t(b) * l.max_pages + j / P] = order[next++];
        const size_t dst = (size_t(l.page_table[size_t(b) * l.max_pages + j / P]) * P + j % P) * row;
        const size_t src = size_t(in.cu_k[b] + j) * row;
        std::copy_n(in.k.bits.begin() + ptrdiff_t(src), row, l.k_pool.begin() + ptrdiff_t(dst));
        std::copy_n(in.v.bits.begin() + ptrdiff_t(src), row, l.v_pool.begin() + ptrdiff_t(dst));
      }
  }
  return l;
}

struct Pointers {
  const void *q, *k, *v;
  const int32_t *cu_q, *cu_k, *page_table, *seqlens_k;
  const float* descales;
};

// The variant's problem on `device` over `ptr` (host or device copies of in and its Layout).
fp_problem variant_problem(const Inputs& in, const Variant& var, const Layout& l,
                           fp_device device, const Pointers& ptr) {
  fp_problem p = fp8_problem(in, device, ptr.q, ptr.k, ptr.v, ptr.cu_q, ptr.cu_k, ptr.descales);
  p.tuning.num_splits = var.splits;
  if (var.bf16_q) {
    p.dtype = var.fp16 ? FP_FLOAT16 : FP_BFLOAT16;
    p.out_dtype = var.fp16 ? FP_FLOAT16 : FP_BFLOAT16;
    p.kv_dtype = FP_FLOAT8_E4M3;
    if (var.dynamic_q) {
      p.q_descale = nullptr;
      p.q_descale_stride_batch = p.q_descale_stride_head = 0;
    }
  }
  if (var.page_size > 0) {
    p.kv_layout = FP_KV_PAGED;
    p.total_k = var.bound_keys ? in.total_k : 0;
    p.cu_seqlens_k = nullptr;
    p.num_pages = l.num_pages;
    p.page_size = var.page_size;
    p.page_table = ptr.page_table;
    p.max_pages_per_seq = l.max_pages;
    p.seqlens_k = ptr.seqlens_k;
    p.k_stride_page = p.v_stride_page = int64_t(var.page_size) * p.k_stride_token;
  }
  return p;
}

// The variant on the CPU (the FP8 reference of that very problem): dense, or sparse over csr.
Result cpu_variant(const Inputs& in, const Variant& var, const Layout& l, const Csr* csr) {
  const std::vector<float> descales = descale_values(in);
  const bool paged = var.page_size > 0;
  const Pointers ptr{var.bf16_q ? static_cast<const void*>(l.q16.data()) : in.q.bits.data(),
                     paged ? l.k_pool.data() : in.k.bits.data(),
                     paged ? l.v_pool.data() : in.v.bits.data(),
                     in.cu_q.data(), in.cu_k.data(), l.page_table.data(), l.seqlens_k.data(),
                     descales.data()};
  const fp_problem p = variant_problem(in, var, l, FP_DEVICE_CPU, ptr);
  std::vector<uint16_t> bits(in.q.bits.size());
  Result r;
  r.lse.resize(size_t(in.total_q) * in.shape.heads_q);
  const fp_output o = output_of(in, bits.data(), r.lse.data());
  cpu_attend(p, o, csr);
  r.out = out_values(bits, var.fp16);
  return r;
}

Result cpu_fp8(const Inputs& in, const Csr* csr) { return cpu_variant(in, Variant{}, Layout{}, csr); }

// An index built on CUDA (fp_build_index), in device buffers, and its host copy.
struct DeviceIndex {
  DeviceBuffer<int32_t> cu, idx;
  DeviceBuffer<float> k_mean, v_mean;
  fp_index index{};
  Csr host() const {
    Csr c;
    c.cu = cu.download();
    // The CSR's used length; the capacity's tail is never written.
    c.idx = idx.download(size_t(std::max<int32_t>(c.cu.back(), 0)));
    c.correction = true;
    c.k_mean = k_mean.download();
    c.v_mean = v_mean.download();
    return c;
  }
};

bool same(const Result& a, const Result& b);

// The variant's calls on CUDA, each into the same poisoned output.
struct VariantCall {
  DeviceBuffer<uint8_t> q8, k, v;
  DeviceBuffer<uint16_t> q16;
  DeviceBuffer<int32_t> cu_q, cu_k, page_table, seqlens_k;
  DeviceBuffer<float> descales;
  DeviceBuffer<uint16_t> out;
  DeviceBuffer<float> lse;
  DeviceBuffer<char> workspace;
  fp_problem p{};
  fp_output o{};

  VariantCall(const Inputs& in, const Variant& var, const Layout& l) {
    const bool paged = var.page_size > 0;
    if (var.bf16_q) q16.upload(l.q16);
    else q8.upload(in.q.bits);
    k.upload(paged ? l.k_pool : in.k.bits);
    v.upload(paged ? l.v_pool : in.v.bits);
    cu_q.upload(in.cu_q);
    cu_k.upload(in.cu_k);
    if (paged) {
      page_table.upload(l.page_table);
      seqlens_k.upload(l.seqlens_k);
    }
    descales.upload(descale_values(in));
    out.resize(in.q.bits.size());
    lse.resize(size_t(in.total_q) * in.shape.heads_q);
    const Pointers ptr{var.bf16_q ? static_cast<const void*>(q16.ptr) : q8.ptr, k.ptr, v.ptr,
                       cu_q.ptr, cu_k.ptr, page_table.ptr, seqlens_k.ptr, descales.ptr};
    p = variant_problem(in, var, l, FP_DEVICE_CUDA, ptr);
    o = output_of(in, out.ptr, lse.ptr);
    fp16_out = var.fp16;
  }
  bool fp16_out = false;
  void room(size_t bytes) {
    if (workspace.count < bytes) workspace.resize(bytes);
  }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(p.stream); }
  Result result(const char* what) {
    finish(what, stream());
    return {out_values(out.download(), fp16_out), lse.download()};
  }
  void poison() {  // NaN in bf16 and fp16
    CUDA_OK(cudaMemsetAsync(out.ptr, 0xFF, out.count * 2, stream()));
    CUDA_OK(cudaMemsetAsync(lse.ptr, 0xFF, lse.count * 4, stream()));
  }
  Result dense() {
    size_t ws = 0;
    FP_OK_OR_DIE(fp_dense_attention_workspace_size(&p, &ws));
    room(std::max<size_t>(ws, 1));
    poison();
    FP_OK_OR_DIE(fp_dense_attention(&p, &o, workspace.ptr, workspace.count));
    return result("the dense call");
  }
  Result sparse(const fp_select_config& config, const fp_index& index) {
    size_t ws = 0;
    FP_OK_OR_DIE(fp_sparse_attention_workspace_size(&p, &config, &ws));
    room(std::max<size_t>(ws, 1));
    poison();
    FP_OK_OR_DIE(fp_sparse_attention(&p, &config, &index, &o, workspace.ptr, workspace.count));
    return result("the sparse call");
  }
  Result prefill(const fp_select_config& config) {
    size_t ws = 0;
    FP_OK_OR_DIE(fp_prefill_workspace_size(&p, &config, &ws));
    room(std::max<size_t>(ws, 1));
    poison();
    FP_OK_OR_DIE(fp_prefill(&p, &config, &o, workspace.ptr, workspace.count));
    return result("the prefill call");
  }
  void build_index(const fp_select_config& config, DeviceIndex* d) {
    fp_index_sizes sizes;
    FP_OK_OR_DIE(fp_index_sizes_query(&p, &config, &sizes));
    d->cu.resize(size_t(sizes.num_segments) + 1);
    d->idx.resize(size_t(std::max<int64_t>(sizes.idx_capacity, 1)));
    d->k_mean.resize(size_t(std::max<int64_t>(sizes.mean_elements, 1)));
    d->v_mean.resize(d->k_mean.count);
    // NaN in every entry fp_build_index leaves unwritten, as the outputs are poisoned.
    CUDA_OK(cudaMemset(d->k_mean.ptr, 0xFF, d->k_mean.count * sizeof(float)));
    CUDA_OK(cudaMemset(d->v_mean.ptr, 0xFF, d->v_mean.count * sizeof(float)));
    d->index = fp_index{d->cu.ptr, d->idx.ptr, d->k_mean.ptr, d->v_mean.ptr,
                        int64_t(d->idx.count)};
    size_t ws = 0;
    FP_OK_OR_DIE(fp_build_index_workspace_size(&p, &config, &ws));
    room(std::max<size_t>(ws, 1));
    FP_OK_OR_DIE(fp_build_index(&p, &config, &d->index, workspace.ptr, workspace.count));
    finish("fp_build_index", stream());
  }
};

// fp_prefill of a variant captured in a CUDA graph on its own stream (q quantized, the paged
// cache gathered, the ranges selected and attended, all inside the graph), replayed into a
// poisoned output against the eager call, bit for bit.
void check_variant_graph(const Shape& s, const Variant& var) {
  const Inputs in = make_inputs(s, false);
  const Layout l = make_layout(in, var);
  std::printf("-- CUDA graph of fp_prefill: %s: %s\n", s.name.c_str(), var.name.c_str());
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  VariantCall gpu(in, var, l);
  gpu.p.stream = stream;
  fp_select_config config;
  fp_select_config_default(&config);
  const Result eager = gpu.prefill(config);  // sizes the workspace; first-call attributes
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const fp_status status =
      fp_prefill(&gpu.p, &config, &gpu.o, gpu.workspace.ptr, gpu.workspace.count);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  verdict(status == FP_OK,
          std::string("  capture: ") + (status == FP_OK ? "ok" : fp_last_error_message()));
  if (status == FP_OK) {
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    gpu.poison();
    CUDA_OK(cudaGraphLaunch(exec, stream));
    verdict(same(gpu.result("the graph replay"), eager),
            "  graph replay equals the eager call, bit for bit");
    CUDA_OK(cudaGraphExecDestroy(exec));
  }
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

bool same(const Result& a, const Result& b) {
  return std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

// Each variant of one shape against the CPU FP8 reference of the same problem: dense, sparse
// over a random index with mean correction, and fp_prefill (the default selection; alpha 0,
// every block, against dense), its output equal bit for bit to fp_build_index then
// fp_sparse_attention on CUDA, and that index attended on the CPU.
void check_variant(const Shape& s, const Variant& var) {
  const Inputs in = make_inputs(s, false);
  const Layout l = make_layout(in, var);
  std::printf("-- %s: %s\n", s.name.c_str(), var.name.c_str());
  VariantCall gpu(in, var, l);
  report("  dense: fp8 library vs CPU FP8 reference", errors(gpu.dense(), cpu_variant(in, var, l, nullptr), in),
         kFp8Tolerance);
  const Csr csr = with_correction(in, random_csr(s, 0.3));
  {
    DeviceBuffer<int32_t> cu, idx;
    DeviceBuffer<float> k_mean, v_mean;
    cu.upload(csr.cu);
    idx.upload(csr.idx);
    if (idx.count == 0) idx.resize(1);
    k_mean.upload(csr.k_mean);
    v_mean.upload(csr.v_mean);
    fp_select_config config;
    fp_select_config_default(&config);
    const fp_index index{cu.ptr, idx.ptr, k_mean.ptr, v_mean.ptr, int64_t(csr.idx.size())};
    report("  sparse 30 %, mean correction: vs CPU FP8 reference",
           errors(gpu.sparse(config, index), cpu_variant(in, var, l, &csr), in), kFp8Tolerance);
  }
  fp_select_config config;
  fp_select_config_default(&config);
  DeviceIndex built;
  gpu.build_index(config, &built);
  const Result two_calls = gpu.sparse(config, built.index);
  const Result prefill = gpu.prefill(config);
  verdict(same(prefill, two_calls),
          "  fp_prefill equals fp_build_index + fp_sparse_attention, bit for bit");
  const Csr host_index = built.host();
  report("  the CUDA index (mean correction): vs CPU FP8 reference, same index",
         errors(two_calls, cpu_variant(in, var, l, &host_index), in), kFp8Tolerance);
  fp_select_config every = config;
  every.alpha = 0.f;
  report("  fp_prefill, alpha 0 (every block): vs CPU FP8 dense",
         errors(gpu.prefill(every), cpu_variant(in, var, l, nullptr), in), kFp8Tolerance);
}

// ---- Timing -----------------------------------------------------------------------------------

template <class Launch>
double median_ms(int reps, Launch&& launch) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  launch();  // warm-up
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& t : ms) {
    CUDA_OK(cudaEventRecord(start));
    launch();
    CUDA_OK(cudaEventRecord(stop));
    finish("a timed launch");
    CUDA_OK(cudaEventElapsedTime(&t, start, stop));
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Float64 attention for a few (token, query head) rows on the dequantized inputs: the 32K case's
// reference, where the CPU's full attention would take minutes.
Result sampled_exact(const Inputs& in, const std::vector<int64_t>& rows) {
  const int hq = in.shape.heads_q, g = hq / in.shape.heads_kv, D = in.shape.head_dim;
  Result r;
  r.out.assign(size_t(in.total_q) * hq * D, 0.f);
  r.lse.assign(size_t(in.total_q) * hq, 0.f);
  std::vector<double> s, acc(D);
  for (int64_t row : rows) {
    const int64_t token = row / hq;
    const int head = int(row % hq), kv_head = head / g;
    // One request (the timing case): keys 0 ... offset + token.
    const int64_t keys = in.shape.len_kv[0] - in.shape.len_q[0] + token + 1;
    s.assign(size_t(keys), 0.0);
    double mx = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) {
      double dot = 0;
      for (int d = 0; d < D; ++d)
        dot += double(in.q.value(size_t(row) * D + d)) *
               in.k.value((size_t(j) * in.shape.heads_kv + kv_head) * D + d);
      s[size_t(j)] = dot * softmax_scale(D);
      mx = std::max(mx, s[size_t(j)]);
    }
    double l = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < keys; ++j) {
      const double w = std::exp(s[size_t(j)] - mx);
      l += w;
      for (int d = 0; d < D; ++d)
        acc[size_t(d)] += w * in.v.value((size_t(j) * in.shape.heads_kv + kv_head) * D + d);
    }
    for (int d = 0; d < D; ++d) r.out[size_t(row) * D + d] = float(acc[size_t(d)] / l);
    r.lse[size_t(head) * size_t(in.total_q) + size_t(token)] = float(mx + std::log(l));
  }
  return r;
}

void time_shape(const Shape& s, int reps) {
  const Inputs in = make_inputs(s, true);
  const double flops = causal_flops(in);
  std::printf("-- timing %s: B 1, Hq %d, Hkv %d, D %d, L %d, causal, %.3g TFLOP per call; median "
              "of %d\n",
              s.name.c_str(), s.heads_q, s.heads_kv, s.head_dim, s.len_q[0], flops * 1e-12, reps);
  Fp8Call fp8(in, nullptr, 0);
  fp8.poison();
  const double fp8_ms = median_ms(reps, [&] { fp8.attend(); });
  const Result got = fp8.result();
  Bf16Run bf16(in);
  const double bf16_ms = median_ms(reps, [&] { bf16.attend(); });
  const Result b16 = bf16.result();
  std::vector<int64_t> rows;
  std::uniform_int_distribution<int64_t> any_row(0, in.total_q * s.heads_q - 1);
  for (int i = 0; i < 12; ++i) rows.push_back(any_row(rng));
  for (int i = 1; i <= 4; ++i) rows.push_back(in.total_q * s.heads_q - i * 7);  // longest rows
  const Result exact = sampled_exact(in, rows);
  report("  fp8 library vs float64, 16 sampled rows", errors(got, exact, in, rows),
         kExactTolerance);
  report("  bf16 library vs float64, same rows", errors(b16, exact, in, rows),
         kExactTolerance, false);
  const auto tflops = [&](double ms) { return flops / (ms * 1e-3) * 1e-12; };
  std::printf("      e4m3 fp_dense_attention  %8.3f ms  %6.1f TFLOP/s (V transpose + kernel)\n",
              fp8_ms, tflops(fp8_ms));
  std::printf("      bf16 fp_dense_attention  %8.3f ms  %6.1f TFLOP/s\n", bf16_ms, tflops(bf16_ms));
  std::printf("      e4m3 / bf16 speedup      %8.2fx\n", bf16_ms / fp8_ms);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 0;
  if (!start_check(argc, argv, seed)) return 2;
  rng.seed(seed);
  std::printf("e4m3 attention through the C ABI (causal, device descales), seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::printf("tolerances: relative L2 %.0e against the CPU FP8 reference, %.0e against float32 "
              "attention on the dequantized inputs, LSE %.2e absolute (docs/ALGORITHM.md)\n",
              kFp8Tolerance, kExactTolerance, kLseTolerance);
  const std::vector<Shape> shapes = {
      {"one tile", 128, 8, 2, {1}, {1}, false},
      {"varlen", 128, 8, 2, {777, 2048}, {777, 2048}, true},
      {"varlen, cached prefixes", 128, 8, 2, {300, 1000}, {1500, 1064}, true},
      {"g = 3 (Q by cp.async)", 128, 6, 2, {1000, 65}, {1000, 65}, true},
      {"g = 1", 128, 4, 4, {129, 513}, {129, 513}, false},
      {"L 4K", 128, 8, 2, {4096}, {4096}, true},
      {"D 64 varlen", 64, 8, 2, {1000, 300}, {1000, 700}, true},
      {"D 64 L 4K", 64, 8, 2, {4096}, {4096}, false},
  };
  // "stress N [density]" (argv[2] ...): N rounds of the cached-prefix shape's dense call and
  // sparse calls over a random index of `density` (0.3) of the causal tiles without and with mean
  // correction, each poisoned and waited for, nothing compared: a kernel that sometimes never
  // finishes, or runs far longer than it should, shows here (under compute-sanitizer too).
  if (argc > 3 && std::strcmp(argv[2], "stress") == 0) {
    hang_seconds = 60;
    slow_seconds = 3;
    const int rounds = std::atoi(argv[3]);
    const double density = argc > 4 ? std::atof(argv[4]) : 0.3;
    const Inputs in = make_inputs(shapes[2], false);
    const Csr csr = random_csr(shapes[2], density);
    const Csr corrected = with_correction(in, csr);
    for (int r = 0; r < rounds; ++r) {
      std::printf("round %d:", r);
      const Csr* kinds[3] = {nullptr, &csr, &corrected};
      const char* names[3] = {"dense", "sparse", "sparse with mean correction"};
      for (int k = 0; k < 3; ++k) {
        std::printf(" %s", names[k]);
        std::fflush(stdout);
        run_fp8(in, kinds[k]);
      }
      std::printf("\n");
    }
    std::printf("%s: %d stress rounds finished, %d calls ran past %.0f s\n",
                slow_calls ? "FAIL" : "PASS", rounds, slow_calls, slow_seconds);
    return slow_calls ? 1 : 0;
  }
  // "small" (argv[2], for compute-sanitizer): the first three shapes, no graph and no timing.
  const bool small_only = argc > 2 && std::strcmp(argv[2], "small") == 0;
  for (size_t i = 0; i < (small_only ? 3 : shapes.size()); ++i) check_shape(shapes[i]);
  const std::vector<Variant> variants = {
      {"paged KV, pages of 16", 16},
      {"paged KV, pages of 64", 64},
      {"paged KV, pages of 1000", 1000},
      {"bf16 q over the e4m3 cache, dynamic c_q", 0, true, true},
      {"bf16 q over the e4m3 cache, given c_q", 0, true, false},
      {"3 KV splits", 0, false, false, 3},
      {"paged 32, total_k given, 3 KV splits", 32, false, false, 3, true},
      {"paged 16, fp16 q (dynamic c_q), fp16 output", 16, true, true, 0, false, true},
      {"bf16 q of magnitude 1e-37 (dynamic c_q held at FLT_MIN), zeros in q", 0, true, true, 0,
       false, false, 1e-37f},
      {"paged 48, bf16 q (dynamic c_q), 2 KV splits", 48, true, true, 2},
  };
  if (small_only) check_variant(shapes[2], variants.back());
  else
    for (const size_t i : {size_t(2), size_t(6)})
      for (const Variant& var : variants) check_variant(shapes[i], var);
  if (!small_only) check_variant_graph(shapes[2], variants.back());
  if (!small_only) {
    check_graph(shapes[2]);
    check_bad_descale(shapes[1]);
    time_shape({"32K", 128, 32, 8, {32768}, {32768}, true}, 10);
  }
  std::printf("%s: %d of %d checks passed\n", failures ? "FAIL" : "PASS", checks - failures,
              checks);
  return failures ? 1 : 0;
}
