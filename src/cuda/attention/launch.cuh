// Definition of launch_attention: the persistent grid, p.ctas CTAs (one per SM at most).
#pragma once

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/launch.hpp"

namespace flashprefill::cuda::attention {

template <class Element, int kHeadDim, KvLayout kLayout, class ElementOut>
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream) {
  using Traits = KernelTraits<Element, kHeadDim, kLayout, ElementOut>;
  auto* kernel = &attention_kernel<Traits>;
  static const cudaError_t attribute = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attribute != cudaSuccess) return attribute;
  kernel<<<unsigned(p.ctas), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::attention
