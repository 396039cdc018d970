// Definition of launch_attention: grid = (query tiles x requests x KV heads, splits).
#pragma once

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/launch.hpp"

namespace flashprefill::cuda::attention {

template <class Element, int kHeadDim>
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream) {
  using Traits = KernelTraits<Element, kHeadDim>;
  auto* kernel = &attention_kernel<Traits>;
  static const cudaError_t attribute = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attribute != cudaSuccess) return attribute;
  const dim3 grid(unsigned(int64_t(p.max_q_tiles) * p.batch * p.heads_kv), unsigned(p.num_splits));
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
