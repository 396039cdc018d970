// The two roles of the warp-specialized mainloop. The producer warpgroup walks the traversal
// and fills shared-memory stages (exact KV tiles by cp.async through KvAddress, mean windows by
// converting the pooled means); each stage carries its kind so that both roles follow one
// sequence. The consumer warpgroups run S = Q K^T, the mask or mean shift, the online softmax
// and O += P V on wgmma for every stage, then the epilogue.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/epilogue.hpp"
#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/mask.hpp"
#include "cuda/attention/paged_kv.hpp"
#include "cuda/attention/softmax.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

using Barrier = cutlass::arch::ClusterBarrier;

__device__ __forceinline__ Barrier& barrier(uint64_t& word) {
  return *reinterpret_cast<Barrier*>(&word);
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

// One warpgroup-wide wgmma batch C (+)= A B over the K mode; A from registers when kARegs.
template <bool kZeroInit, bool kARegs, class Mma, class A, class B, class C>
__device__ __forceinline__ void wgmma(Mma& mma, A& a, const B& b, C& c) {
  using namespace cute;
  if constexpr (kARegs) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegs) warpgroup_fence_operand(a);
}

template <class Traits>
struct Mainloop {
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;
  static constexpr int kStages = Traits::kStages;

  __device__ static void produce(const AttentionParams& p, const WorkTile& w,
                                 const Traversal& trav, Storage& ss) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.vt.data()), typename Traits::SmemLayoutVt{});
    const int thread = threadIdx.x % Traits::kProducerThreads;
    const TileLoader<Traits> loader{p, w, thread};

    loader.load_q(sQ);
    cp_async_commit();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma reads
    barrier(ss.q_loaded).arrive();

    StageCursor<kStages> cur;
    int pending = -1;  // the stage whose copies are still in flight
    auto open_stage = [&](int32_t kind, int32_t tile) {
      barrier(ss.kv_consumed[cur.index]).wait(cur.phase ^ 1u);
      if (thread == 0) {
        ss.stage_kind[cur.index] = kind;
        ss.stage_tile[cur.index] = tile;
      }
    };
    auto close_stage = [&]() {
      cp_async_commit();
      if (pending >= 0) {
        cp_async_wait<1>();
        cutlass::arch::fence_view_async_shared();
        barrier(ss.kv_loaded[pending]).arrive();
      }
      pending = cur.index;
      cur.advance();
    };

    const BlockGeometry blocks{p.block_size, w.seq.len_kv};
    // The next exact tile id is read one iteration ahead of its use.
    auto fetch = [&](int32_t i) {
      return (i < trav.last && trav.is_exact(i)) ? trav.exact_tile(p, i) : -1;
    };
    int32_t next_tile = fetch(trav.first);
    for (int32_t i = trav.first; i < trav.last; ++i) {
      const int32_t tile = next_tile;
      next_tile = fetch(i + 1);
      if (trav.is_exact(i)) {
        if (tile < 0) continue;
        open_stage(Traits::kExactTile, tile);
        loader.load_kv_tile(sK, sVt, tile, cur.index);
      } else {
        const int32_t first_block = trav.window_first_block(i);
        open_stage(Traits::kMeanWindow, first_block);
        loader.load_mean_window(sK, sVt, first_block, trav.visible_blocks, cur.index);
        if (thread < Traits::kBlockN) {
          const int32_t j = first_block + thread;
          const bool surrogate = j < trav.visible_blocks && block_unlisted(p, trav, blocks, j);
          ss.column_bias[cur.index][thread] =
              surrogate ? log2f(float(blocks.count(j))) : -INFINITY;  // Eq. 6: log |B_J|
        }
      }
      close_stage();
    }
    open_stage(Traits::kEnd, 0);
    close_stage();
    cp_async_wait<0>();
    cutlass::arch::fence_view_async_shared();
    barrier(ss.kv_loaded[pending]).arrive();
  }

  __device__ static void consume(const AttentionParams& p, const WorkTile& w, Storage& ss) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.vt.data()), typename Traits::SmemLayoutVt{});
    const int thread = threadIdx.x - Traits::kProducerThreads;

    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(thread);
    auto thr_pv = mma_pv.get_thread_slice(thread);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrK = thr_qk.partition_fragment_B(sK);
    Tensor tOrVt = thr_pv.partition_fragment_B(sVt);
    Tensor tSrS = partition_fragment_C(
        mma_qk, Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{});
    Tensor tOrO = partition_fragment_C(
        mma_pv, Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{});
    Tensor rP = make_fragment_like<Element>(tSrS);
    Tensor tOrP = make_tensor(rP.data(), typename Traits::LayoutP{});
    static_assert(size(typename Traits::LayoutP{}) == decltype(size(tSrS))::value);

    Tensor tScS = thr_qk.partition_C(
        make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{}));
    Tensor tOcO = thr_pv.partition_C(
        make_identity_tensor(Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}));
    Tensor s = make_tensor(tSrS.data(), rowcol(tSrS.layout()));
    Tensor s_coord = make_tensor(tScS.data(), rowcol(tScS.layout()));
    Tensor o = make_tensor(tOrO.data(), rowcol(tOrO.layout()));
    Tensor o_coord = make_tensor(tOcO.data(), rowcol(tOcO.layout()));

    // Positions of this thread's two rows (Eq. 13) and the first position of the tile.
    int32_t pos[2];
    CUTE_UNROLL
    for (int m = 0; m < 2; ++m)
      pos[m] = w.seq.position(w.seq.tile_row_begin(w.tile) + get<0>(s_coord(m, 0)));
    const int32_t pmin = w.seq.pmin(w.tile);

    clear(tOrO);
    OnlineSoftmax softmax;
    barrier(ss.q_loaded).wait(0);
    StageCursor<kStages> cur;
    for (;;) {
      barrier(ss.kv_loaded[cur.index]).wait(cur.phase);
      const int32_t kind = ss.stage_kind[cur.index];
      if (kind == Traits::kEnd) break;
      const int32_t tile = ss.stage_tile[cur.index];
      wgmma<true, false>(mma_qk, tSrQ, tSrK(_, _, _, cur.index), tSrS);
      warpgroup_wait<0>();
      if (kind == Traits::kExactTile) {
        const bool need_mask = tile * kKvTile + kKvTile - 1 > pmin;
        scale_and_mask_exact(s, s_coord, tile, pos, p.scale_log2, need_mask);
      } else {
        scale_and_shift_means(s, s_coord, ss.column_bias[cur.index], p.scale_log2);
      }
      softmax.update(s, o);
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) rP(i) = Element(tSrS(i));
      wgmma<false, true>(mma_pv, tOrP, tOrVt(_, _, _, cur.index), tOrO);
      warpgroup_wait<0>();
      barrier(ss.kv_consumed[cur.index]).arrive();
      cur.advance();
    }
    float lse[2];
    softmax.finalize(o, lse);
    store_tile<Element>(p, w, o, o_coord, lse);
  }
};

}  // namespace flashprefill::cuda::attention
