// FP8 e4m3 (Eq. 15, docs/ALGORITHM.md "FP8 e4m3"): the conversion, the FP8 reference against
// exact attention on the dequantized inputs, and the errors of FP8 problems.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "reference/numerics.hpp"
#include "test_support.hpp"

using namespace fptest;
using flashprefill::ref::e4m3_to_float;
using flashprefill::ref::float_to_e4m3;

namespace {

// The FP8 fields are appended: every field before them keeps its offset (LP64).
static_assert(sizeof(void*) != 8 || (offsetof(fp_problem, seqlens_k) == 208 &&
                                     offsetof(fp_problem, kv_dtype) == 216 &&
                                     offsetof(fp_problem, v_descale_stride_head) == 288));

TEST(E4m3, DecodesEveryCode) {
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.f, -9));   // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.f, -6));   // smallest normal
  EXPECT_EQ(e4m3_to_float(0x38), 1.f);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)) && e4m3_to_float(0x80) == 0.f);
  for (int c = 0; c < 256; ++c) {
    const float x = e4m3_to_float(uint8_t(c));
    if (std::isnan(x)) continue;
    EXPECT_EQ(float_to_e4m3(x), c) << "code " << c;  // exact round trip
    if ((c & 0x7f) < 0x7e) EXPECT_LT(std::fabs(x), std::fabs(e4m3_to_float(uint8_t(c + 1))));
  }
}

TEST(E4m3, RoundsToNearestEven) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = e4m3_to_float(uint8_t(c)), hi = e4m3_to_float(uint8_t(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact in float32
    EXPECT_EQ(float_to_e4m3(mid), (c % 2 == 0) ? c : c + 1) << "between codes " << c;
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 0.f)), c);
    EXPECT_EQ(float_to_e4m3(std::nextafter(mid, 1e9f)), c + 1);
    EXPECT_EQ(float_to_e4m3(-mid), 0x80 | float_to_e4m3(mid));
  }
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.f, -11)), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
}

TEST(E4m3, SaturatesAndKeepsNaN) {
  for (float x : {448.f, 449.f, 463.9f, 464.f, 480.f, 1e4f, 3.4e38f, INFINITY}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xfe) << -x;
  }
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(-NAN))));
}

// A float32 problem quantized to e4m3 with descales per (request, KV head) (c = max|x| / 448) or
// one per tensor, and the float32 problem of the dequantized values.
class Quantized {
 public:
  Quantized(TestProblem& source, bool per_head) : src_(source) {
    const int32_t B = src_.batch(), Hkv = src_.heads_kv(), g = src_.heads_q() / Hkv,
                  D = src_.head_dim();
    for (int which = 0; which < 3; ++which) {
      const bool is_q = which == 0;
      const int32_t heads = is_q ? src_.heads_q() : Hkv;
      const int64_t rows = is_q ? src_.total_q() : src_.total_k();
      std::vector<float>& c = descale_[which];
      c.assign(size_t(B) * Hkv, 0.f);
      auto value = [&](int64_t t, int32_t h, int32_t d) {
        return which == 0 ? src_.q(t, h, d) : which == 1 ? src_.k(t, h, d) : src_.v(t, h, d);
      };
      auto request_of = [&](int64_t t) {
        int32_t b = 0;
        while ((is_q ? src_.cu_q(b + 1) : src_.cu_k(b + 1)) <= t) ++b;
        return b;
      };
      auto slot = [&](int64_t t, int32_t h) {
        return per_head ? size_t(request_of(t)) * Hkv + (is_q ? h / g : h) : size_t(0);
      };
      for (int64_t t = 0; t < rows; ++t)
        for (int32_t h = 0; h < heads; ++h)
          for (int32_t d = 0; d < D; ++d)
            c[slot(t, h)] = std::max(c[slot(t, h)], std::fabs(value(t, h, d)) / 448.f);
      for (float& x : c) x = x > 0.f ? x : 1.f;
      if (!per_head) std::fill(c.begin(), c.end(), c[0]);
      std::vector<uint8_t>& codes = codes_[which];
      std::vector<float>& deq = dequantized_[which];
      codes.resize(size_t(rows) * heads * D);
      deq.resize(codes.size());
      for (int64_t t = 0; t < rows; ++t)
        for (int32_t h = 0; h < heads; ++h)
          for (int32_t d = 0; d < D; ++d) {
            const size_t i = (size_t(t) * heads + h) * D + d;
            const float s = c[slot(t, h)];
            codes[i] = float_to_e4m3(value(t, h, d) * (1.f / s));
            deq[i] = s * e4m3_to_float(codes[i]);
          }
    }
  }

  // q, k and v in e4m3 with their descales.
  fp_problem fp8() const {
    fp_problem p = src_.contiguous();
    p.dtype = FP_FLOAT8_E4M3;
    p.q = codes_[0].data();
    p.k = codes_[1].data();
    p.v = codes_[2].data();
    set_descales(p, true);
    return p;
  }

  // The source q in its dtype over the e4m3 KV cache; c_q dynamic unless given.
  fp_problem kv_cache() const {
    fp_problem p = src_.contiguous();
    p.kv_dtype = FP_FLOAT8_E4M3;
    p.k = codes_[1].data();
    p.v = codes_[2].data();
    set_descales(p, false);
    return p;
  }

  // Float32 copies of the dequantized q (k, v) of fp8().
  TestProblem dequantized() const {
    TestProblem t(src_.lengths(), src_.heads_q(), src_.heads_kv(), src_.head_dim(), FP_FLOAT32, 1);
    t.set_data(dequantized_[0], dequantized_[1], dequantized_[2]);
    return t;
  }

 private:
  void set_descales(fp_problem& p, bool with_q) const {
    const int64_t hkv = src_.heads_kv();
    if (with_q) p.q_descale = descale_[0].data();
    p.k_descale = descale_[1].data();
    p.v_descale = descale_[2].data();
    p.q_descale_stride_batch = p.k_descale_stride_batch = p.v_descale_stride_batch = hkv;
    p.q_descale_stride_head = p.k_descale_stride_head = p.v_descale_stride_head = 1;
  }

  TestProblem& src_;
  std::vector<float> descale_[3];
  std::vector<uint8_t> codes_[3];
  std::vector<float> dequantized_[3];
};

// The output of an FP8 problem, written in bfloat16.
std::vector<float> run_fp8(const fp_problem& p, const fp_select_config* prefill_config,
                           std::vector<float>* lse = nullptr) {
  fp_problem shape = p;
  shape.dtype = FP_BFLOAT16;
  Output out(shape, lse != nullptr);
  if (prefill_config) {
    size_t bytes = 0;
    EXPECT_EQ(fp_prefill_workspace_size(&p, prefill_config, &bytes), FP_OK) << fp_last_error_message();
    std::vector<unsigned char> ws(bytes);
    EXPECT_EQ(fp_prefill(&p, prefill_config, &out.view, ws.data(), ws.size()), FP_OK)
        << fp_last_error_message();
  } else {
    EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_OK) << fp_last_error_message();
  }
  if (lse) *lse = out.lse;
  return out.values();
}

fp_select_config dense_config(int mean_correction) {
  fp_select_config c = default_config();
  c.alpha = 0.f;
  c.sink_tokens = c.window_tokens = c.dense_recent_tiles = 0;
  c.mean_correction = mean_correction;
  return c;
}

struct Fp8Case {
  int32_t head_dim;
  bool structured, per_head;
};

class Fp8Dense : public ::testing::TestWithParam<Fp8Case> {};

// docs/ALGORITHM.md's FP8 tolerances: against float64 attention on the dequantized inputs only
// the e4m3 probabilities round (relative L2 <= 3e-2); against the unquantized inputs the
// quantization of q, k and v adds its own error (<= 8e-2).
TEST_P(Fp8Dense, MatchesFloat64OnTheDequantizedInputs) {
  const auto [D, structured, per_head] = GetParam();
  TestProblem src({{300, 300}, {129, 500}}, 8, 2, D, FP_FLOAT32, 31);
  if (structured) fill_structured(src, 32);
  const Quantized qz(src, per_head);
  const TestProblem deq = qz.dequantized();
  const std::vector<float> exact_deq = run_dense(deq.contiguous());
  const std::vector<float> exact_src = run_dense(src.contiguous());
  std::vector<float> lse, lse_exact;
  const std::vector<float> got = run_fp8(qz.fp8(), nullptr, &lse);
  run_dense(deq.contiguous(), &lse_exact);
  const double err_deq = rel_l2(got, exact_deq), err_src = rel_l2(got, exact_src);
  EXPECT_LT(err_deq, 3e-2);
  EXPECT_LT(err_src, 8e-2);
  double lse_err = 0;
  for (size_t i = 0; i < lse.size(); ++i) lse_err = std::max(lse_err, double(std::fabs(lse[i] - lse_exact[i])));
  EXPECT_LT(lse_err, 2e-2);  // the 2^8 offset comes out of the LSE
  // bf16 inputs for comparison: the FP8 error stays within a few times bf16's.
  TestProblem bf16(src.lengths(), 8, 2, D, FP_BFLOAT16, 1);
  std::vector<float> q, k, v;
  for (int64_t t = 0; t < src.total_q(); ++t)
    for (int32_t h = 0; h < 8; ++h)
      for (int32_t d = 0; d < D; ++d) q.push_back(src.q(t, h, d));
  for (int64_t t = 0; t < src.total_k(); ++t)
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t d = 0; d < D; ++d) {
        k.push_back(src.k(t, h, d));
        v.push_back(src.v(t, h, d));
      }
  bf16.set_data(q, k, v);
  const double err_bf16 = rel_l2(run_dense(bf16.contiguous()), exact_src);
  RecordProperty("fp8_vs_dequantized", std::to_string(err_deq));
  RecordProperty("fp8_vs_unquantized", std::to_string(err_src));
  RecordProperty("bf16_vs_unquantized", std::to_string(err_bf16));
  EXPECT_LT(err_bf16, err_src);
}

TEST_P(Fp8Dense, AlphaZeroPrefillEqualsFp8Dense) {
  const auto [D, structured, per_head] = GetParam();
  TestProblem src({{300, 300}, {129, 500}}, 8, 2, D, FP_FLOAT32, 33);
  if (structured) fill_structured(src, 34);
  const Quantized qz(src, per_head);
  const std::vector<float> dense = run_fp8(qz.fp8(), nullptr);
  for (int corr = 0; corr < 2; ++corr) {
    const fp_select_config c = dense_config(corr);
    EXPECT_EQ(rel_l2(run_fp8(qz.fp8(), &c), dense), 0.0) << "mean_correction " << corr;
  }
}

INSTANTIATE_TEST_SUITE_P(Inputs, Fp8Dense,
                         ::testing::Values(Fp8Case{64, false, true}, Fp8Case{64, true, false},
                                           Fp8Case{128, true, true}),
                         [](const auto& info) {
                           return "d" + std::to_string(info.param.head_dim) +
                                  (info.param.structured ? "_structured" : "_random") +
                                  (info.param.per_head ? "_per_head" : "_per_tensor");
                         });

// bf16 / fp16 q over an e4m3 KV cache: q quantized with the dynamic c_q per (request, KV head)
// gives the same output as the e4m3 q quantized the same way.
TEST(Fp8, KvCacheQuantizesQLikeAnFp8Q) {
  for (fp_dtype dt : {FP_BFLOAT16, FP_FLOAT16}) {
    TestProblem src({{200, 260}, {64, 64}}, 8, 2, 64, dt, 35);
    const Quantized qz(src, true);
    const std::vector<float> fp8_q = run_fp8(qz.fp8(), nullptr);
    fp_problem kv = qz.kv_cache();
    fp_problem shape = kv;
    shape.out_dtype = dt;
    Output out(shape);
    ASSERT_EQ(fp_dense_attention(&kv, &out.view, nullptr, 0), FP_OK) << fp_last_error_message();
    // Output in q's dtype (fp16 holds 3 more mantissa bits than bf16).
    EXPECT_LT(rel_l2(out.values(), fp8_q), dt == FP_FLOAT16 ? 4e-3 : 1e-6) << "dtype " << int(dt);
    const std::vector<float> exact = run_dense(qz.dequantized().contiguous());
    EXPECT_LT(rel_l2(out.values(), exact), 2e-2);
  }
}

// A bf16 q below 448 FLT_MIN in magnitude (request 0; some of its entries exactly 0) over the e4m3
// cache: the dynamic c_q is held at FLT_MIN, so 1 / c_q is finite, the zeros quantize to zeros
// (not 0 * inf = NaN), and the output is the attention of that q on the dequantized K/V.
TEST(Fp8, DynamicQDescaleOfATinyQStaysNormal) {
  TestProblem src({{96, 160}, {64, 64}}, 4, 2, 32, FP_BFLOAT16, 39);
  const int32_t hq = src.heads_q(), hkv = src.heads_kv(), D = src.head_dim();
  std::vector<float> q(size_t(src.total_q()) * hq * D), k(size_t(src.total_k()) * hkv * D),
      v(k.size());
  for (int64_t t = 0; t < src.total_q(); ++t)
    for (int32_t h = 0; h < hq; ++h)
      for (int32_t d = 0; d < D; ++d)
        q[(size_t(t) * hq + h) * D + d] =
            t < src.cu_q(1) ? (d % 4 == 0 ? 0.f : src.q(t, h, d) * 1e-37f) : src.q(t, h, d);
  for (int64_t t = 0; t < src.total_k(); ++t)
    for (int32_t h = 0; h < hkv; ++h)
      for (int32_t d = 0; d < D; ++d) {
        k[(size_t(t) * hkv + h) * D + d] = src.k(t, h, d);
        v[(size_t(t) * hkv + h) * D + d] = src.v(t, h, d);
      }
  src.set_data(q, k, v);
  const Quantized qz(src, true);  // its k and v; q is the library's to quantize here
  fp_problem kv = qz.kv_cache();
  Output out(kv);
  ASSERT_EQ(fp_dense_attention(&kv, &out.view, nullptr, 0), FP_OK) << fp_last_error_message();
  const std::vector<float> got = out.values();
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  const TestProblem dq = qz.dequantized();
  for (int64_t t = 0; t < src.total_k(); ++t)
    for (int32_t h = 0; h < hkv; ++h)
      for (int32_t d = 0; d < D; ++d) {
        k[(size_t(t) * hkv + h) * D + d] = dq.k(t, h, d);
        v[(size_t(t) * hkv + h) * D + d] = dq.v(t, h, d);
      }
  // q dequantized as docs/ALGORITHM.md quantizes it: c_q = max(max|q| / 448, FLT_MIN) per
  // (request, KV head), round_e4m3(q * (1 / c_q)).
  const int32_t g = hq / hkv;
  for (int32_t b = 0; b < src.batch(); ++b)
    for (int32_t h = 0; h < hkv; ++h) {
      float amax = 0.f;
      for (int64_t t = src.cu_q(b); t < src.cu_q(b + 1); ++t)
        for (int32_t j = h * g; j < (h + 1) * g; ++j)
          for (int32_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(src.q(t, j, d)));
      const float c = std::max(amax / 448.f, std::numeric_limits<float>::min());
      if (b == 0) EXPECT_EQ(c, std::numeric_limits<float>::min());
      for (int64_t t = src.cu_q(b); t < src.cu_q(b + 1); ++t)
        for (int32_t j = h * g; j < (h + 1) * g; ++j)
          for (int32_t d = 0; d < D; ++d)
            q[(size_t(t) * hq + j) * D + d] =
                c * e4m3_to_float(float_to_e4m3(src.q(t, j, d) * (1.f / c)));
    }
  TestProblem exact(src.lengths(), hq, hkv, D, FP_FLOAT32, 1);
  exact.set_data(q, k, v);
  EXPECT_LT(rel_l2(got, run_dense(exact.contiguous())), 2e-2);
}

TEST(Fp8, MeanCorrectionUsesE4m3Surrogates) {
  TestProblem src({{400, 1200}}, 4, 1, 64, FP_FLOAT32, 36);
  fill_structured(src, 37);
  const Quantized qz(src, false);
  fp_select_config c = default_config();
  c.alpha = 0.3f;
  c.sink_tokens = 64;
  c.window_tokens = 64;
  const std::vector<float> exact = run_dense(qz.dequantized().contiguous());
  c.mean_correction = 0;
  const double plain = rel_l2(run_fp8(qz.fp8(), &c), exact);
  c.mean_correction = 1;
  const double corrected = rel_l2(run_fp8(qz.fp8(), &c), exact);
  EXPECT_LT(corrected, plain);
}

fp_status dense_status(const fp_problem& p) {
  std::vector<uint16_t> out(size_t(p.total_q) * p.num_heads_q * p.head_dim);
  const fp_output o{out.data(), int64_t(p.num_heads_q) * p.head_dim, p.head_dim, nullptr};
  return fp_dense_attention(&p, &o, nullptr, 0);
}

void expect_error(const fp_problem& p, fp_status status, const std::string& message) {
  EXPECT_EQ(dense_status(p), status) << message;
  EXPECT_NE(std::string(fp_last_error_message()).find(message), std::string::npos)
      << fp_last_error_message();
}

TEST(Fp8, Errors) {
  TestProblem src({{70, 90}, {5, 5}}, 4, 2, 16, FP_BFLOAT16, 38);
  const Quantized qz(src, true);
  std::vector<float> bad = {1.f, 1.f, 0.f, 1.f};
  fp_problem p = qz.fp8();
  p.k_descale = bad.data();
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "k_descale[request 1, kv head 0] = 0 must be finite and > 0");
  {  // the index size query reads the lengths only, no factor (nor q for a dynamic c_q)
    fp_select_config c;
    fp_select_config_default(&c);
    fp_index_sizes sizes{};
    EXPECT_EQ(fp_index_sizes_query(&p, &c, &sizes), FP_OK) << fp_last_error_message();
    EXPECT_GT(sizes.num_segments, 0);
  }
  bad[2] = NAN;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "must be finite and > 0");
  bad[2] = INFINITY;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "must be finite and > 0");
  bad[2] = 1e-45f;  // subnormal: 1 / c overflows
  expect_error(p, FP_ERROR_INVALID_ARGUMENT,
               "k_descale[request 1, kv head 0] = 1.4013e-45 is below the smallest normal float32");
  bad[2] = std::numeric_limits<float>::min();  // the smallest accepted
  EXPECT_EQ(dense_status(p), FP_OK) << fp_last_error_message();
  p = qz.fp8();
  p.v_descale_stride_head = -1;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "v_descale strides must be >= 0");
  p = qz.fp8();  // two requests, two KV heads: the last factor at stride_batch + stride_head
  p.q_descale_stride_batch = (int64_t(1) << 48) - 1;
  p.q_descale_stride_head = 1;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT,
               "q_descale strides (batch 281474976710655, head 1) span more than 2^48 elements");
  p.q_descale_stride_batch = INT64_MAX;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "q_descale strides");
  p = src.contiguous();  // bf16, no e4m3 tensor
  p.q_descale = bad.data();
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "q_descale is set but no tensor is e4m3");
  p = qz.fp8();
  p.kv_dtype = FP_BFLOAT16;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "mixed dtypes");
  p = src.contiguous();
  p.kv_dtype = FP_FLOAT16;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "mixed dtypes");
  TestProblem f32({{8, 8}}, 4, 2, 16, FP_FLOAT32, 39);
  p = f32.contiguous();
  p.kv_dtype = FP_FLOAT8_E4M3;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "mixed dtypes");
  p = qz.fp8();
  p.out_dtype = FP_FLOAT8_E4M3;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "an FP8 problem writes bfloat16 or float16");
  p = src.contiguous();
  p.out_dtype = FP_FLOAT16;
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "only FP8 problems choose it");
  p = qz.fp8();
  int32_t unknown = 7;
  std::memcpy(&p.kv_dtype, &unknown, sizeof unknown);
  expect_error(p, FP_ERROR_INVALID_ARGUMENT, "unknown kv_dtype 7");
}

// FP8 on CUDA, checked before the device is: every build reports the same, and no pointer is
// read (host arrays stand in for device ones; nothing here launches). The attention calls and
// fp_prefill run the e4m3 kernels; what they do not compute is refused.
class Fp8Cuda : public ::testing::Test {
 protected:
  Fp8Cuda() : src_({{70, 90}, {16, 40}}, 4, 2, 64, FP_BFLOAT16, 40), qz_(src_, true) {
    src_.make_paged(16, 41);
  }

  // e4m3 q, k and v on CUDA, contiguous KV: what the kernel computes.
  fp_problem supported() const {
    fp_problem p = qz_.fp8();
    p.device = FP_DEVICE_CUDA;
    return p;
  }

  // fp_dense_attention and fp_sparse_attention (mean correction off unless `config` is given)
  // and their size queries: each returns `status` with `message` in its error.
  static void expect_attention(const fp_problem& p, fp_status status, const std::string& message,
                               const fp_select_config* config = nullptr) {
    fp_select_config c = default_config();
    c.mean_correction = 0;
    if (config != nullptr) c = *config;
    std::vector<int32_t> cu(1024, 0), idx(1, 0);
    const fp_index index{cu.data(), idx.data(), nullptr, nullptr, 0};
    std::vector<uint16_t> out(size_t(p.total_q) * p.num_heads_q * p.head_dim);
    const fp_output o{out.data(), int64_t(p.num_heads_q) * p.head_dim, p.head_dim, nullptr};
    size_t bytes = 0;
    const std::pair<const char*, std::function<fp_status()>> calls[] = {
        {"fp_dense_attention_workspace_size",
         [&] { return fp_dense_attention_workspace_size(&p, &bytes); }},
        {"fp_dense_attention", [&] { return fp_dense_attention(&p, &o, nullptr, 0); }},
        {"fp_sparse_attention_workspace_size",
         [&] { return fp_sparse_attention_workspace_size(&p, &c, &bytes); }},
        {"fp_sparse_attention",
         [&] { return fp_sparse_attention(&p, &c, &index, &o, nullptr, 0); }},
    };
    for (const auto& [name, call] : calls) {
      EXPECT_EQ(call(), status) << name << ": " << fp_last_error_message();
      EXPECT_NE(std::string(fp_last_error_message()).find(message), std::string::npos)
          << name << ": " << fp_last_error_message();
    }
  }

  TestProblem src_;
  Quantized qz_;
};

// A problem the e4m3 kernels compute gets past the FP8 checks to the device's: without a GPU the
// call says so; with one it would launch on these host arrays, so only the refusals run there.
// fp_prefill, a bf16 q over the e4m3 cache, a paged cache, KV splits and host-validated metadata
// all reach it.
TEST_F(Fp8Cuda, SupportedProblemsReachTheDeviceCheck) {
  if (fp_cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  fp_problem kv = qz_.kv_cache();
  kv.device = FP_DEVICE_CUDA;
  fp_problem paged = src_.paged();
  paged.device = FP_DEVICE_CUDA;
  paged.dtype = FP_FLOAT8_E4M3;
  fp_problem paged_kv = src_.paged();
  paged_kv.device = FP_DEVICE_CUDA;
  paged_kv.kv_dtype = FP_FLOAT8_E4M3;
  std::vector<fp_problem> problems = {supported(), kv, paged, paged_kv};
  for (int32_t splits : {1, 2, FP_MAX_SPLITS}) {
    fp_problem p = supported();
    p.tuning.num_splits = splits;
    problems.push_back(p);
  }
  fp_problem validated = supported();
  validated.flags |= FP_FLAG_VALIDATE_DEVICE_METADATA;
  problems.push_back(validated);
  const fp_select_config c = default_config();
  for (const fp_problem& p : problems) {
    expect_attention(p, FP_ERROR_UNSUPPORTED, "no CUDA backend");
    size_t bytes = 0;
    EXPECT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(fp_last_error_message()).find("no CUDA backend"), std::string::npos)
        << fp_last_error_message();
    fp_index_sizes sizes;  // the calls that launch nothing take any FP8 problem
    EXPECT_EQ(fp_index_sizes_query(&p, &c, &sizes), FP_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(fp_last_error_message()).find("no CUDA backend"), std::string::npos)
        << fp_last_error_message();
  }
}

// The e4m3 kernels write bfloat16 or float16 (out_dtype; a float16 q writes float16 unless told
// otherwise): both get past the FP8 checks.
TEST_F(Fp8Cuda, Float16OutputReachesTheDeviceCheck) {
  if (fp_cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  fp_problem p = supported();
  p.out_dtype = FP_FLOAT16;
  expect_attention(p, FP_ERROR_UNSUPPORTED, "no CUDA backend");
  p = qz_.kv_cache();
  p.device = FP_DEVICE_CUDA;
  p.dtype = FP_FLOAT16;
  expect_attention(p, FP_ERROR_UNSUPPORTED, "no CUDA backend");
}

// Mean correction runs on e4m3 too: a sparse call with it gets past the FP8 checks.
TEST_F(Fp8Cuda, MeanCorrectionReachesTheDeviceCheck) {
  if (fp_cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  const fp_select_config c = default_config();  // mean correction on
  ASSERT_NE(c.mean_correction, 0);
  expect_attention(supported(), FP_ERROR_UNSUPPORTED, "no CUDA backend", &c);
}

// e4m3 rows are read in 16-byte chunks: strides of 8 elements, enough for 16-bit operands, are
// not; a bf16 q (quantized in 16-byte chunks of 8 elements) needs multiples of 8; a paged
// cache's page strides count too.
TEST_F(Fp8Cuda, StridesOfWhole16ByteChunks) {
  fp_problem p = supported();
  p.q_stride_head = 72;
  p.q_stride_token = 4 * 72;
  expect_attention(p, FP_ERROR_UNSUPPORTED,
                   "q strides must be multiples of 16 elements, got (token 288, head 72)");
  p = supported();
  p.k_stride_token = 136;
  expect_attention(p, FP_ERROR_UNSUPPORTED,
                   "k strides must be multiples of 16 elements, got (token 136, head 64)");
  p = supported();
  p.v_stride_head = 72;
  p.v_stride_token = 2 * 72 + 8;
  expect_attention(p, FP_ERROR_UNSUPPORTED,
                   "v strides must be multiples of 16 elements, got (token 152, head 72)");
  p = src_.paged();
  p.device = FP_DEVICE_CUDA;
  p.dtype = FP_FLOAT8_E4M3;
  p.v_stride_page += 8;
  expect_attention(p, FP_ERROR_UNSUPPORTED,
                   "v strides must be multiples of 16 elements, got (token 128, head 64, page " +
                       std::to_string(p.v_stride_page) + ")");
  p = qz_.kv_cache();
  p.device = FP_DEVICE_CUDA;
  p.q_stride_head = 68;
  p.q_stride_token = 4 * 68;
  expect_attention(p, FP_ERROR_UNSUPPORTED,
                   "q strides must be multiples of 8 elements, got (token 272, head 68)");
}

// The CUDA index stage takes e4m3 q, k and v: its entry points pass them on to the device (here
// only the size queries run: they read no tensor), and refuse a bf16/fp16 q over e4m3 K/V.
TEST(Fp8, CudaIndexStage) {
  TestProblem src({{70, 90}}, 4, 2, 64, FP_BFLOAT16, 41);
  const Quantized qz(src, true);
  const fp_select_config c = default_config();
  fp_problem p = qz.fp8();
  p.device = FP_DEVICE_CUDA;
  size_t bytes = 0;
  fp_index_sizes sizes{};
  const fp_status index_ws = fp_build_index_workspace_size(&p, &c, &bytes);
  const std::string message = fp_last_error_message();
  const fp_status sizes_status = fp_index_sizes_query(&p, &c, &sizes);
  if (fp_cuda_available()) {
    EXPECT_EQ(index_ws, FP_OK) << message;
    EXPECT_EQ(sizes_status, FP_OK) << fp_last_error_message();
  } else {  // the build or the machine has no CUDA, and says that, not that FP8 is refused
    EXPECT_EQ(index_ws, FP_ERROR_UNSUPPORTED);
    EXPECT_NE(message.find("no CUDA backend or no sm_90 GPU"), std::string::npos) << message;
    EXPECT_EQ(sizes_status, FP_ERROR_UNSUPPORTED);
  }

  // A bf16 q over the e4m3 cache: the index stage quantizes it first, reading it in 16-byte
  // chunks; fp_pool_kv reads no q.
  p = qz.kv_cache();
  p.device = FP_DEVICE_CUDA;
  std::vector<float> means(1);
  const fp_status kv_ws = fp_build_index_workspace_size(&p, &c, &bytes);
  const std::string kv_message = fp_last_error_message();
  if (fp_cuda_available()) {
    EXPECT_EQ(kv_ws, FP_OK) << kv_message;
  } else {
    EXPECT_EQ(kv_ws, FP_ERROR_UNSUPPORTED);
    EXPECT_NE(kv_message.find("no CUDA backend or no sm_90 GPU"), std::string::npos) << kv_message;
    EXPECT_EQ(fp_pool_kv(&p, &c, means.data(), means.data(), nullptr), FP_ERROR_UNSUPPORTED);
    EXPECT_NE(std::string(fp_last_error_message()).find("no CUDA backend"), std::string::npos)
        << fp_last_error_message();
  }
  p.q_stride_head = 68;
  p.q_stride_token = 4 * 68;
  EXPECT_EQ(fp_build_index_workspace_size(&p, &c, &bytes), FP_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fp_last_error_message())
                .find("q strides must be multiples of 8 elements, got (token 272, head 68)"),
            std::string::npos)
      << fp_last_error_message();
  p = qz.kv_cache();
  p.device = FP_DEVICE_CUDA;
  p.q = static_cast<const char*>(p.q) + 2;  // one bf16 element in: not 16-byte aligned
  EXPECT_EQ(fp_build_index_workspace_size(&p, &c, &bytes), FP_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fp_last_error_message()).find("must be 16-byte aligned"),
            std::string::npos)
      << fp_last_error_message();
}

}  // namespace
