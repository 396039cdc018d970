// Surrogate keys for mean correction in the operand dtype: rho(k_mean), rho(v_mean) (Eq. 6, the
// rounding docs/ALGORITHM.md prescribes), written once per call into the attention workspace so
// that the kernel's producer can fetch a 128-block mean window by TMA like a pair of KV tiles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/params.hpp"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::attention {

// Rows of one converted mean tensor: one per (request, KV head, block slot).
__host__ __device__ inline int64_t converted_mean_rows(int32_t batch, int32_t heads_kv,
                                                       int32_t max_blocks) {
  return int64_t(batch) * heads_kv * max_blocks;
}

// k_out / v_out: [batch, heads_kv, max_blocks, head_dim] in `dtype`; blocks past a request's
// last block are written as zeros, so no unwritten mean can reach the tensor cores.
cudaError_t launch_lowp_means(const AttentionParams& p, fp_dtype dtype, int head_dim, void* k_out,
                              void* v_out, cudaStream_t stream);

}  // namespace flashprefill::cuda::attention
