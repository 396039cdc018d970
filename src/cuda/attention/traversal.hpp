// Which KV iterations a query tile runs: the exact tiles, listed by the CSR and walked backwards
// (Eq. 17) or every causal tile in dense mode, then the mean-correction windows over the blocks
// fully visible to the tile (Eq. 6, mean_correction.hpp). A split (Eq. 18) takes an equal share
// of that sequence, and StageSequence groups it into pipeline stages.
#pragma once

#include <cstdint>

#include "core/geometry.hpp"
#include "cuda/attention/mean_correction.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"

namespace flashprefill::cuda::attention {

struct Traversal {
  int64_t csr_end = 0;        // sparse: one past the segment's last CSR entry
  int32_t num_exact = 0;      // CSR entries (sparse) or causal tiles (dense)
  int32_t causal_tiles = 0;   // T_c(I): ids at or past it are skipped, never read
  int32_t visible_blocks = 0; // blocks with end_J - 1 <= pmin(I)
  int32_t first = 0, last = 0;  // this split's iterations [first, last)

  // cu_begin and cu_end: p.cu at the item's segment and the next (ItemDecoder loads them early;
  // unused in dense mode).
  __device__ static Traversal make(const AttentionParams& p, const WorkTile& w, int64_t cu_begin,
                                   int64_t cu_end) {
    Traversal t;
    t.causal_tiles = w.seq.causal_tiles(w.tile);
    if (p.sparse) {
      const int64_t begin = clamp_csr(p, cu_begin);
      t.csr_end = clamp_csr(p, cu_end);
      t.num_exact = t.csr_end > begin ? int32_t(t.csr_end - begin) : 0;
    } else {
      t.num_exact = t.causal_tiles;
    }
    int32_t windows = 0;
    if (p.correction) {
      t.visible_blocks = count_visible_blocks(p, w);
      windows = window_count(t.visible_blocks);
    }
    const int64_t total = int64_t(t.num_exact) + windows;
    if (p.num_splits == 1) {  // no 64-bit division on the decoder's path
      t.first = 0;
      t.last = int32_t(total);
    } else {
      t.first = int32_t(total * w.split / p.num_splits);  // Eq. 18
      t.last = int32_t(total * (w.split + 1) / p.num_splits);
    }
    return t;
  }

  __device__ bool is_exact(int32_t i) const { return i < num_exact; }

  // The next reachable exact tile at or after iteration i (advancing i past it), or -1.
  __device__ int32_t next_exact(const AttentionParams& p, int32_t& i) const {
    while (i < last && is_exact(i)) {
      const int32_t t = exact_tile(p, i++);
      if (t >= 0) return t;
    }
    return -1;
  }

  // Exact iteration i: the tile id, or -1 when a foreign index lists an unreachable tile.
  __device__ int32_t exact_tile(const AttentionParams& p, int32_t i) const {
    const int32_t t = p.sparse ? p.idx[csr_end - 1 - i] : causal_tiles - 1 - i;  // Eq. 17
    return (t >= 0 && t < causal_tiles) ? t : -1;
  }

  // Correction iteration i covers blocks [first_block, first_block + kWindowBlocks).
  __device__ int32_t window_first_block(int32_t i) const {
    return (i - num_exact) * kWindowBlocks;
  }

 private:
  __device__ static int64_t clamp_csr(const AttentionParams& p, int64_t x) {
    return x < 0 ? 0 : (x > p.idx_capacity ? p.idx_capacity : x);
  }
};

enum class StageKind : int8_t { kExactTiles, kMeanWindow, kEnd };

// One pipeline stage: two exact tiles (tile1 = -1 when the stage holds only one: the first of
// an odd count that starts on an aligned pair's lower tile, else an odd count's last), or a mean
// window of kWindowBlocks blocks starting at first_block.
struct Stage {
  StageKind kind = StageKind::kEnd;
  int32_t tile0 = -1, tile1 = -1;
  int32_t first_block = 0;
};

// What the producer put into a pipeline stage, sent with it through shared memory: the stage's
// kind and tiles (or mean window), whether it is its item's last, and whether any of it was
// written by cp.async or stores (then the consumers fence before wgmma reads it); for a stage
// with cp.async rows, the parity of its buffer's kv_copied barrier to wait for. An item with no
// stage sends one of kind kEnd.
struct alignas(16) StageInfo {
  int32_t tile0 = -1, tile1 = -1, first_block = 0;
  StageKind kind = StageKind::kEnd;
  bool last = true;
  bool generic_writes = false;
  uint8_t copied_phase = 0;
};
static_assert(sizeof(StageInfo) == 16, "one 16-byte shared-memory load");

// The stages of one split, in order, as the producer walks them; each stage it fills goes to the
// consumers with its StageInfo.
struct StageSequence {
  const Traversal& trav;
  int32_t i;

  __device__ explicit StageSequence(const Traversal& t) : trav(t), i(t.first) {}

  __device__ Stage next(const AttentionParams& p) {
    Stage s;
    while (i < trav.last) {
      if (!trav.is_exact(i)) {
        s.kind = StageKind::kMeanWindow;
        s.first_block = trav.window_first_block(i++);
        return s;
      }
      // Two exact iterations at once: both index loads are in flight before either is tested
      // (the common case); an unreachable entry or the segment's end takes the path below.
      if (i + 1 < trav.last && trav.is_exact(i + 1)) {
        const int32_t a = trav.exact_tile(p, i), b = trav.exact_tile(p, i + 1);
        if (a >= 0 && b >= 0) {
          s.tile0 = a;
          s.kind = StageKind::kExactTiles;
          // An odd number of exact tiles whose first (highest) is the lower tile of an aligned
          // pair, such as a diagonal block clipped at T_c: that tile goes alone, so that the
          // stages after it hold aligned, adjacent pairs (one TMA box per operand) rather than
          // pairs that straddle two blocks.
          const int32_t exact_end = trav.last < trav.num_exact ? trav.last : trav.num_exact;
          if (i == trav.first && (a & 1) == 0 && ((exact_end - trav.first) & 1) != 0) {
            i += 1;
            return s;
          }
          s.tile1 = b;
          i += 2;
          return s;
        }
      }
      s.tile0 = trav.next_exact(p, i);
      if (s.tile0 < 0) continue;
      s.tile1 = trav.next_exact(p, i);
      s.kind = StageKind::kExactTiles;
      return s;
    }
    return s;
  }
};

}  // namespace flashprefill::cuda::attention
