// The producer role of the warp-specialized mainloop (kernel.cuh), run once per work item by
// warpgroup 0: it walks the item's StageSequence (traversal.hpp) and fills the shared-memory
// stages, each with its StageInfo, from the loaders: exact KV tiles (load_kv.hpp, paged addressing
// in paged_kv.hpp), mean windows (mean_correction.hpp) and, after the first stage, the Q tile
// (load_q.hpp). The consumer role is consumer.hpp's; docs/KERNEL.md has the whole picture.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "core/geometry.hpp"
#include "cuda/attention/barriers.hpp"
#include "cuda/attention/kernel_traits.hpp"
#include "cuda/attention/load_kv.hpp"
#include "cuda/attention/load_q.hpp"
#include "cuda/attention/mean_correction.hpp"
#include "cuda/attention/paged_kv.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/scheduler.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

template <class Traits>
struct Producer {
  using Storage = typename Traits::SharedStorage;
  static constexpr int kStages = Traits::kStages;
  static_assert(Traits::kProducerThreads == kWindowBlocks && Traits::kBlockN == kWindowBlocks &&
                    Traits::kProducerThreads == kWarpgroupThreads,
                "a mean window gives each producer thread one column");

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
    auto [sQ, sK, sVt] = Traits::smem_tensors(ss);
    const int thread = threadIdx.x % Traits::kProducerThreads;
    const QLoader<Traits> q_loader{p, w, thread};
    const KvLoader<Traits> kv_loader{p, w, thread};
    const PagedKv<Traits> paged{p, w, thread};
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
    if constexpr (Traits::kRuns) request_runs = paged.request_runs();

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
          paged_boxes_by_lane ? paged.box_row(stage.tile0, stage.tile1) : 0;
#ifdef FP_PRODUCER_LAG_NS
      // A check build (CMake FP_PRODUCER_LAG_NS): threads 1-127 reach every wait late, so that
      // a wait the barrier below does not cover shows as a hang.
      if (thread != 0) __nanosleep(FP_PRODUCER_LAG_NS);
#endif
      barrier(ss.kv_consumed[cur.index]).wait(cur.phase ^ 1u);
      // Every producer thread passes the wait before thread 0 refills the buffer, so that none
      // falls a round of the ring behind and waits on a parity whose phase never comes
      // (docs/KERNEL.md, "The producer's barrier").
      producer_sync();
      uint64_t* bar = &ss.kv_loaded[cur.index];
      StageInfo info{stage.tile0, stage.tile1, stage.first_block, stage.kind,
                     following.kind == StageKind::kEnd, false};
      int32_t run_row = -1;
      if constexpr (Traits::kRuns) {
        if (request_runs && stage.kind == StageKind::kExactTiles && stage.tile1 >= 0)
          run_row = paged.run_row(stage.tile0, stage.tile1);
      }
      if (run_row >= 0) {
        info.tile0 = info.tile0 < info.tile1 ? info.tile0 : info.tile1;
        info.tile1 = info.tile0 + 1;
        if (thread == 0) {
          ss.stage_info[cur.index] = info;
          TxBarrier::arrive_and_expect_tx(bar, 2 * Traits::kTileTmaBytes);
          kv_loader.tma_kv_pair(sK, sVt, run_row, cur.index, bar);
        }
      } else if (stage.kind == StageKind::kExactTiles) {
        // Full tiles come by TMA where the maps cover the KV (thread 0 expects their bytes and,
        // for contiguous KV, issues them); the rest by cp.async. A stage with one tile leaves its
        // upper half as it was: the consumers mask those columns of S and skip them in P V.
        const bool has1 = stage.tile1 >= 0;
        const bool tma0 = kv_loader.tma_tile(stage.tile0);
        const bool tma1 = has1 && kv_loader.tma_tile(stage.tile1);
        const bool copy0 = !tma0, copy1 = has1 && !tma1;
        const uint32_t tma_bytes = (int(tma0) + int(tma1)) * Traits::kTileTmaBytes;
        info.generic_writes = copy0 || copy1;
        auto tma_tiles = [&] {  // thread 0: the stage's full tiles, in whole-tile boxes
          if constexpr (Traits::kPaged) {
            // Both rows first: each is a page-table load, and the two overlap.
            const int32_t row0 = tma0 ? kv_loader.tma_row(stage.tile0) : 0;
            const int32_t row1 = tma1 ? kv_loader.tma_row(stage.tile1) : 0;
            if (tma0) kv_loader.tma_kv_tile(sK, sVt, row0, 0, cur.index, bar);
            if (tma1) kv_loader.tma_kv_tile(sK, sVt, row1, 1, cur.index, bar);
          } else {
            if (tma0)
              kv_loader.tma_kv_tile(sK, sVt, kv_loader.tma_row(stage.tile0), 0, cur.index, bar);
            if (tma1)
              kv_loader.tma_kv_tile(sK, sVt, kv_loader.tma_row(stage.tile1), 1, cur.index, bar);
          }
        };
        // Boxes smaller than a tile: each producer thread with a box issues it (no ordering
        // against thread 0's expect; the stage cannot complete before thread 0 arrives).
        auto paged_boxes = [&] {
          paged.tma_boxes(sK, sVt, stage.tile0, stage.tile1, box_row, cur.index, bar);
        };
        if (!info.generic_writes) {
          // The common case: thread 0's one arrival, with the bytes to expect, is all it takes.
          // Two adjacent tiles (every two-tile dense stage; in sparse mode, stages that pair
          // the tiles of one selected block) come in one box per operand, the lower tile first.
          const int32_t lo = stage.tile0 < stage.tile1 ? stage.tile0 : stage.tile1;
          // Paged, thread 0 decides below, once it knows the tiles' rows.
          // (e4m3: no pair maps for the transposed V.)
          const bool pair = p.tma_pair && has1 && stage.tile0 + stage.tile1 == 2 * lo + 1 &&
                            !Traits::kPaged && !Traits::kFp8;
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
              // ptxas's schedule of the contiguous kernel: kept apart. Computed in a function
              // of PagedKv, the rows and the pair changed ptxas's schedule of this path.)
              const bool adjacent = has1 && stage.tile0 + stage.tile1 == 2 * lo + 1;
              int32_t row0, row1;
              if (adjacent) {
                const int32_t row_lo = paged.tma_row(lo);
                const bool one_page = paged.one_page_pair(lo);
                const int32_t row_hi = one_page ? row_lo + kKvTile : paged.tma_row(lo + 1);
                row0 = lo == stage.tile0 ? row_lo : row_hi;
                row1 = lo == stage.tile0 ? row_hi : row_lo;
              } else {
                row0 = paged.tma_row(stage.tile0);
                row1 = has1 ? paged.tma_row(stage.tile1) : 0;
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
                kv_loader.tma_kv_pair(sK, sVt, row_lo, cur.index, bar);
              } else {
                kv_loader.tma_kv_tile(sK, sVt, row0, 0, cur.index, bar);
                if (has1) kv_loader.tma_kv_tile(sK, sVt, row1, 1, cur.index, bar);
              }
            } else {
              ss.stage_info[cur.index] = info;
              TxBarrier::arrive_and_expect_tx(bar, tma_bytes);
              if (pair) kv_loader.tma_kv_pair(sK, sVt, kv_loader.tma_row(lo), cur.index, bar);
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
          if (copy0) kv_loader.load_kv_tile(sK, sVt, stage.tile0, 0, cur.index);
          if (copy1) kv_loader.load_kv_tile(sK, sVt, stage.tile1, 1, cur.index);
          arrive_when_copied(ss.kv_copied[cur.index]);
        }
      } else if (stage.kind == StageKind::kMeanWindow) {
        // Mean window: thread 0 fetches the surrogate keys by TMA while the warpgroup writes the
        // column biases; thread 0 arrives once every thread's bias writes are done.
        if (thread == 0) {
          ss.stage_info[cur.index] = info;
          TxBarrier::expect_transaction(bar, 2 * Traits::kTileTmaBytes);
          tma_mean_window<Traits::kFp8>(p, w, sK, sVt, stage.first_block, cur.index, bar);
        }
        window_bias(p, trav, blocks, stage.first_block, ss.column_bias[cur.index], thread);
        producer_sync();
        if (thread == 0) arrive_ordered(*bar);
      } else if (thread == 0) {
        ss.stage_info[cur.index] = info;  // the item has no stage at all
        arrive_ordered(*bar);
      }
      if (first) {
        // Q by TMA is thread 0's alone, and so is the wait for its buffer (as above); Q by
        // cp.async takes every thread's copies, so each thread waits.
        if (!p.q_tma || thread == 0) barrier(ss.q_consumed).wait(q_phase ^ 1u);
        if (p.q_tma) {
          if (thread == 0) {
            TxBarrier::arrive_and_expect_tx(&ss.q_loaded, Traits::kQTmaBytes);
            q_loader.tma_q(sQ, &ss.q_loaded);
          }
        } else {
          q_loader.load_q(sQ);
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
};

}  // namespace flashprefill::cuda::attention
