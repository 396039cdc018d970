// Division by a divisor fixed at launch, without the division instruction sequence: the host
// precomputes a magic multiplier once and the kernels divide with one high multiply, an add and
// a shift (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994,
// Fig. 4.1). Exact for every dividend n in [0, 2^31) and divisor d in [1, 2^31).
#pragma once

#include <cstdint>

#include "core/geometry.hpp"

namespace flashprefill {

struct FastDivmod {
  int32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 * (2^shift - d) / d) + 1
  uint32_t shift = 0;       // ceil(log2(d))

  FastDivmod() = default;
  explicit FastDivmod(int32_t d) : divisor(d) {
    while ((int64_t(1) << shift) < d) ++shift;
    multiplier =
        uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1);
  }

  FP_HD int32_t div(int32_t n) const {
    const uint32_t u = uint32_t(n);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(u, multiplier);
#else
    const uint32_t hi = uint32_t((uint64_t(u) * multiplier) >> 32);
#endif
    return int32_t((hi + u) >> shift);  // hi <= u < 2^31: the sum does not wrap
  }
  FP_HD int32_t mod(int32_t n) const { return n - div(n) * divisor; }
  FP_HD void divmod(int32_t n, int32_t& quotient, int32_t& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

}  // namespace flashprefill
