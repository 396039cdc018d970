// The consumer role of the warp-specialized mainloop (kernel.cuh), run once per work item by
// warpgroups 1 and 2: for every stage the producer (producer.hpp) sends, S = Q K^T on wgmma, the
// mask of exact tiles (mask.hpp) or the log |B_J| shift of mean windows (mean_correction.hpp),
// the online softmax (softmax.hpp) and O += P V, then the epilogue (epilogue.hpp).
// docs/KERNEL.md has the whole picture.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/barriers.hpp"
#include "cuda/attention/epilogue.hpp"
#include "cuda/attention/fp8.hpp"
#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/mask.hpp"
#include "cuda/attention/mean_correction.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/softmax.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

// One warpgroup-wide wgmma batch C (+)= A B over the K mode; A from registers when kARegs.
// With kLowerHalf, only the first half of the K mode runs (a stage holding one KV tile).
template <bool kZeroInit, bool kARegs, bool kLowerHalf = false, class Mma, class A, class B,
          class C>
__device__ __forceinline__ void wgmma(Mma& mma, A& a, const B& b, C& c) {
  using namespace cute;
  constexpr int kBlocks = decltype(size<2>(a))::value / (kLowerHalf ? 2 : 1);
  if constexpr (kARegs) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < kBlocks; ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegs) warpgroup_fence_operand(a);
}

template <class Traits>
struct Consumer {
  using Element = typename Traits::Element;
  using ElementOut = typename Traits::ElementOut;
  using Storage = typename Traits::SharedStorage;
  static constexpr int kStages = Traits::kStages;

  // Intra-warpgroup overlap (Eq. 14): while the softmax of stage n runs on the CUDA cores, the
  // tensor cores finish P_{n-1} V_{n-1}; S_n = Q K_n is issued before both, and O is rescaled
  // while S_n runs. The two consumer warpgroups take turns issuing their wgmmas (named barriers
  // kTurnBarrier + warpgroup), so one warpgroup's softmax runs while the other's wgmmas do.
  // The cursor carries the pipeline position from item to item; q_phase is the item's parity.
  __device__ static void consume(const AttentionParams& p, const WorkTile& w, Storage& ss,
                                 StageCursor<kStages>& cur, uint32_t q_phase) {
    using namespace cute;
    auto [sQ, sK, sVt] = Traits::smem_tensors(ss);
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
    Tensor rP = make_fragment_like<Element>(tSrS);  // e4m3: filled a 32-bit word at a time
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

    // S for the stage's kind: mask exact tiles that reach past pmin, shift mean windows (e4m3:
    // in units of the item's c_q c_k, set below).
    float mean_unit = 1.f;
    auto to_logits = [&](int buffer, const StageInfo& info) {
      if (info.kind == StageKind::kExactTiles) {
        const int32_t tiles[2] = {info.tile0, info.tile1};
        if (stage_needs_mask(tiles, pmin)) mask_exact(s, s_coord, tiles, pos);
      } else {
        shift_means<Traits::kFp8>(s, s_coord, ss.column_bias[buffer], mean_unit);
      }
    };
    // The stage's data and StageInfo have landed before its wgmma reads them; data written by
    // cp.async or by stores (not TMA) is then made visible to the async proxy.
    auto wait_loaded = [&](int buffer, uint32_t phase) {
      wait_ordered(ss.kv_loaded[buffer], phase);
      const StageInfo info = ss.stage_info[buffer];
      if (info.generic_writes) {
        wait_ordered(ss.kv_copied[buffer], info.copied_phase);
        cutlass::arch::fence_view_async_shared();
      }
      return info;
    };
    // Every consumer thread arrives once its wgmmas no longer read the buffer (and it has read
    // the stage's StageInfo and column biases): each thread's own reads are ordered before its
    // own release, so no ordering rests on another thread's arrival.
    auto release = [&](int buffer) { arrive_ordered(ss.kv_consumed[buffer]); };
    // The same for the Q tile, after the item's last S = Q K^T has landed.
    auto release_q = [&]() { arrive_ordered(ss.q_consumed); };
    // A stage of exact tiles whose upper half holds no tile: its P is zero there (masked) and
    // its V rows are stale, so P V runs over the lower half only.
    auto one_tile = [](const StageInfo& info) {
      return info.kind == StageKind::kExactTiles && info.tile1 < 0;
    };
    // O += P V; the two batches are whole (arrive to commit) on either path, so no wgmma of the
    // common one waits on a branch (ptxas would otherwise split it and insert an empty wgmma).
    auto issue_pv = [&](int buffer, bool lower_half) {
      if (lower_half) wgmma<false, true, true>(mma_pv, tOrP, tOrVt(_, _, _, buffer), tOrO);
      else wgmma<false, true>(mma_pv, tOrP, tOrVt(_, _, _, buffer), tOrO);
    };
    // P from the probabilities in tSrS; e4m3 adds the rounded ones to the softmax's row sums.
    auto to_p = [&](OnlineSoftmax& softmax) {
      if constexpr (Traits::kFp8) {
        float sums[2] = {0.f, 0.f};
        convert_p_e4m3(tSrS, reinterpret_cast<uint32_t*>(raw_pointer_cast(rP.data())), sums);
        softmax.add_rounded(sums);
      } else {
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) rP(i) = Element(tSrS(i));
      }
    };
    // Turns: wait for the other warpgroup's wgmmas to be issued, then hand the turn back.
    const int wg = thread / 128;
    auto turn_begin = [&] { named_sync<Traits::kConsumerThreads>(kTurnBarrier + wg); };
    auto turn_end = [&] { named_arrive<Traits::kConsumerThreads>(kTurnBarrier + 1 - wg); };

    // The finished tile goes out through the K half of the item's last stage (staged_store):
    // each warpgroup overwrites its 64 rows of it once its last P V has landed and the other
    // warpgroup's last S = Q K^T, which read all of it, has too (a named barrier per parity of
    // q_phase, so a warpgroup that runs ahead into the next item cannot pass it twice).
    // (e4m3: it does not fit, and the tile goes out directly. Written as `kStagedStore &&
    // staged_store(p)`, the 16-bit kernels' PTX changed.)
    bool staged = false;
    if constexpr (Traits::kStagedStore) staged = staged_store(p);
    const int staging_barrier = kStagingBarrier + 2 * int(q_phase);
    auto last_qk_landed = [&] {
      release_q();
      if (staged) named_arrive<Traits::kConsumerThreads>(staging_barrier + 1 - wg);
    };

    clear(tOrO);
    constexpr bool kE4m3 = Traits::kFp8;
    // e4m3 (Eq. 15): the logits take c_q c_k and the output c_v of the item's (request, KV
    // head); 16-bit operands keep the softmax scale and finalize reads no factor. The e4m3
    // scale is held at 2^-60: c_q c_k may underflow (each factor is only >= FLT_MIN), and
    // 1 / (c_q c_k), the mean windows' unit, would be infinite; |q~ . k~| <= 448^2 128 < 2^25,
    // so below 2^-60 every exponent is exp2(x) with |x| < 2^-35, 1 in float32 either way.
    float scale_log2 = p.scale_log2, out_scale = 1.f;
    if constexpr (kE4m3) {
      const float qk = descale_at(p.q_descale, w.b, w.h) * descale_at(p.k_descale, w.b, w.h);
      scale_log2 *= qk;
      mean_unit = 1.f / qk;
      if (!(scale_log2 >= 0x1p-60f)) {
        scale_log2 = 0x1p-60f;
        mean_unit = p.scale_log2 * 0x1p60f;  // p.scale_log2 / scale_log2, finite (< 2^125)
      }
      out_scale = descale_at(p.v_descale, w.b, w.h);
    }
    OnlineSoftmax softmax(scale_log2);
    float factors[2];
    float lse[2];
    wait_ordered(p.q_tma ? ss.q_loaded : ss.q_copied, q_phase);
    cutlass::arch::fence_view_async_shared();
    StageInfo info = wait_loaded(cur.index, cur.phase);
    if (info.kind == StageKind::kEnd) {  // an item without stages: zero rows, LSE -inf
      release(cur.index);
      release_q();
      cur.advance();
      softmax.finalize<kE4m3>(o, lse, out_scale);
      store_tile<ElementOut, Traits::kHeadDim>(p, w, o, o_coord, lse);
    } else {
      int prev = cur.index;
      bool prev_one_tile = one_tile(info);
      // The item body in three parts. Each lambda must be forced inline: ptxas otherwise
      // compiles one as a call with a 1360-byte stack frame. Written this way, ptxas orders
      // D = 64's stage loop a little differently (the same 694 instructions) and D = 64 runs
      // 0.6-2.5 % faster than the same code in one block, for reasons not known; D = 128 is
      // unchanged.
      // The first stage: its S = Q K^T, mask and softmax have no P V to overlap.
      auto first_stage = [&]() __attribute__((always_inline)) {
        turn_begin();
        wgmma<true, false>(mma_qk, tSrQ, tSrK(_, _, _, cur.index), tSrS);
        turn_end();
        warpgroup_wait<0>();
        if (info.last) last_qk_landed();
        to_logits(cur.index, info);
        softmax.update<kE4m3>(s, factors);
        to_p(softmax);
      };
      // Stages 1 ... last (Eq. 14); on entry P_{n-1} is in registers and prev its buffer.
      auto stage_loop = [&]() __attribute__((always_inline)) {
        while (!info.last) {
          cur.advance();
          info = wait_loaded(cur.index, cur.phase);
          turn_begin();
          wgmma<true, false>(mma_qk, tSrQ, tSrK(_, _, _, cur.index), tSrS);
          OnlineSoftmax::rescale(o, factors);  // while S_n runs; P_{n-1} V_{n-1} adds to it
          issue_pv(prev, prev_one_tile);
          turn_end();
          warpgroup_wait<1>();  // S_n landed; P_{n-1} V_{n-1} may still run
          if (info.last) last_qk_landed();
          to_logits(cur.index, info);
          softmax.update<kE4m3>(s, factors);
          warpgroup_wait<0>();
          release(prev);
          to_p(softmax);
          prev = cur.index;
          prev_one_tile = one_tile(info);
        }
      };
      // The last P V takes no turn: there is no softmax left for it to overlap, and both
      // warpgroups skip it, so the turns stay paired. (Measured 1.6-1.9 % faster in dense mode,
      // where it is rare: ptxas then spills 4 bytes instead of 20. Skipping the first
      // S = Q K^T's turn as well lost 1 % at low density.)
      auto finish = [&]() __attribute__((always_inline)) {
        OnlineSoftmax::rescale(o, factors);
        issue_pv(prev, prev_one_tile);
        warpgroup_wait<0>();
        softmax.finalize<kE4m3>(o, lse, out_scale);
        if (staged) {
          named_sync<Traits::kConsumerThreads>(staging_barrier + wg);
          char* staging = reinterpret_cast<char*>(&sK(0, 0, prev)) +
                          wg * (Traits::kBlockM / 2) * Traits::kHeadDim * int(sizeof(ElementOut));
          store_tile_staged<ElementOut, Traits::kHeadDim>(p, w, o, o_coord, lse, staging);
          cutlass::arch::fence_view_async_shared();  // before TMA refills the stage
          release(prev);
        } else {
          release(prev);
          store_tile<ElementOut, Traits::kHeadDim>(p, w, o, o_coord, lse);
        }
        cur.advance();  // the next item starts on the following stage
      };
      first_stage();
      stage_loop();
      finish();
    }
  }
};

}  // namespace flashprefill::cuda::attention
