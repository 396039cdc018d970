// Every bad input gets a clear error and nothing is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>

#include "flashprefill/flashprefill.hpp"
#include "test_support.hpp"

using namespace fptest;

namespace {

struct BadCase {
  const char* name;
  std::function<void(fp_problem&, fp_select_config&)> mutate;
  fp_status status;
  const char* message;  // a substring of fp_last_error_message()
};

// How GoogleTest (and so ctest's test names) shows a case.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class Validation : public ::testing::TestWithParam<BadCase> {};

// Runs prefill, sparse attention, index building and dense attention on the broken problem
// (dense skips config-only errors) and checks each reports the error and leaves the output alone.
TEST_P(Validation, EveryEntryPointReportsIt) {
  const BadCase& bad = GetParam();
  TestProblem t({{100, 300}, {20, 20}}, 4, 2, 16, FP_BFLOAT16, 41);
  t.make_paged(16, 42);
  const bool paged = std::string(bad.name).rfind("paged", 0) == 0;
  fp_problem good = paged ? t.paged() : t.contiguous();
  fp_select_config c = default_config();
  IndexBuffers ix(good, c);
  Output out(good);
  std::vector<unsigned char> ws(1 << 20);
  fp_problem p = good;
  bad.mutate(p, c);
  const std::vector<unsigned char> before = out.data;

  EXPECT_EQ(fp_prefill(&p, &c, &out.view, ws.data(), ws.size()), bad.status);
  EXPECT_NE(std::string(fp_last_error_message()).find(bad.message), std::string::npos)
      << "message was: " << fp_last_error_message();
  EXPECT_EQ(fp_build_index(&p, &c, &ix.view, ws.data(), ws.size()), bad.status);
  EXPECT_EQ(fp_sparse_attention(&p, &c, &ix.view, &out.view, ws.data(), ws.size()), bad.status);
  EXPECT_EQ(out.data, before) << "a failing call wrote to the output";
}

// An int outside an enum's values stored in the enum field, as a C or ctypes caller may (a
// C++ cast to the enum type would itself be undefined).
template <typename E>
void store_bits(E& field, int32_t bits) {
  static_assert(sizeof(E) == sizeof(int32_t));
  std::memcpy(&field, &bits, sizeof bits);
}

std::vector<BadCase> cases() {
  using P = fp_problem;
  using C = fp_select_config;
  const auto E = FP_ERROR_INVALID_ARGUMENT;
  return {
      {"heads_not_multiple", [](P& p, C&) { p.num_heads_q = 6; p.num_heads_kv = 4; }, E, "multiple of num_heads_kv"},
      {"head_dim_zero", [](P& p, C&) { p.head_dim = 0; }, E, "head_dim"},
      {"head_dim_too_large", [](P& p, C&) { p.head_dim = 1024; }, E, "head_dim"},
      {"bad_dtype", [](P& p, C&) { store_bits(p.dtype, 9); }, E, "dtype"},
      {"bad_device", [](P& p, C&) { store_bits(p.device, 5); }, E, "device"},
      {"batch_zero", [](P& p, C&) { p.batch_size = 0; }, E, "batch_size"},
      {"null_q", [](P& p, C&) { p.q = nullptr; }, E, "q is NULL"},
      {"null_k", [](P& p, C&) { p.k = nullptr; }, E, "k is NULL"},
      {"null_cu_q", [](P& p, C&) { p.cu_seqlens_q = nullptr; }, E, "cu_seqlens_q is NULL"},
      {"null_cu_k", [](P& p, C&) { p.cu_seqlens_k = nullptr; }, E, "cu_seqlens_k is NULL"},
      {"q_heads_overlap", [](P& p, C&) { p.q_stride_head = 8; }, E, "overlap"},
      {"q_stride_zero", [](P& p, C&) { p.q_stride_token = 0; }, E, "positive"},
      {"total_q_mismatch", [](P& p, C&) { p.total_q = 119; }, E, "cu_seqlens_q[batch_size]"},
      {"total_k_mismatch", [](P& p, C&) { p.total_k = 321; }, E, "cu_seqlens_k[batch_size]"},
      {"more_queries_than_keys", [](P& p, C&) { p.total_k = 300; p.batch_size = 1; p.total_q = 100; p.max_seqlen_k = 300;
         static const int32_t cu_k[2] = {0, 50}; p.cu_seqlens_k = cu_k; p.total_k = 50; }, E, "more queries"},
      {"max_seqlen_q_too_small", [](P& p, C&) { p.max_seqlen_q = 50; }, E, "max_seqlen_q"},
      {"max_seqlen_k_too_small", [](P& p, C&) { p.max_seqlen_k = 200; }, E, "max_seqlen_k"},
      {"negative_scale", [](P& p, C&) { p.softmax_scale = -1.f; }, E, "softmax_scale"},
      {"nan_scale", [](P& p, C&) { p.softmax_scale = NAN; }, E, "softmax_scale"},
      {"tiny_scale", [](P& p, C&) { p.softmax_scale = 1e-30f; }, E, "outside [2^-64, 2^64]"},
      {"huge_scale", [](P& p, C&) { p.softmax_scale = 1e30f; }, E, "outside [2^-64, 2^64]"},
      {"bad_layout", [](P& p, C&) { store_bits(p.kv_layout, 3); }, E, "kv_layout"},
      {"alpha_nan", [](P&, C& c) { c.alpha = NAN; }, E, "alpha"},
      {"alpha_negative", [](P&, C& c) { c.alpha = -0.1f; }, E, "alpha"},
      {"alpha_above_one", [](P&, C& c) { c.alpha = 1.5f; }, E, "alpha"},
      {"block_not_multiple_of_64", [](P&, C& c) { c.block_size = 96; }, E, "block_size"},
      {"block_zero", [](P&, C& c) { c.block_size = 0; }, E, "block_size"},
      {"negative_sink", [](P&, C& c) { c.sink_tokens = -1; }, E, "sink_tokens"},
      {"bad_correction_flag", [](P&, C& c) { c.mean_correction = 2; }, E, "mean_correction"},
      {"paged_entry_out_of_range", [](P& p, C&) {
         static std::vector<int32_t> table;
         table.assign(p.page_table, p.page_table + p.batch_size * p.max_pages_per_seq);
         table[3] = p.num_pages;
         p.page_table = table.data(); }, E, "outside [0, num_pages"},
      {"paged_negative_entry", [](P& p, C&) {
         static std::vector<int32_t> table;
         table.assign(p.page_table, p.page_table + p.batch_size * p.max_pages_per_seq);
         table[0] = -1;
         p.page_table = table.data(); }, E, "outside [0, num_pages"},
      {"paged_too_few_pages", [](P& p, C&) { p.max_pages_per_seq = 5; }, E, "needs 19 pages"},
      {"paged_page_size_zero", [](P& p, C&) { p.page_size = 0; }, E, "page_size"},
      {"paged_null_table", [](P& p, C&) { p.page_table = nullptr; }, E, "page_table is NULL"},
      {"paged_null_seqlens", [](P& p, C&) { p.seqlens_k = nullptr; }, E, "seqlens_k is NULL"},
      {"paged_negative_seqlen", [](P& p, C&) {
         static int32_t lens[2];
         lens[0] = -5; lens[1] = 20;
         p.seqlens_k = lens; }, E, "negative"},
      {"paged_strides_overlap", [](P& p, C&) { p.k_stride_page = 16; }, E, "overlap"},
      {"unknown_flag_bits", [](P& p, C&) { p.flags |= 0x80u; }, E, "unknown problem flags 0x80"},
      {"tuning_splits_negative", [](P& p, C&) { p.tuning.num_splits = -1; }, E, "tuning.num_splits must lie in [0, 16]"},
      {"tuning_splits_too_many", [](P& p, C&) { p.tuning.num_splits = FP_MAX_SPLITS + 1; }, E, "tuning.num_splits must lie in [0, 16]"},
      {"tuning_head_section_negative", [](P& p, C&) { p.tuning.head_section = -2; }, E, "tuning.head_section"},
      {"tuning_head_section_past_kv_heads", [](P& p, C&) { p.tuning.head_section = 3; }, E, "num_heads_kv = 2"},
      {"tuning_lead_tiles_negative", [](P& p, C&) { p.tuning.lead_tiles = -1; }, E, "tuning.lead_tiles must be >= 0"},
      {"q_stride_2_pow_62", [](P& p, C&) { p.q_stride_token = int64_t(1) << 62; }, E, "2^48"},
      {"paged_stride_2_pow_62", [](P& p, C&) { p.v_stride_page = int64_t(1) << 62; }, E, "2^48"},
  };
}

INSTANTIATE_TEST_SUITE_P(BadInputs, Validation, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ValidationMisc, CudaOnABuildOrMachineWithoutIt) {
  if (fp_cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  TestProblem t({{10, 10}}, 2, 1, 16, FP_BFLOAT16, 43);
  fp_problem p = t.contiguous();
  p.device = FP_DEVICE_CUDA;
  Output out(p);
  EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(fp_last_error_message()).find("CUDA"), std::string::npos);
}

TEST(ValidationMisc, NullStructs) {
  TestProblem t({{10, 10}}, 2, 1, 16, FP_FLOAT32, 44);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  Output out(p);
  size_t bytes;
  EXPECT_EQ(fp_prefill(nullptr, &c, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(fp_last_error_message(), "problem is NULL");
  EXPECT_EQ(fp_prefill_workspace_size(&p, nullptr, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(fp_last_error_message(), "config is NULL");
  EXPECT_EQ(fp_prefill_workspace_size(&p, &c, nullptr), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fp_dense_attention(&p, nullptr, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(fp_last_error_message(), "output is NULL");
  fp_output no_out = out.view;
  no_out.out = nullptr;
  EXPECT_EQ(fp_dense_attention(&p, &no_out, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(fp_last_error_message(), "out is NULL");
  EXPECT_EQ(fp_sparse_attention(&p, &c, nullptr, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(fp_last_error_message(), "index is NULL");
}

// The tuning is appended after the FP8 fields, which keep their offsets (LP64).
static_assert(sizeof(void*) != 8 || (offsetof(fp_problem, v_descale_stride_head) == 288 &&
                                     offsetof(fp_problem, tuning) == 296 &&
                                     sizeof(fp_attention_tuning) == 12 &&
                                     sizeof(fp_problem) == 312));

// The tuning is part of the problem: the size queries and the dense call check it as well.
TEST(ValidationMisc, TuningIsCheckedByEveryCall) {
  TestProblem t({{100, 100}}, 4, 2, 16, FP_FLOAT32, 48);
  fp_problem p = t.contiguous();
  p.tuning.num_splits = 17;
  fp_select_config c = default_config();
  Output out(p);
  size_t bytes = 0;
  fp_index_sizes sizes;
  const auto rejected = [] {
    return std::string(fp_last_error_message()).find("tuning.num_splits") != std::string::npos;
  };
  EXPECT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
  EXPECT_EQ(fp_sparse_attention_workspace_size(&p, &c, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
  EXPECT_EQ(fp_build_index_workspace_size(&p, &c, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
  EXPECT_EQ(fp_index_sizes_query(&p, &c, &sizes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
  EXPECT_EQ(fp_dense_attention_workspace_size(&p, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
  EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(rejected());
}

// The CPU path has no work layout to tune: any valid tuning gives the same bits.
TEST(ValidationMisc, ValidTuningLeavesTheCpuResultAlone) {
  TestProblem t({{300, 300}, {70, 500}}, 4, 2, 16, FP_FLOAT32, 49);
  const fp_problem plain = t.contiguous();
  fp_select_config c = default_config();
  Output want(plain);
  std::vector<unsigned char> ws(1 << 22);
  ASSERT_EQ(fp_prefill(&plain, &c, &want.view, ws.data(), ws.size()), FP_OK)
      << fp_last_error_message();
  for (const fp_attention_tuning tuning :
       {fp_attention_tuning{1, 0, 0}, fp_attention_tuning{FP_MAX_SPLITS, 2, 1},
        fp_attention_tuning{0, 1, 1000}}) {
    fp_problem p = plain;
    p.tuning = tuning;
    size_t bytes = 0;
    ASSERT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_OK) << fp_last_error_message();
    ASSERT_LE(bytes, ws.size());
    Output got(p);
    ASSERT_EQ(fp_prefill(&p, &c, &got.view, ws.data(), ws.size()), FP_OK)
        << fp_last_error_message();
    EXPECT_EQ(got.data, want.data);
  }
}

TEST(ValidationMisc, WorkspaceTooSmall) {
  TestProblem t({{100, 100}}, 2, 1, 16, FP_FLOAT32, 45);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  size_t bytes = 0;
  ASSERT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_OK);
  ASSERT_GT(bytes, 0u);
  std::vector<unsigned char> ws(bytes - 1);
  Output out(p);
  EXPECT_EQ(fp_prefill(&p, &c, &out.view, ws.data(), ws.size()), FP_ERROR_WORKSPACE_TOO_SMALL);
  EXPECT_NE(std::string(fp_last_error_message()).find("workspace"), std::string::npos);
  EXPECT_EQ(fp_prefill(&p, &c, &out.view, nullptr, bytes), FP_ERROR_INVALID_ARGUMENT);
  std::vector<unsigned char> big(bytes + 16);
  EXPECT_EQ(fp_prefill(&p, &c, &out.view, big.data() + 4, bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("aligned"), std::string::npos);
}

TEST(ValidationMisc, IndexBuffers) {
  TestProblem t({{300, 300}}, 2, 1, 16, FP_FLOAT32, 46);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  IndexBuffers ix(p, c);
  fp_index small = ix.view;
  small.idx_capacity -= 1;
  EXPECT_EQ(fp_build_index(&p, &c, &small, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("idx_capacity"), std::string::npos);
  fp_index no_v = ix.view;
  no_v.v_mean = nullptr;
  EXPECT_EQ(fp_build_index(&p, &c, &no_v, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("v_mean"), std::string::npos);
  c.mean_correction = 0;
  EXPECT_EQ(fp_build_index(&p, &c, &no_v, nullptr, 0), FP_OK) << fp_last_error_message();
}

TEST(ValidationMisc, ForeignIndexIsChecked) {
  TestProblem t({{300, 300}}, 2, 1, 16, FP_FLOAT32, 47);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  IndexBuffers ix(p, c);
  ASSERT_EQ(fp_build_index(&p, &c, &ix.view, nullptr, 0), FP_OK);
  Output out(p);
  IndexBuffers bad = ix;
  bad.view = fp_index{bad.cu.data(), bad.idx.data(), bad.k_mean.data(), bad.v_mean.data(), bad.sizes.idx_capacity};
  bad.idx[bad.cu[1] - 1] = 1000;  // beyond the causal range of segment 0
  EXPECT_EQ(fp_sparse_attention(&p, &c, &bad.view, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("causal range"), std::string::npos);
  bad.idx = ix.idx;
  const int32_t last = int32_t(ix.sizes.num_segments) - 1;  // the last tile lists many tiles
  ASSERT_GE(ix.cu[last + 1] - ix.cu[last], 2);
  std::swap(bad.idx[ix.cu[last]], bad.idx[ix.cu[last] + 1]);
  EXPECT_EQ(fp_sparse_attention(&p, &c, &bad.view, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("ascending"), std::string::npos);
}

TEST(ValidationMisc, StatusStringsAndDefaults) {
  EXPECT_STREQ(fp_status_string(FP_ERROR_WORKSPACE_TOO_SMALL), "workspace too small");
  fp_select_config c;
  fp_select_config_default(&c);
  EXPECT_EQ(c.block_size, 128);
  EXPECT_FLOAT_EQ(c.alpha, 0.1f);
  EXPECT_EQ(c.sink_tokens, 256);
  EXPECT_EQ(c.window_tokens, 512);
  EXPECT_EQ(c.mean_correction, 1);
}

}  // namespace

namespace {

TEST(CppHeader, ThrowsWithTheLibraryMessage) {
  TestProblem t({{50, 80}}, 4, 2, 16, FP_FLOAT32, 48);
  const fp_problem good = t.contiguous();
  const int32_t cu_q[2] = {0, 50}, cu_k[2] = {0, 80};
  const fp_problem built = flashprefill::contiguous_problem(
      FP_DEVICE_CPU, FP_FLOAT32, 1, 4, 2, 16, good.q, 50, cu_q, 50, good.k, good.v, 80, cu_k, 80);
  fp_select_config c = flashprefill::default_config();
  std::vector<unsigned char> ws(flashprefill::prefill_workspace_size(built, c));
  Output a(built), b(good);
  flashprefill::prefill(built, c, a.view, ws.data(), ws.size());
  ASSERT_EQ(fp_prefill(&good, &c, &b.view, ws.data(), ws.size()), FP_OK);
  EXPECT_EQ(a.data, b.data);
  c.alpha = -1.f;
  try {
    flashprefill::prefill(built, c, a.view, ws.data(), ws.size());
    FAIL() << "expected flashprefill::Error";
  } catch (const flashprefill::Error& e) {
    EXPECT_EQ(e.status(), FP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("alpha"), std::string::npos);
  }
}

}  // namespace
