#include "core/fp8.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
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

struct Descale {
  const char* name;
  const float* data;
  int64_t stride_batch, stride_head;
};

Descale descale(const fp_problem& p, int which) {
  switch (which) {
    case 0: return {"q_descale", p.q_descale, p.q_descale_stride_batch, p.q_descale_stride_head};
    case 1: return {"k_descale", p.k_descale, p.k_descale_stride_batch, p.k_descale_stride_head};
    default: return {"v_descale", p.v_descale, p.v_descale_stride_batch, p.v_descale_stride_head};
  }
}

// A descale tensor's copy on the host bounds its span to this many floats per factor (b, h):
// FA3's [B, Hkv] tensors, expanded scalars and column slices of small tensors lie in one span of
// at most B * Hkv floats; others are copied factor by factor.
constexpr int64_t kSpanPerFactor = 16;

// The factors c(b, h) of descale tensor d (not NULL) into out[b * Hkv + h]: read in place on the
// CPU; on CUDA copied to the host first (FP_FLAG_VALIDATE_DEVICE_METADATA: the call synchronizes
// anyway), in one copy of the span they lie in when it is small, else one copy per factor.
fp_status host_factors(const fp_problem& p, const Descale& d, std::vector<float>& out) {
  const int32_t B = p.batch_size, H = p.num_heads_kv;
  out.resize(size_t(B) * H);
  auto offset = [&](int32_t b, int32_t h) { return b * d.stride_batch + h * d.stride_head; };
  if (p.device == FP_DEVICE_CPU) {
    for (int32_t b = 0; b < B; ++b)
      for (int32_t h = 0; h < H; ++h) out[size_t(b) * H + h] = d.data[offset(b, h)];
    return FP_OK;
  }
  const Size span = Size(B - 1) * Size(d.stride_batch) + Size(H - 1) * Size(d.stride_head) + 1;
  if (span.fits(kSpanPerFactor * int64_t(out.size()))) {
    std::vector<float> all(size_t(span.value()));
    if (fp_status s = cuda::copy_to_host(all.data(), d.data, all.size() * sizeof(float), p.stream);
        s != FP_OK)
      return s;
    for (int32_t b = 0; b < B; ++b)
      for (int32_t h = 0; h < H; ++h) out[size_t(b) * H + h] = all[size_t(offset(b, h))];
    return FP_OK;
  }
  for (int32_t b = 0; b < B; ++b)
    for (int32_t h = 0; h < H; ++h)
      if (fp_status s = cuda::copy_to_host(&out[size_t(b) * H + h], d.data + offset(b, h),
                                           sizeof(float), p.stream);
          s != FP_OK)
        return s;
  return FP_OK;
}

// c_q = max|q| / 448 over the finite q of request b's queries in KV head h's group (1 when all
// are 0), so the largest |q| quantizes to the largest e4m3 value.
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
  return amax > 0.f ? amax / ref::kE4m3Max : 1.f;
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
    const Descale d = descale(p, which);
    if (d.data != nullptr && !info->on)
      return invalid(std::string(d.name) + " is set but no tensor is e4m3");
    if (d.stride_batch < 0 || d.stride_head < 0)
      return invalid(std::string(d.name) + " strides must be >= 0 (batch " +
                     std::to_string(d.stride_batch) + ", head " + std::to_string(d.stride_head) +
                     ")");
  }
  return FP_OK;
}

fp_status load_fp8_scales(const fp_problem& p, const std::vector<int32_t>& cu_q, Fp8Info* info) {
  if (!info->on) return FP_OK;
  const size_t n = size_t(p.batch_size) * p.num_heads_kv;
  std::vector<float>* out[3] = {&info->cq, &info->ck, &info->cv};
  for (int which = 0; which < 3; ++which) {
    const Descale d = descale(p, which);
    if (d.data == nullptr) {
      out[which]->assign(n, 1.f);
      // The dynamic c_q reads q: the CPU's (the CUDA attention takes e4m3 q only).
      if (which == 0 && info->quantize_q && p.device == FP_DEVICE_CPU)
        for (int32_t b = 0; b < p.batch_size; ++b)
          for (int32_t h = 0; h < p.num_heads_kv; ++h)
            (*out[which])[size_t(b) * p.num_heads_kv + h] = dynamic_q_descale(p, cu_q, b, h);
      continue;
    }
    if (fp_status s = host_factors(p, d, *out[which]); s != FP_OK) return s;
    for (int32_t b = 0; b < p.batch_size; ++b)
      for (int32_t h = 0; h < p.num_heads_kv; ++h) {
        const float c = (*out[which])[size_t(b) * p.num_heads_kv + h];
        if (!std::isfinite(c) || c <= 0.f) {
          char value[32];
          std::snprintf(value, sizeof value, "%g", double(c));
          return invalid(std::string(d.name) + "[request " + std::to_string(b) + ", kv head " +
                         std::to_string(h) + "] = " + value + " must be finite and > 0");
        }
      }
  }
  return FP_OK;
}

}  // namespace flashprefill
