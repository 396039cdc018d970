// Sizes that cannot wrap, validators that read nothing before checking it, flags that cannot be
// misused, bounds clamped to the call, the prefill in bounded memory (the CPU path, and the CUDA
// path's range arithmetic), and a reference that keeps its contract at long contexts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "core/query_ranges.hpp"
#include "flashprefill/flashprefill.hpp"
#include "test_support.hpp"

using namespace fptest;
using flashprefill::ceil_div;
using flashprefill::kKvTile;
using flashprefill::kTileRows;
using flashprefill::QueryRangeShape;
using flashprefill::SeqGeometry;

namespace {

bool message_has(const char* text) {
  return std::string(fp_last_error_message()).find(text) != std::string::npos;
}

// A problem whose cu_seqlens are real (B + 1 zeros, then the given totals; a placeholder past 2^20
// requests) and whose tensors are a placeholder never read: enough for the size queries and the
// checks before any data is read.
struct ShapeOnly {
  std::vector<int32_t> cu_q, cu_k;
  float placeholder[4] = {};
  fp_problem p{};

  ShapeOnly(int32_t batch, int32_t hq, int32_t hkv, int32_t d, int32_t len_q, int32_t len_k) {
    if (batch < (1 << 20)) {
      cu_q.assign(size_t(batch) + 1, 0);
      cu_k.assign(size_t(batch) + 1, 0);
      cu_q.back() = len_q;  // the last request holds every token
      cu_k.back() = len_k;
    }
    const int32_t* none = reinterpret_cast<const int32_t*>(placeholder);
    p = flashprefill::contiguous_problem(FP_DEVICE_CPU, FP_BFLOAT16, batch, hq, hkv, d,
                                         placeholder, len_q, cu_q.empty() ? none : cu_q.data(),
                                         len_q, placeholder, placeholder, len_k,
                                         cu_k.empty() ? none : cu_k.data(), len_k);
  }
};

// Issue: B = 2^17, Hq = Hkv = 2^11, D = 512, max_seqlen_k = INT32_MAX made mean_elements * 4
// wrap to a 256-byte workspace that fp_prefill then overran.
TEST(SizeArithmetic, MeanBytesDoNotWrap) {
  ShapeOnly s(1 << 17, 1 << 11, 1 << 11, 512, 0, 0);
  s.p.max_seqlen_k = INT32_MAX;
  fp_select_config c = default_config();
  c.block_size = 64;
  fp_index_sizes sizes;
  EXPECT_EQ(fp_index_sizes_query(&s.p, &c, &sizes), FP_ERROR_UNSUPPORTED);
  EXPECT_TRUE(message_has("block-mean elements")) << fp_last_error_message();
  size_t bytes = 0;
  EXPECT_EQ(fp_build_index_workspace_size(&s.p, &c, &bytes), FP_ERROR_UNSUPPORTED);
  // fp_prefill keeps the means itself and sizes them from total_k = 0: a tiny, correct workspace.
  ASSERT_EQ(fp_prefill_workspace_size(&s.p, &c, &bytes), FP_OK) << fp_last_error_message();
  EXPECT_LT(bytes, size_t(1) << 20);
  std::vector<unsigned char> ws(bytes);
  fp_output out{s.placeholder, int64_t(1 << 11) * 512, 512, nullptr};
  EXPECT_EQ(fp_prefill(&s.p, &c, &out, ws.data(), ws.size()), FP_OK) << fp_last_error_message();
}

TEST(SizeArithmetic, QueryTilesCheckedBeforeNarrowing) {
  // 2^12 query heads per KV head over 2^30 tokens: 2^35 query tiles per request.
  ShapeOnly s(1, 1 << 12, 1, 1, 1 << 30, 1 << 30);
  fp_select_config c = default_config();
  fp_index_sizes sizes;
  EXPECT_EQ(fp_index_sizes_query(&s.p, &c, &sizes), FP_ERROR_UNSUPPORTED);
  EXPECT_TRUE(message_has("query tiles")) << fp_last_error_message();
  size_t bytes;
  EXPECT_EQ(fp_dense_attention_workspace_size(&s.p, &bytes), FP_ERROR_UNSUPPORTED);
}

TEST(SizeArithmetic, SegmentsCheckedAtHugeBatch) {
  ShapeOnly s(INT32_MAX, 1, 1, 1, 1 << 25, 1 << 25);  // 2^18 query tiles; cu is never reached
  size_t bytes;
  EXPECT_EQ(fp_dense_attention_workspace_size(&s.p, &bytes), FP_ERROR_UNSUPPORTED);
  EXPECT_TRUE(message_has("index segments exceed 2^48")) << fp_last_error_message();
}

// Issue: Hq = 512, Hkv = 1 with max_seqlen_q = 2^30 (a loose bound) returned FP_OK without
// writing the output; Hq = 256 with max_seqlen_q = INT32_MAX reported num_segments = -2.
TEST(SizeArithmetic, LooseQueryBoundsGiveTheTightResult) {
  for (const int32_t hq : {512, 256}) {
    TestProblem t({{3, 40}}, hq, 1, 8, FP_FLOAT32, 60 + hq);
    const fp_problem tight = t.contiguous();
    fp_problem loose = tight;
    loose.max_seqlen_q = hq == 512 ? 1 << 30 : INT32_MAX;
    loose.max_seqlen_k = INT32_MAX;
    fp_select_config c = default_config();
    fp_index_sizes a, b;
    ASSERT_EQ(fp_index_sizes_query(&tight, &c, &a), FP_OK);
    ASSERT_EQ(fp_index_sizes_query(&loose, &c, &b), FP_OK) << fp_last_error_message();
    EXPECT_EQ(b.num_segments, a.num_segments);
    EXPECT_EQ(b.max_q_tiles, a.max_q_tiles);
    EXPECT_EQ(run_dense(loose), run_dense(tight));
    EXPECT_EQ(run_prefill(loose, c), run_prefill(tight, c));
    IndexBuffers ix(loose, c);
    ASSERT_EQ(fp_build_index(&loose, &c, &ix.view, nullptr, 0), FP_OK) << fp_last_error_message();
    Output out(loose);
    ASSERT_EQ(fp_sparse_attention(&loose, &c, &ix.view, &out.view, nullptr, 0), FP_OK)
        << fp_last_error_message();
    EXPECT_EQ(out.values(), run_prefill(tight, c));
  }
}

// Issue: a 16-token call declaring max_seqlen_q = max_seqlen_k = INT32_MAX took a 2 GiB
// workspace.
TEST(SizeArithmetic, SmallCallsGetSmallWorkspaces) {
  TestProblem t({{16, 16}}, 4, 2, 16, FP_BFLOAT16, 61);
  const fp_problem tight = t.contiguous();
  fp_problem loose = tight;
  loose.max_seqlen_q = loose.max_seqlen_k = INT32_MAX;
  fp_select_config c = default_config();
  size_t a = 0, b = 0;
  ASSERT_EQ(fp_prefill_workspace_size(&tight, &c, &a), FP_OK);
  ASSERT_EQ(fp_prefill_workspace_size(&loose, &c, &b), FP_OK);
  EXPECT_EQ(a, b);
  EXPECT_LT(b, size_t(64) << 10);
  EXPECT_EQ(run_prefill(loose, c), run_prefill(tight, c));
  t.make_paged(8, 62);
  fp_problem paged = t.paged();
  paged.max_seqlen_q = paged.max_seqlen_k = INT32_MAX;
  ASSERT_EQ(fp_prefill_workspace_size(&paged, &c, &b), FP_OK);
  EXPECT_LT(b, size_t(64) << 10);
  EXPECT_EQ(run_prefill(paged, c), run_prefill(tight, c));
}

// A foreign index with cu = {0, 6, 0} and idx_capacity = 3: every cu entry is checked before any
// idx entry is read (the idx buffer holds exactly 3 entries, so a read past them is an ASan error).
TEST(ForeignIndex, OffsetsCheckedBeforeTiles) {
  TestProblem t({{200, 200}}, 1, 1, 16, FP_FLOAT32, 63);  // two query tiles
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  IndexBuffers ix(p, c);
  ASSERT_EQ(ix.sizes.num_segments, 2);
  std::vector<int32_t> cu = {0, 6, 0}, idx = {0, 1, 2};
  fp_index bad{cu.data(), idx.data(), ix.k_mean.data(), ix.v_mean.data(), 3};
  Output out(p);
  const std::vector<unsigned char> before = out.data;
  EXPECT_EQ(fp_sparse_attention(&p, &c, &bad, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("idx_capacity = 3")) << fp_last_error_message();
  EXPECT_EQ(out.data, before);
  double density = -1;
  EXPECT_EQ(fp_index_density(&p, &c, &bad, &density), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("idx_capacity = 3")) << fp_last_error_message();
  EXPECT_EQ(density, -1);
  cu = {0, 2, 1};
  EXPECT_EQ(fp_index_density(&p, &c, &bad, &density), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("decreases")) << fp_last_error_message();
  cu = {0, 1, 3};
  idx = {0, 0, 9};  // segment 1 (tiles 0..3 causal) lists tile 9
  EXPECT_EQ(fp_index_density(&p, &c, &bad, &density), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("causal range")) << fp_last_error_message();
  idx = {0, 0, 3};
  ASSERT_EQ(fp_index_density(&p, &c, &bad, &density), FP_OK) << fp_last_error_message();
  EXPECT_DOUBLE_EQ(density, 3.0 / (2 + 4));
}

// Issue: fp_prefill under FP_FLAG_MEANS_POOLED read stale workspace as means and returned FP_OK.
TEST(Flags, MeansPooledRefusedByPrefill) {
  TestProblem t({{100, 300}}, 4, 2, 16, FP_FLOAT32, 64);
  fp_problem p = t.contiguous();
  p.flags |= FP_FLAG_MEANS_POOLED;
  fp_select_config c = default_config();
  size_t bytes = 0;
  EXPECT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("FP_FLAG_MEANS_POOLED")) << fp_last_error_message();
  std::vector<unsigned char> ws(1 << 20);
  Output out(p);
  EXPECT_EQ(fp_prefill(&p, &c, &out.view, ws.data(), ws.size()), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("FP_FLAG_MEANS_POOLED")) << fp_last_error_message();
}

// The documented least workspace of the CPU prefill (docs/ALGORITHM.md, "Workspace"): cu, the
// two mean tensors and one segment's worth of index entries, each rounded up to 256 bytes.
size_t least_prefill_workspace(const fp_problem& p, const fp_select_config& c) {
  fp_index_sizes s;
  EXPECT_EQ(fp_index_sizes_query(&p, &c, &s), FP_OK);
  auto align = [](int64_t bytes) { return size_t((bytes + 255) / 256 * 256); };
  return align(4 * (s.num_segments + 1)) + 2 * align(4 * s.mean_elements) +
         align(4 * ((p.max_seqlen_k + 63) / 64));
}

// With a workspace that holds one segment's entries, the CPU prefill selects and attends the
// segments range by range; the output is identical to the one-range run.
TEST(BoundedPrefill, RangesMatchTheWholeIndex) {
  TestProblem t({{1500, 2100}, {700, 700}}, 4, 2, 32, FP_BFLOAT16, 65);
  fill_structured(t, 66);
  const fp_problem p = t.contiguous();
  fp_select_config c = default_config();
  c.sink_tokens = 64;
  c.window_tokens = 128;
  fp_index_sizes s;
  ASSERT_EQ(fp_index_sizes_query(&p, &c, &s), FP_OK);
  size_t least = least_prefill_workspace(p, c), whole = least + 4 * size_t(s.idx_capacity);
  Output ranged(p), one(p), mid(p);
  std::vector<unsigned char> ws(whole);
  ASSERT_EQ(fp_prefill(&p, &c, &one.view, ws.data(), whole), FP_OK) << fp_last_error_message();
  ASSERT_EQ(fp_prefill(&p, &c, &ranged.view, ws.data(), least), FP_OK) << fp_last_error_message();
  ASSERT_EQ(fp_prefill(&p, &c, &mid.view, ws.data(), least + 4 * 1000), FP_OK);
  EXPECT_EQ(ranged.data, one.data);
  EXPECT_EQ(mid.data, one.data);
  EXPECT_EQ(fp_prefill(&p, &c, &ranged.view, ws.data(), least - 1), FP_ERROR_WORKSPACE_TOO_SMALL);
  // The sparse result is what fp_build_index + fp_sparse_attention give.
  IndexBuffers ix(p, c);
  ASSERT_EQ(fp_build_index(&p, &c, &ix.view, nullptr, 0), FP_OK);
  Output staged(p);
  ASSERT_EQ(fp_sparse_attention(&p, &c, &ix.view, &staged.view, nullptr, 0), FP_OK);
  EXPECT_EQ(staged.data, one.data);
}

// Issue: at Hq = 32, Hkv = 8, D = 128 the prefill workspace grew as L^2 (16 GiB at 1M tokens, then
// refused). On the CPU it now grows linearly: the 1M query succeeds and doubles from 512K.
TEST(BoundedPrefill, MillionTokenWorkspaceIsLinear) {
  fp_select_config c = default_config();
  size_t half = 0, full = 0;
  ShapeOnly a(1, 32, 8, 128, 1 << 19, 1 << 19), b(1, 32, 8, 128, 1 << 20, 1 << 20);
  ASSERT_EQ(fp_prefill_workspace_size(&a.p, &c, &half), FP_OK) << fp_last_error_message();
  ASSERT_EQ(fp_prefill_workspace_size(&b.p, &c, &full), FP_OK) << fp_last_error_message();
  EXPECT_LE(full, size_t(82) << 20);  // 64 MiB of means, 1 MiB of cu, 16 MiB of index entries
  EXPECT_LE(double(full) / double(half), 2.01);
  EXPECT_GE(double(full) / double(half), 1.99);
}

// The CUDA prefill's query-tile ranges (core/query_ranges.hpp) for one request of `len` queries
// and keys, with the index sizes the C ABI reports (they do not depend on the device, so the CPU
// query stands in for a CUDA problem on a machine without a GPU).
QueryRangeShape one_request(int32_t len, int32_t hq, int32_t hkv, int32_t d) {
  ShapeOnly s(1, hq, hkv, d, len, len);
  fp_select_config c = default_config();
  fp_index_sizes sizes{};
  EXPECT_EQ(fp_index_sizes_query(&s.p, &c, &sizes), FP_OK) << fp_last_error_message();
  return {1, hkv, sizes.max_q_tiles, ceil_div(len, kKvTile), sizes.idx_capacity};
}

// Issue: at Hq = 32, Hkv = 8, D = 128 the CUDA prefill sized the whole index (16 GiB at 1M tokens)
// and refused it. Its ranges hold at most 2^25 entries (128 MiB) there, whatever the length: the
// index work grows as L^2, so the number of ranges does, not the memory.
TEST(QueryRanges, MillionTokensFitABoundedIndex) {
  const QueryRangeShape half = one_request(1 << 19, 32, 8, 128);
  const QueryRangeShape full = one_request(1 << 20, 32, 8, 128);
  EXPECT_EQ(full.max_q_tiles, 32768);
  EXPECT_EQ(full.idx_capacity, int64_t(1) << 32);  // the whole index: 16 GiB of int32
  const int64_t w = flashprefill::default_range_tiles(full);
  EXPECT_EQ(w, 256);
  EXPECT_EQ(flashprefill::range_entries(full, w).value(), flashprefill::kRangeEntries);
  EXPECT_EQ(flashprefill::range_segments(full, w).value(), 2048);
  EXPECT_EQ(flashprefill::range_count(full, w), 128);
  const int64_t wh = flashprefill::default_range_tiles(half);
  EXPECT_LE(flashprefill::range_entries(half, wh).value(), flashprefill::kRangeEntries);
  EXPECT_EQ(flashprefill::range_count(full, w), 4 * flashprefill::range_count(half, wh));
  // A one-tile range (the least workspace) grows linearly: 8 heads x 16384 tiles.
  EXPECT_EQ(flashprefill::range_entries(full, 1).value(), 8 * 16384);
  EXPECT_EQ(flashprefill::range_entries(full, 1).value(),
            2 * flashprefill::range_entries(half, 1).value());
}

// Problems whose whole index fits the range budget run as one range: the index of the
// one-range call, nothing more.
TEST(QueryRanges, ShortProblemsRunAsOneRange) {
  for (const int32_t len : {1, 100, 4096, 65536}) {
    const QueryRangeShape s = one_request(len, 32, 8, 128);
    const int64_t w = flashprefill::default_range_tiles(s);
    EXPECT_EQ(w, s.max_q_tiles) << len;
    EXPECT_EQ(flashprefill::range_count(s, w), 1) << len;
    EXPECT_EQ(flashprefill::range_entries(s, w).value(), s.idx_capacity) << len;
  }
}

// The range budget grows to one tile of every request and KV head when that is more.
TEST(QueryRanges, ManyHeadsTakeOneTileRanges) {
  const QueryRangeShape s{4, 256, 100000, 65536, int64_t(1) << 45};
  EXPECT_EQ(flashprefill::default_range_tiles(s), 1);
  EXPECT_EQ(flashprefill::range_entries(s, 1).value(), int64_t(4) * 256 * 65536);
}

// Every segment of a varlen batch lies in exactly one range, and each range's entries hold the
// causal tiles (the most a segment can list) of all its segments, for every width.
TEST(QueryRanges, RangesHoldTheirSegmentsCausalTiles) {
  const std::vector<std::pair<int32_t, int32_t>> lens = {{3000, 5000}, {1, 1}, {700, 700},
                                                         {0, 64}, {4096, 4100}};
  const int32_t group = 4, hkv = 2;
  int32_t max_q = 0, max_k = 0;
  int64_t total_q = 0;
  for (const auto& [lq, lk] : lens) {
    max_q = std::max(max_q, lq);
    max_k = std::max(max_k, lk);
    total_q += lq;
  }
  const int64_t max_q_tiles = ceil_div(int64_t(group) * max_q, kTileRows);
  const int64_t T = ceil_div(max_k, kKvTile);
  const int64_t batch = int64_t(lens.size());
  const int64_t capacity =
      hkv * std::min(ceil_div(group * total_q, kTileRows) + batch, batch * max_q_tiles) * T;
  const QueryRangeShape s{batch, hkv, max_q_tiles, T, capacity};
  for (const int64_t w : {int64_t(1), int64_t(3), int64_t(7), max_q_tiles}) {
    std::vector<int> seen(size_t(batch * hkv * max_q_tiles), 0);
    for (int64_t i0 = 0; i0 < max_q_tiles; i0 += w) {
      const int64_t tiles = std::min(w, max_q_tiles - i0);
      int64_t listed = 0;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t h = 0; h < hkv; ++h)
          for (int64_t i = i0; i < i0 + tiles; ++i) {
            ++seen[size_t((b * hkv + h) * max_q_tiles + i)];
            const SeqGeometry seq{lens[size_t(b)].first, lens[size_t(b)].second, group};
            if (i < seq.num_q_tiles()) listed += seq.causal_tiles(int32_t(i));
          }
      EXPECT_LE(listed, flashprefill::range_entries(s, tiles).value()) << w << " " << i0;
    }
    for (const int n : seen) EXPECT_EQ(n, 1) << w;
    EXPECT_EQ(flashprefill::range_count(s, w), ceil_div(max_q_tiles, w));
  }
}

// Issue: float32 running sums in the reference lost the tail behind a dominant sink (rel. L2
// 1.7e-4 at 4K keys against dense). q = e_0, k[0, 0] = 136 (a sink logit of 17, all others 0).
TEST(ReferenceAccuracy, AlphaZeroPrefillEqualsDenseBehindASink) {
  for (const int32_t len : {4096, 65536}) {
    const int32_t D = 64;
    TestProblem t({{1, len}}, 1, 1, D, FP_FLOAT32, 67);
    std::mt19937_64 rng(68);
    std::normal_distribution<float> n(0.f, 1.f);
    std::vector<float> q(D, 0.f), k(size_t(len) * D), v(size_t(len) * D);
    q[0] = 1.f;
    for (int32_t j = 0; j < len; ++j)
      for (int32_t d = 0; d < D; ++d) {
        k[size_t(j) * D + d] = d == 0 ? 0.f : n(rng);
        v[size_t(j) * D + d] = n(rng);
      }
    k[0] = 136.f;
    t.set_data(q, k, v);
    const fp_problem p = t.contiguous();
    fp_select_config c = default_config();
    c.alpha = 0.f;
    const std::vector<float> dense = run_dense(p), sparse = run_prefill(p, c);
    EXPECT_LT(rel_l2(sparse, dense), 1e-5) << len << " keys";
    const std::vector<double> exact = naive_attention(t, 1.f / 8.f);
    EXPECT_LT(rel_l2(dense, std::vector<float>(exact.begin(), exact.end())), 1e-6) << len << " keys";
  }
}

}  // namespace

// A paged problem's total_k, when given, bounds the keys of all its requests (CUDA FP8 attention
// gathers that many rows into its workspace): the bound is taken as exact, one key less is
// refused by name with nothing written, and 0 leaves the keys unbounded.
TEST(SizeArithmetic, PagedTotalKBoundsTheKeys) {
  TestProblem t({{40, 70}, {20, 50}}, 4, 2, 16, FP_FLOAT32, 64);
  t.make_paged(16, 65);
  fp_problem p = t.paged();
  const fp_select_config c = default_config();
  p.total_k = 120;
  EXPECT_EQ(run_prefill(p, c), run_prefill(t.paged(), c));
  p.total_k = 119;
  Output out(p);
  const std::vector<unsigned char> before = out.data;
  size_t bytes = 0;
  ASSERT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("hold 120 keys up to request 1, more than total_k = 119"))
      << fp_last_error_message();
  EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out.data, before);
}
