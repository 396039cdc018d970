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

int64_t num_segments(const ProblemInfo& info) {
  return int64_t(info.p->batch_size) * info.p->num_heads_kv * info.max_q_tiles;
}

int32_t max_selected(const ProblemInfo& info, int64_t s) {
  const Segment seg = segment_of(info, s);
  const SeqGeometry seq = info.seq(seg.b);
  return seg.tile < seq.num_q_tiles() ? seq.causal_tiles(seg.tile) : 0;
}

void score_and_select(const ProblemInfo& info, const fp_select_config& config,
                      const fp_index& index, int64_t s0, int64_t s1) {
  if (s1 < 0) s1 = num_segments(info);
  const int32_t max_blocks = int32_t(ceil_div(info.p->max_seqlen_k, config.block_size));
  std::vector<std::vector<int32_t>> lists(s1 - s0);
  parallel_for(s1 - s0, [&](int64_t i) {
    const Segment seg = segment_of(info, s0 + i);
    if (seg.tile < info.seq(seg.b).num_q_tiles())
      lists[i] = select_tiles(info, config, index.k_mean, max_blocks, seg);
  });
  index.cu[0] = 0;
  for (int64_t i = 0; i < s1 - s0; ++i) {
    index.cu[i + 1] = index.cu[i] + int32_t(lists[i].size());
    std::copy(lists[i].begin(), lists[i].end(), index.idx + index.cu[i]);
  }
}

namespace {

std::string segment_name(const Segment& seg, int64_t s) {
  return "index segment " + std::to_string(s) + " (request " + std::to_string(seg.b) +
         ", kv head " + std::to_string(seg.h) + ", query tile " + std::to_string(seg.tile) + ")";
}

}  // namespace

fp_status validate_index_offsets(const ProblemInfo& info, const int32_t* cu, int64_t idx_capacity) {
  const int64_t segments = num_segments(info);
  if (cu[0] != 0) return fail(FP_ERROR_INVALID_ARGUMENT, "index->cu[0] must be 0");
  for (int64_t s = 0; s < segments; ++s) {
    const int32_t begin = cu[s], end = cu[s + 1];
    if (end < begin)
      return fail(FP_ERROR_INVALID_ARGUMENT,
                  "index->cu decreases at " + segment_name(segment_of(info, s), s));
    if (end > idx_capacity)
      return fail(FP_ERROR_INVALID_ARGUMENT,
                  "index->cu[" + std::to_string(s + 1) + "] = " + std::to_string(end) +
                      " lists tiles past idx_capacity = " + std::to_string(idx_capacity));
    if (end != begin && max_selected(info, s) == 0)
      return fail(FP_ERROR_INVALID_ARGUMENT, segment_name(segment_of(info, s), s) +
                                                 " lies past the request's queries but lists tiles");
  }
  return FP_OK;
}

fp_status validate_index_tiles(const ProblemInfo& info, const int32_t* cu, const int32_t* idx) {
  const int64_t segments = num_segments(info);
  for (int64_t s = 0; s < segments; ++s) {
    const int32_t begin = cu[s], end = cu[s + 1];
    if (begin == end) continue;
    const int32_t causal = max_selected(info, s);
    for (int32_t i = begin; i < end; ++i) {
      const int32_t t = idx[i];
      if (t < 0 || t >= causal)
        return fail(FP_ERROR_INVALID_ARGUMENT,
                    segment_name(segment_of(info, s), s) + " lists tile " + std::to_string(t) +
                        " outside its causal range [0, " + std::to_string(causal) + ")");
      if (i > begin && t <= idx[i - 1])
        return fail(FP_ERROR_INVALID_ARGUMENT,
                    segment_name(segment_of(info, s), s) + " is not strictly ascending");
    }
  }
  return FP_OK;
}

double index_density(const ProblemInfo& info, const fp_index& index) {
  const int64_t segments = num_segments(info);
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
