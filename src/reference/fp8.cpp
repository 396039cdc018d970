// Stage 2 in FP8 e4m3 (Eq. 15): the online softmax with e4m3 probabilities.
#include "reference/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace flashprefill::ref {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// P~ = round_e4m3(2^8 exp(S - m)) lies in [0, 256]: probabilities down to 2^-17 stay representable
// (e4m3's smallest subnormal is 2^-9). The offset cancels in O and comes out of the LSE.
constexpr float kProbabilityOffsetLog2 = 8.f;
// Blocks per correction stage (cuda/attention/mean_correction.hpp's kWindowBlocks).
constexpr int32_t kWindowBlocks = 2 * kKvTile;

struct KeyRange {
  int32_t begin, end;  // key indices into E4m3Keys
};

// The stages of the unsplit operator (cuda/attention/traversal.hpp): the exact tiles walked from
// the highest, two per stage, except that an odd count whose highest tile is even (the lower tile
// of an aligned pair) starts with that tile alone; then one stage per 128-block mean window.
std::vector<std::vector<KeyRange>> stages_of(const E4m3Keys& keys) {
  std::vector<KeyRange> tiles;
  std::vector<int32_t> tile_id;
  for (int32_t j = 0; j < keys.exact; ++j) {
    const int32_t t = keys.position[j] / kKvTile;
    if (tile_id.empty() || tile_id.back() != t) {
      tile_id.push_back(t);
      tiles.push_back({j, j});
    }
    tiles.back().end = j + 1;
  }
  std::vector<std::vector<KeyRange>> stages;
  const int32_t n = int32_t(tiles.size());
  int32_t i = 0;
  if (n % 2 == 1 && tile_id[n - 1] % 2 == 0) stages.push_back({tiles[n - 1 - i++]});
  for (; i < n; i += 2) {
    stages.push_back({tiles[n - 1 - i]});
    if (i + 1 < n) stages.back().push_back(tiles[n - 2 - i]);
  }
  for (int32_t s = 0; s < keys.surrogates; ++s) {
    const int32_t j = keys.exact + s;
    if (s == 0 || keys.block[s] / kWindowBlocks != keys.block[s - 1] / kWindowBlocks)
      stages.push_back({{j, j}});
    stages.back().back().end = j + 1;
  }
  return stages;
}

}  // namespace

void attend_tile_e4m3(const ProblemInfo& info, const fp_output& output, int32_t b, int32_t h,
                      int32_t tile, const QueryTile& qt, const E4m3Keys& keys) {
  const fp_problem& p = *info.p;
  const SeqGeometry seq = info.seq(b);
  const int32_t D = p.head_dim;
  const std::vector<std::vector<KeyRange>> stages = stages_of(keys);
  // S = c_q c_k (q~ . k~) * scale, in log2 units (Eq. 15).
  const float score_log2 = info.scale * logit_descale(info, b, h) * kLog2e;
  const float c_v = kv_descale(info, b, h, true);
  std::vector<float> acc(D), x;
  std::vector<int32_t> key;
  for (int32_t i = 0; i < qt.rows; ++i) {
    const float* q = &qt.q[size_t(i) * D];
    float m = -INFINITY, l = 0.f;  // running maximum (log2 units) and sum of P~
    std::fill(acc.begin(), acc.end(), 0.f);
    for (const std::vector<KeyRange>& stage : stages) {
      x.clear();
      key.clear();
      float stage_max = -INFINITY;
      for (const KeyRange& r : stage)
        for (int32_t j = r.begin; j < r.end; ++j) {
          if (j < keys.exact && keys.position[j] > qt.position[i]) continue;  // causal mask
          float s = dot(q, &keys.k[size_t(j) * D], D) * score_log2;
          if (j >= keys.exact) s += keys.logit_shift[j - keys.exact] * kLog2e;  // Eq. 6
          x.push_back(s);
          key.push_back(j);
          stage_max = std::max(stage_max, s);
        }
      if (x.empty()) continue;
      // The maximum skips NaN scores (fmaxf), which then make P~ and the output NaN; with no
      // finite score yet, the base is 0.
      const float m_new = std::max(m, stage_max);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float rescale = std::exp2(m - base);  // 0 while nothing has been seen
      l *= rescale;
      for (float& a : acc) a *= rescale;
      for (size_t n = 0; n < x.size(); ++n) {
        const float w = round_to_e4m3(std::exp2(x[n] - (base - kProbabilityOffsetLog2)));
        l += w;
        axpy(w, &keys.v[size_t(key[n]) * D], acc.data(), D);
      }
      m = m_new;
    }
    const int64_t r = seq.tile_row_begin(tile) + i;
    const int64_t token = info.cu_q[b] + seq.query_index(r);
    const int64_t head = int64_t(h) * info.group + seq.head_in_group(r);
    const int64_t base = token * output.out_stride_token + head * output.out_stride_head;
    const float norm = l == 0.f ? 0.f : c_v / l;  // O = c_v sum P~ V~ / sum P~
    for (int32_t d = 0; d < D; ++d) store(output.out, base + d, info.fp8.out_dtype, acc[d] * norm);
    if (output.lse)
      output.lse[head * p.total_q + token] =
          l == 0.f ? -INFINITY : (m + std::log2(l) - kProbabilityOffsetLog2) * kLn2;
  }
}

}  // namespace flashprefill::ref
