// The two roles of the warp-specialized mainloop, run once per work item. The producer warpgroup
// walks the item's StageSequence and fills shared-memory stages (exact KV tiles by TMA or by
// cp.async through KvAddress, mean windows by TMA from the converted means), each with its
// StageInfo; the consumer warpgroups run S = Q K^T, the mask or mean shift, the online softmax
// and O += P V on wgmma for every stage they receive, then the epilogue. docs/KERNEL.md has the
// whole picture.
#pragma once

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/attention/epilogue.hpp"
#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/mask.hpp"
#include "cuda/attention/paged_kv.hpp"
#include "cuda/attention/scheduler.hpp"
#include "cuda/attention/softmax.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

using Barrier = cutlass::arch::ClusterBarrier;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

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

// The producer warpgroup's named barrier (1; window_bias uses it too).
__device__ __forceinline__ void producer_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kWindowBlocks) : "memory");
}

// kv_copied[s] and q_copied expect one arrival from each producer thread, which fires once that
// thread's cp.async copies so far have landed (`.noinc`: the arrival counts against the
// barrier's expected count). Every producer thread arrives, whether it copied anything or not.
__device__ __forceinline__ void arrive_when_copied(uint64_t& bar) {
  cutlass::arch::cpasync_barrier_arrive_noinc(&bar);
}

// Bias of column c of a mean window (block j = first_block + c): ln |B_J| in raw-score units
// (the softmax applies the scale) for a block fully visible to the tile and listed by no CSR
// entry of the segment (Eq. 6), else -inf. The producer warpgroup first writes every column as if
// unlisted, then, after a warpgroup barrier, strikes the blocks its share of the segment's
// entries falls in. Called by all kProducerThreads (= kBlockN) threads.
__device__ inline void window_bias(const AttentionParams& p, const Traversal& trav,
                                   const BlockGeometry& blocks, int32_t first_block, float* bias,
                                   int thread) {
  constexpr int kThreads = kWindowBlocks;
  const int32_t j = first_block + thread;
  bias[thread] = j < trav.visible_blocks ? log2f(float(blocks.count(j))) / p.scale_log2 : -INFINITY;
  producer_sync();
  for (int64_t e = trav.csr_end - trav.num_exact + thread; e < trav.csr_end; e += kThreads) {
    const int32_t t = p.idx[e];
    if (t < 0) continue;
    const int32_t jt = blocks.block_of_tile(t);
    // A tile past the request's last block lists nothing (end_tile <= t).
    if (jt >= first_block && jt < first_block + kThreads && t < blocks.end_tile(jt))
      bias[jt - first_block] = -INFINITY;
  }
}

// Named barriers: 0 is __syncthreads, 1 the producer warpgroup's (window_bias), kTurnBarrier + w
// the turn of consumer warpgroup w, and kStagingBarrier + 2 parity + w tells consumer warpgroup w
// that the other one's last S = Q K^T of an item (of that parity) has landed (Mainloop::consume).
inline constexpr int kTurnBarrier = 2;
inline constexpr int kStagingBarrier = 4;

template <class Traits>
struct Mainloop {
  using Element = typename Traits::Element;
  using Storage = typename Traits::SharedStorage;
  static constexpr int kStages = Traits::kStages;
  static_assert(Traits::kProducerThreads == kWindowBlocks && Traits::kBlockN == kWindowBlocks,
                "a mean window gives each producer thread one column");

  // The shared-memory buffers as CuTe tensors: the Q tile, the K stages and the V^T stages.
  __device__ static auto smem_tensors(Storage& ss) {
    using namespace cute;
    return cute::make_tuple(
        make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{}),
        make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{}),
        make_tensor(make_smem_ptr(ss.vt.data()), typename Traits::SmemLayoutVt{}));
  }

  // Stages are published on kv_loaded[stage] by thread 0's arrival plus the bytes of the
  // stage's TMA boxes. A stage with cp.async rows also completes kv_copied[stage], on which every
  // producer thread's cp.async.mbarrier.arrive fires once its copies land, so the producer never
  // waits on a copy and runs ahead by up to kStages stages, across items.
  // With each stage goes its StageInfo (what it holds, whether it is the item's last), so the
  // consumers never read the index themselves. An item without stages still sends one empty
  // stage: the consumers learn from it that the item has ended.
  // The item's Q tile follows its first stage: that stage's buffer frees before the consumers
  // have finished the previous item's last S = Q K^T, which the Q buffer waits for.
  // next_item() runs once, after Q and once at most kClaimAheadIterations iterations are left
  // (the scheduler claims and decodes the following item while the buffers are still busy).
  template <class NextItem>
  __device__ static void produce(const AttentionParams& p, const WorkTile& w,
                                 const Traversal& trav, Storage& ss, StageCursor<kStages>& cur,
                                 uint32_t q_phase, NextItem&& next_item) {
    using namespace cute;
    auto [sQ, sK, sVt] = smem_tensors(ss);
    const int thread = threadIdx.x % Traits::kProducerThreads;
    const TileLoader<Traits> loader{p, w, thread};
    const BlockGeometry blocks{p.block_size, w.seq.len_kv};
    StageSequence sequence(trav);
    bool q_issued = false, next_claimed = false;
    auto claim_next = [&] {
      if (q_issued && !next_claimed && trav.last - sequence.i <= kClaimAheadIterations) {
        next_claimed = true;
        next_item();
      }
    };

    // Paged pools with the run table (p.tma_runs): two adjacent tiles from an even one whose
    // 128 keys lie back to back in the pool come in one pair box, whatever the page size. The
    // stages read the table only when the request has such a pair at all (entry 0): read for
    // every stage, it cost shuffled pools that never pair 2-4 %.
    // (A flag, not a pointer to the request's row: one register fewer, and the producer's
    // whole-tile path then spills nothing.)
    bool request_runs = false;
    if constexpr (Traits::kRuns)
      request_runs = p.tma_runs && p.pair_rows[int64_t(w.b) * (1 + p.max_pairs)] != 0;

    Stage stage = sequence.next(p);
    bool first = true;
    do {
      // The following stage's tile ids are read from the index before waiting for this stage's
      // buffer (Eq. 17); they also tell whether this stage is the item's last.
      const Stage following = stage.kind == StageKind::kEnd ? stage : sequence.next(p);
      claim_next();
      // Paged KV by TMA in boxes smaller than a tile: the producer's threads look up the pages
      // of the stage's boxes (one each, spread over the four warps) before the buffer frees, so
      // that the page-table latency overlaps the wait. (Whole-tile boxes, whose pages thread 0
      // looks up after the wait, ran faster that way: H200, dense 32K, pages of 64 keys 1.16x
      // contiguous against 1.27x, of 128 keys 1.01x against 1.10x.)
      const bool paged_boxes_by_lane = Traits::kPaged && p.tma && p.tma_box_rows < kKvTile &&
                                       stage.kind == StageKind::kExactTiles;
      const int32_t box_row =
          paged_boxes_by_lane ? loader.paged_box_row(stage.tile0, stage.tile1) : 0;
      barrier(ss.kv_consumed[cur.index]).wait(cur.phase ^ 1u);
      uint64_t* bar = &ss.kv_loaded[cur.index];
      StageInfo info{stage.tile0, stage.tile1, stage.first_block, stage.kind,
                     following.kind == StageKind::kEnd, false};
      int32_t run_row = -1;
      if constexpr (Traits::kRuns) {
        if (request_runs && stage.kind == StageKind::kExactTiles && stage.tile1 >= 0) {
          const int32_t lo = stage.tile0 < stage.tile1 ? stage.tile0 : stage.tile1;
          if (stage.tile0 + stage.tile1 == 2 * lo + 1 && lo % 2 == 0)
            run_row = p.pair_rows[int64_t(w.b) * (1 + p.max_pairs) + 1 + lo / 2];
        }
      }
      if (run_row >= 0) {
        info.tile0 = info.tile0 < info.tile1 ? info.tile0 : info.tile1;
        info.tile1 = info.tile0 + 1;
        if (thread == 0) {
          ss.stage_info[cur.index] = info;
          TxBarrier::arrive_and_expect_tx(bar, 2 * Traits::kTileTmaBytes);
          loader.tma_kv_pair(sK, sVt, run_row, cur.index, bar);
        }
      } else if (stage.kind == StageKind::kExactTiles) {
        // Full tiles come by TMA where the maps cover the KV (thread 0 expects their bytes and,
        // for contiguous KV, issues them); the rest by cp.async. A stage with one tile leaves its
        // upper half as it was: the consumers mask those columns of S and skip them in P V.
        const bool has1 = stage.tile1 >= 0;
        const bool tma0 = loader.tma_tile(stage.tile0), tma1 = has1 && loader.tma_tile(stage.tile1);
        const bool copy0 = !tma0, copy1 = has1 && !tma1;
        const uint32_t tma_bytes = (int(tma0) + int(tma1)) * Traits::kTileTmaBytes;
        info.generic_writes = copy0 || copy1;
        auto tma_tiles = [&] {  // thread 0: the stage's full tiles, in whole-tile boxes
          if constexpr (Traits::kPaged) {
            // Both rows first: each is a page-table load, and the two overlap.
            const int32_t row0 = tma0 ? loader.tma_row(stage.tile0) : 0;
            const int32_t row1 = tma1 ? loader.tma_row(stage.tile1) : 0;
            if (tma0) loader.tma_kv_tile(sK, sVt, row0, 0, cur.index, bar);
            if (tma1) loader.tma_kv_tile(sK, sVt, row1, 1, cur.index, bar);
          } else {
            if (tma0) loader.tma_kv_tile(sK, sVt, loader.tma_row(stage.tile0), 0, cur.index, bar);
            if (tma1) loader.tma_kv_tile(sK, sVt, loader.tma_row(stage.tile1), 1, cur.index, bar);
          }
        };
        // Boxes smaller than a tile: each producer thread with a box issues it (no ordering
        // against thread 0's expect; the stage cannot complete before thread 0 arrives).
        auto paged_boxes = [&] {
          loader.tma_kv_boxes(sK, sVt, stage.tile0, stage.tile1, box_row, cur.index, bar);
        };
        if (!info.generic_writes) {
          // The common case: thread 0's one arrival, with the bytes to expect, is all it takes.
          // Two adjacent tiles (every two-tile dense stage; in sparse mode, stages that pair
          // the tiles of one selected block) come in one box per operand, the lower tile first.
          const int32_t lo = stage.tile0 < stage.tile1 ? stage.tile0 : stage.tile1;
          // Paged, thread 0 decides below, once it knows the tiles' rows.
          const bool pair = p.tma_pair && has1 && stage.tile0 + stage.tile1 == 2 * lo + 1 &&
                            !Traits::kPaged;
          if (pair) {
            info.tile0 = lo;
            info.tile1 = lo + 1;
          }
          if (paged_boxes_by_lane) {  // no pairs: those need pages of a multiple of 64 keys
            if (thread == 0) {
              ss.stage_info[cur.index] = info;
              TxBarrier::arrive_and_expect_tx(bar, tma_bytes);
            }
            paged_boxes();
          } else if (thread == 0) {
            if constexpr (Traits::kPaged) {
              // Whole-tile boxes. Adjacent tiles whose rows lie back to back in the pool (in one
              // page, or in consecutive pages) are a pair. Inside one page, one page-table load
              // gives both rows. (Sharing `adjacent` with the contiguous `pair` above changes
              // ptxas's schedule of the contiguous kernel: kept apart.)
              const bool adjacent = has1 && stage.tile0 + stage.tile1 == 2 * lo + 1;
              int32_t row0, row1;
              if (adjacent) {
                const int32_t row_lo = loader.tma_row(lo);
                const bool one_page = p.page_div.mod(lo * kKvTile) + 2 * kKvTile <= p.page_size;
                const int32_t row_hi = one_page ? row_lo + kKvTile : loader.tma_row(lo + 1);
                row0 = lo == stage.tile0 ? row_lo : row_hi;
                row1 = lo == stage.tile0 ? row_hi : row_lo;
              } else {
                row0 = loader.tma_row(stage.tile0);
                row1 = has1 ? loader.tma_row(stage.tile1) : 0;
              }
              const int32_t row_lo = lo == stage.tile0 ? row0 : row1;
              const bool paged_pair =
                  p.tma_pair && adjacent && (lo == stage.tile0 ? row1 : row0) == row_lo + kKvTile;
              if (paged_pair) {
                info.tile0 = lo;
                info.tile1 = lo + 1;
              }
              ss.stage_info[cur.index] = info;
              TxBarrier::arrive_and_expect_tx(bar, tma_bytes);
              if (paged_pair) {
                loader.tma_kv_pair(sK, sVt, row_lo, cur.index, bar);
              } else {
                loader.tma_kv_tile(sK, sVt, row0, 0, cur.index, bar);
                if (has1) loader.tma_kv_tile(sK, sVt, row1, 1, cur.index, bar);
              }
            } else {
              ss.stage_info[cur.index] = info;
              TxBarrier::arrive_and_expect_tx(bar, tma_bytes);
              if (pair) loader.tma_kv_pair(sK, sVt, loader.tma_row(lo), cur.index, bar);
              else tma_tiles();
            }
          }
        } else {
          // Some of the stage comes by cp.async: thread 0 publishes the stage (and its TMA
          // bytes) as above, and every producer thread arrives on kv_copied when its copies land.
          if (thread == 0) {
            // kv_copied[s] advances only on such stages: thread 0 counts them per buffer.
            info.copied_phase = (ss.copied_phases >> cur.index) & 1u;
            ss.copied_phases ^= 1u << cur.index;
            ss.stage_info[cur.index] = info;
            TxBarrier::arrive_and_expect_tx(bar, tma_bytes);
            if (!paged_boxes_by_lane) tma_tiles();
          }
          if (paged_boxes_by_lane) paged_boxes();
          if (copy0) loader.load_kv_tile(sK, sVt, stage.tile0, 0, cur.index);
          if (copy1) loader.load_kv_tile(sK, sVt, stage.tile1, 1, cur.index);
          arrive_when_copied(ss.kv_copied[cur.index]);
        }
      } else if (stage.kind == StageKind::kMeanWindow) {
        // Mean window: thread 0 fetches the surrogate keys by TMA while the warpgroup writes the
        // column biases; thread 0 arrives once every thread's bias writes are done.
        if (thread == 0) {
          ss.stage_info[cur.index] = info;
          TxBarrier::expect_transaction(bar, 2 * Traits::kTileTmaBytes);
          loader.tma_mean_window(sK, sVt, stage.first_block, cur.index, bar);
        }
        window_bias(p, trav, blocks, stage.first_block, ss.column_bias[cur.index], thread);
        producer_sync();
        if (thread == 0) arrive_ordered(*bar);
      } else if (thread == 0) {
        ss.stage_info[cur.index] = info;  // the item has no stage at all
        arrive_ordered(*bar);
      }
      if (first) {
        barrier(ss.q_consumed).wait(q_phase ^ 1u);
        if (p.q_tma) {
          if (thread == 0) {
            TxBarrier::arrive_and_expect_tx(&ss.q_loaded, Traits::kQTmaBytes);
            loader.tma_q(sQ, &ss.q_loaded);
          }
        } else {
          loader.load_q(sQ);
          arrive_when_copied(ss.q_copied);
        }
        q_issued = true;
        first = false;
      }
      cur.advance();
      stage = following;
    } while (stage.kind != StageKind::kEnd);
    claim_next();  // nothing is left: fires now if it has not yet
  }

  // Intra-warpgroup overlap (Eq. 14): while the softmax of stage n runs on the CUDA cores, the
  // tensor cores finish P_{n-1} V_{n-1}; S_n = Q K_n is issued before both, and O is rescaled
  // while S_n runs. The two consumer warpgroups take turns issuing their wgmmas (named barriers
  // kTurnBarrier + warpgroup), so one warpgroup's softmax runs while the other's wgmmas do.
  // The cursor carries the pipeline position from item to item; q_phase is the item's parity.
  __device__ static void consume(const AttentionParams& p, const WorkTile& w, Storage& ss,
                                 StageCursor<kStages>& cur, uint32_t q_phase) {
    using namespace cute;
    auto [sQ, sK, sVt] = smem_tensors(ss);
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

    // S for the stage's kind: mask exact tiles that reach past pmin, shift mean windows.
    auto to_logits = [&](int buffer, const StageInfo& info) {
      if (info.kind == StageKind::kExactTiles) {
        const int32_t tiles[2] = {info.tile0, info.tile1};
        if (stage_needs_mask(tiles, pmin)) mask_exact(s, s_coord, tiles, pos);
      } else {
        shift_means(s, s_coord, ss.column_bias[buffer]);
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
    // One arrival per consumer warp once the warp's wgmmas no longer read the buffer.
    auto release = [&](int buffer) {
      __syncwarp();
      if (threadIdx.x % 32 == 0) barrier(ss.kv_consumed[buffer]).arrive();
    };
    // The same for the Q tile, after the item's last S = Q K^T has landed.
    auto release_q = [&]() {
      __syncwarp();
      if (threadIdx.x % 32 == 0) barrier(ss.q_consumed).arrive();
    };
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
    auto to_p = [&]() {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) rP(i) = Element(tSrS(i));
    };
    // Turns: wait for the other warpgroup's wgmmas to be issued, then hand the turn back.
    const int wg = thread / 128;
    auto turn_begin = [&] {
      asm volatile("bar.sync %0, %1;\n" ::"r"(kTurnBarrier + wg), "n"(Traits::kConsumerThreads)
                   : "memory");
    };
    auto turn_end = [&] {
      asm volatile("bar.arrive %0, %1;\n" ::"r"(kTurnBarrier + 1 - wg),
                   "n"(Traits::kConsumerThreads)
                   : "memory");
    };

    // The finished tile goes out through the K half of the item's last stage (staged_store):
    // each warpgroup overwrites its 64 rows of it once its last P V has landed and the other
    // warpgroup's last S = Q K^T, which read all of it, has too (a named barrier per parity of
    // q_phase, so a warpgroup that runs ahead into the next item cannot pass it twice).
    static_assert(Traits::kBlockM <= Traits::kBlockN, "the tile's rows fit in a stage's K half");
    const bool staged = staged_store(p);
    const int staging_barrier = kStagingBarrier + 2 * int(q_phase);
    auto last_qk_landed = [&] {
      release_q();
      if (staged)
        asm volatile("bar.arrive %0, %1;\n" ::"r"(staging_barrier + 1 - wg),
                     "n"(Traits::kConsumerThreads)
                     : "memory");
    };

    clear(tOrO);
    OnlineSoftmax softmax(p.scale_log2);
    float factors[2];
    float lse[2];
    wait_ordered(p.q_tma ? ss.q_loaded : ss.q_copied, q_phase);
    cutlass::arch::fence_view_async_shared();
    StageInfo info = wait_loaded(cur.index, cur.phase);
    if (info.kind == StageKind::kEnd) {  // an item without stages: zero rows, LSE -inf
      release(cur.index);
      release_q();
      cur.advance();
      softmax.finalize(o, lse);
      store_tile<Element, Traits::kHeadDim>(p, w, o, o_coord, lse);
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
        softmax.update(s, factors);
        to_p();
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
          softmax.update(s, factors);
          warpgroup_wait<0>();
          release(prev);
          to_p();
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
        softmax.finalize(o, lse);
        if (staged) {
          asm volatile("bar.sync %0, %1;\n" ::"r"(staging_barrier + wg),
                       "n"(Traits::kConsumerThreads)
                       : "memory");
          char* staging = reinterpret_cast<char*>(&sK(0, 0, prev)) +
                          wg * (Traits::kBlockM / 2) * Traits::kHeadDim * int(sizeof(Element));
          store_tile_staged<Element, Traits::kHeadDim>(p, w, o, o_coord, lse, staging);
          cutlass::arch::fence_view_async_shared();  // before TMA refills the stage
          release(prev);
        } else {
          release(prev);
          store_tile<Element, Traits::kHeadDim>(p, w, o, o_coord, lse);
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
