// Stage 1a: block means of K and V (Eq. 5).
#include <vector>

#include "reference/fp8.hpp"
#include "reference/numerics.hpp"
#include "reference/reference.hpp"

namespace flashprefill::ref {

QueryTile load_query_tile(const ProblemInfo& info, int32_t b, int32_t h, int32_t tile) {
  const fp_problem& p = *info.p;
  const SeqGeometry seq = info.seq(b);
  const int64_t r0 = seq.tile_row_begin(tile), r1 = seq.tile_row_end(tile);
  QueryTile t;
  t.rows = int32_t(r1 - r0);
  t.q.resize(size_t(t.rows) * p.head_dim);
  t.position.resize(t.rows);
  for (int32_t i = 0; i < t.rows; ++i) {
    const int64_t r = r0 + i;  // Eq. 13
    const int64_t token = info.cu_q[b] + seq.query_index(r);
    const int64_t head = int64_t(h) * info.group + seq.head_in_group(r);
    const int64_t base = token * p.q_stride_token + head * p.q_stride_head;
    for (int32_t d = 0; d < p.head_dim; ++d) t.q[size_t(i) * p.head_dim + d] = q_operand(info, b, h, base + d);
    t.position[i] = seq.position(r);
  }
  return t;
}

void pool(const ProblemInfo& info, const fp_select_config& config, float* k_mean, float* v_mean,
          const int32_t* pooled_keys) {
  const fp_problem& p = *info.p;
  const int32_t D = p.head_dim;
  const int32_t max_blocks = int32_t(ceil_div(p.max_seqlen_k, config.block_size));
  parallel_for(int64_t(p.batch_size) * p.num_heads_kv, [&](int64_t bh) {
    const int32_t b = int32_t(bh / p.num_heads_kv), h = int32_t(bh % p.num_heads_kv);
    const BlockGeometry blocks{config.block_size, info.len_kv[b]};
    for (int value = 0; value < 2; ++value) {
      float* means = value ? v_mean : k_mean;
      if (means == nullptr) continue;
      const void* data = value ? p.v : p.k;
      const int64_t head_off = int64_t(h) * (value ? p.v_stride_head : p.k_stride_head);
      const KvAddress addr = info.kv_address(b, value);
      const float c = kv_descale(info, b, h, value);  // FP8: means of the dequantized K/V
      std::vector<float> sum(D);
      const int32_t first = pooled_keys ? pooled_keys[b] / config.block_size : 0;
      for (int32_t j = first; j < blocks.num_blocks(); ++j) {
        std::fill(sum.begin(), sum.end(), 0.f);
        for (int32_t key = blocks.begin(j); key < blocks.end(j); ++key) {
          const int64_t base = addr.offset(key) + head_off;
          for (int32_t d = 0; d < D; ++d) sum[d] += c * load(data, base + d, info.fp8.kv_dtype);
        }
        float* out = means + (size_t(bh) * max_blocks + j) * D;
        const float count = float(blocks.count(j));
        for (int32_t d = 0; d < D; ++d) out[d] = sum[d] / count;
      }
    }
  });
}

}  // namespace flashprefill::ref
