// The quantized q of a bf16/fp16 q over an e4m3 KV cache (quantize_q.hpp): one pass for max|q|
// per (request, KV head) when q_descale is NULL, one pass writing round_e4m3(q * (1 / c_q)).
#include "cuda/quantize/quantize_q.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/checked.hpp"
#include "cuda/attention/fp8.hpp"

namespace flashprefill::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr int kThreads = 256;
constexpr int64_t kGridCtas = 1024;  // CTAs of one pass (the grid's x: per (request, KV head))
constexpr float kE4m3Max = 448.f;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

struct FrontLayout {
  size_t q = 0, c = 0, amax = 0;
  size_t total() const { return q + c + amax; }
};

FrontLayout front_layout(const fp_problem& p) {
  const size_t pairs = size_t(p.batch_size) * size_t(p.num_heads_kv);
  return {align_up(size_t(p.total_q) * size_t(p.num_heads_q) * size_t(p.head_dim)),
          align_up(pairs * sizeof(float)), align_up(pairs * sizeof(uint32_t))};
}

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// The 8 elements of one 16-byte chunk of q as floats.
template <class T>
__device__ __forceinline__ void load8(const T* src, float (&x)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(src);
  const T* e = reinterpret_cast<const T*>(&u);
  for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
}

struct QSource {
  const void* q;
  int64_t stride_token, stride_head;
  const int32_t* cu_q;
  int32_t group, head_dim, heads_kv;
};

// max|q| over the finite q of (request blockIdx.y, KV head blockIdx.z)'s group, into amax as
// float bits (non-negative floats order as their bits do; amax zeroed before).
template <class T>
__global__ void __launch_bounds__(kThreads) q_amax_kernel(const QSource s, uint32_t* amax) {
  const int32_t b = blockIdx.y, h = blockIdx.z;
  const int32_t row0 = s.cu_q[b], len = s.cu_q[b + 1] - row0;
  const int32_t chunks = s.group * s.head_dim / 8;
  float m = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < int64_t(len) * chunks;
       i += int64_t(gridDim.x) * kThreads) {
    const int32_t r = int32_t(i / chunks), c = int32_t(i % chunks);
    const int32_t hq = h * s.group + c * 8 / s.head_dim, d = c * 8 % s.head_dim;
    float x[8];
    load8(static_cast<const T*>(s.q) + (row0 + r) * s.stride_token + hq * s.stride_head + d, x);
    for (float v : x)
      if (isfinite(v)) m = fmaxf(m, fabsf(v));
  }
  __shared__ float warp_max[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    if (m > 0.f) atomicMax(&amax[b * s.heads_kv + h], __float_as_uint(m));
  }
}

// q~ = round_e4m3(q * (1 / c_q)) into q8 [total_q, Hq, D]; c_q from `given`, or from amax (then
// written to c_out by the first CTA of each (request, KV head)).
template <class T>
__global__ void __launch_bounds__(kThreads)
    q_quantize_kernel(const QSource s, Descale given, const uint32_t* amax, float* c_out,
                      uint8_t* q8, int32_t heads_q) {
  const int32_t b = blockIdx.y, h = blockIdx.z;
  float c;
  if (given.data != nullptr) {
    c = given(b, h);
  } else {
    const float m = __uint_as_float(amax[b * s.heads_kv + h]);
    c = m > 0.f ? fmaxf(m / kE4m3Max, FLT_MIN) : 1.f;  // 1 / c finite (quantize_q.hpp)
    if (blockIdx.x == 0 && threadIdx.x == 0) c_out[b * s.heads_kv + h] = c;
  }
  const float inv = 1.f / c;
  const int32_t row0 = s.cu_q[b], len = s.cu_q[b + 1] - row0;
  const int32_t chunks = s.group * s.head_dim / 8;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < int64_t(len) * chunks;
       i += int64_t(gridDim.x) * kThreads) {
    const int32_t c = int32_t(i % chunks);
    const int64_t t = row0 + i / chunks;
    const int32_t hq = h * s.group + c * 8 / s.head_dim, d = c * 8 % s.head_dim;
    float x[8];
    load8(static_cast<const T*>(s.q) + t * s.stride_token + hq * s.stride_head + d, x);
    uint2 out;
    out.x = attention::e4m3x2_from_floats(x[0] * inv, x[1] * inv) |
            attention::e4m3x2_from_floats(x[2] * inv, x[3] * inv) << 16;
    out.y = attention::e4m3x2_from_floats(x[4] * inv, x[5] * inv) |
            attention::e4m3x2_from_floats(x[6] * inv, x[7] * inv) << 16;
    *reinterpret_cast<uint2*>(q8 + (t * heads_q + hq) * s.head_dim + d) = out;
  }
}

}  // namespace

size_t quantized_q_bytes(const ProblemInfo& info) {
  if (info.p->device != FP_DEVICE_CUDA || !info.fp8.quantize_q) return 0;
  return front_layout(*info.p).total();
}

void e4m3_problem(const ProblemInfo& info, void* front, E4m3Problem* out) {
  const fp_problem& p = *info.p;
  out->p = p;
  out->info = info;
  out->info.p = &out->p;
  out->info.fp8.quantize_q = false;
  out->info.fp8.q_dtype = FP_FLOAT8_E4M3;
  out->p.dtype = FP_FLOAT8_E4M3;
  out->p.kv_dtype = FP_FLOAT8_E4M3;
  out->p.out_dtype = info.fp8.out_dtype;
  if (front == nullptr) return;
  const FrontLayout f = front_layout(p);
  char* base = static_cast<char*>(front);
  out->p.q = base;
  out->p.q_stride_token = int64_t(p.num_heads_q) * p.head_dim;
  out->p.q_stride_head = p.head_dim;
  if (p.q_descale == nullptr) {  // the dynamic c_q that quantize_q writes
    out->p.q_descale = reinterpret_cast<const float*>(base + f.q);
    out->p.q_descale_stride_batch = p.num_heads_kv;
    out->p.q_descale_stride_head = 1;
  }
}

fp_status quantize_q(const ProblemInfo& info, void* front) {
  const fp_problem& p = *info.p;
  if (p.total_q == 0 || p.batch_size == 0) return FP_OK;
  const FrontLayout f = front_layout(p);
  char* base = static_cast<char*>(front);
  auto* c = reinterpret_cast<float*>(base + f.q);
  auto* amax = reinterpret_cast<uint32_t*>(base + f.q + f.c);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const QSource src{p.q, p.q_stride_token, p.q_stride_head, p.cu_seqlens_q, info.group,
                    p.head_dim, p.num_heads_kv};
  // About kGridCtas CTAs in all, none with nothing to do in the longest request.
  const int64_t pairs = int64_t(p.batch_size) * p.num_heads_kv;
  const int64_t chunks = int64_t(info.group) * p.head_dim / 8;
  const int32_t row_blocks = int32_t(std::clamp<int64_t>(
      std::min(ceil_div(kGridCtas, pairs), ceil_div(int64_t(p.max_seqlen_q) * chunks, kThreads)),
      1, kGridCtas));
  const dim3 grid{unsigned(row_blocks), unsigned(p.batch_size), unsigned(p.num_heads_kv)};
  const bool bf16 = p.dtype == FP_BFLOAT16;
  const Descale given{p.q_descale, p.q_descale_stride_batch, p.q_descale_stride_head};
  cudaError_t e = cudaSuccess;
  if (given.data == nullptr) {
    e = cudaMemsetAsync(amax, 0, size_t(p.batch_size) * p.num_heads_kv * sizeof(uint32_t), stream);
    if (e == cudaSuccess) {
      if (bf16) q_amax_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(src, amax);
      else q_amax_kernel<__half><<<grid, kThreads, 0, stream>>>(src, amax);
      e = cudaGetLastError();
    }
  }
  if (e == cudaSuccess) {
    auto* q8 = reinterpret_cast<uint8_t*>(base);
    if (bf16)
      q_quantize_kernel<__nv_bfloat16>
          <<<grid, kThreads, 0, stream>>>(src, given, amax, c, q8, p.num_heads_q);
    else
      q_quantize_kernel<__half><<<grid, kThreads, 0, stream>>>(src, given, amax, c, q8,
                                                                p.num_heads_q);
    e = cudaGetLastError();
  }
  if (e != cudaSuccess)
    return fail(FP_ERROR_CUDA, std::string("q quantization failed: ") + cudaGetErrorString(e));
  return FP_OK;
}

}  // namespace flashprefill::cuda
