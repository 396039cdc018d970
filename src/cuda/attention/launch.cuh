// Definition of launch_attention: a persistent grid of one CTA per SM (at most one per work item).
#pragma once

#include <cstdlib>

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/launch.hpp"

namespace flashprefill::cuda::attention {

template <class Traits>
cudaError_t launch_traits(const AttentionParams& p, cudaStream_t stream) {
  auto* kernel = &attention_kernel<Traits>;
  static const cudaError_t attribute = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (attribute != cudaSuccess) return attribute;
  const int64_t items = int64_t(p.max_q_tiles) * p.batch * p.heads_kv * p.num_splits;
  int64_t ctas = items < p.num_sms ? items : p.num_sms;  // one CTA per SM (shared memory)
  if (const char* v = std::getenv("FLASHPREFILL_ATTENTION_VARIANT"); v && (std::atoi(v) & 1))
    ctas = items;
  kernel<<<unsigned(ctas), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Element, int kHeadDim>
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream) {
  const char* v = std::getenv("FLASHPREFILL_ATTENTION_VARIANT");
  const bool unfold = v && (std::atoi(v) & 2);
  return unfold ? launch_traits<KernelTraits<Element, kHeadDim, false>>(p, stream)
                : launch_traits<KernelTraits<Element, kHeadDim, true>>(p, stream);
}

}  // namespace flashprefill::cuda::attention
