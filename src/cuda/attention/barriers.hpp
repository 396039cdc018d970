// The synchronization of the attention kernel, in one place: the mbarriers of the shared-memory
// pipeline (SharedStorage in kernel_traits.hpp names each by the event it signals: kv_loaded,
// kv_copied, kv_consumed, q_loaded, q_copied, q_consumed, work_full, work_empty), the cursors
// that track their parities, and the hardware named barriers, numbered by NamedBarrier.
#pragma once

#include <cstdint>

#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>

namespace flashprefill::cuda::attention {

using Barrier = cutlass::arch::ClusterBarrier;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

__device__ __forceinline__ Barrier& barrier(uint64_t& word) {
  return *reinterpret_cast<Barrier*>(&word);
}

// mbarrier arrive and wait that also keep the compiler from moving shared-memory accesses across
// them (CUTLASS's wrappers carry no memory clobber; the hardware's release/acquire does the rest).
__device__ __forceinline__ void arrive_ordered(uint64_t& bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(
                   cute::cast_smem_ptr_to_uint(&bar))
               : "memory");
}
__device__ __forceinline__ void wait_ordered(uint64_t& bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(cute::cast_smem_ptr_to_uint(&bar)),
      "r"(phase)
      : "memory");
}

// kv_copied[s] and q_copied expect one arrival from each producer thread, which fires once that
// thread's cp.async copies so far have landed (`.noinc`: the arrival counts against the
// barrier's expected count). Every producer thread arrives, whether it copied anything or not.
__device__ __forceinline__ void arrive_when_copied(uint64_t& bar) {
  cutlass::arch::cpasync_barrier_arrive_noinc(&bar);
}

// A stage index and the parity of its current use.
template <int kStages>
struct StageCursor {
  int index = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// Position in the two-slot ring of decoded items (work_full, work_empty).
struct SlotCursor {
  int index = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    index ^= 1;
    if (index == 0) phase ^= 1u;
  }
};

// The hardware named barriers. 0 is __syncthreads; kProducerBarrier is the producer warpgroup's
// own (every stage after its kv_consumed wait, producer.hpp; the mean windows' column
// biases, mean_correction.hpp); kTurnBarrier + w is the turn of
// consumer warpgroup w to issue its wgmmas; kStagingBarrier + 2 parity + w tells consumer
// warpgroup w that the other one's last S = Q K^T of an item (of that parity of q_phase) has
// landed, so that the staged epilogue may overwrite the K half it read (consumer.hpp).
enum NamedBarrier : int {
  kSyncThreadsBarrier = 0,
  kProducerBarrier = 1,
  kTurnBarrier = 2,     // + consumer warpgroup: 2, 3
  kStagingBarrier = 4,  // + 2 parity + consumer warpgroup: 4 ... 7
};

// bar.sync / bar.arrive on named barrier `id` among kThreads threads: `id` a compile-time
// constant (kId) or computed (a warpgroup's own).
template <int kThreads>
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kThreads>
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void named_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Threads of one warpgroup: the producer is one, each consumer is one.
inline constexpr int kWarpgroupThreads = 128;

// The producer warpgroup's barrier.
__device__ __forceinline__ void producer_sync() {
  named_sync<kProducerBarrier, kWarpgroupThreads>();
}

}  // namespace flashprefill::cuda::attention
