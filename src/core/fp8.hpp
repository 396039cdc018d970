// FP8 e4m3 problems (docs/ALGORITHM.md "FP8 e4m3"): the dtypes of q, k/v and out, and the
// descale factors of Eq. 15 per (request, KV head).
#pragma once

#include <cstdint>
#include <vector>

#include "core/geometry.hpp"
#include "flashprefill/flashprefill.h"

namespace flashprefill {

// One descale tensor of fp_problem (q_descale, k_descale or v_descale) where it lives (host
// memory for the CPU, device memory for CUDA, read there by the kernels): c(b, h) =
// data[b * stride_batch + h * stride_head] for request b and KV head h, 1 when data is NULL.
struct Descale {
  const float* data = nullptr;
  int64_t stride_batch = 0, stride_head = 0;

  FP_HD float operator()(int32_t b, int32_t h) const {
    return data == nullptr ? 1.f : data[b * stride_batch + h * stride_head];
  }
};

enum class Fp8Tensor { kQ = 0, kK = 1, kV = 2 };

// The problem's descale tensor of q, k or v.
inline Descale descale_of(const fp_problem& p, Fp8Tensor which) {
  switch (which) {
    case Fp8Tensor::kQ: return {p.q_descale, p.q_descale_stride_batch, p.q_descale_stride_head};
    case Fp8Tensor::kK: return {p.k_descale, p.k_descale_stride_batch, p.k_descale_stride_head};
    case Fp8Tensor::kV: break;
  }
  return {p.v_descale, p.v_descale_stride_batch, p.v_descale_stride_head};
}

struct Fp8Info {
  bool on = false;          // k and v are e4m3
  bool quantize_q = false;  // q arrives in bf16/fp16 and is rounded to e4m3 with c_q
  fp_dtype q_dtype = FP_FLOAT32, kv_dtype = FP_FLOAT32, out_dtype = FP_FLOAT32;
  // Host copies, [B * Hkv] (b * Hkv + h), filled for FP8 problems with host metadata: c_q
  // (dynamic when q_descale is NULL and q is bf16/fp16), c_k, c_v.
  int32_t num_heads_kv = 1;
  std::vector<float> cq, ck, cv;

  float c_q(int32_t b, int32_t h) const { return cq[size_t(b) * num_heads_kv + h]; }
  float c_k(int32_t b, int32_t h) const { return ck[size_t(b) * num_heads_kv + h]; }
  float c_v(int32_t b, int32_t h) const { return cv[size_t(b) * num_heads_kv + h]; }
};

// Checks the FP8 fields of a problem whose dtype, device and head counts are already valid
// (the dtype combination, output dtype and descale strides) and resolves the dtypes into `info`.
fp_status validate_fp8_fields(const fp_problem& p, Fp8Info* info);

// With host metadata (the CPU always; CUDA under FP_FLAG_VALIDATE_DEVICE_METADATA, copying
// each descale tensor's span to the host: one synchronization): copies the descale factors,
// checks that each is finite and > 0, and, on the CPU, computes the dynamic c_q (CUDA computes
// it on the device, cuda/quantize/quantize_q.hpp). cu_q: the validated host cu_seqlens_q.
fp_status load_fp8_scales(const fp_problem& p, const std::vector<int32_t>& cu_q, Fp8Info* info);

}  // namespace flashprefill
