// The FP8 e4m3 variant of the reference stages (Eq. 15, docs/ALGORITHM.md "FP8 e4m3"). The
// tensor cores consume e4m3 values; the descale factors apply to the logits (c_q c_k) and to the
// output (c_v). For other problems every helper here is the identity of the unquantized path.
#pragma once

#include <cstdint>

#include "reference/numerics.hpp"
#include "reference/reference.hpp"

namespace flashprefill::ref {

// Element i of q as the Q operand of query rows of (b, KV head h): the widened value, or, for FP8
// problems, the e4m3 value (q's own, or round_e4m3(q * (1 / c_q)) for a bf16/fp16 q).
inline float q_operand(const ProblemInfo& info, int32_t b, int32_t h, int64_t i) {
  const fp_problem& p = *info.p;
  if (!info.fp8.quantize_q) return load(p.q, i, p.dtype);
  return round_to_e4m3(load(p.q, i, p.dtype) * (1.f / info.fp8.c_q(b, h)));
}

// The descale of k (value = false) or v of (b, h): 1 for problems without e4m3 K/V.
inline float kv_descale(const ProblemInfo& info, int32_t b, int32_t h, bool value) {
  if (!info.fp8.on) return 1.f;
  return value ? info.fp8.c_v(b, h) : info.fp8.c_k(b, h);
}

// c_q c_k, the factor of the raw logits q . k: 1 for problems without e4m3 K/V.
inline float logit_descale(const ProblemInfo& info, int32_t b, int32_t h) {
  if (!info.fp8.on) return 1.f;
  return info.fp8.c_q(b, h) * info.fp8.c_k(b, h);
}

// A float32 block mean as the operand that scoring (Eq. 19) and the surrogate keys (Eq. 6)
// consume: rho(x) in the problem's dtype, or, for FP8 problems, round_e4m3(x * (1 / c)) in the
// precision of the exact keys, with the same descale c as they have.
inline float mean_operand(const ProblemInfo& info, int32_t b, int32_t h, bool value, float mean) {
  if (!info.fp8.on) return round_to_dtype(mean, info.p->dtype);
  return round_to_e4m3(mean * (1.f / kv_descale(info, b, h, value)));
}

// The keys of one query tile as attention.cpp gathers them: e4m3 values, exact keys in ascending
// position, then the surrogates of blocks `block` in ascending order with their ln n_J shifts.
struct E4m3Keys {
  const float* k;  // [exact + surrogates, D]
  const float* v;
  const int32_t* position;  // [exact]
  int32_t exact;
  const float* logit_shift;  // [surrogates]
  const int32_t* block;      // [surrogates]
  int32_t surrogates;
};

// Eq. 15 for the rows of one query tile: the online softmax over the stages of the unsplit
// operator (exact tiles from the highest down, two per stage; then the surrogates, 128 blocks per
// stage), P~ = round_e4m3(2^8 exp(S - m)) against the running maximum m, float32 accumulation;
// writes out in the output dtype and, when asked, lse.
void attend_tile_e4m3(const ProblemInfo& info, const fp_output& output, int32_t b, int32_t h,
                      int32_t tile, const QueryTile& qt, const E4m3Keys& keys);

}  // namespace flashprefill::ref
