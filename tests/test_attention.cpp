// Attention stage and the whole prefill against exact attention.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "test_support.hpp"

using namespace fptest;

namespace {

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

struct GqaCase {
  int32_t hq, hkv;
};

// How GoogleTest (and so ctest's test names) shows a case.
void PrintTo(const GqaCase& c, std::ostream* os) { *os << "Hq=" << c.hq << " Hkv=" << c.hkv; }

class GqaTest : public ::testing::TestWithParam<GqaCase> {};

TEST_P(GqaTest, DenseMatchesIndependentFloat64Attention) {
  const auto [hq, hkv] = GetParam();
  TestProblem t({{70, 70}, {33, 150}, {1, 1}}, hq, hkv, 24, FP_FLOAT32, 11);
  const fp_problem p = t.contiguous();
  const std::vector<float> want = to_float(naive_attention(t, 1.f / std::sqrt(24.f)));
  EXPECT_LT(rel_l2(run_dense(p), want), 1e-6);
}

TEST_P(GqaTest, AlphaZeroPrefillEqualsDense) {
  const auto [hq, hkv] = GetParam();
  TestProblem t({{300, 300}, {129, 500}}, hq, hkv, 32, FP_FLOAT32, 12);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  c.alpha = 0.f;
  c.sink_tokens = c.window_tokens = c.dense_recent_tiles = 0;
  for (int corr = 0; corr < 2; ++corr) {
    c.mean_correction = corr;
    EXPECT_LT(rel_l2(run_prefill(p, c), run_dense(p)), 1e-5) << "mean_correction " << corr;
  }
}

INSTANTIATE_TEST_SUITE_P(Ratios, GqaTest, ::testing::Values(GqaCase{4, 4}, GqaCase{8, 2}, GqaCase{8, 1}),
                         [](const auto& info) {
                           return "g" + std::to_string(info.param.hq / info.param.hkv);
                         });

TEST(Attention, LowPrecisionDtypesMatchFloat64) {
  for (fp_dtype dt : {FP_BFLOAT16, FP_FLOAT16}) {
    TestProblem t({{200, 260}}, 8, 2, 64, dt, 13);
    const std::vector<float> want = to_float(naive_attention(t, 1.f / 8.f));
    const fp_problem p = t.contiguous();
    EXPECT_LT(rel_l2(run_dense(p), want), 1e-2);
    fp_select_config c = default_config();
    c.alpha = 0.f;
    EXPECT_LT(rel_l2(run_prefill(p, c), want), 1e-2);
  }
}

TEST(Attention, LogSumExpMatchesDefinition) {
  TestProblem t({{40, 90}}, 2, 1, 16, FP_FLOAT32, 14);
  const fp_problem p = t.contiguous();
  std::vector<float> lse;
  run_dense(p, &lse);
  for (int32_t i = 0; i < 40; ++i)
    for (int32_t h = 0; h < 2; ++h) {
      double sum = 0;
      for (int32_t j = 0; j <= 50 + i; ++j) {
        double s = 0;
        for (int32_t d = 0; d < 16; ++d) s += double(t.q(i, h, d)) * t.k(j, 0, d);
        sum += std::exp(s / 4.0);
      }
      EXPECT_NEAR(lse[size_t(h) * 40 + i], std::log(sum), 1e-5);
    }
}

TEST(Attention, PagedEqualsContiguous) {
  for (int32_t page : {1, 16, 64, 100, 256}) {
    TestProblem t({{150, 400}, {77, 77}, {1, 333}}, 8, 2, 32, FP_BFLOAT16, 15);
    fill_structured(t, 16);
    t.make_paged(page, 17);
    fp_select_config c = default_config();
    c.sink_tokens = 64;
    c.window_tokens = 64;
    c.dense_recent_tiles = 0;
    c.alpha = 0.2f;
    EXPECT_EQ(run_prefill(t.paged(), c), run_prefill(t.contiguous(), c)) << "page_size " << page;
    EXPECT_EQ(run_dense(t.paged()), run_dense(t.contiguous())) << "page_size " << page;
  }
}

TEST(Attention, VarlenBatchEqualsEachSequenceAlone) {
  const std::vector<Lengths> lengths = {{260, 700}, {1, 129}, {513, 513}, {0, 40}};
  TestProblem batch(lengths, 4, 2, 32, FP_FLOAT32, 18);
  fill_structured(batch, 19);
  fp_select_config c = default_config();
  c.sink_tokens = c.window_tokens = 64;
  c.alpha = 0.3f;
  const std::vector<float> all = run_prefill(batch.contiguous(), c);
  const size_t row = 4 * 32;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b].q == 0) continue;
    TestProblem one({lengths[b]}, 4, 2, 32, FP_FLOAT32, 1);
    std::vector<float> q, k, v;
    for (int32_t i = 0; i < lengths[b].q; ++i)
      for (int32_t h = 0; h < 4; ++h)
        for (int32_t d = 0; d < 32; ++d) q.push_back(batch.q(batch.cu_q(int32_t(b)) + i, h, d));
    for (int32_t j = 0; j < lengths[b].kv; ++j)
      for (int32_t h = 0; h < 2; ++h)
        for (int32_t d = 0; d < 32; ++d) {
          k.push_back(batch.k(batch.cu_k(int32_t(b)) + j, h, d));
          v.push_back(batch.v(batch.cu_k(int32_t(b)) + j, h, d));
        }
    one.set_data(q, k, v);
    const std::vector<float> alone = run_prefill(one.contiguous(), c);
    const std::vector<float> slice(all.begin() + batch.cu_q(int32_t(b)) * row,
                                   all.begin() + batch.cu_q(int32_t(b) + 1) * row);
    EXPECT_EQ(slice, alone) << "request " << b;
  }
}

TEST(Attention, CachedPrefixIsBottomRightAligned) {
  // The last 100 queries of a 400-token sequence, against all 400 keys, equal the last 100 rows of
  // the full causal attention.
  TestProblem full({{400, 400}}, 4, 2, 16, FP_FLOAT32, 20);
  TestProblem tail({{100, 400}}, 4, 2, 16, FP_FLOAT32, 1);
  std::vector<float> q, k, v;
  for (int32_t i = 300; i < 400; ++i)
    for (int32_t h = 0; h < 4; ++h)
      for (int32_t d = 0; d < 16; ++d) q.push_back(full.q(i, h, d));
  for (int32_t j = 0; j < 400; ++j)
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t d = 0; d < 16; ++d) {
        k.push_back(full.k(j, h, d));
        v.push_back(full.v(j, h, d));
      }
  tail.set_data(q, k, v);
  const std::vector<float> all = run_dense(full.contiguous());
  const std::vector<float> want(all.begin() + 300 * 64, all.end());
  EXPECT_LT(rel_l2(run_dense(tail.contiguous()), want), 1e-12);
  fp_select_config c = default_config();
  c.alpha = 0.f;
  EXPECT_LT(rel_l2(run_prefill(tail.contiguous(), c), want), 1e-5);
}

TEST(Attention, MeanCorrectionHelpsAtHighSparsity) {
  TestProblem t({{2048, 2048}}, 4, 1, 64, FP_BFLOAT16, 21);
  fill_structured(t, 22);
  const fp_problem p = t.contiguous();
  const std::vector<float> exact = to_float(naive_attention(t, 1.f / 8.f));
  fp_select_config c = default_config();
  c.block_size = 64;
  c.sink_tokens = 64;
  c.window_tokens = 128;
  c.dense_recent_tiles = 0;
  double last_plain = 0, last_corr = 0;
  for (float alpha : {0.05f, 0.2f, 0.5f, 1.f}) {
    c.alpha = alpha;
    c.mean_correction = 0;
    const double plain = rel_l2(run_prefill(p, c), exact);
    c.mean_correction = 1;
    const double corr = rel_l2(run_prefill(p, c), exact);
    EXPECT_LE(corr, plain * 1.001 + 1e-4) << "alpha " << alpha;
    last_plain = plain;
    last_corr = corr;
  }
  EXPECT_LT(last_corr, 0.7 * last_plain) << "at alpha 1 the correction should cut the error";
}

TEST(Attention, StridedQueriesFromAFusedQkvBuffer) {
  TestProblem t({{90, 90}}, 4, 2, 16, FP_FLOAT32, 23);
  const fp_problem p = t.contiguous();
  // [token, (Hq + 2 Hkv) * D] with q in the first Hq heads.
  const int64_t width = (4 + 2 * 2) * 16;
  std::vector<float> fused(90 * width, NAN);
  for (int32_t i = 0; i < 90; ++i)
    for (int32_t h = 0; h < 4; ++h)
      for (int32_t d = 0; d < 16; ++d) fused[i * width + h * 16 + d] = t.q(i, h, d);
  fp_problem s = p;
  s.q = fused.data();
  s.q_stride_token = width;
  EXPECT_EQ(run_dense(s), run_dense(p));
  fp_select_config c = default_config();
  EXPECT_EQ(run_prefill(s, c), run_prefill(p, c));
}

TEST(Attention, EveryOutputElementIsWritten) {
  TestProblem t({{333, 1000}, {64, 64}}, 8, 2, 32, FP_BFLOAT16, 24);
  fill_structured(t, 25);
  fp_select_config c = default_config();
  c.sink_tokens = c.window_tokens = 0;
  c.alpha = 1.f;
  for (float x : run_prefill(t.contiguous(), c)) ASSERT_TRUE(std::isfinite(x));
  for (float x : run_dense(t.contiguous())) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
