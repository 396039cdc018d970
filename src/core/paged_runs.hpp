// Rows and runs of a paged KV cache (Eq. 22): a key's row in the page pool, and where 128
// consecutive keys of a request also lie back to back in the pool, so that one TMA box of the
// pair maps reads them. Shared by the CUDA kernels' TMA paths (cuda/attention/paged_kv.hpp), the
// run table's pre-pass (cuda/attention/schedule_prep.cu) and the CPU tests.
#pragma once

#include <cstdint>

#include "core/fast_divmod.hpp"
#include "core/geometry.hpp"

namespace flashprefill {

inline constexpr int32_t kPairKeys = 2 * kKvTile;  // keys per pair of tiles

// The pool row of a request's key `key` (Eq. 22): its page's first row plus its offset in the
// page. pages is the request's page-table row; rows fit in 32 bits where the caller reads the
// pool as one TMA tensor.
FP_HD int32_t pool_row(const int32_t* pages, int32_t page_size, int32_t key) {
  const int32_t slot = key / page_size;
  return pages[slot] * page_size + (key - slot * page_size);
}

// The same, with page_size as a launch-time divisor (the kernels: a high multiply, an add and a
// shift instead of a division's instruction sequence).
FP_HD int32_t pool_row(const int32_t* pages, const FastDivmod& page_size, int32_t key) {
  int32_t slot, offset;
  page_size.divmod(key, slot, offset);
  return pages[slot] * page_size.divisor + offset;
}

// The pool row (page * page_size + offset in the page) of key key0 when keys [key0, key0 + 128)
// all lie in a request of len keys and each lies one row after the one before, else -1. pages is
// the request's page-table row; the check touches one entry per page the keys span.
FP_HD int32_t pair_run_row(const int32_t* pages, int32_t page_size, int32_t key0, int32_t len) {
  if (key0 < 0 || key0 + kPairKeys > len) return -1;
  const int32_t row0 = pool_row(pages, page_size, key0);
  for (int32_t slot = key0 / page_size + 1; slot * page_size < key0 + kPairKeys; ++slot)
    if (pages[slot] * page_size != row0 + (slot * page_size - key0)) return -1;
  return row0;
}

}  // namespace flashprefill
