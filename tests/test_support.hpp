// Host-side test problems: random or structured Q/K/V in any dtype, contiguous or paged, varlen.
#pragma once

#include <cstdint>
#include <vector>

#include "flashprefill/flashprefill.h"

namespace fptest {

struct Lengths {
  int32_t q, kv;
};

class TestProblem {
 public:
  TestProblem(std::vector<Lengths> lengths, int32_t heads_q, int32_t heads_kv, int32_t head_dim,
              fp_dtype dtype, uint64_t seed);

  // Stores the same keys in pages of `page_size`, pages shuffled and one spare page.
  void make_paged(int32_t page_size, uint64_t seed);
  // Loads q/k/v from row-major float tensors [total, H, D] (rounded to the dtype).
  void set_data(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v);

  fp_problem contiguous() const;
  fp_problem paged() const;

  int32_t batch() const { return int32_t(lengths_.size()); }
  int32_t heads_q() const { return hq_; }
  int32_t heads_kv() const { return hkv_; }
  int32_t head_dim() const { return d_; }
  fp_dtype dtype() const { return dtype_; }
  int64_t total_q() const { return cu_q_.back(); }
  int64_t total_k() const { return cu_k_.back(); }
  const std::vector<Lengths>& lengths() const { return lengths_; }
  // Element accessors in float.
  float q(int64_t token, int32_t head, int32_t d) const;
  float k(int64_t token, int32_t head, int32_t d) const;
  float v(int64_t token, int32_t head, int32_t d) const;
  int32_t cu_q(int32_t b) const { return cu_q_[b]; }
  int32_t cu_k(int32_t b) const { return cu_k_[b]; }

 private:
  std::vector<Lengths> lengths_;
  int32_t hq_, hkv_, d_;
  fp_dtype dtype_;
  std::vector<int32_t> cu_q_, cu_k_, seqlens_k_;
  std::vector<unsigned char> q_, k_, v_;
  int32_t page_size_ = 0, num_pages_ = 0, max_pages_ = 0;
  std::vector<unsigned char> k_cache_, v_cache_;
  std::vector<int32_t> page_table_;
};

// Output buffer of a problem: float values and the fp_output view (LSE included).
struct Output {
  std::vector<unsigned char> data;
  std::vector<float> lse;
  fp_output view;
  fp_dtype dtype;
  Output(const fp_problem& p, bool with_lse = false);
  std::vector<float> values() const;
};

// Index buffers sized by fp_index_sizes_query.
struct IndexBuffers {
  std::vector<int32_t> cu, idx;
  std::vector<float> k_mean, v_mean;
  fp_index_sizes sizes{};
  fp_index view{};
  IndexBuffers(const fp_problem& p, const fp_select_config& c);
};

fp_select_config default_config();
std::vector<float> run_dense(const fp_problem& p, std::vector<float>* lse = nullptr);
std::vector<float> run_prefill(const fp_problem& p, const fp_select_config& c);
double rel_l2(const std::vector<float>& got, const std::vector<float>& want);

// Exact causal attention written independently of the library: float64, head by head.
std::vector<double> naive_attention(const TestProblem& t, float scale);

// Q/K/V with a sink, a local band and far-back needles, so block selection has work to do.
void fill_structured(TestProblem& t, uint64_t seed);

}  // namespace fptest
