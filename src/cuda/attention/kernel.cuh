// The attention kernel: a persistent grid (one CTA per SM) whose CTAs claim work items, each a
// (query tile, request x KV head, split), from the scheduler (scheduler.hpp). Warpgroup 0
// produces, warpgroups 1-2 consume, with registers moved from the producer to the consumers.
// The shared-memory pipeline runs on across items: while the consumers finish an item (its last
// stages, softmax and stores), the producer already fetches the next item's first KV stage and,
// once the last S = Q K^T is done, its Q tile.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/attention/barriers.hpp"
#include "cuda/attention/consumer.hpp"
#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/load_q.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/producer.hpp"
#include "cuda/attention/scheduler.hpp"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::attention {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    attention_kernel(const __grid_constant__ AttentionParams p) {
  using Storage = typename Traits::SharedStorage;
  constexpr int kStages = Traits::kStages;
  extern __shared__ char smem[];
  Storage& ss = *reinterpret_cast<Storage*>(smem);

  if (threadIdx.x == 0) {
    ss.decoder = ItemDecoder{};
    ss.copied_phases = 0;
    barrier(ss.q_loaded).init(1);  // thread 0, with the TMA bytes
    barrier(ss.q_copied).init(Traits::kProducerThreads);  // arrive_when_copied
    barrier(ss.q_consumed).init(Traits::kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      barrier(ss.kv_loaded[s]).init(1);
      barrier(ss.kv_copied[s]).init(Traits::kProducerThreads);
      barrier(ss.kv_consumed[s]).init(Traits::kConsumerThreads);
    }
    for (int s = 0; s < 2; ++s) {
      barrier(ss.work_full[s]).init(1);
      barrier(ss.work_empty[s]).init(Traits::kThreads);
    }
  }
  __syncthreads();  // barriers initialized

  const bool producer = threadIdx.x < Traits::kProducerThreads;
  StageCursor<kStages> stages;
  SlotCursor slot;
  uint32_t q_phase = 0;

  if (producer) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    const bool scheduler = threadIdx.x == 0;
    ItemDecoder& decoder = ss.decoder;  // in shared memory: no producer registers
    // Thread 0 writes the decoded item `item` into the ring slot `at`.
    auto publish = [&](int32_t item, SlotCursor at) {
      wait_ordered(ss.work_empty[at.index], at.phase ^ 1u);
      ScheduledWork& sw = ss.work[at.index];
      decoder.decode(p, item, sw);
      arrive_ordered(ss.work_full[at.index]);
      if (sw.valid) QLoader<Traits>{p, sw.w, 0}.prefetch_q();
    };
    if (scheduler) publish(blockIdx.x, slot);
    for (;;) {
      wait_ordered(ss.work_full[slot.index], slot.phase);
      const ScheduledWork& sw = ss.work[slot.index];
      if (!sw.valid) break;
      SlotCursor following = slot;
      following.advance();
      // Item k + 1 is claimed (the atomic, whose result is not waited for) once at most
      // kClaimAheadIterations iterations of item k are left to fetch, and decoded once all of
      // item k's stages are issued: the atomic and the decoder's dependent loads (lengths, CSR
      // offsets) never hold up a stage of item k, no item waits claimed behind a long one while
      // other SMs run dry, and the consumers still find item k + 1 decoded well before they
      // finish item k.
      int32_t claimed = 0;
      Producer<Traits>::produce(p, sw.w, sw.trav, ss, stages, q_phase, [&] {
        if (scheduler) claimed = p.ctas + atomicAdd(p.work_counter, 1);
      });
      if (scheduler) publish(claimed, following);
      q_phase ^= 1u;
      arrive_ordered(ss.work_empty[slot.index]);
      slot = following;
    }
    cp_async_wait_all();  // no copy outlives its issuing thread
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    // Consumer warpgroup 0 takes the first turn (Consumer::consume): warpgroup 1 hands it over.
    if (threadIdx.x >= Traits::kProducerThreads + 128)
      named_arrive<kTurnBarrier, Traits::kConsumerThreads>();
    for (;;) {
      wait_ordered(ss.work_full[slot.index], slot.phase);
      const ScheduledWork sw = ss.work[slot.index];
      arrive_ordered(ss.work_empty[slot.index]);
      slot.advance();
      if (!sw.valid) break;
      Consumer<Traits>::consume(p, sw.w, ss, stages, q_phase);
      q_phase ^= 1u;
    }
  }
}

}  // namespace flashprefill::cuda::attention
