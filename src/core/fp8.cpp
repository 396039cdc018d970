#include "core/fp8.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "core/checked.hpp"
#include "core/problem.hpp"
#include "cuda/backend.hpp"
#include "reference/numerics.hpp"

namespace flashprefill {
namespace {

fp_status invalid(const std::string& message) { return fail(FP_ERROR_INVALID_ARGUMENT, message); }

int32_t enum_value(const fp_dtype& field) {
  int32_t bits;
  std::memcpy(&bits, &field, sizeof bits);
  return bits;
}

constexpr const char* kDescaleNames[3] = {"q_descale", "k_descale", "v_descale"};

// A descale tensor copied from the device in one span holds at most this many floats per factor.
constexpr int64_t kSpanPerFactor = 16;

// Elements from a descale tensor's first factor to its last, (B - 1) stride_batch +
// (Hkv - 1) stride_head + 1, in checked arithmetic (strides already >= 0).
Size descale_span(const fp_problem& p, const Descale& d) {
  return Size(p.batch_size - 1) * Size(d.stride_batch) +
         Size(p.num_heads_kv - 1) * Size(d.stride_head) + Size(1);
}

// c_q = max|q| / 448 over the finite q of request b's queries in KV head h's group (1 when all
// are 0), so the largest |q| quantizes to the largest e4m3 value; held at FLT_MIN, the smallest
// normal float32, where max|q| < 448 FLT_MIN, so that 1 / c_q stays finite (q * (1 / c_q) would
// turn a zero q into NaN).
float dynamic_q_descale(const fp_problem& p, const std::vector<int32_t>& cu_q, int32_t b,
                        int32_t h) {
  const int32_t g = p.num_heads_q / p.num_heads_kv;
  float amax = 0.f;
  for (int64_t t = cu_q[b]; t < cu_q[b + 1]; ++t)
    for (int32_t hq = h * g; hq < (h + 1) * g; ++hq) {
      const int64_t base = t * p.q_stride_token + hq * p.q_stride_head;
      for (int32_t d = 0; d < p.head_dim; ++d) {
        const float a = std::fabs(ref::load(p.q, base + d, p.dtype));
        if (std::isfinite(a) && a > amax) amax = a;
      }
    }
  return amax > 0.f ? std::max(amax / ref::kE4m3Max, std::numeric_limits<float>::min()) : 1.f;
}

}  // namespace

fp_status validate_fp8_fields(const fp_problem& p, Fp8Info* info) {
  const int32_t kv = enum_value(p.kv_dtype), out = enum_value(p.out_dtype);
  if (kv != FP_FLOAT32 && kv != FP_BFLOAT16 && kv != FP_FLOAT16 && kv != FP_FLOAT8_E4M3)
    return invalid("unknown kv_dtype " + std::to_string(kv));
  if (out != FP_FLOAT32 && out != FP_BFLOAT16 && out != FP_FLOAT16 && out != FP_FLOAT8_E4M3)
    return invalid("unknown out_dtype " + std::to_string(out));
  *info = Fp8Info{};
  info->num_heads_kv = p.num_heads_kv;
  info->q_dtype = p.dtype;
  info->kv_dtype = kv == FP_FLOAT32 ? p.dtype : p.kv_dtype;
  info->on = info->kv_dtype == FP_FLOAT8_E4M3;
  if (out != FP_FLOAT32) info->out_dtype = p.out_dtype;
  else info->out_dtype = p.dtype == FP_FLOAT8_E4M3 ? FP_BFLOAT16 : p.dtype;

  const std::string dtypes = std::string("q is ") + dtype_name(info->q_dtype) + ", k and v " +
                             dtype_name(info->kv_dtype);
  if (info->kv_dtype != info->q_dtype && !info->on)
    return invalid("mixed dtypes: " + dtypes + "; q, k and v share one dtype, except bfloat16 "
                   "or float16 q over an e4m3 KV cache (kv_dtype = FP_FLOAT8_E4M3)");
  if (info->q_dtype == FP_FLOAT8_E4M3 && !info->on)
    return invalid("mixed dtypes: " + dtypes + "; e4m3 q needs e4m3 k and v");
  if (info->on && info->q_dtype == FP_FLOAT32)
    return invalid("mixed dtypes: " + dtypes + "; over an e4m3 KV cache q is e4m3, bfloat16 or "
                   "float16");
  if (info->on && info->out_dtype != FP_BFLOAT16 && info->out_dtype != FP_FLOAT16)
    return invalid(std::string("out_dtype ") + dtype_name(info->out_dtype) + ": an FP8 problem "
                   "writes bfloat16 or float16");
  if (!info->on && info->out_dtype != p.dtype)
    return invalid(std::string("out_dtype ") + dtype_name(info->out_dtype) + " differs from "
                   "the problem's dtype " + dtype_name(p.dtype) + "; only FP8 problems choose it");
  info->quantize_q = info->on && info->q_dtype != FP_FLOAT8_E4M3;

  for (int which = 0; which < 3; ++which) {
    const Descale d = descale_of(p, Fp8Tensor(which));
    const std::string name = kDescaleNames[which];
    if (d.data != nullptr && !info->on) return invalid(name + " is set but no tensor is e4m3");
    if (d.stride_batch < 0 || d.stride_head < 0)
      return invalid(name + " strides must be >= 0 (batch " + std::to_string(d.stride_batch) +
                     ", head " + std::to_string(d.stride_head) + ")");
    if (d.data != nullptr && !descale_span(p, d).fits(kMaxElements))
      return invalid(name + " strides (batch " + std::to_string(d.stride_batch) + ", head " +
                     std::to_string(d.stride_head) + ") span more than 2^48 elements");
  }
  return FP_OK;
}

fp_status load_fp8_scales(const fp_problem& p, const std::vector<int32_t>& cu_q, Fp8Info* info) {
  if (!info->on) return FP_OK;
  const size_t n = size_t(p.batch_size) * p.num_heads_kv;
  std::vector<float>* out[3] = {&info->cq, &info->ck, &info->cv};
  for (int which = 0; which < 3; ++which) {
    Descale d = descale_of(p, Fp8Tensor(which));
    // CUDA: the factors copied to the host, in one copy of the span they lie in when it holds at
    // most kSpanPerFactor floats per factor (FA3's [B, Hkv] tensors, expanded scalars, column
    // slices of small tensors), else one factor at a time into a [B, Hkv] copy: a sparse span
    // (up to 2^48 elements) is never allocated.
    std::vector<float> device_copy;
    if (d.data != nullptr && p.device == FP_DEVICE_CUDA) {
      const Size span = descale_span(p, d);
      if (span.fits(kSpanPerFactor * int64_t(n))) {
        device_copy.resize(size_t(span.value()));
        if (fp_status s = cuda::copy_to_host(device_copy.data(), d.data,
                                             device_copy.size() * sizeof(float), p.stream);
            s != FP_OK)
          return s;
      } else {
        device_copy.resize(n);
        for (int32_t b = 0; b < p.batch_size; ++b)
          for (int32_t h = 0; h < p.num_heads_kv; ++h)
            if (fp_status s = cuda::copy_to_host(&device_copy[size_t(b) * p.num_heads_kv + h],
                                                 d.data + b * d.stride_batch + h * d.stride_head,
                                                 sizeof(float), p.stream);
                s != FP_OK)
              return s;
        d.stride_batch = p.num_heads_kv;
        d.stride_head = 1;
      }
      d.data = device_copy.data();
    }
    out[which]->assign(n, 1.f);
    for (int32_t b = 0; b < p.batch_size; ++b)
      for (int32_t h = 0; h < p.num_heads_kv; ++h) {
        float& c = (*out[which])[size_t(b) * p.num_heads_kv + h];
        if (d.data == nullptr) {
          // CUDA computes the dynamic c_q on the device (cuda/quantize/quantize_q.hpp)
          if (which == 0 && info->quantize_q && p.device == FP_DEVICE_CPU)
            c = dynamic_q_descale(p, cu_q, b, h);
          continue;
        }
        c = d(b, h);
        // Below the smallest normal float32, 1 / c (the quantization of a bf16/fp16 q, the
        // kernels' factors) is infinite and zeros become NaN.
        if (!std::isfinite(c) || c < std::numeric_limits<float>::min()) {
          char value[32];
          std::snprintf(value, sizeof value, "%g", double(c));
          return invalid(std::string(kDescaleNames[which]) + "[request " + std::to_string(b) +
                         ", kv head " + std::to_string(h) + "] = " + value +
                         (std::isfinite(c) && c > 0.f
                              ? " is below the smallest normal float32 (1.17549e-38): 1 / c "
                                "would overflow"
                              : " must be finite and > 0"));
        }
      }
  }
  return FP_OK;
}

}  // namespace flashprefill
