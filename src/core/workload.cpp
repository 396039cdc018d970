#include "core/workload.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/reference.hpp"

namespace flashprefill::demo {
namespace {

// splitmix64: a small, portable, deterministic generator.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  float normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

// Unit vector over the dims [d0, d1).
std::vector<float> direction(Rng& rng, int32_t D, int32_t d0, int32_t d1) {
  std::vector<float> u(D, 0.f);
  double norm = 0;
  for (int32_t d = d0; d < d1; ++d) {
    u[d] = rng.normal();
    norm += double(u[d]) * u[d];
  }
  for (float& x : u) x = float(x / std::sqrt(norm));
  return u;
}

void add(float* row, const std::vector<float>& u, float amount) {
  for (size_t d = 0; d < u.size(); ++d) row[d] += amount * u[d];
}

}  // namespace

void make_workload(const WorkloadShape& s, float* q, float* k, float* v) {
  const int32_t L = s.seqlen, D = s.head_dim, g = s.num_heads_q / s.num_heads_kv;

  // Target logits (after the 1/sqrt(D) scale) of each structure, and the key-side amplitude of
  // each direction: large keys keep the queries short, so that key noise spreads the logits
  // inside a block by only ~0.5 (std ~ |q| * kKeyNoise / sqrt(D), |q| ~ 20).
  constexpr float kSinkLogit = 10.f, kVerticalLogit = 6.f, kNeedleLogit = 7.f, kBandLogit = 6.f;
  constexpr float kSinkKey = 8.f, kVerticalKey = 6.f, kNeedleKey = 5.f;
  constexpr float kQueryNoise = 0.5f, kKeyNoise = 0.25f;
  // The local band is a sum of cosines of the position difference with periods from 256 to
  // 8192 tokens: peaked at distance 0, smooth inside a block, fluctuating by ~1 far away.
  constexpr double kShortestPeriod = 256.0, kLongestPeriod = 8192.0;
  const float unit = std::sqrt(float(D));
  const int32_t band_dims = std::min(64, D / 2);  // dims [0, band_dims) hold the positional kernel
  ref::parallel_for(s.num_heads_kv, [&](int64_t head) {
    const int32_t h = int32_t(head);
    Rng rng{s.seed * 0x2545f4914f6cdd1dull + uint64_t(h)};
    auto krow = [&](int32_t pos) { return &k[(size_t(pos) * s.num_heads_kv + h) * D]; };
    auto vrow = [&](int32_t pos) { return &v[(size_t(pos) * s.num_heads_kv + h) * D]; };
    auto qrow = [&](int32_t pos, int32_t r) {
      return &q[(size_t(pos) * s.num_heads_q + h * g + r) * D];
    };
    for (int32_t pos = 0; pos < L; ++pos)
      for (int32_t d = 0; d < D; ++d) {
        krow(pos)[d] = kKeyNoise * rng.normal();
        vrow(pos)[d] = rng.normal();
        for (int32_t r = 0; r < g; ++r) qrow(pos, r)[d] = kQueryNoise * rng.normal();
      }
    const std::vector<float> sink = direction(rng, D, band_dims, D);
    const std::vector<float> vertical = direction(rng, D, band_dims, D);
    const std::vector<float> needle = direction(rng, D, band_dims, D);
    for (int32_t pos = 0; pos < L; ++pos)
      for (int32_t f = 0; f < band_dims / 2; ++f) {
        const double period =
            kShortestPeriod * std::pow(kLongestPeriod / kShortestPeriod, 2.0 * f / band_dims);
        const double omega = 6.283185307179586 / period;
        const float c = float(std::cos(omega * pos)), sn = float(std::sin(omega * pos));
        const float amp = std::sqrt(kBandLogit * unit / (band_dims / 2));
        krow(pos)[2 * f] += amp * c;
        krow(pos)[2 * f + 1] += amp * sn;
        for (int32_t r = 0; r < g; ++r) {
          qrow(pos, r)[2 * f] += amp * c;
          qrow(pos, r)[2 * f + 1] += amp * sn;
        }
      }
    // Sinks and vertical columns: every query reads them.
    for (int32_t pos = 0; pos < std::min(L, 4); ++pos) add(krow(pos), sink, kSinkKey);
    std::vector<int32_t> columns;
    for (int32_t c = 0; c < 8 && L > 1024; ++c) columns.push_back(1024 + int32_t(rng.next() % uint64_t(L - 1024)));
    for (int32_t c : columns) add(krow(c), vertical, kVerticalKey);
    // Needles: a few far-back 128-token passages that one later query range retrieves each.
    for (int32_t n = 0; n < 4 && L >= 4096; ++n) {
      const int32_t block = int32_t(rng.next() % uint64_t(L / 2 / 128)) * 128;
      const int32_t q0 = L / 2 + int32_t(rng.next() % uint64_t(L / 2 - 256));
      for (int32_t pos = block; pos < block + 128; ++pos) add(krow(pos), needle, kNeedleKey);
      for (int32_t pos = q0; pos < std::min(L, q0 + 256); ++pos)
        for (int32_t r = 0; r < g; ++r) add(qrow(pos, r), needle, kNeedleLogit * unit / kNeedleKey);
    }
    for (int32_t pos = 0; pos < L; ++pos)
      for (int32_t r = 0; r < g; ++r) {
        add(qrow(pos, r), sink, kSinkLogit * unit / kSinkKey);
        add(qrow(pos, r), vertical, kVerticalLogit * unit / kVerticalKey);
      }
  });
}

}  // namespace flashprefill::demo
