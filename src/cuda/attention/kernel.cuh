// The attention kernel: one CTA per (query tile, request x KV head, split); warpgroup 0 produces,
// warpgroups 1-2 consume, with registers moved from the producer to the consumers.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/mainloop.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/seqlen.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    attention_kernel(const __grid_constant__ AttentionParams p) {
  using Storage = typename Traits::SharedStorage;
  extern __shared__ char smem[];
  Storage& ss = *reinterpret_cast<Storage*>(smem);

  const WorkTile w = decode_work(p, blockIdx.x, blockIdx.y);
  if (w.empty()) return;  // uniform over the CTA, before any barrier is used
  if (threadIdx.x == 0) {
    barrier(ss.q_loaded).init(Traits::kProducerThreads);
    for (int s = 0; s < Traits::kStages; ++s) {
      barrier(ss.kv_loaded[s]).init(Traits::kProducerThreads);
      barrier(ss.kv_consumed[s]).init(Traits::kConsumerWarps);
    }
  }
  __syncthreads();  // barriers initialized

  const Traversal trav = Traversal::make(p, w);
  if (threadIdx.x < Traits::kProducerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    Mainloop<Traits>::produce(p, w, trav, ss);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    Mainloop<Traits>::consume(p, w, trav, ss);
  }
}

}  // namespace flashprefill::cuda::attention
