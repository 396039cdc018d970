// Tile <-> position arithmetic of docs/ALGORITHM.md, shared by the CPU reference and the CUDA
// kernels so that both stages compute the same ranges from the same formulas.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP_HD __host__ __device__ __forceinline__
#else
#define FP_HD inline
#endif

namespace flashprefill {

inline constexpr int kTileRows = 128;  // PackGQA rows per query tile (Eq. 12-13)
inline constexpr int kKvTile = 64;     // tokens per physical KV tile

FP_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One request's lengths as seen by one (request, KV head).
struct SeqGeometry {
  int32_t len_q = 0;   // L_q
  int32_t len_kv = 0;  // L_kv
  int32_t group = 1;   // g = Hq / Hkv

  FP_HD int32_t offset() const { return len_kv - len_q; }
  FP_HD int64_t packed_rows() const { return int64_t(group) * len_q; }
  FP_HD int32_t num_q_tiles() const { return int32_t(ceil_div(packed_rows(), kTileRows)); }
  // Eq. 13: packed row -> query index inside the request, and absolute position. Rows below 2^31
  // (every practical request) take the unsigned 32-bit division (r >= 0, g >= 1), several times
  // cheaper on the GPU than the 64-bit one.
  FP_HD int32_t query_index(int64_t r) const {
    return r <= INT32_MAX ? int32_t(uint32_t(r) / uint32_t(group)) : int32_t(r / group);
  }
  FP_HD int32_t position(int64_t r) const { return offset() + query_index(r); }
  FP_HD int32_t head_in_group(int64_t r) const {
    return r <= INT32_MAX ? int32_t(uint32_t(r) % uint32_t(group)) : int32_t(r % group);
  }
  FP_HD int64_t tile_row_begin(int32_t tile) const { return int64_t(tile) * kTileRows; }
  FP_HD int64_t tile_row_end(int32_t tile) const {
    const int64_t e = int64_t(tile + 1) * kTileRows;
    return e < packed_rows() ? e : packed_rows();
  }
  FP_HD int32_t pmin(int32_t tile) const { return position(tile_row_begin(tile)); }
  FP_HD int32_t pmax(int32_t tile) const { return position(tile_row_end(tile) - 1); }
  // Tiles t < causal_tiles(I) are reachable by the query tile.
  FP_HD int32_t causal_tiles(int32_t tile) const { return pmax(tile) / kKvTile + 1; }
  FP_HD int32_t num_kv_tiles() const { return int32_t(ceil_div(len_kv, kKvTile)); }
};

// Logical KV blocks of `block_size` tokens.
struct BlockGeometry {
  int32_t block_size = 128;
  int32_t len_kv = 0;

  FP_HD int32_t num_blocks() const { return int32_t(ceil_div(len_kv, block_size)); }
  FP_HD int32_t begin(int32_t j) const { return j * block_size; }
  FP_HD int32_t end(int32_t j) const {
    const int64_t e = int64_t(j + 1) * block_size;  // past INT32_MAX for the last of long blocks
    return e < len_kv ? int32_t(e) : len_kv;
  }
  FP_HD int32_t count(int32_t j) const { return end(j) - begin(j); }
  FP_HD int32_t first_tile(int32_t j) const { return begin(j) / kKvTile; }
  FP_HD int32_t end_tile(int32_t j) const { return int32_t(ceil_div(end(j), kKvTile)); }
  FP_HD int32_t block_of_tile(int32_t t) const { return t * kKvTile / block_size; }
  // Candidate blocks of a query tile whose last position is pmax: J <= pmax / block_size.
  FP_HD int32_t num_candidates(int32_t pmax) const { return pmax / block_size + 1; }
};

// The forced part of Eq. 20 for block j of a query tile; `tile`/`num_tiles` for the recent rule.
struct SelectRules {
  int32_t sink_tokens = 256;
  int32_t window_tokens = 512;
  int32_t dense_recent_tiles = 1;

  FP_HD bool forced(const BlockGeometry& blocks, int32_t j, int32_t pmin, int32_t tile,
                    int32_t num_tiles) const {
    if (tile >= num_tiles - dense_recent_tiles) return true;          // recent
    if (blocks.begin(j) < sink_tokens) return true;                    // sink
    const int32_t last = blocks.end(j) - 1;
    if (last >= pmin) return true;                                     // diagonal
    return int64_t(last) >= int64_t(pmin) - window_tokens;             // window
  }
};

// Mean correction applies to blocks fully visible to every row of the tile (Eq. 6).
FP_HD bool fully_visible(const BlockGeometry& blocks, int32_t j, int32_t pmin) {
  return blocks.end(j) - 1 <= pmin;
}

// Segment numbering of the CSR index.
FP_HD int64_t segment_id(int32_t b, int32_t h, int32_t tile, int32_t num_heads_kv,
                         int32_t max_q_tiles) {
  return (int64_t(b) * num_heads_kv + h) * max_q_tiles + tile;
}

// Eq. 22: the buffer row of key j of a request, contiguous (row0 + j) or paged.
struct KvAddress {
  bool paged = false;
  int64_t row0 = 0;                 // contiguous: cu_seqlens_k[b]
  const int32_t* pages = nullptr;   // paged: page_table + b * max_pages_per_seq
  int32_t page_size = 1;
  int64_t stride_page = 0, stride_token = 0;

  FP_HD int64_t offset(int32_t j) const {
    if (!paged) return (row0 + j) * stride_token;
    return int64_t(pages[j / page_size]) * stride_page + int64_t(j % page_size) * stride_token;
  }
};

}  // namespace flashprefill
