// GPU check of the e4m3 attention kernel (Eq. 15; docs/KERNEL.md "FP8 e4m3"), which the C ABI
// does not reach yet: the kernel is instantiated here and launched directly, in dense mode and
// in sparse mode over a random index, on random e4m3 Q/K/V with per-tensor descales
// (c = max |x| / 448; fresh data each run, the seed printed). Each output, poisoned first, is
// compared against the CPU FP8 reference (the library on the CPU, dtype FP_FLOAT8_E4M3) and
// against float32 attention on the dequantized inputs, beside the library's bf16 operator on the
// same dequantized inputs. Then one 32K timing case: the e4m3 kernel against the library's bf16
// dense attention (CUDA events, median). Exit status 0 when every check passes.
// Usage: fp_gpu_fp8_check [seed [small]] ("small": three shapes, no timing, for sanitizers).
#include <cuda.h>
#include <cuda_bf16.h>
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
#include "cuda/attention/heuristics.hpp"
#include "cuda/attention/launch.cuh"
#include "cuda/attention/schedule_prep.hpp"
#include "cuda/attention/transpose_v.cuh"
#include "flashprefill/flashprefill.h"
#include "gpu_check.hpp"

namespace {

namespace attn = flashprefill::cuda::attention;
using flashprefill::ceil_div;
using flashprefill::kKvTile;
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
};

int max_of(const std::vector<int>& v) { return *std::max_element(v.begin(), v.end()); }

// One e4m3 tensor with its per-tensor descale c: bits = round_e4m3(x / c), value = c * e4m3.
struct Quantized {
  std::vector<uint8_t> bits;
  float c = 1.f;
  float value(size_t i) const { return c * e4m3_value(bits[i]); }
};

// Random normal data (fast: a cheaper uniform one, for the timing case), quantized per tensor.
Quantized quantize_random(size_t n, bool fast) {
  std::vector<float> x(n);
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
  float amax = 0.f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  Quantized q;
  q.c = amax > 0.f ? amax / kE4m3Max : 1.f;
  q.bits.resize(n);
  const float inv = 1.f / q.c;
  for (size_t i = 0; i < n; ++i) q.bits[i] = e4m3_bits(std::clamp(x[i] * inv, -kE4m3Max, kE4m3Max));
  return q;
}

struct Inputs {
  Shape shape;
  std::vector<int32_t> cu_q, cu_k;
  int64_t total_q = 0, total_k = 0;
  Quantized q, k, v;  // [total, heads, D]
};

Inputs make_inputs(const Shape& s, bool fast) {
  const int D = s.head_dim;
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
  in.q = quantize_random(size_t(in.total_q) * s.heads_q * D, fast);
  in.k = quantize_random(size_t(in.total_k) * s.heads_kv * D, fast);
  in.v = quantize_random(size_t(in.total_k) * s.heads_kv * D, fast);
  return in;
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

// Waits for the work queued on the default stream; a kernel that has not finished after
// kHangSeconds counts as hung: the check says so and exits (a hung kernel cannot be recovered).
constexpr double kHangSeconds = 30;
void finish(const char* what) {
  cudaEvent_t done;
  CUDA_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(done));
  const auto start = std::chrono::steady_clock::now();
  cudaError_t e;
  while ((e = cudaEventQuery(done)) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kHangSeconds) {
      std::printf("FAIL: %s has not finished after %.0f s (hung)\n", what, kHangSeconds);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CUDA_OK(e);
  CUDA_OK(cudaEventDestroy(done));
}

// ---- The e4m3 kernel, launched directly ------------------------------------------------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// A byte tensor map (dims innermost first, byte strides of the outer dims); exits on failure.
void encode_bytes(CUtensorMap* map, const void* base, cuuint32_t rank, const cuuint64_t* dims,
                  const cuuint64_t* strides, const cuuint32_t* box, CUtensorMapSwizzle swizzle,
                  const char* what) {
  static const EncodeTiled encode = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                             cudaEnableDefault, &found));
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(f) : nullptr;
  }();
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode ? encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(base), dims,
                      strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
             : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed for %s (CUresult %d)\n", what, int(r));
    std::exit(2);
  }
}

int sm_count() {
  int device = 0, n = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  return n;
}
int l2_bytes() {
  int device = 0, n = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&n, cudaDevAttrL2CacheSize, device));
  return n;
}

// Device copies of the inputs, the transposed V, the outputs and the kernel's parameters.
struct Fp8Run {
  DeviceBuffer<uint8_t> q, k, v, vt;
  DeviceBuffer<int32_t> cu_q, cu_k, schedule, cu, idx;
  DeviceBuffer<uint16_t> out;  // bf16 [total_q, Hq, D]
  DeviceBuffer<float> lse;     // [Hq, total_q]
  attn::AttentionParams p;
  int64_t vt_rows = 0;
  int32_t max_kv_tiles = 0;
  int D = 0;

  // Dense mode, or sparse mode over csr.
  explicit Fp8Run(const Inputs& in, const Csr* csr = nullptr) {
    const Shape& s = in.shape;
    const int B = int(s.len_q.size()), g = s.heads_q / s.heads_kv;
    D = s.head_dim;
    q.upload(in.q.bits);
    k.upload(in.k.bits);
    v.upload(in.v.bits);
    cu_q.upload(in.cu_q);
    cu_k.upload(in.cu_k);
    vt_rows = attn::transposed_v_rows(in.total_k, B);
    vt.resize(size_t(vt_rows) * s.heads_kv * D);
    CUDA_OK(cudaMemset(vt.ptr, 0xFF, vt.count));  // rows no tile reads stay NaN
    out.resize(size_t(in.total_q) * s.heads_q * D);
    lse.resize(size_t(in.total_q) * s.heads_q);
    schedule.resize(attn::schedule_bytes(B) / sizeof(int32_t));
    max_kv_tiles = int32_t(ceil_div(int64_t(max_of(s.len_kv)), kKvTile));

    const int64_t token_q = int64_t(s.heads_q) * D, token_kv = int64_t(s.heads_kv) * D;
    p.q = q.ptr;
    p.q_stride_token = token_q;
    p.q_stride_head = D;
    p.total_q = in.total_q;
    p.cu_seqlens_q = cu_q.ptr;
    p.k = k.ptr;
    p.v = vt.ptr;
    p.k_stride_token = p.v_stride_token = token_kv;
    p.k_stride_head = p.v_stride_head = D;
    p.cu_seqlens_k = cu_k.ptr;
    p.batch = B;
    p.heads_kv = s.heads_kv;
    p.group = g;
    p.max_q_tiles = max_q_tiles(s);
    p.tile_begin = 0;  // one launch for every query tile
    p.range_tiles = p.max_q_tiles;
    if (csr) {
      cu.upload(csr->cu);
      idx.upload(csr->idx);
      if (idx.count == 0) idx.resize(1);
      p.sparse = true;
      p.cu = cu.ptr;
      p.idx = idx.ptr;
      p.idx_capacity = int64_t(csr->idx.size());
    }
    p.scale_log2 = softmax_scale(D) * float(M_LOG2E) * in.q.c * in.k.c;  // c_q c_k (Eq. 15)
    p.v_descale = in.v.c;
    p.out = out.ptr;
    p.out_stride_token = token_q;
    p.out_stride_head = D;
    p.out_vec16 = true;
    p.lse = lse.ptr;
    p.num_splits = 1;
    const int64_t items =
        std::min<int64_t>(ceil_div(int64_t(g) * in.total_q, kTileRows) + B,
                          int64_t(p.max_q_tiles) * B) * s.heads_kv;
    p.ctas = int32_t(std::min<int64_t>(items, sm_count()));
    // Head sections as heuristics.hpp sizes them, for one-byte K and V.
    const int64_t head_bytes = std::max<int64_t>(2 * int64_t(max_of(s.len_kv)) * D, 1);
    p.head_section = int32_t(std::clamp<int64_t>(
        int64_t(double(l2_bytes()) * attn::kL2Share) / head_bytes, 1, s.heads_kv));
    p.lead_tiles = attn::choose_lead_tiles(p.ctas, p.heads_kv, 1);

    // Q and K rows are D bytes: one swizzle row of the stages (KernelTraits::AtomQK).
    const CUtensorMapSwizzle row_swizzle =
        D == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    // K: (D, Hkv, total_k) in D x 1 x 64-key boxes.
    const cuuint64_t k_dims[3] = {cuuint64_t(D), cuuint64_t(s.heads_kv), cuuint64_t(in.total_k)};
    const cuuint64_t k_strides[2] = {cuuint64_t(D), cuuint64_t(token_kv)};
    const cuuint32_t k_box[3] = {cuuint32_t(D), 1, kKvTile};
    encode_bytes(&p.tma_k, k.ptr, 3, k_dims, k_strides, k_box, row_swizzle, "K");
    // V^T: (rows, D, Hkv) in 64-key x D boxes, the 64-byte swizzle of SmemLayoutVt.
    const cuuint64_t v_dims[3] = {cuuint64_t(vt_rows), cuuint64_t(D), cuuint64_t(s.heads_kv)};
    const cuuint64_t v_strides[2] = {cuuint64_t(vt_rows), cuuint64_t(vt_rows) * D};
    const cuuint32_t v_box[3] = {kKvTile, cuuint32_t(D), 1};
    encode_bytes(&p.tma_v, vt.ptr, 3, v_dims, v_strides, v_box, CU_TENSOR_MAP_SWIZZLE_64B, "V^T");
    p.tma = true;
    // Q: (D, g, Hkv, total_q, 1) in D x g x 1 x (128 / g) x 1 boxes (a whole query tile) when g
    // is a power of two; else cp.async.
    p.q_tma = (g & (g - 1)) == 0 && g <= kTileRows;
    if (p.q_tma) {
      const cuuint64_t q_dims[5] = {cuuint64_t(D), cuuint64_t(g), cuuint64_t(s.heads_kv),
                                    cuuint64_t(in.total_q), 1};
      const cuuint64_t q_strides[4] = {cuuint64_t(D), cuuint64_t(g) * D, cuuint64_t(token_q),
                                       cuuint64_t(D)};
      const cuuint32_t q_box[5] = {cuuint32_t(D), cuuint32_t(g), 1, cuuint32_t(kTileRows / g), 1};
      encode_bytes(&p.tma_q, q.ptr, 5, q_dims, q_strides, q_box, row_swizzle, "Q");
    }
  }

  void transpose(cudaStream_t stream) {
    auto* launch = D == 128 ? &attn::launch_transpose_v<128> : &attn::launch_transpose_v<64>;
    CUDA_OK(launch(v.ptr, p.v_stride_token, p.v_stride_head, cu_k.ptr, p.batch, p.heads_kv,
                   max_kv_tiles, vt.ptr, vt_rows, stream));
  }
  void attend(cudaStream_t stream) {
    using E4m3 = cutlass::float_e4m3_t;
    constexpr attn::KvLayout kContiguous = attn::KvLayout::kContiguous;
    auto* launch = D == 128 ? &attn::launch_attention<E4m3, 128, kContiguous>
                            : &attn::launch_attention<E4m3, 64, kContiguous>;
    p.work_counter = schedule.ptr;
    p.tile_prefix = schedule.ptr + 1;
    CUDA_OK(attn::launch_prepare_schedule(p, stream));
    CUDA_OK(launch(p, stream));
  }
};

struct Result {
  std::vector<float> out;  // [total_q, Hq, D]
  std::vector<float> lse;  // [Hq, total_q]
};

Result run_fp8(const Inputs& in, const Csr* csr) {
  Fp8Run run(in, csr);
  CUDA_OK(cudaMemset(run.out.ptr, 0xFF, run.out.count * 2));  // bf16 NaN
  CUDA_OK(cudaMemset(run.lse.ptr, 0xFF, run.lse.count * 4));
  run.transpose(nullptr);
  run.attend(nullptr);
  finish(csr ? "the sparse fp8 kernel" : "the dense fp8 kernel");
  Result r;
  const std::vector<uint16_t> bits = run.out.download();
  r.out.resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) r.out[i] = bf16_value(bits[i]);
  r.lse = run.lse.download();
  return r;
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

// fp_dense_attention, or fp_sparse_attention over csr (no mean correction), on the CPU.
void cpu_attend(const fp_problem& p, const fp_output& o, const Csr* csr) {
  if (!csr) {
    FP_OK_OR_DIE(fp_dense_attention(&p, &o, nullptr, 0));
    return;
  }
  fp_select_config config;
  fp_select_config_default(&config);
  config.mean_correction = 0;
  fp_index_sizes sizes;
  FP_OK_OR_DIE(fp_index_sizes_query(&p, &config, &sizes));
  std::vector<int32_t> cu = csr->cu, idx = csr->idx;
  idx.resize(std::max<size_t>(idx.size(), 1));
  std::vector<float> k_mean(size_t(std::max<int64_t>(sizes.mean_elements, 1)), 0.f);
  const fp_index index{cu.data(), idx.data(), k_mean.data(), nullptr, int64_t(csr->idx.size())};
  FP_OK_OR_DIE(fp_sparse_attention(&p, &config, &index, &o, nullptr, 0));
}

// The CPU FP8 reference (Eq. 15, the same stages), bf16 output.
Result cpu_fp8(const Inputs& in, const Csr* csr) {
  fp_problem p = base_problem(in);
  p.device = FP_DEVICE_CPU;
  p.dtype = FP_FLOAT8_E4M3;
  p.out_dtype = FP_BFLOAT16;
  p.q = in.q.bits.data();
  p.k = in.k.bits.data();
  p.v = in.v.bits.data();
  p.cu_seqlens_q = in.cu_q.data();
  p.cu_seqlens_k = in.cu_k.data();
  p.q_descale = &in.q.c;
  p.k_descale = &in.k.c;
  p.v_descale = &in.v.c;
  std::vector<uint16_t> bits(in.q.bits.size());
  Result r;
  r.lse.resize(size_t(in.total_q) * in.shape.heads_q);
  const fp_output o = output_of(in, bits.data(), r.lse.data());
  cpu_attend(p, o, csr);
  r.out.resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) r.out[i] = bf16_value(bits[i]);
  return r;
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
    Result r;
    const std::vector<uint16_t> bits = out.download();
    r.out.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) r.out[i] = bf16_value(bits[i]);
    r.lse = lse.download();
    return r;
  }
};

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
  std::printf("-- %s (c_q %.3g, c_k %.3g, c_v %.3g)\n", name.c_str(), in.q.c, in.k.c, in.v.c);
  const Result fp8 = run_fp8(in, nullptr);
  const Result ref8 = cpu_fp8(in, nullptr);
  const Result exact = cpu_exact(in, nullptr);
  Bf16Run bf16(in);
  bf16.attend();
  const Result b16 = bf16.result();
  report("  dense: fp8 kernel vs CPU FP8 reference", errors(fp8, ref8, in),
         kFp8Tolerance);
  report("  dense: fp8 kernel vs float32 on dequantized inputs",
         errors(fp8, exact, in), kExactTolerance);
  report("  dense: CPU FP8 reference vs float32 (for scale)",
         errors(ref8, exact, in), kExactTolerance, false);
  report("  dense: bf16 library vs float32 (for scale)",
         errors(b16, exact, in), kExactTolerance, false);
  // Sparse mode over a random index of 30 % of the causal tiles, against both references on
  // the same index.
  const Csr csr = random_csr(s, 0.3);
  const Result sparse = run_fp8(in, &csr);
  report("  sparse 30 %: fp8 kernel vs CPU FP8 reference",
         errors(sparse, cpu_fp8(in, &csr), in), kFp8Tolerance);
  report("  sparse 30 %: fp8 kernel vs float32, same index",
         errors(sparse, cpu_exact(in, &csr), in), kExactTolerance);
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
  Fp8Run fp8(in);
  CUDA_OK(cudaMemset(fp8.out.ptr, 0xFF, fp8.out.count * 2));
  CUDA_OK(cudaMemset(fp8.lse.ptr, 0xFF, fp8.lse.count * 4));
  const double transpose_ms = median_ms(reps, [&] { fp8.transpose(nullptr); });
  const double fp8_ms = median_ms(reps, [&] { fp8.attend(nullptr); });
  CUDA_OK(cudaDeviceSynchronize());
  Result got;
  {
    const std::vector<uint16_t> bits = fp8.out.download();
    got.out.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) got.out[i] = bf16_value(bits[i]);
    got.lse = fp8.lse.download();
  }
  Bf16Run bf16(in);
  const double bf16_ms = median_ms(reps, [&] { bf16.attend(); });
  const Result b16 = bf16.result();
  std::vector<int64_t> rows;
  std::uniform_int_distribution<int64_t> any_row(0, in.total_q * s.heads_q - 1);
  for (int i = 0; i < 12; ++i) rows.push_back(any_row(rng));
  for (int i = 1; i <= 4; ++i) rows.push_back(in.total_q * s.heads_q - i * 7);  // longest rows
  const Result exact = sampled_exact(in, rows);
  report("  fp8 kernel vs float64, 16 sampled rows", errors(got, exact, in, rows),
         kExactTolerance);
  report("  bf16 library vs float64, same rows", errors(b16, exact, in, rows),
         kExactTolerance, false);
  const auto tflops = [&](double ms) { return flops / (ms * 1e-3) * 1e-12; };
  std::printf("      fp8 attention kernel     %8.3f ms  %6.1f TFLOP/s\n", fp8_ms, tflops(fp8_ms));
  std::printf("      fp8 V transpose step     %8.3f ms\n", transpose_ms);
  std::printf("      fp8 transpose + kernel   %8.3f ms  %6.1f TFLOP/s\n", transpose_ms + fp8_ms,
              tflops(transpose_ms + fp8_ms));
  std::printf("      bf16 fp_dense_attention  %8.3f ms  %6.1f TFLOP/s\n", bf16_ms, tflops(bf16_ms));
  std::printf("      fp8 kernel / bf16        %8.2fx (with the transpose %.2fx)\n",
              bf16_ms / fp8_ms, bf16_ms / (transpose_ms + fp8_ms));
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 0;
  if (!start_check(argc, argv, seed)) return 2;
  rng.seed(seed);
  std::printf("e4m3 attention kernel (causal, per-tensor descales), seed %llu\n",
              static_cast<unsigned long long>(seed));
  std::printf("tolerances: relative L2 %.0e against the CPU FP8 reference, %.0e against float32 "
              "attention on the dequantized inputs, LSE %.2e absolute (docs/ALGORITHM.md)\n",
              kFp8Tolerance, kExactTolerance, kLseTolerance);
  const std::vector<Shape> shapes = {
      {"one tile", 128, 8, 2, {1}, {1}},
      {"varlen", 128, 8, 2, {777, 2048}, {777, 2048}},
      {"varlen, cached prefixes", 128, 8, 2, {300, 1000}, {1500, 1064}},
      {"g = 3 (Q by cp.async)", 128, 6, 2, {1000, 65}, {1000, 65}},
      {"g = 1", 128, 4, 4, {129, 513}, {129, 513}},
      {"L 4K", 128, 8, 2, {4096}, {4096}},
      {"D 64 varlen", 64, 8, 2, {1000, 300}, {1000, 700}},
      {"D 64 L 4K", 64, 8, 2, {4096}, {4096}},
  };
  // "small" (argv[2], for compute-sanitizer): the first three shapes and no timing.
  const bool small_only = argc > 2 && std::strcmp(argv[2], "small") == 0;
  for (size_t i = 0; i < (small_only ? 3 : shapes.size()); ++i) check_shape(shapes[i]);
  if (!small_only) time_shape({"32K", 128, 32, 8, {32768}, {32768}}, 10);
  std::printf("%s: %d of %d checks passed\n", failures ? "FAIL" : "PASS", checks - failures,
              checks);
  return failures ? 1 : 0;
}
