// Stage 1b-c: fused block scoring (Eq. 19), max-based thresholding with forced blocks (Eq. 20),
// and the CSR of selected 64-token tiles.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "reference/fp8.hpp"
#include "reference/numerics.hpp"
#include "reference/reference.hpp"

namespace flashprefill::ref {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct Segment {
  int32_t b, h, tile;
};

Segment segment_of(const ProblemInfo& info, int64_t s) {
  const int32_t tile = int32_t(s % info.max_q_tiles);
  const int64_t bh = s / info.max_q_tiles;
  return {int32_t(bh / info.p->num_heads_kv), int32_t(bh % info.p->num_heads_kv), tile};
}

// Pooled keys of (b, h) as scoring consumes them (the rho rule; e4m3 for FP8), [num_blocks, D].
std::vector<float> rounded_means(const ProblemInfo& info, const float* means, int32_t max_blocks,
                                 int32_t b, int32_t h, int32_t num_blocks) {
  const fp_problem& p = *info.p;
  const float* src = means + (size_t(b) * p.num_heads_kv + h) * max_blocks * p.head_dim;
  std::vector<float> out(size_t(num_blocks) * p.head_dim);
  for (size_t i = 0; i < out.size(); ++i) out[i] = mean_operand(info, b, h, false, src[i]);
  return out;
}

// The selected tiles of one query tile, ascending.
std::vector<int32_t> select_tiles(const ProblemInfo& info, const fp_select_config& config,
                                  const float* k_mean, int32_t max_blocks, const Segment& seg) {
  const fp_problem& p = *info.p;
  const SeqGeometry seq = info.seq(seg.b);
  const BlockGeometry blocks{config.block_size, seq.len_kv};
  const SelectRules rules{config.sink_tokens, config.window_tokens, config.dense_recent_tiles};
  const QueryTile qt = load_query_tile(info, seg.b, seg.h, seg.tile);
  const int32_t pmin = seq.pmin(seg.tile), pmax = seq.pmax(seg.tile);
  const int32_t candidates = blocks.num_candidates(pmax);
  const std::vector<float> kbar = rounded_means(info, k_mean, max_blocks, seg.b, seg.h, candidates);

  // Eq. 19: x_rJ in log2 units over valid pairs (J starts at or before the row's position).
  const float x_scale = info.scale * logit_descale(info, seg.b, seg.h) * kLog2e;
  std::vector<float> x(size_t(qt.rows) * candidates, -INFINITY);
  float m = -INFINITY;
  for (int32_t r = 0; r < qt.rows; ++r)
    for (int32_t j = 0; j < candidates && blocks.begin(j) <= qt.position[r]; ++j) {
      const float v = dot(&qt.q[size_t(r) * p.head_dim], &kbar[size_t(j) * p.head_dim],
                          p.head_dim) * x_scale;
      x[size_t(r) * candidates + j] = v;
      m = std::max(m, v);
    }
  std::vector<float> energy(candidates, 0.f);
  for (int32_t r = 0; r < qt.rows; ++r)
    for (int32_t j = 0; j < candidates; ++j) {
      const float v = x[size_t(r) * candidates + j];
      if (v != -INFINITY) energy[j] += std::exp2(v - m);
    }
  const float e_max = *std::max_element(energy.begin(), energy.end());
  const float threshold = config.alpha * e_max;  // Eq. 20

  std::vector<int32_t> tiles;
  const int32_t causal_tiles = seq.causal_tiles(seg.tile);
  for (int32_t j = 0; j < candidates; ++j) {
    if (!(energy[j] >= threshold ||
          rules.forced(blocks, j, pmin, seg.tile, seq.num_q_tiles())))
      continue;
    const int32_t end = std::min(blocks.end_tile(j), causal_tiles);
    for (int32_t t = blocks.first_tile(j); t < end; ++t) tiles.push_back(t);
  }
  return tiles;
}

}  // namespace

void score_and_select(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index) {
  const fp_problem& p = *info.p;
  const int64_t segments = int64_t(p.batch_size) * p.num_heads_kv * info.max_q_tiles;
  const int32_t max_blocks = int32_t(ceil_div(p.max_seqlen_k, config.block_size));
  std::vector<std::vector<int32_t>> lists(segments);
  parallel_for(segments, [&](int64_t s) {
    const Segment seg = segment_of(info, s);
    if (seg.tile < info.seq(seg.b).num_q_tiles())
      lists[s] = select_tiles(info, config, index.k_mean, max_blocks, seg);
  });
  index.cu[0] = 0;
  for (int64_t s = 0; s < segments; ++s) {
    index.cu[s + 1] = index.cu[s] + int32_t(lists[s].size());
    std::copy(lists[s].begin(), lists[s].end(), index.idx + index.cu[s]);
  }
}

fp_status validate_index(const ProblemInfo& info, const fp_index& index) {
  const fp_problem& p = *info.p;
  const int64_t segments = int64_t(p.batch_size) * p.num_heads_kv * info.max_q_tiles;
  if (index.cu[0] != 0) return fail(FP_ERROR_INVALID_ARGUMENT, "index->cu[0] must be 0");
  if (index.cu[segments] > index.idx_capacity)
    return fail(FP_ERROR_INVALID_ARGUMENT,
                "index lists " + std::to_string(index.cu[segments]) +
                    " tiles but idx_capacity is " + std::to_string(index.idx_capacity));
  for (int64_t s = 0; s < segments; ++s) {
    const Segment seg = segment_of(info, s);
    const SeqGeometry seq = info.seq(seg.b);
    const int32_t begin = index.cu[s], end = index.cu[s + 1];
    const std::string where = "index segment " + std::to_string(s) + " (request " +
                              std::to_string(seg.b) + ", kv head " + std::to_string(seg.h) +
                              ", query tile " + std::to_string(seg.tile) + ")";
    if (end < begin) return fail(FP_ERROR_INVALID_ARGUMENT, "index->cu decreases at " + where);
    if (seg.tile >= seq.num_q_tiles()) {
      if (end != begin)
        return fail(FP_ERROR_INVALID_ARGUMENT, where + " lies past the request's queries but lists tiles");
      continue;
    }
    const int32_t causal = seq.causal_tiles(seg.tile);
    for (int32_t i = begin; i < end; ++i) {
      const int32_t t = index.idx[i];
      if (t < 0 || t >= causal)
        return fail(FP_ERROR_INVALID_ARGUMENT, where + " lists tile " + std::to_string(t) +
                                                   " outside its causal range [0, " +
                                                   std::to_string(causal) + ")");
      if (i > begin && t <= index.idx[i - 1])
        return fail(FP_ERROR_INVALID_ARGUMENT, where + " is not strictly ascending");
    }
  }
  return FP_OK;
}

double index_density(const ProblemInfo& info, const fp_index& index) {
  const fp_problem& p = *info.p;
  const int64_t segments = int64_t(p.batch_size) * p.num_heads_kv * info.max_q_tiles;
  double selected = 0, causal = 0;
  for (int64_t s = 0; s < segments; ++s) {
    const Segment seg = segment_of(info, s);
    const SeqGeometry seq = info.seq(seg.b);
    if (seg.tile >= seq.num_q_tiles()) continue;
    causal += seq.causal_tiles(seg.tile);
    selected += index.cu[s + 1] - index.cu[s];
  }
  return causal > 0 ? selected / causal : 0.0;
}

}  // namespace flashprefill::ref
