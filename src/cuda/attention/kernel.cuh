// The attention kernel: a persistent grid over (query tile, request x KV head, split) work items;
// warpgroup 0 produces, warpgroups 1-2 consume, with registers moved from the producer to the
// consumers.
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

  if (threadIdx.x == 0) {
    barrier(ss.q_loaded).init(Traits::kProducerThreads);
    barrier(ss.q_consumed).init(Traits::kConsumerWarps);
    for (int s = 0; s < Traits::kStages; ++s) {
      barrier(ss.kv_loaded[s]).init(Traits::kProducerThreads);
      barrier(ss.kv_consumed[s]).init(Traits::kConsumerWarps);
    }
  }
  __syncthreads();  // barriers initialized

  // Persistent: CTA c takes work items c, c + gridDim.x, ... in the heavy-first order of
  // decode_work; producer and consumers walk the same items and carry the pipeline across them.
  const int64_t items = int64_t(p.max_q_tiles) * p.batch * p.heads_kv * p.num_splits;
  StageCursor<Traits::kStages> cur;
  uint32_t q_phase = 0;
  if (threadIdx.x < Traits::kProducerThreads) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const WorkTile w = decode_work(p, int32_t(item / p.num_splits), int32_t(item % p.num_splits));
      if (w.empty()) continue;
      Mainloop<Traits>::produce(p, w, Traversal::make(p, w), ss, cur, q_phase);
      q_phase ^= 1u;
    }
    cp_async_wait_all();  // no copy outlives its issuing thread
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const WorkTile w = decode_work(p, int32_t(item / p.num_splits), int32_t(item % p.num_splits));
      if (w.empty()) continue;
      Mainloop<Traits>::consume(p, w, Traversal::make(p, w), ss, cur, q_phase);
      q_phase ^= 1u;
    }
  }
}

}  // namespace flashprefill::cuda::attention
