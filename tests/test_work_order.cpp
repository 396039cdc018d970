// The CUDA attention kernel's work order (core/work_order.hpp), which its persistent scheduler
// decodes on the device: every (request, KV head, query tile, split) is numbered exactly once, in
// the documented order, whether the decoder searches from request 0, from where a CTA's previous
// (smaller) item left it, or keeps that request's tile range as the kernel does (RequestCursor).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/work_order.hpp"

namespace {

using flashprefill::decode_in_request;
using flashprefill::decode_work_item;
using flashprefill::kTileRows;
using flashprefill::range_request_tiles;
using flashprefill::request_tiles;
using flashprefill::RequestCursor;
using flashprefill::WorkCoord;

struct Batch {
  std::vector<int32_t> len_q;
  int32_t group = 1, heads_kv = 1, section = 1, lead = 0, splits = 1, max_q_tiles = 0;
};

std::vector<int32_t> prefix_of(const Batch& batch) {
  std::vector<int32_t> prefix(batch.len_q.size() + 1, 0);
  for (size_t b = 0; b < batch.len_q.size(); ++b)
    prefix[b + 1] = prefix[b] + request_tiles(batch.len_q[b], batch.group, batch.max_q_tiles);
  return prefix;
}

// The order docs/ALGORITHM.md gives, built directly.
std::vector<WorkCoord> expected_order(const Batch& batch) {
  std::vector<WorkCoord> order;
  for (int32_t b = 0; b < int32_t(batch.len_q.size()); ++b) {
    const int32_t tiles = request_tiles(batch.len_q[b], batch.group, batch.max_q_tiles);
    const int32_t rest = std::max(tiles - batch.lead, 0);
    for (int32_t tile = tiles - 1; tile >= rest; --tile)
      for (int32_t h = 0; h < batch.heads_kv; ++h)
        for (int32_t split = 0; split < batch.splits; ++split) order.push_back({b, h, tile, split});
    for (int32_t h0 = 0; h0 < batch.heads_kv; h0 += batch.section)
      for (int32_t tile = rest - 1; tile >= 0; --tile)
        for (int32_t h = h0; h < std::min(h0 + batch.section, batch.heads_kv); ++h)
          for (int32_t split = 0; split < batch.splits; ++split)
            order.push_back({b, h, tile, split});
  }
  return order;
}

void expect_order(const Batch& batch, std::mt19937& rng) {
  const std::vector<int32_t> prefix = prefix_of(batch);
  const int32_t batch_size = int32_t(batch.len_q.size());
  const std::vector<WorkCoord> want = expected_order(batch);
  ASSERT_EQ(int64_t(want.size()), int64_t(prefix.back()) * batch.heads_kv * batch.splits);
  // From request 0 every time.
  for (int32_t item = 0; item < int32_t(want.size()); ++item) {
    int32_t request = 0;
    const WorkCoord c = decode_work_item(prefix.data(), batch_size, batch.heads_kv, batch.section,
                                         batch.lead, batch.splits, item, request);
    const WorkCoord& w = want[size_t(item)];
    ASSERT_EQ(std::tie(c.b, c.h, c.tile, c.split), std::tie(w.b, w.h, w.tile, w.split))
        << "item " << item;
    ASSERT_EQ(request, c.b);
  }
  // As a CTA claims them: increasing items with random gaps, the hint carried along; every item
  // is covered by some CTA exactly once.
  const int ctas = 1 + int(rng() % 7);
  std::set<std::tuple<int32_t, int32_t, int32_t, int32_t>> seen;
  std::vector<int32_t> hint(size_t(ctas), 0);
  for (int32_t item = 0; item < int32_t(want.size()); ++item) {
    int32_t& request = hint[size_t(rng() % unsigned(ctas))];
    const WorkCoord c = decode_work_item(prefix.data(), batch_size, batch.heads_kv, batch.section,
                                         batch.lead, batch.splits, item, request);
    ASSERT_LT(c.tile, request_tiles(batch.len_q[size_t(c.b)], batch.group, batch.max_q_tiles));
    ASSERT_GE(c.tile, 0);
    ASSERT_TRUE(seen.insert({c.b, c.h, c.tile, c.split}).second) << "item " << item;
    const WorkCoord& w = want[size_t(item)];
    ASSERT_EQ(std::tie(c.b, c.h, c.tile, c.split), std::tie(w.b, w.h, w.tile, w.split));
  }
  // As the kernel's decoder does it: a RequestCursor per CTA (the last request's tile range kept,
  // searched and reloaded only past it), then decode_in_request.
  std::vector<RequestCursor> cursors(static_cast<size_t>(ctas));
  for (int32_t item = 0; item < int32_t(want.size()); ++item) {
    RequestCursor& cursor = cursors[size_t(rng() % unsigned(ctas))];
    cursor.seek(prefix.data(), batch_size, item / (batch.heads_kv * batch.splits));
    ASSERT_EQ(cursor.first, prefix[size_t(cursor.request)]);
    ASSERT_EQ(cursor.next, prefix[size_t(cursor.request) + 1]);
    const WorkCoord c =
        decode_in_request(cursor.request, cursor.first, cursor.next - cursor.first,
                          batch.heads_kv, batch.section, batch.lead, batch.splits, item);
    const WorkCoord& w = want[size_t(item)];
    ASSERT_EQ(std::tie(c.b, c.h, c.tile, c.split), std::tie(w.b, w.h, w.tile, w.split))
        << "item " << item;
  }
}

TEST(WorkOrder, RequestTilesArePackGqaTilesCappedByTheReservation) {
  EXPECT_EQ(request_tiles(0, 4, 10), 0);
  EXPECT_EQ(request_tiles(1, 4, 10), 1);
  EXPECT_EQ(request_tiles(32, 4, 10), 1);   // 128 packed rows
  EXPECT_EQ(request_tiles(33, 4, 10), 2);
  EXPECT_EQ(request_tiles(100003, 1, 1000000), (100003 + kTileRows - 1) / kTileRows);
  EXPECT_EQ(request_tiles(4096, 8, 100), 100);  // 256 tiles, capped
}

// fp_prefill's query-tile ranges on CUDA: each launch numbers the tiles
// [tile_begin, tile_begin + range_tiles) of every request (range_request_tiles in its
// tile_prefix) and the decoder adds tile_begin. Over the ranges of any width every (request, KV
// head, tile, split) runs exactly once, with the in-range segment (b Hkv + h) range_tiles +
// I - tile_begin inside the range's segments.
TEST(WorkOrder, QueryTileRangesCoverEveryItemOnce) {
  Batch batch;
  batch.len_q = {1000, 0, 17, 333, 1000};
  batch.group = 4;
  batch.heads_kv = 3;
  batch.section = 2;
  batch.lead = 3;
  batch.splits = 2;
  batch.max_q_tiles = 32;
  const int32_t batch_size = int32_t(batch.len_q.size());
  for (const int32_t width : {1, 5, 32, 40}) {
    std::set<std::tuple<int32_t, int32_t, int32_t, int32_t>> seen;
    for (int32_t begin = 0; begin < batch.max_q_tiles; begin += width) {
      const int32_t tiles = std::min(width, batch.max_q_tiles - begin);
      std::vector<int32_t> prefix(size_t(batch_size) + 1, 0);
      for (int32_t b = 0; b < batch_size; ++b)
        prefix[size_t(b) + 1] =
            prefix[size_t(b)] + range_request_tiles(batch.len_q[size_t(b)], batch.group,
                                                    batch.max_q_tiles, begin, tiles);
      const int32_t items = prefix.back() * batch.heads_kv * batch.splits;
      int32_t request = 0;
      for (int32_t item = 0; item < items; ++item) {
        const WorkCoord c = decode_work_item(prefix.data(), batch_size, batch.heads_kv,
                                             batch.section, batch.lead, batch.splits, item,
                                             request);
        const int32_t tile = begin + c.tile;
        ASSERT_GE(c.tile, 0);
        ASSERT_LT(c.tile, tiles);
        ASSERT_LT(tile, request_tiles(batch.len_q[size_t(c.b)], batch.group, batch.max_q_tiles));
        ASSERT_LT(flashprefill::segment_id(c.b, c.h, c.tile, batch.heads_kv, tiles),
                  int64_t(batch_size) * batch.heads_kv * tiles);
        ASSERT_TRUE(seen.insert({c.b, c.h, tile, c.split}).second) << width << " " << item;
      }
    }
    int64_t all = 0;
    for (const int32_t len : batch.len_q) all += request_tiles(len, batch.group, batch.max_q_tiles);
    EXPECT_EQ(int64_t(seen.size()), all * batch.heads_kv * batch.splits) << width;
  }
}

// One request of 1000 queries, g = 4, two KV heads: 32 query tiles per head.
std::vector<int32_t> one_request_prefix() {
  Batch batch;
  batch.len_q = {1000};
  batch.group = 4;
  batch.heads_kv = 2;
  batch.max_q_tiles = 32;
  return prefix_of(batch);
}

TEST(WorkOrder, SingleRequestHeaviestTileFirst) {
  const std::vector<int32_t> prefix = one_request_prefix();
  int32_t request = 0;
  const WorkCoord first = decode_work_item(prefix.data(), 1, 2, 2, 0, 1, 0, request);
  EXPECT_EQ(first.tile, 31);  // ceil(4000 / 128) = 32 tiles, the last one first
  EXPECT_EQ(first.h, 0);
  const WorkCoord second = decode_work_item(prefix.data(), 1, 2, 2, 0, 1, 1, request);
  EXPECT_EQ(second.tile, 31);
  EXPECT_EQ(second.h, 1);
}

TEST(WorkOrder, OneHeadSectionsRunEachHeadsTilesTogether) {
  const std::vector<int32_t> prefix = one_request_prefix();
  int32_t request = 0;
  for (int32_t item = 0; item < 64; ++item) {
    const WorkCoord c = decode_work_item(prefix.data(), 1, 2, 1, 0, 1, item, request);
    EXPECT_EQ(c.h, item / 32);
    EXPECT_EQ(c.tile, 31 - item % 32);
  }
}

TEST(WorkOrder, LeadTilesOfEveryHeadComeFirst) {
  const std::vector<int32_t> prefix = one_request_prefix();
  int32_t request = 0;
  // Three lead tiles: (31, h0) (31, h1) (30, h0) ... (29, h1), then head 0's tiles 28 ... 0.
  for (int32_t item = 0; item < 6; ++item) {
    const WorkCoord c = decode_work_item(prefix.data(), 1, 2, 1, 3, 1, item, request);
    EXPECT_EQ(c.tile, 31 - item / 2);
    EXPECT_EQ(c.h, item % 2);
  }
  for (int32_t item = 6; item < 64; ++item) {
    const WorkCoord c = decode_work_item(prefix.data(), 1, 2, 1, 3, 1, item, request);
    EXPECT_EQ(c.h, (item - 6) / 29);
    EXPECT_EQ(c.tile, 28 - (item - 6) % 29);
  }
  // More lead tiles than the request has: the whole request is the lead phase.
  for (int32_t item = 0; item < 64; ++item) {
    const WorkCoord c = decode_work_item(prefix.data(), 1, 2, 1, 100, 1, item, request);
    EXPECT_EQ(c.tile, 31 - item / 2);
    EXPECT_EQ(c.h, item % 2);
  }
}

TEST(WorkOrder, VarlenBatchesWithEmptyRequestsAndSplits) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    Batch batch;
    const int n = 1 + int(rng() % 9);
    for (int b = 0; b < n; ++b) {
      const unsigned kind = rng() % 4;
      batch.len_q.push_back(kind == 0 ? 0 : kind == 1 ? int32_t(1 + rng() % 40)
                                                      : int32_t(1 + rng() % 3000));
    }
    batch.group = 1 + int32_t(rng() % 8);
    batch.heads_kv = 1 + int32_t(rng() % 4);
    batch.section = 1 + int32_t(rng() % unsigned(batch.heads_kv));
    batch.lead = int32_t(rng() % 6);
    batch.splits = 1 + int32_t(rng() % 3);
    int32_t most = 0;
    for (const int32_t l : batch.len_q) most = std::max(most, request_tiles(l, batch.group, INT32_MAX));
    batch.max_q_tiles = std::max(1, most - int32_t(rng() % 2));  // sometimes one tile short
    expect_order(batch, rng);
  }
}

TEST(WorkOrder, LeadingAndTrailingEmptyRequests) {
  std::mt19937 rng(5);
  Batch batch;
  batch.len_q = {0, 0, 7, 0, 300, 0};
  batch.group = 8;
  batch.heads_kv = 3;
  batch.splits = 2;
  batch.max_q_tiles = 19;
  for (batch.section = 1; batch.section <= batch.heads_kv; ++batch.section)
    for (batch.lead = 0; batch.lead < 4; ++batch.lead) expect_order(batch, rng);
}

}  // namespace
