// The CUDA attention stage's split heuristic (Eq. 18; cuda/attention/heuristics.hpp), which is
// host code decided from shapes alone: a short-query batch takes the fewest splits whose modeled
// time (waves of equal items on the SMs) is within 3 % of the best the caps (KV tiles per split,
// splits, partial bytes) allow; batches that fill the GPU twice over are never split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/attention/heuristics.hpp"

namespace {

using flashprefill::ceil_div;
using flashprefill::kKvTile;
using flashprefill::kTileRows;
using flashprefill::ProblemInfo;
using flashprefill::cuda::attention::choose_head_section;
using flashprefill::cuda::attention::choose_lead_tiles;
using flashprefill::cuda::attention::choose_splits;
using flashprefill::cuda::attention::kMaxPartialBytes;
using flashprefill::cuda::attention::kMaxSplits;
using flashprefill::cuda::attention::kMinTilesPerSplit;
using flashprefill::cuda::attention::kTmaMinBoxRows;
using flashprefill::cuda::attention::paged_row_units;
using flashprefill::cuda::attention::paged_rows_fit_32_bits;
using flashprefill::cuda::attention::paged_tma_box_rows;
using flashprefill::cuda::attention::tuned_head_section;
using flashprefill::cuda::attention::tuned_lead_tiles;
using flashprefill::cuda::attention::tuned_splits;

constexpr int kSms = 132;

struct Shape {
  int64_t total_q = 0, max_seqlen_k = 0;
  int32_t heads_q = 32, heads_kv = 8, head_dim = 128;
};

int32_t splits_for(const Shape& s, int sms = kSms) {
  fp_problem p{};
  p.total_q = s.total_q;
  p.max_seqlen_k = s.max_seqlen_k;
  p.num_heads_q = s.heads_q;
  p.num_heads_kv = s.heads_kv;
  p.head_dim = s.head_dim;
  ProblemInfo info;
  info.p = &p;
  info.group = s.heads_q / s.heads_kv;
  return choose_splits(info, sms);
}

int64_t work_tiles(const Shape& s) {
  return int64_t(s.heads_kv) * ceil_div(int64_t(s.heads_q / s.heads_kv) * s.total_q, kTileRows);
}

TEST(SplitHeuristic, LongPrefillIsNotSplit) {
  EXPECT_EQ(splits_for({32768, 32768}), 1);
  EXPECT_EQ(splits_for({8192, 8192}), 1);
  EXPECT_EQ(splits_for({4096, 131072}), 1);  // 1024 work tiles
}

// The fastest split count of a sweep over 1, 2, 3, 4, 6, 8, 9, 12 and 16 splits on the H200
// (Hq 32, Hkv 8, D 128, bf16, dense mode, one request: docs/PERF.md, "Chunked prefill").
TEST(SplitHeuristic, PicksTheMeasuredFastestSplitOfAChunk) {
  EXPECT_EQ(splits_for({128, 32768}), 4);    // 32 work tiles: one wave of 128 items
  EXPECT_EQ(splits_for({128, 131072}), 4);
  EXPECT_EQ(splits_for({256, 65536}), 2);    // 64 work tiles
  EXPECT_EQ(splits_for({512, 131072}), 1);   // 128 work tiles: already one wave
  EXPECT_EQ(splits_for({512, 32768}), 1);
  EXPECT_EQ(splits_for({1024, 65536}), 1);   // 256 work tiles: two waves either way
}

TEST(SplitHeuristic, ShortCacheIsNotSplit) {
  // Fewer than kMinTilesPerSplit KV tiles per split would be left: no split.
  EXPECT_EQ(splits_for({16, 256}), 1);
}

// The model written out independently: waves of kSms items, each its share of the two-tile
// stages plus two stages of its own.
double modeled(int64_t tiles, int64_t stages, int64_t s) {
  const double waves = std::ceil(double(tiles * s) / kSms);
  return waves * (std::ceil(double(stages) / double(s)) + 2.0);
}

TEST(SplitHeuristic, RandomShapesTakeTheFewestSplitsNearTheBestModeledTime) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 5000; ++trial) {
    Shape s;
    s.heads_kv = 1 << int(rng() % 4);
    s.heads_q = s.heads_kv * (1 + int32_t(rng() % 8));
    s.head_dim = rng() % 2 ? 64 : 128;
    s.total_q = 1 + int64_t(rng() % 20000);
    s.max_seqlen_k = s.total_q + int64_t(rng() % 200000);
    const int32_t n = splits_for(s);
    ASSERT_GE(n, 1);
    ASSERT_LE(n, kMaxSplits);
    const int64_t tiles = work_tiles(s);
    if (tiles >= 2 * kSms) {
      ASSERT_EQ(n, 1) << "total_q " << s.total_q;
      continue;
    }
    const int64_t kv_tiles = ceil_div(s.max_seqlen_k, kKvTile);
    const int64_t bytes_per_split =
        s.total_q * s.heads_q * (int64_t(s.head_dim) + 1) * int64_t(sizeof(float));
    const int64_t cap = std::max<int64_t>(
        std::min<int64_t>({kv_tiles / kMinTilesPerSplit, kMaxSplits, kMaxPartialBytes / bytes_per_split}), 1);
    ASSERT_LE(n, cap) << "total_q " << s.total_q << " L_kv " << s.max_seqlen_k;
    // Every split keeps at least kMinTilesPerSplit KV tiles of the longest request.
    if (n > 1) ASSERT_GE(kv_tiles / n, kMinTilesPerSplit);
    const int64_t stages = ceil_div(kv_tiles, 2);
    double best = modeled(tiles, stages, 1);
    for (int64_t c = 2; c <= cap; ++c) best = std::min(best, modeled(tiles, stages, c));
    ASSERT_LE(modeled(tiles, stages, n), 1.03 * best) << "total_q " << s.total_q;
    for (int64_t c = 1; c < n; ++c)
      ASSERT_GT(modeled(tiles, stages, c), 1.03 * best) << "fewer splits were as good: " << c;
  }
}

int32_t section_for(int64_t max_seqlen_k, int32_t heads_kv, int32_t head_dim, int64_t l2,
                    bool e4m3 = false) {
  fp_problem p{};
  p.max_seqlen_k = max_seqlen_k;
  p.num_heads_kv = heads_kv;
  p.num_heads_q = heads_kv;
  p.head_dim = head_dim;
  ProblemInfo info;
  info.p = &p;
  info.group = 1;
  info.fp8.on = e4m3;
  return choose_head_section(info, l2);
}

TEST(HeadSection, AsManyHeadsAsFitInHalfTheL2) {
  constexpr int64_t kL2 = 50 << 20;  // H100 / H200
  // One head's K and V at 8K, D = 128, bf16: 4 MiB; 25 MiB hold 6 of 8 heads.
  EXPECT_EQ(section_for(8192, 8, 128, kL2), 6);
  EXPECT_EQ(section_for(2048, 8, 128, kL2), 8);  // all heads fit: the plain order
  EXPECT_EQ(section_for(32768, 8, 128, kL2), 1);  // 16 MiB per head
  EXPECT_EQ(section_for(32768, 8, 64, kL2), 3);   // 8 MiB per head
  EXPECT_EQ(section_for(131072, 8, 128, kL2), 1);  // more than the L2: still one head
  EXPECT_EQ(section_for(0, 4, 128, kL2), 4);
}

// e4m3 K and V (and the transposed V the kernel reads) take one byte per element: twice the
// heads fit.
TEST(HeadSection, E4m3HeadsTakeHalfTheBytes) {
  constexpr int64_t kL2 = 50 << 20;
  EXPECT_EQ(section_for(8192, 8, 128, kL2, true), 8);    // 2 MiB per head: all fit
  EXPECT_EQ(section_for(32768, 8, 128, kL2, true), 3);   // 8 MiB per head (bf16: 1)
  EXPECT_EQ(section_for(32768, 8, 64, kL2, true), 6);    // 4 MiB per head (bf16: 3)
  EXPECT_EQ(section_for(131072, 8, 128, kL2, true), 1);
}

TEST(HeadSection, AlwaysBetweenOneAndTheKvHeads) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    const int32_t heads = 1 + int32_t(rng() % 64);
    const int64_t len = int64_t(rng() % 1000000);
    const int32_t s = section_for(len, heads, rng() % 2 ? 64 : 128, int64_t(1 + rng() % (1u << 28)));
    ASSERT_GE(s, 1);
    ASSERT_LE(s, heads);
  }
}

TEST(LeadTiles, OneWaveOfTheGridAcrossAllHeads) {
  EXPECT_EQ(choose_lead_tiles(132, 8, 1), 17);  // 136 items >= 132 CTAs
  EXPECT_EQ(choose_lead_tiles(132, 8, 4), 5);
  EXPECT_EQ(choose_lead_tiles(132, 1, 1), 132);
  EXPECT_EQ(choose_lead_tiles(1, 8, 1), 1);
  for (int32_t ctas = 1; ctas <= 200; ++ctas)
    for (int32_t heads = 1; heads <= 16; ++heads)
      for (int32_t splits = 1; splits <= 4; ++splits) {
        const int32_t lead = choose_lead_tiles(ctas, heads, splits);
        ASSERT_GE(lead * heads * splits, ctas);
        ASSERT_LT((lead - 1) * heads * splits, ctas);
      }
}

// A chunk of 256 queries against a 128K prefix (Hq 32, Hkv 8, D 128): the heuristic splits it.
fp_problem chunk_problem() {
  fp_problem p{};
  p.total_q = 256;
  p.max_seqlen_k = 131072;
  p.num_heads_q = 32;
  p.num_heads_kv = 8;
  p.head_dim = 128;
  return p;
}

// fp_attention_tuning: a field set replaces its heuristic, a field left 0 keeps it; one field
// leaves the other choices alone.
TEST(Tuning, SetFieldsOverrideTheHeuristicsAndZeroKeepsThem) {
  fp_problem p = chunk_problem();
  ProblemInfo info;
  info.p = &p;
  info.group = 4;
  constexpr int64_t kL2 = 50 << 20;
  const int32_t splits = choose_splits(info, kSms), section = choose_head_section(info, kL2);
  ASSERT_GT(splits, 1);
  EXPECT_EQ(tuned_splits(info, kSms), splits);
  EXPECT_EQ(tuned_head_section(info, kL2), section);
  EXPECT_EQ(tuned_lead_tiles(info, kSms, splits), choose_lead_tiles(kSms, 8, splits));
  for (int32_t n = 1; n <= kMaxSplits; ++n) {
    p.tuning = {};
    p.tuning.num_splits = n;
    EXPECT_EQ(tuned_splits(info, kSms), n);
    EXPECT_EQ(tuned_head_section(info, kL2), section);
    EXPECT_EQ(tuned_lead_tiles(info, kSms, n), choose_lead_tiles(kSms, 8, n));
  }
  for (int32_t n = 1; n <= p.num_heads_kv; ++n) {
    p.tuning = {};
    p.tuning.head_section = n;
    EXPECT_EQ(tuned_head_section(info, kL2), n);
    EXPECT_EQ(tuned_splits(info, kSms), splits);
  }
  p.tuning = {};
  p.tuning.lead_tiles = 3;
  EXPECT_EQ(tuned_lead_tiles(info, kSms, splits), 3);
  EXPECT_EQ(tuned_splits(info, kSms), splits);
}

// e4m3 operands split as 16-bit ones do: the split count depends on the work, not the dtype,
// and a forced count is taken as it is.
TEST(Tuning, E4m3SplitsAsSixteenBitOperandsDo) {
  fp_problem p = chunk_problem();
  ProblemInfo info;
  info.p = &p;
  info.group = 4;
  const int32_t bf16 = tuned_splits(info, kSms);
  ASSERT_GT(bf16, 1);
  info.fp8.on = true;
  EXPECT_EQ(tuned_splits(info, kSms), bf16);
  p.tuning.num_splits = 1;
  EXPECT_EQ(tuned_splits(info, kSms), 1);
  p.tuning.num_splits = 3;
  EXPECT_EQ(tuned_splits(info, kSms), 3);
}

// A paged pool [num_pages, page_size, Hkv, D] (NHD); gap_tokens poisoned tokens after each page.
fp_problem paged_pool(int32_t page_size, int32_t heads_kv = 8, int32_t head_dim = 128,
                      int32_t gap_tokens = 0) {
  fp_problem p{};
  p.kv_layout = FP_KV_PAGED;
  p.page_size = page_size;
  p.num_heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.k_stride_head = p.v_stride_head = head_dim;
  p.k_stride_token = p.v_stride_token = int64_t(heads_kv) * head_dim;
  p.k_stride_page = p.v_stride_page = int64_t(page_size + gap_tokens) * p.k_stride_token;
  return p;
}

TEST(PagedTma, BoxesOfTheLargestPowerOfTwoUpToATileThatDividesThePage) {
  // Pages of 16 keys or more whose gcd with 64 is at least 16: boxes of that many rows.
  EXPECT_EQ(paged_tma_box_rows(paged_pool(16)), 16);   // vLLM's default
  EXPECT_EQ(paged_tma_box_rows(paged_pool(32)), 32);
  EXPECT_EQ(paged_tma_box_rows(paged_pool(48)), 16);
  EXPECT_EQ(paged_tma_box_rows(paged_pool(96)), 32);
  EXPECT_EQ(paged_tma_box_rows(paged_pool(64)), 64);   // a whole tile per box
  EXPECT_EQ(paged_tma_box_rows(paged_pool(128)), 64);
  EXPECT_EQ(paged_tma_box_rows(paged_pool(192)), 64);
  EXPECT_EQ(paged_tma_box_rows(paged_pool(64, 1, 64)), 64);
  // Smaller boxes than 16 rows go through cp.async.
  for (const int32_t ps : {1, 2, 4, 8, 24, 40, 100, 200})
    EXPECT_EQ(paged_tma_box_rows(paged_pool(ps)), 0) << "page size " << ps;
}

TEST(PagedTma, OnlyPoolsWhosePagesLieBackToBack) {
  EXPECT_EQ(paged_tma_box_rows(paged_pool(64, 8, 128, 1)), 0);  // a token's gap between pages
  fp_problem p = paged_pool(64);
  p.v_stride_page += p.v_stride_token;  // V padded, K not
  EXPECT_EQ(paged_tma_box_rows(p), 0);
  // Heads outermost within a page (HND: [num_pages, Hkv, page_size, D]): a token's stride is D,
  // a page's Hkv page_size D, not page_size token strides.
  fp_problem hnd = paged_pool(64);
  hnd.k_stride_token = hnd.v_stride_token = hnd.head_dim;
  hnd.k_stride_head = hnd.v_stride_head = int64_t(64) * hnd.head_dim;
  EXPECT_EQ(paged_tma_box_rows(hnd), 0);
  // One KV head: HND and NHD are the same layout.
  fp_problem one = paged_pool(64, 1);
  one.k_stride_head = one.v_stride_head = int64_t(64) * one.head_dim;
  EXPECT_EQ(paged_tma_box_rows(one), 64);
}

// The cp.async path's 32-bit row numbers: unit * (page * page_units + j * token_units) bytes
// is the byte offset of row j of page `page`, for every layout the tests use.
TEST(PagedRows, NumbersTimesTheUnitGiveEveryRowsByteOffset) {
  fp_problem hnd = paged_pool(16);
  hnd.k_stride_token = hnd.v_stride_token = hnd.head_dim;
  hnd.k_stride_head = hnd.v_stride_head = int64_t(16) * hnd.head_dim;
  fp_problem v_padded = paged_pool(100);
  v_padded.v_stride_page += 8;  // V's pages 8 elements apart, K's back to back
  for (const fp_problem& p : {paged_pool(1), paged_pool(16), paged_pool(100), paged_pool(64, 8, 128, 1),
                              paged_pool(16, 2, 64, 3), hnd, v_padded}) {
    for (const bool v : {false, true}) {
      const auto u = paged_row_units(p, v);
      const int64_t sp = (v ? p.v_stride_page : p.k_stride_page) * 2;
      const int64_t st = (v ? p.v_stride_token : p.k_stride_token) * 2;
      ASSERT_GT(u.unit, 0);
      EXPECT_EQ(u.unit * u.page_units, sp);
      EXPECT_EQ(u.unit * u.token_units, st);
      EXPECT_EQ(sp % u.unit, 0);
      EXPECT_EQ(st % u.unit, 0);
    }
  }
  // Back-to-back NHD pools: the unit is a token's stride, the number the pool row.
  const auto u = paged_row_units(paged_pool(16), false);
  EXPECT_EQ(u.unit, 8 * 128 * 2);
  EXPECT_EQ(u.page_units, 16);
  EXPECT_EQ(u.token_units, 1);
  // V padded by 8 elements a page: a unit of 16 bytes.
  EXPECT_EQ(paged_row_units(v_padded, true).unit, 16);
}

TEST(PagedRows, PoolsWhoseLastRowNumberPassesTwoToThe32AreRejected) {
  // NHD, 8 heads of 128: a unit of 2048 bytes, so 2^32 rows is 8 TiB: every real pool fits.
  fp_problem p = paged_pool(16);
  p.num_pages = 1 << 20;
  EXPECT_TRUE(paged_rows_fit_32_bits(p));
  // V's pages padded by 8 elements (16 bytes): V's unit is 16 bytes, a page 16 * 2048 / 16 + 1 =
  // 2049 units, a token 128; the last row is (num_pages - 1) * 2049 + 15 * 128.
  p.v_stride_page += 8;
  ASSERT_EQ(paged_row_units(p, true).page_units, 2049);
  ASSERT_EQ(paged_row_units(p, true).token_units, 128);
  const int64_t fit = (int64_t(UINT32_MAX) - 15 * 128) / 2049 + 1;  // pages that fit
  p.num_pages = int32_t(fit);
  EXPECT_TRUE(paged_rows_fit_32_bits(p));
  p.num_pages = int32_t(fit + 1);
  EXPECT_FALSE(paged_rows_fit_32_bits(p));
  // K alone too large.
  fp_problem k = paged_pool(16);
  k.k_stride_page += 8;
  k.num_pages = int32_t(fit + 1);
  EXPECT_FALSE(paged_rows_fit_32_bits(k));
}

TEST(PagedTma, BoxesStayInsideOnePageAndHoldWholeSwizzleAtoms) {
  for (int32_t ps = 1; ps <= 512; ++ps) {
    const int32_t rows = paged_tma_box_rows(paged_pool(ps));
    if (rows == 0) continue;
    ASSERT_GE(rows, kTmaMinBoxRows);
    ASSERT_EQ(ps % rows, 0) << "page size " << ps;
    ASSERT_EQ(flashprefill::kKvTile % rows, 0) << "page size " << ps;
    ASSERT_EQ(rows % 8, 0) << "page size " << ps;  // 8-row atoms of the 128-byte swizzle
  }
}

}  // namespace
