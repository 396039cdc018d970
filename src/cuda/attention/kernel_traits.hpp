// Tile shapes, wgmma atoms and shared-memory layouts of the attention kernel.
//
// One CTA = one producer warpgroup + two consumer warpgroups. A query tile is FP_TILE_ROWS = 128
// PackGQA rows (64 per consumer warpgroup). One pipeline stage holds two 64-token KV tiles, i.e.
// two CSR entries that need not be adjacent, so every wgmma is 128 keys wide.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "core/geometry.hpp"
#include "cuda/attention/params.hpp"
#include "cuda/attention/scheduler.hpp"
#include "cuda/attention/traversal.hpp"

namespace flashprefill::cuda::attention {

using namespace cute;

// Element: the operand type of Q, K, V and P on the tensor cores; ElementOut: the output's (the
// same 16-bit type; for e4m3 operands bf16, or fp16 when asked). kLayout: contiguous KV, a paged cache (params'
// paged), or a paged cache with the run table (params' tma_runs); a kernel each (params.hpp
// KvLayout).
//
// e4m3 operands (kFp8, Eq. 15; docs/KERNEL.md "FP8 e4m3"): FP8 wgmma takes both operands K-major,
// so V comes transposed (keys contiguous) from the transpose step of transpose_v.cuh, with the
// keys of every 32-key group permuted so that the S accumulator, converted to e4m3 in place, is
// already the A operand of P V (fp8.hpp). Contiguous KV (a paged cache is gathered into it by
// the transpose step), every tile by TMA.
// ElementOut_: void for the default output type, or (e4m3) cutlass::half_t for float16.
template <class Element_, int kHeadDim_, KvLayout kLayout, class ElementOut_ = void>
struct KernelTraits {
  using Element = Element_;
  static constexpr bool kFp8 = std::is_same_v<Element_, cutlass::float_e4m3_t>;
  using ElementOut =
      std::conditional_t<!std::is_void_v<ElementOut_>, ElementOut_,
                         std::conditional_t<kFp8, cutlass::bfloat16_t, Element_>>;
  using ElementAccum = float;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kPaged = kLayout != KvLayout::kContiguous;
  static constexpr bool kRuns = kLayout == KvLayout::kPagedRuns;
  static_assert(!kFp8 || !kPaged, "e4m3: contiguous KV (a paged cache is gathered first)");
  static constexpr int kBlockM = kTileRows;   // PackGQA rows per query tile
  static constexpr int kTilesPerStage = 2;
  static constexpr int kBlockN = kTilesPerStage * kKvTile;  // keys per stage
  // A stage of 16-bit D = 128 operands is 64 KB; of e4m3 ones (or 16-bit D = 64) 32 KB.
  static constexpr int kStages = kHeadDim * int(sizeof(Element)) == 256 ? 3 : 5;
  static constexpr int kProducerThreads = 128;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // setmaxnreg budgets: the consumers' increase must fit in what the producer releases from the
  // launch allocation (65536 / 384 rounded down to 168 per thread), or setmaxnreg.inc waits forever.
  // 56 for the producer: with 40 its per-item state (scheduler, Q copy) spilled to local memory,
  // and the consumers need no more than 224 (no spills at D = 128).
  static constexpr int kLaunchRegs = 168;
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 224;
  static_assert(kProducerRegs * kProducerThreads + kConsumerRegs * kConsumerThreads <=
                kLaunchRegs * (kProducerThreads + kConsumerThreads));
  static constexpr int kChunk = 16 / sizeof(Element);  // elements per 16-byte copy

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayout = Layout<Shape<_2, _1, _1>>;  // one 64-row atom per consumer warpgroup

  // S = Q K^T: A = Q and B = K both from shared memory, K-major.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum,
                           Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  // O += P V: A = P from registers, B = V^T from shared memory: head dim contiguous (MN-major)
  // for 16-bit operands, keys contiguous (K-major, the only FP8 form) for e4m3.
  static constexpr GMMA::Major kMajorVt = kFp8 ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, kMajorVt>(),
      AtomLayout{}));

  // Q and K rows (head dim contiguous) in 128-byte swizzle rows, or 64-byte ones where a row is
  // 64 bytes (e4m3, D = 64).
  static constexpr int kRowBytes = kHeadDim * int(sizeof(Element));
  using AtomQK = std::conditional_t<kRowBytes % 128 == 0, GMMA::Layout_K_SW128_Atom<Element>,
                                    GMMA::Layout_K_SW64_Atom<Element>>;
  using SmemLayoutQ = decltype(tile_to_shape(AtomQK{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(AtomQK{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // Keys before head-dim halves (Step<_2, _1, _3>): each 64-wide half of the head dimension holds
  // the stage's keys as consecutive swizzled 128-byte rows, exactly as in SmemLayoutK, so one
  // 64 x 64 TMA box (or 64 cp.async rows) fills a KV tile's half of either operand.
  // e4m3: keys contiguous in 64-byte swizzle rows, head-dim rows first (the atom's default
  // order), so each KV tile's half is one contiguous 64-key x kHeadDim block: one TMA box of
  // the transposed V.
  using AtomVt = std::conditional_t<kFp8, GMMA::Layout_K_SW64_Atom<Element>,
                                    GMMA::Layout_MN_SW128_Atom<Element>>;
  using StepVt = std::conditional_t<kFp8, Step<_1, _2, _3>, Step<_2, _1, _3>>;
  using SmemLayoutVt = decltype(tile_to_shape(
      AtomVt{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, StepVt{}));
  // TMA box: 64 keys x one swizzle row of head-dim elements (64 of 16 bits = 8 KB; e4m3, 128 or,
  // at D = 64, 64); a KV tile is kHeadDim / kBoxCols boxes per operand.
  static constexpr int kBoxCols = kRowBytes < 128 ? kHeadDim : 128 / int(sizeof(Element));
  static constexpr uint32_t kTileTmaBytes = uint32_t(2 * kKvTile * kHeadDim * sizeof(Element));
  static constexpr uint32_t kQTmaBytes = uint32_t(kBlockM * kHeadDim * sizeof(Element));

  // The S accumulator ((2, 2, N/8), 1, 1) reread as the wgmma A-register operand
  // ((2, 2, 2), 1, N/16): both hold (col pair, row + 8, col + 8) in the same order. e4m3: the
  // A operand's own compact layout ((4, 2, 2), 1, N/32), (col quad, row + 8, col + 16), which
  // fp8.hpp's convert_p fills from the accumulator.
  using LayoutP16 = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>,
                           Stride<Stride<_1, _2, _4>, _0, _8>>;
  using LayoutP8 = Layout<Shape<Shape<_4, _2, _2>, _1, Int<kBlockN / 32>>,
                          Stride<Stride<_1, _4, _8>, _0, _16>>;
  using LayoutP = std::conditional_t<kFp8, LayoutP8, LayoutP16>;
  // The finished tile is written through a stage's K half when it fits there (store_tile_staged).
  static constexpr bool kStagedStore = kBlockM * sizeof(ElementOut) <= kBlockN * sizeof(Element);

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutVt>, 1024> vt;
    float column_bias[kStages][kBlockN];  // mean windows: log2 |B_J| / scale_log2, or -inf
    StageInfo stage_info[kStages];        // what each stage holds (traversal.hpp)
    ScheduledWork work[2];                // the scheduler's ring of decoded items
    ItemDecoder decoder;                  // thread 0's decoder state
    uint32_t copied_phases;               // thread 0: bit s, the next parity of kv_copied[s]
    alignas(8) uint64_t q_loaded;         // thread 0's arrival and the Q box's bytes (TMA)
    uint64_t q_copied;                    // every producer thread's cp.async copies of Q
    uint64_t q_consumed;                  // the consumers' last S = Q K^T of an item is done
    uint64_t kv_loaded[kStages];          // thread 0's arrival (stage info) and TMA bytes
    uint64_t kv_copied[kStages];          // every producer thread's cp.async copies
    uint64_t kv_consumed[kStages];
    uint64_t work_full[2], work_empty[2];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared storage exceeds the sm_90 limit");

  // The shared-memory buffers as CuTe tensors: the Q tile, the K stages and the V^T stages.
  __device__ static auto smem_tensors(SharedStorage& ss) {
    return cute::make_tuple(make_tensor(make_smem_ptr(ss.q.data()), SmemLayoutQ{}),
                            make_tensor(make_smem_ptr(ss.k.data()), SmemLayoutK{}),
                            make_tensor(make_smem_ptr(ss.vt.data()), SmemLayoutVt{}));
  }
};

}  // namespace flashprefill::cuda::attention
