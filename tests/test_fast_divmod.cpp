// FastDivmod (the CUDA kernels' division by a launch-time divisor) against plain division, on
// the divisors and dividends the kernels see and on the edges of its documented range.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/fast_divmod.hpp"

namespace {

using flashprefill::FastDivmod;

void expect_exact(int32_t d, int32_t n) {
  const FastDivmod f(d);
  int32_t q = -1, r = -1;
  f.divmod(n, q, r);
  ASSERT_EQ(q, n / d) << "n = " << n << ", d = " << d;
  ASSERT_EQ(r, n % d) << "n = " << n << ", d = " << d;
  ASSERT_EQ(f.div(n), n / d);
  ASSERT_EQ(f.mod(n), n % d);
}

TEST(FastDivmod, SmallDivisorsEveryDividendNearMultiples) {
  for (int32_t d = 1; d <= 1024; ++d)
    for (int32_t k : {0, 1, 2, 3, 1000, 65535, (INT32_MAX - d) / d})
      for (int32_t delta : {-1, 0, 1, d - 1})
        if (int64_t n = int64_t(k) * d + delta; n >= 0 && n <= INT32_MAX)
          expect_exact(d, int32_t(n));
}

TEST(FastDivmod, DenseRangeForKernelDivisors) {
  // Group sizes, block sizes and head counts the index stage divides by.
  for (int32_t d : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 64, 100, 128, 192, 256, 320, 1024})
    for (int32_t n = 0; n < (1 << 16); ++n) expect_exact(d, n);
}

TEST(FastDivmod, LargeDivisorsAndDividends) {
  std::mt19937 rng(7);
  std::vector<int32_t> divisors = {INT32_MAX, INT32_MAX - 1, 1 << 30, (1 << 30) + 1,
                                   (1 << 30) - 1, 46341, 65537, 1000003};
  for (int s = 1; s < 31; ++s) {
    divisors.push_back(1 << s);
    divisors.push_back((1 << s) + 1);
    divisors.push_back((1 << s) - 1);
  }
  std::uniform_int_distribution<int32_t> any(0, INT32_MAX);
  for (int32_t d : divisors) {
    if (d < 1) continue;
    expect_exact(d, 0);
    expect_exact(d, INT32_MAX);
    expect_exact(d, d - 1);
    expect_exact(d, d);
    for (int i = 0; i < 2000; ++i) expect_exact(d, any(rng));
  }
}

}  // namespace

// SeqGeometry's packed-row arithmetic (Eq. 13) takes a 32-bit division below 2^31 and a 64-bit
// one above; both must give the same query index, head and position as plain 64-bit division.
TEST(SeqGeometry, RowDivisionAgreesOnBothSidesOf32Bits) {
  for (int32_t g : {1, 2, 3, 4, 5, 7, 8, 16}) {
    flashprefill::SeqGeometry seq;
    seq.group = g;
    seq.len_q = INT32_MAX - 5;  // positions r / g + 5, the last one INT32_MAX - 1
    seq.len_kv = INT32_MAX;
    for (int64_t r : {int64_t(0), int64_t(1), int64_t(g) * 1000 + g - 1, int64_t(INT32_MAX) - 1,
                      int64_t(INT32_MAX), int64_t(INT32_MAX) + 1, int64_t(g) * INT32_MAX / 2 - 1,
                      int64_t(g) * seq.len_q - 1}) {
      if (r >= int64_t(g) * seq.len_q) continue;  // not a row of the request (g = 1)
      EXPECT_EQ(seq.query_index(r), int32_t(r / g)) << "g " << g << " r " << r;
      EXPECT_EQ(seq.head_in_group(r), int32_t(r % g)) << "g " << g << " r " << r;
      EXPECT_EQ(seq.position(r), seq.offset() + int32_t(r / g)) << "g " << g << " r " << r;
    }
  }
}
