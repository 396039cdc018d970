// Runs of a paged KV cache (core/paged_runs.hpp): pair_run_row finds where 128 keys of a request
// lie back to back in the pool, checking one page-table entry per page, and must agree with a
// key-by-key check for every page size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/paged_runs.hpp"

namespace {

using flashprefill::kPairKeys;
using flashprefill::pair_run_row;

// The key-by-key definition: every key's pool row is the first key's plus its distance.
int32_t naive_run_row(const std::vector<int32_t>& pages, int32_t ps, int32_t key0, int32_t len) {
  if (key0 + kPairKeys > len) return -1;
  auto row = [&](int32_t key) { return pages[size_t(key / ps)] * ps + key % ps; };
  for (int32_t k = key0; k < key0 + kPairKeys; ++k)
    if (row(k) != row(key0) + (k - key0)) return -1;
  return row(key0);
}

TEST(PairRunRow, PagesInOrderAreOneRunAtEveryPageSize) {
  for (const int32_t ps : {1, 8, 16, 100, 128, 256}) {
    const int32_t len = 1000;
    std::vector<int32_t> pages(size_t((len + ps - 1) / ps));
    std::iota(pages.begin(), pages.end(), 0);
    for (int32_t key0 = 0; key0 + kPairKeys <= len; key0 += kPairKeys)
      EXPECT_EQ(pair_run_row(pages.data(), ps, key0, len), key0) << "page size " << ps;
    // 1000 = 7 * 128 + 104: the last pair is partial.
    EXPECT_EQ(pair_run_row(pages.data(), ps, 7 * kPairKeys, len), -1) << "page size " << ps;
  }
}

TEST(PairRunRow, InsideOnePageAnyPageIdAndAcrossConsecutivePagesOnly) {
  const std::vector<int32_t> big = {9, 3};  // pages of 256 keys
  EXPECT_EQ(pair_run_row(big.data(), 256, 0, 512), 9 * 256);
  EXPECT_EQ(pair_run_row(big.data(), 256, 128, 512), 9 * 256 + 128);
  EXPECT_EQ(pair_run_row(big.data(), 256, 256, 512), 3 * 256);
  const std::vector<int32_t> consecutive = {5, 6}, apart = {5, 7}, backwards = {6, 5};
  EXPECT_EQ(pair_run_row(consecutive.data(), 64, 0, 128), 5 * 64);
  EXPECT_EQ(pair_run_row(apart.data(), 64, 0, 128), -1);
  EXPECT_EQ(pair_run_row(backwards.data(), 64, 0, 128), -1);
}

TEST(PairRunRow, OneMisplacedPageBreaksOnlyThePairsItTouches) {
  const int32_t ps = 16, len = 4 * kPairKeys;
  std::vector<int32_t> pages(size_t(len / ps));
  std::iota(pages.begin(), pages.end(), 100);
  std::swap(pages[9], pages[20]);  // pages 9 (pair 1) and 20 (pair 2)
  EXPECT_EQ(pair_run_row(pages.data(), ps, 0, len), 100 * ps);
  EXPECT_EQ(pair_run_row(pages.data(), ps, kPairKeys, len), -1);
  EXPECT_EQ(pair_run_row(pages.data(), ps, 2 * kPairKeys, len), -1);
  EXPECT_EQ(pair_run_row(pages.data(), ps, 3 * kPairKeys, len), 100 * ps + 3 * kPairKeys);
}

TEST(PairRunRow, AgreesWithTheKeyByKeyCheck) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 3000; ++trial) {
    const int32_t ps = 1 + int32_t(rng() % 300);
    const int32_t len = 1 + int32_t(rng() % 2000);
    const int32_t n = (len + ps - 1) / ps;
    std::vector<int32_t> pages(static_cast<size_t>(n));
    std::iota(pages.begin(), pages.end(), int32_t(rng() % 50));
    // Break the order now and then: about one swap per 256 keys, at least a few.
    const int swaps = int(rng() % (2 + len / 256));
    for (int s = 0; s < swaps; ++s) std::swap(pages[rng() % n], pages[rng() % n]);
    for (int32_t key0 = 0; key0 < len; key0 += kPairKeys)
      ASSERT_EQ(pair_run_row(pages.data(), ps, key0, len), naive_run_row(pages, ps, key0, len))
          << "page size " << ps << ", length " << len << ", key " << key0;
  }
}

// The kernels' pool_row divides by a FastDivmod: the same row as the plain division for every
// key, at page sizes up to 1 << 20 and keys up to the int32 limit.
TEST(PoolRow, FastDivisorAgreesWithDivision) {
  std::mt19937 rng(22);
  for (int trial = 0; trial < 2000; ++trial) {
    const int32_t ps = trial < 300 ? 1 + trial : 1 + int32_t(rng() % (1 << 20));
    const flashprefill::FastDivmod div(ps);
    const int32_t max_key = int32_t(rng() % 2 ? rng() % 100000 : rng() % 0x7fffffffu);
    const int32_t n = max_key / ps + 1;
    if (n > (1 << 16)) continue;  // keep the page table small
    std::vector<int32_t> pages(static_cast<size_t>(n));
    for (auto& page : pages) page = int32_t(rng() % 1000);
    for (int k = 0; k < 64; ++k) {
      const int32_t key = k == 0 ? max_key : int32_t(rng() % (uint32_t(max_key) + 1));
      ASSERT_EQ(flashprefill::pool_row(pages.data(), div, key),
                flashprefill::pool_row(pages.data(), ps, key))
          << "page size " << ps << ", key " << key;
    }
  }
}

}  // namespace
