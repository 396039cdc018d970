// FP8 e4m3 problems (docs/ALGORITHM.md "FP8 e4m3"): the dtypes of q, k/v and out, and the
// descale factors of Eq. 15 per (request, KV head).
#pragma once

#include <cstdint>
#include <vector>

#include "flashprefill/flashprefill.h"

namespace flashprefill {

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

// Copies the descale factors to the host (on CUDA from the device: only for problems whose
// metadata is validated on the host), checks that each is finite and > 0, and, on the CPU,
// computes the dynamic c_q. cu_q: the validated host cu_seqlens_q.
fp_status load_fp8_scales(const fp_problem& p, const std::vector<int32_t>& cu_q, Fp8Info* info);

}  // namespace flashprefill
