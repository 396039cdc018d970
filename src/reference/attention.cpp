// Stage 2: sparse attention over the CSR (Eq. 4) with the fused mean correction (Eq. 6), and the
// exact dense attention it is measured against.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "reference/fp8.hpp"
#include "reference/numerics.hpp"
#include "reference/reference.hpp"

namespace flashprefill::ref {
namespace {

// Keys the rows of a query tile attend to, widened to float32: exact keys in ascending position,
// then one surrogate per corrected block (Eq. 6) with its log|B_J| logit shift.
struct KeySet {
  int32_t exact = 0;
  std::vector<float> k, v;         // [exact + surrogates, D]
  std::vector<int32_t> position;   // [exact]
  std::vector<float> logit_shift;  // [surrogates]
  std::vector<int32_t> block;      // [surrogates]
};

void append_key(const ProblemInfo& info, int32_t b, int32_t h, int32_t key, KeySet& keys) {
  const fp_problem& p = *info.p;
  for (int value = 0; value < 2; ++value) {
    const KvAddress addr = info.kv_address(b, value);
    const int64_t base =
        addr.offset(key) + int64_t(h) * (value ? p.v_stride_head : p.k_stride_head);
    std::vector<float>& dst = value ? keys.v : keys.k;
    for (int32_t d = 0; d < p.head_dim; ++d)
      dst.push_back(load(value ? p.v : p.k, base + d, info.fp8.kv_dtype));
  }
  keys.position.push_back(key);
  ++keys.exact;
}

KeySet gather_tiles(const ProblemInfo& info, int32_t b, int32_t h, const int32_t* tiles,
                    int32_t count) {
  KeySet keys;
  const int32_t len_kv = info.len_kv[b];
  for (int32_t i = 0; i < count; ++i)
    for (int32_t key = tiles[i] * kKvTile; key < std::min((tiles[i] + 1) * kKvTile, len_kv); ++key)
      append_key(info, b, h, key, keys);
  return keys;
}

// Eq. 6: blocks fully visible to the whole tile with none of their tiles listed.
void append_surrogates(const ProblemInfo& info, const fp_select_config& config,
                       const fp_index& index, int32_t b, int32_t h, int32_t pmin,
                       const int32_t* tiles, int32_t count, KeySet& keys) {
  const fp_problem& p = *info.p;
  const BlockGeometry blocks{config.block_size, info.len_kv[b]};
  std::vector<char> listed(blocks.num_blocks(), 0);
  for (int32_t i = 0; i < count; ++i) listed[blocks.block_of_tile(tiles[i])] = 1;
  const int32_t max_blocks = int32_t(ceil_div(p.max_seqlen_k, config.block_size));
  const size_t head_base = (size_t(b) * p.num_heads_kv + h) * max_blocks;
  for (int32_t j = 0; j < blocks.num_blocks() && fully_visible(blocks, j, pmin); ++j) {
    if (listed[j]) continue;
    for (int value = 0; value < 2; ++value) {
      const float* mean = (value ? index.v_mean : index.k_mean) + (head_base + j) * p.head_dim;
      std::vector<float>& dst = value ? keys.v : keys.k;
      for (int32_t d = 0; d < p.head_dim; ++d) dst.push_back(mean_operand(info, b, h, value, mean[d]));
    }
    keys.logit_shift.push_back(std::log(float(blocks.count(j))));
    keys.block.push_back(j);
  }
}

// softmax(q K^T * scale) V for one row over the keys it may see, accumulated in Acc.
template <typename Acc>
void attend_row(const float* q, int32_t position, const KeySet& keys, int32_t D, float scale,
                std::vector<Acc>& score, std::vector<Acc>& acc, Acc& lse) {
  const int32_t visible =
      int32_t(std::upper_bound(keys.position.begin(), keys.position.end(), position) -
              keys.position.begin());
  const int32_t surrogates = int32_t(keys.logit_shift.size());
  score.clear();
  Acc m = -INFINITY;
  auto logit = [&](int32_t key) -> Acc {
    if constexpr (sizeof(Acc) == 8) return dot_f64(q, &keys.k[size_t(key) * D], D) * Acc(scale);
    else return dot(q, &keys.k[size_t(key) * D], D) * scale;
  };
  for (int32_t j = 0; j < visible; ++j) score.push_back(logit(j));
  for (int32_t s = 0; s < surrogates; ++s)
    score.push_back(logit(keys.exact + s) + Acc(keys.logit_shift[s]));  // Eq. 6
  for (Acc s : score) m = std::max(m, s);
  std::fill(acc.begin(), acc.end(), Acc(0));
  if (score.empty()) {
    lse = -INFINITY;
    return;
  }
  Acc sum = 0;
  for (size_t i = 0; i < score.size(); ++i) {
    const int32_t key = i < size_t(visible) ? int32_t(i) : keys.exact + int32_t(i - visible);
    const Acc w = std::exp(score[i] - m);
    sum += w;
    axpy(w, &keys.v[size_t(key) * D], acc.data(), D);
  }
  for (int32_t d = 0; d < D; ++d) acc[d] /= sum;
  lse = m + std::log(sum);
}

template <typename Acc>
void attend_tile(const ProblemInfo& info, const fp_output& output, int32_t b, int32_t h,
                 int32_t tile, const QueryTile& qt, const KeySet& keys) {
  const fp_problem& p = *info.p;
  const SeqGeometry seq = info.seq(b);
  const int32_t D = p.head_dim;
  std::vector<Acc> score, acc(D);
  for (int32_t i = 0; i < qt.rows; ++i) {
    Acc lse;
    attend_row<Acc>(&qt.q[size_t(i) * D], qt.position[i], keys, D, info.scale, score, acc, lse);
    const int64_t r = seq.tile_row_begin(tile) + i;
    const int64_t token = info.cu_q[b] + seq.query_index(r);
    const int64_t head = int64_t(h) * info.group + seq.head_in_group(r);
    const int64_t base = token * output.out_stride_token + head * output.out_stride_head;
    for (int32_t d = 0; d < D; ++d) store(output.out, base + d, p.dtype, float(acc[d]));
    if (output.lse) output.lse[head * p.total_q + token] = float(lse);
  }
}

// FP8 problems: Eq. 15 over the gathered keys (fp8.cpp).
void attend_e4m3(const ProblemInfo& info, const fp_output& output, int32_t b, int32_t h,
                 int32_t tile, const KeySet& keys) {
  const E4m3Keys view{keys.k.data(), keys.v.data(), keys.position.data(), keys.exact,
                      keys.logit_shift.data(), keys.block.data(), int32_t(keys.block.size())};
  attend_tile_e4m3(info, output, b, h, tile, load_query_tile(info, b, h, tile), view);
}

template <typename Fn>
void for_each_tile(const ProblemInfo& info, Fn&& fn) {
  const fp_problem& p = *info.p;
  parallel_for(int64_t(p.batch_size) * p.num_heads_kv * info.max_q_tiles, [&](int64_t s) {
    const int32_t tile = int32_t(s % info.max_q_tiles);
    const int64_t bh = s / info.max_q_tiles;
    const int32_t b = int32_t(bh / p.num_heads_kv), h = int32_t(bh % p.num_heads_kv);
    if (tile < info.seq(b).num_q_tiles()) fn(s, b, h, tile);
  });
}

}  // namespace

void sparse_attention(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, const fp_output& output) {
  for_each_tile(info, [&](int64_t s, int32_t b, int32_t h, int32_t tile) {
    const int32_t* tiles = index.idx + index.cu[s];
    const int32_t count = index.cu[s + 1] - index.cu[s];
    KeySet keys = gather_tiles(info, b, h, tiles, count);
    if (config.mean_correction)
      append_surrogates(info, config, index, b, h, info.seq(b).pmin(tile), tiles, count, keys);
    if (info.fp8.on) return attend_e4m3(info, output, b, h, tile, keys);
    attend_tile<float>(info, output, b, h, tile, load_query_tile(info, b, h, tile), keys);
  });
}

void dense_attention(const ProblemInfo& info, const fp_output& output) {
  for_each_tile(info, [&](int64_t, int32_t b, int32_t h, int32_t tile) {
    std::vector<int32_t> tiles(info.seq(b).causal_tiles(tile));
    std::iota(tiles.begin(), tiles.end(), 0);
    const KeySet keys = gather_tiles(info, b, h, tiles.data(), int32_t(tiles.size()));
    if (info.fp8.on) return attend_e4m3(info, output, b, h, tile, keys);  // float32, as sparse
    attend_tile<double>(info, output, b, h, tile, load_query_tile(info, b, h, tile), keys);
  });
}

}  // namespace flashprefill::ref
