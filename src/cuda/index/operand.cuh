// The element types of the index stage (docs/ALGORITHM.md, the rounding rule and "FP8 e4m3").
// Q, K and V are read in their storage type T; the scoring products run on 16-bit tensor cores
// in the Operand type: T for bfloat16 / float16, and bfloat16 for e4m3, whose every value is
// exact in bfloat16 (so the products and their float32 sums are those of the e4m3 values).
// rho(k_mean), the scoring operand the pooling writes, is stored in that type too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ptx.cuh"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::index {

template <typename T>
struct IndexTypes {
  using Operand = T;
  static constexpr bool kE4m3 = false;
};

template <>
struct IndexTypes<__nv_fp8_e4m3> {
  using Operand = __nv_bfloat16;
  static constexpr bool kE4m3 = true;
};

// Bytes of one Operand element, for every stored type: the workspace holds rho(k_mean) in it.
inline constexpr int64_t kOperandBytes = 2;
static_assert(sizeof(IndexTypes<__nv_bfloat16>::Operand) == kOperandBytes &&
              sizeof(IndexTypes<__half>::Operand) == kOperandBytes &&
              sizeof(IndexTypes<__nv_fp8_e4m3>::Operand) == kOperandBytes);

// The index stage's kernel instantiations in one place: fn.template operator()<T, D>() for the
// stored type T of `dtype` (bfloat16, float16 or e4m3) and head_dim D (64 or 128).
template <typename Fn>
cudaError_t dispatch_index_types(fp_dtype dtype, int32_t head_dim, Fn&& fn) {
  const bool d64 = head_dim == 64;
  switch (dtype) {
    case FP_BFLOAT16:
      return d64 ? fn.template operator()<__nv_bfloat16, 64>()
                 : fn.template operator()<__nv_bfloat16, 128>();
    case FP_FLOAT8_E4M3:
      return d64 ? fn.template operator()<__nv_fp8_e4m3, 64>()
                 : fn.template operator()<__nv_fp8_e4m3, 128>();
    default:
      return d64 ? fn.template operator()<__half, 64>() : fn.template operator()<__half, 128>();
  }
}

// rho of one pooled key mean as the scoring operand: rounded to the 16-bit dtype, or, for e4m3
// keys, round_e4m3(k_mean * (1 / c_k)) with the keys' descale (inv_c = 1 / c_k; unused for
// 16-bit keys).
template <typename T>
__device__ __forceinline__ typename IndexTypes<T>::Operand mean_operand(float mean, float inv_c) {
  if constexpr (IndexTypes<T>::kE4m3) {
    return __float2bfloat16_rn(round_e4m3(mean * inv_c));
  } else {
    return round_to<T>(mean);
  }
}

}  // namespace flashprefill::cuda::index
