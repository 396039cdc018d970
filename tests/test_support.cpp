#include "test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "flashprefill/flashprefill.hpp"
#include "reference/numerics.hpp"

namespace fptest {

using flashprefill::ref::load;
using flashprefill::ref::store;

namespace {
size_t esize(fp_dtype t) { return t == FP_FLOAT32 ? 4 : 2; }
}  // namespace

TestProblem::TestProblem(std::vector<Lengths> lengths, int32_t heads_q, int32_t heads_kv,
                         int32_t head_dim, fp_dtype dtype, uint64_t seed)
    : lengths_(std::move(lengths)), hq_(heads_q), hkv_(heads_kv), d_(head_dim), dtype_(dtype) {
  cu_q_.push_back(0);
  cu_k_.push_back(0);
  for (const Lengths& l : lengths_) {
    cu_q_.push_back(cu_q_.back() + l.q);
    cu_k_.push_back(cu_k_.back() + l.kv);
    seqlens_k_.push_back(l.kv);
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> q(size_t(total_q()) * hq_ * d_), k(size_t(total_k()) * hkv_ * d_),
      v(k.size());
  for (float& x : q) x = n(rng);
  for (float& x : k) x = n(rng);
  for (float& x : v) x = n(rng);
  set_data(q, k, v);
}

void TestProblem::set_data(const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v) {
  auto fill = [&](std::vector<unsigned char>& dst, const std::vector<float>& src) {
    dst.assign(src.size() * esize(dtype_), 0);
    for (size_t i = 0; i < src.size(); ++i) store(dst.data(), int64_t(i), dtype_, src[i]);
  };
  fill(q_, q);
  fill(k_, k);
  fill(v_, v);
  if (page_size_ > 0) make_paged(page_size_, 7);
}

void TestProblem::make_paged(int32_t page_size, uint64_t seed) {
  page_size_ = page_size;
  max_pages_ = 1;
  int32_t pages = 0;
  for (const Lengths& l : lengths_) {
    const int32_t need = (l.kv + page_size - 1) / page_size;
    max_pages_ = std::max(max_pages_, need);
    pages += need;
  }
  num_pages_ = pages + 1;  // one spare page that no request uses
  std::vector<int32_t> order(num_pages_);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  const size_t row = size_t(hkv_) * d_ * esize(dtype_);
  k_cache_.assign(size_t(num_pages_) * page_size * row, 0xAB);
  v_cache_.assign(k_cache_.size(), 0xCD);
  page_table_.assign(size_t(batch()) * max_pages_, -1);
  int32_t next = 0;
  for (int32_t b = 0; b < batch(); ++b) {
    const int32_t need = (lengths_[b].kv + page_size - 1) / page_size;
    for (int32_t i = 0; i < need; ++i) page_table_[size_t(b) * max_pages_ + i] = order[next++];
    for (int32_t j = 0; j < lengths_[b].kv; ++j) {
      const size_t dst = (size_t(page_table_[size_t(b) * max_pages_ + j / page_size]) * page_size +
                          j % page_size) * row;
      const size_t src = size_t(cu_k_[b] + j) * row;
      std::copy_n(k_.begin() + src, row, k_cache_.begin() + dst);
      std::copy_n(v_.begin() + src, row, v_cache_.begin() + dst);
    }
  }
}

fp_problem TestProblem::contiguous() const {
  int32_t max_q = 0, max_k = 0;
  for (const Lengths& l : lengths_) {
    max_q = std::max(max_q, l.q);
    max_k = std::max(max_k, l.kv);
  }
  return flashprefill::contiguous_problem(FP_DEVICE_CPU, dtype_, batch(), hq_, hkv_, d_,
                                          q_.data(), total_q(), cu_q_.data(), max_q, k_.data(),
                                          v_.data(), total_k(), cu_k_.data(), max_k);
}

fp_problem TestProblem::paged() const {
  return flashprefill::paged_problem(contiguous(), k_cache_.data(), v_cache_.data(), num_pages_,
                                     page_size_, page_table_.data(), max_pages_,
                                     seqlens_k_.data());
}

float TestProblem::q(int64_t t, int32_t h, int32_t d) const {
  return load(q_.data(), (t * hq_ + h) * d_ + d, dtype_);
}
float TestProblem::k(int64_t t, int32_t h, int32_t d) const {
  return load(k_.data(), (t * hkv_ + h) * d_ + d, dtype_);
}
float TestProblem::v(int64_t t, int32_t h, int32_t d) const {
  return load(v_.data(), (t * hkv_ + h) * d_ + d, dtype_);
}

Output::Output(const fp_problem& p, bool with_lse) : dtype(p.dtype) {
  const size_t n = size_t(p.total_q) * p.num_heads_q * p.head_dim;
  data.assign(n * esize(p.dtype), 0xFF);  // poison: NaN in every dtype
  view = fp_output{data.data(), int64_t(p.num_heads_q) * p.head_dim, p.head_dim, nullptr};
  if (with_lse) {
    lse.assign(size_t(p.total_q) * p.num_heads_q, NAN);
    view.lse = lse.data();
  }
}

std::vector<float> Output::values() const {
  std::vector<float> out(data.size() / esize(dtype));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load(data.data(), int64_t(i), dtype);
  return out;
}

IndexBuffers::IndexBuffers(const fp_problem& p, const fp_select_config& c) {
  EXPECT_EQ(fp_index_sizes_query(&p, &c, &sizes), FP_OK) << fp_last_error_message();
  cu.assign(sizes.num_segments + 1, -1);
  idx.assign(std::max<int64_t>(sizes.idx_capacity, 1), -1);
  k_mean.assign(std::max<int64_t>(sizes.mean_elements, 1), NAN);
  v_mean.assign(k_mean.size(), NAN);
  view = fp_index{cu.data(), idx.data(), k_mean.data(), v_mean.data(), sizes.idx_capacity};
}

fp_select_config default_config() {
  fp_select_config c;
  fp_select_config_default(&c);
  return c;
}

std::vector<float> run_dense(const fp_problem& p, std::vector<float>* lse) {
  Output out(p, lse != nullptr);
  EXPECT_EQ(fp_dense_attention(&p, &out.view, nullptr, 0), FP_OK) << fp_last_error_message();
  if (lse) *lse = out.lse;
  return out.values();
}

std::vector<float> run_prefill(const fp_problem& p, const fp_select_config& c) {
  size_t bytes = 0;
  EXPECT_EQ(fp_prefill_workspace_size(&p, &c, &bytes), FP_OK) << fp_last_error_message();
  std::vector<unsigned char> ws(bytes);
  Output out(p);
  EXPECT_EQ(fp_prefill(&p, &c, &out.view, ws.data(), ws.size()), FP_OK) << fp_last_error_message();
  return out.values();
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<double> naive_attention(const TestProblem& t, float scale) {
  const int32_t D = t.head_dim(), g = t.heads_q() / t.heads_kv();
  std::vector<double> out(size_t(t.total_q()) * t.heads_q() * D, 0.0);
  for (int32_t b = 0; b < t.batch(); ++b) {
    const Lengths l = t.lengths()[b];
    for (int32_t i = 0; i < l.q; ++i) {
      const int32_t pos = l.kv - l.q + i;
      for (int32_t h = 0; h < t.heads_q(); ++h) {
        std::vector<double> s(pos + 1);
        double m = -INFINITY;
        for (int32_t j = 0; j <= pos; ++j) {
          double acc = 0;
          for (int32_t d = 0; d < D; ++d)
            acc += double(t.q(t.cu_q(b) + i, h, d)) * t.k(t.cu_k(b) + j, h / g, d);
          s[j] = acc * scale;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        double* o = &out[(size_t(t.cu_q(b) + i) * t.heads_q() + h) * D];
        for (int32_t j = 0; j <= pos; ++j)
          for (int32_t d = 0; d < D; ++d) o[d] += s[j] / sum * t.v(t.cu_k(b) + j, h / g, d);
      }
    }
  }
  return out;
}

void fill_structured(TestProblem& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  const int32_t D = t.head_dim(), g = t.heads_q() / t.heads_kv();
  const float unit = std::sqrt(float(D));
  std::vector<float> q(size_t(t.total_q()) * t.heads_q() * D), k(size_t(t.total_k()) * t.heads_kv() * D),
      v(k.size());
  for (float& x : q) x = 0.3f * n(rng);
  for (float& x : k) x = 0.3f * n(rng);
  for (float& x : v) x = n(rng);
  for (int32_t b = 0; b < t.batch(); ++b) {
    const Lengths l = t.lengths()[b];
    for (int32_t h = 0; h < t.heads_kv(); ++h) {
      // Dims 0..1: sink; 2..3: a needle at keys [L/4, L/4 + 32); dims 4..: local band via angles.
      for (int32_t j = 0; j < l.kv; ++j) {
        float* kr = &k[(size_t(t.cu_k(b) + j) * t.heads_kv() + h) * D];
        if (j < 2) kr[0] += 3.f;
        if (j >= l.kv / 4 && j < l.kv / 4 + 32) kr[2] += 3.f;
        const float a = float(j) / 40.f;
        kr[4] += 1.5f * std::cos(a);
        kr[5] += 1.5f * std::sin(a);
      }
      for (int32_t i = 0; i < l.q; ++i) {
        const int32_t pos = l.kv - l.q + i;
        for (int32_t r = 0; r < g; ++r) {
          float* qr = &q[(size_t(t.cu_q(b) + i) * t.heads_q() + h * g + r) * D];
          qr[0] += 1.2f * unit / 3.f;
          if (pos % 3 == 0) qr[2] += 1.5f * unit / 3.f;
          const float a = float(pos) / 40.f;
          qr[4] += 1.5f * unit / 1.5f * std::cos(a) * 0.6f;
          qr[5] += 1.5f * unit / 1.5f * std::sin(a) * 0.6f;
        }
      }
    }
  }
  t.set_data(q, k, v);
}

}  // namespace fptest
