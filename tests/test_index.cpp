// Index stage: pooling, selection and the CSR, against independent brute-force computations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/geometry.hpp"
#include "reference/numerics.hpp"
#include "test_support.hpp"

using namespace fptest;
using flashprefill::ceil_div;

namespace {

struct Built {
  IndexBuffers ix;
  fp_problem p;
  fp_select_config c;
};

// Builds the index and checks the call succeeded.
void build(IndexBuffers& ix, const fp_problem& p, const fp_select_config& c) {
  ASSERT_EQ(fp_build_index(&p, &c, &ix.view, nullptr, 0), FP_OK) << fp_last_error_message();
}

// Query tile geometry recomputed here from docs/ALGORITHM.md, independently of geometry.hpp.
struct TileInfo {
  int32_t tiles, pmin, pmax;
};
TileInfo tile_info(Lengths l, int32_t g, int32_t tile) {
  const int64_t rows = int64_t(g) * l.q;
  const int64_t r0 = int64_t(tile) * 128, r1 = std::min<int64_t>(r0 + 128, rows) - 1;
  return {int32_t((rows + 127) / 128), int32_t(l.kv - l.q + r0 / g), int32_t(l.kv - l.q + r1 / g)};
}

void expect_well_formed(const TestProblem& t, const IndexBuffers& ix, const fp_select_config& c) {
  const int32_t g = t.heads_q() / t.heads_kv();
  const int32_t max_tiles = ix.sizes.max_q_tiles;
  ASSERT_EQ(ix.cu[0], 0);
  for (int32_t b = 0; b < t.batch(); ++b)
    for (int32_t h = 0; h < t.heads_kv(); ++h)
      for (int32_t tile = 0; tile < max_tiles; ++tile) {
        const int64_t s = (int64_t(b) * t.heads_kv() + h) * max_tiles + tile;
        const int32_t begin = ix.cu[s], end = ix.cu[s + 1];
        ASSERT_LE(begin, end);
        const Lengths l = t.lengths()[b];
        const TileInfo ti = tile_info(l, g, tile);
        if (tile >= ti.tiles) {
          EXPECT_EQ(begin, end) << "segment past the request's queries must be empty";
          continue;
        }
        std::set<int32_t> listed(ix.idx.begin() + begin, ix.idx.begin() + end);
        EXPECT_EQ(listed.size(), size_t(end - begin)) << "duplicates in segment " << s;
        for (int32_t i = begin + 1; i < end; ++i) EXPECT_LT(ix.idx[i - 1], ix.idx[i]);
        const int32_t causal = ti.pmax / 64 + 1;
        for (int32_t x : listed) {
          EXPECT_GE(x, 0);
          EXPECT_LT(x, causal) << "tile beyond the causal limit";
        }
        // Forced blocks: sink, window, diagonal.
        for (int32_t t64 = 0; t64 < causal; ++t64) {
          const int32_t j = t64 * 64 / c.block_size;
          const int32_t last = std::min((j + 1) * c.block_size, l.kv) - 1;
          const bool sink = j * c.block_size < c.sink_tokens;
          const bool window = last >= ti.pmin - c.window_tokens;
          if (sink || window)
            EXPECT_TRUE(listed.count(t64)) << "forced tile " << t64 << " missing in segment " << s;
        }
      }
}

TEST(Index, CsrIsWellFormed) {
  for (int32_t block : {64, 128, 256}) {
    TestProblem t({{700, 1200}, {1, 1}, {127, 127}, {300, 4097}}, 8, 2, 32, FP_BFLOAT16, 31);
    fill_structured(t, 32);
    fp_select_config c = default_config();
    c.block_size = block;
    c.sink_tokens = 100;
    c.window_tokens = 200;
    c.alpha = 0.3f;
    IndexBuffers ix(t.contiguous(), c);
    build(ix, t.contiguous(), c);
    expect_well_formed(t, ix, c);
  }
}

TEST(Index, PoolingIsTheBlockMean) {
  TestProblem t({{10, 300}, {5, 77}}, 4, 2, 8, FP_BFLOAT16, 33);
  fp_select_config c = default_config();
  IndexBuffers ix(t.contiguous(), c);
  build(ix, t.contiguous(), c);
  const int32_t max_blocks = ix.sizes.max_blocks;
  for (int32_t b = 0; b < 2; ++b)
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t j = 0; j * 128 < t.lengths()[b].kv; ++j) {
        const int32_t end = std::min((j + 1) * 128, t.lengths()[b].kv);
        for (int32_t d = 0; d < 8; ++d) {
          double sk = 0, sv = 0;
          for (int32_t x = j * 128; x < end; ++x) {
            sk += t.k(t.cu_k(b) + x, h, d);
            sv += t.v(t.cu_k(b) + x, h, d);
          }
          const size_t at = ((size_t(b) * 2 + h) * max_blocks + j) * 8 + d;
          EXPECT_NEAR(ix.k_mean[at], sk / (end - j * 128), 1e-5);
          EXPECT_NEAR(ix.v_mean[at], sv / (end - j * 128), 1e-5);
        }
      }
}

// Eq. 19-20 in float64, written from the paper and docs/ALGORITHM.md without the library's code.
TEST(Index, SelectionMatchesBruteForce) {
  const Lengths l{600, 1000};
  TestProblem t({l}, 4, 2, 32, FP_BFLOAT16, 34);
  fill_structured(t, 35);
  fp_select_config c = default_config();
  c.block_size = 64;
  c.sink_tokens = 0;
  c.window_tokens = 0;
  c.dense_recent_tiles = 0;
  c.alpha = 0.15f;
  IndexBuffers ix(t.contiguous(), c);
  build(ix, t.contiguous(), c);
  const int32_t g = 2, D = 32;
  const double scale = 1.0 / std::sqrt(32.0);
  int checked = 0;
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t tile = 0; tile < ix.sizes.max_q_tiles; ++tile) {
      const TileInfo ti = tile_info(l, g, tile);
      const int32_t candidates = ti.pmax / 64 + 1;
      std::vector<std::vector<double>> x;
      double m = -INFINITY;
      for (int32_t r = tile * 128; r < std::min(tile * 128 + 128, g * l.q); ++r) {
        const int32_t pos = l.kv - l.q + r / g;
        std::vector<double> row(candidates, -INFINITY);
        for (int32_t j = 0; j < candidates && j * 64 <= pos; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < D; ++d) {
            double mean = 0;
            const int32_t end = std::min(j * 64 + 64, l.kv);
            for (int32_t key = j * 64; key < end; ++key) mean += t.k(key, h, d);
            mean = flashprefill::ref::round_to_dtype(float(mean / (end - j * 64)), FP_BFLOAT16);
            dot += double(t.q(r / g, h * g + r % g, d)) * mean;
          }
          row[j] = dot * scale;
          m = std::max(m, row[j]);
        }
        x.push_back(row);
      }
      std::vector<double> energy(candidates, 0.0);
      for (const auto& row : x)
        for (int32_t j = 0; j < candidates; ++j)
          if (row[j] != -INFINITY) energy[j] += std::exp(row[j] - m);
      const double e_max = *std::max_element(energy.begin(), energy.end());
      const int64_t s = int64_t(h) * ix.sizes.max_q_tiles + tile;
      const std::set<int32_t> listed(ix.idx.begin() + ix.cu[s], ix.idx.begin() + ix.cu[s + 1]);
      for (int32_t j = 0; j < candidates; ++j) {
        const double ratio = energy[j] / e_max;
        const bool diagonal = std::min(j * 64 + 64, l.kv) - 1 >= ti.pmin;
        if (diagonal || std::fabs(ratio - c.alpha) <= 1e-3 * c.alpha) continue;
        EXPECT_EQ(listed.count(j) == 1, ratio >= c.alpha)
            << "head " << h << " tile " << tile << " block " << j << " ratio " << ratio;
        ++checked;
      }
    }
  EXPECT_GT(checked, 100);
}

TEST(Index, AlphaZeroSelectsEveryCausalTile) {
  TestProblem t({{500, 900}, {64, 64}}, 8, 2, 16, FP_FLOAT32, 36);
  fp_select_config c = default_config();
  c.alpha = 0.f;
  c.sink_tokens = c.window_tokens = c.dense_recent_tiles = 0;
  IndexBuffers ix(t.contiguous(), c);
  build(ix, t.contiguous(), c);
  double density = 0;
  const fp_problem p = t.contiguous();
  ASSERT_EQ(fp_index_density(&p, &c, &ix.view, &density), FP_OK);
  EXPECT_DOUBLE_EQ(density, 1.0);
}

TEST(Index, RecentTilesRunDense) {
  const Lengths l{1000, 3000};
  TestProblem t({l}, 4, 1, 16, FP_FLOAT32, 37);
  fp_select_config c = default_config();
  c.alpha = 1.f;
  c.sink_tokens = c.window_tokens = 0;
  c.dense_recent_tiles = 2;
  IndexBuffers ix(t.contiguous(), c);
  build(ix, t.contiguous(), c);
  const int32_t tiles = ix.sizes.max_q_tiles;
  for (int32_t tile = 0; tile < tiles; ++tile) {
    const int32_t count = ix.cu[tile + 1] - ix.cu[tile];
    const int32_t causal = tile_info(l, 4, tile).pmax / 64 + 1;
    if (tile >= tiles - 2) EXPECT_EQ(count, causal) << "tile " << tile;
    else EXPECT_LT(count, causal) << "tile " << tile;
  }
}

TEST(Index, DensityFallsAsAlphaRises) {
  TestProblem t({{2048, 2048}}, 4, 1, 32, FP_BFLOAT16, 38);
  fill_structured(t, 39);
  const fp_problem p = t.contiguous();
  double previous = 2.0;
  for (float alpha : {0.f, 0.01f, 0.1f, 0.5f, 1.f}) {
    fp_select_config c = default_config();
    c.alpha = alpha;
    c.sink_tokens = c.window_tokens = 64;
    IndexBuffers ix(p, c);
    build(ix, p, c);
    double density = 0;
    ASSERT_EQ(fp_index_density(&p, &c, &ix.view, &density), FP_OK);
    EXPECT_LE(density, previous) << "alpha " << alpha;
    EXPECT_GT(density, 0.0);
    previous = density;
  }
  EXPECT_LT(previous, 0.5);
}

}  // namespace

namespace {

// Chunked prefill: means pooled for a 300-key prefix, then extended to 777 keys incrementally,
// equal a full pooling; an index built on them under FP_FLAG_MEANS_POOLED equals a fresh one.
TEST(Index, IncrementalPoolingEqualsFullPooling) {
  TestProblem full({{477, 777}}, 8, 2, 32, FP_BFLOAT16, 51);
  fill_structured(full, 52);
  fp_select_config c = default_config();
  const fp_problem p = full.contiguous();
  IndexBuffers fresh(p, c);
  build(fresh, p, c);

  fp_problem prefix = p;  // the first chunk: keys [0, 300), its last 100 queries
  const int32_t cu_q[2] = {0, 100}, cu_k[2] = {0, 300};
  prefix.q = static_cast<const unsigned char*>(p.q) + size_t(200) * 8 * 32 * 2;
  prefix.total_q = prefix.max_seqlen_q = 100;
  prefix.cu_seqlens_q = cu_q;
  prefix.total_k = 300;
  prefix.cu_seqlens_k = cu_k;
  std::vector<float> k_mean(fresh.k_mean.size(), NAN), v_mean(fresh.v_mean.size(), NAN);
  ASSERT_EQ(fp_pool_kv(&prefix, &c, k_mean.data(), v_mean.data(), nullptr), FP_OK)
      << fp_last_error_message();
  const int32_t pooled[1] = {300};
  ASSERT_EQ(fp_pool_kv(&p, &c, k_mean.data(), v_mean.data(), pooled), FP_OK);
  const size_t used = size_t(2) * 7 * 32;  // 2 heads x ceil(777 / 128) blocks x D
  for (size_t h = 0; h < 2; ++h)
    for (size_t i = 0; i < used / 2; ++i) {
      const size_t at = h * fresh.sizes.max_blocks * 32 + i;
      ASSERT_EQ(k_mean[at], fresh.k_mean[at]) << at;
      ASSERT_EQ(v_mean[at], fresh.v_mean[at]) << at;
    }

  IndexBuffers reused(p, c);
  reused.k_mean = k_mean;
  reused.v_mean = v_mean;
  reused.view.k_mean = reused.k_mean.data();
  reused.view.v_mean = reused.v_mean.data();
  fp_problem flagged = p;
  flagged.flags |= FP_FLAG_MEANS_POOLED;
  build(reused, flagged, c);
  EXPECT_EQ(reused.cu, fresh.cu);
  EXPECT_EQ(std::vector<int32_t>(reused.idx.begin(), reused.idx.begin() + reused.cu.back()),
            std::vector<int32_t>(fresh.idx.begin(), fresh.idx.begin() + fresh.cu.back()));

  const int32_t too_many[1] = {778};
  EXPECT_EQ(fp_pool_kv(&p, &c, k_mean.data(), v_mean.data(), too_many), FP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fp_last_error_message()).find("pooled_keys"), std::string::npos);
  EXPECT_EQ(fp_pool_kv(&p, &c, nullptr, v_mean.data(), nullptr), FP_ERROR_INVALID_ARGUMENT);
}

}  // namespace
