// Stage 1b. Four warps hold the 128 PackGQA rows of the query tile (32 rows each) as mma.sync A
// fragments; the pooled keys stream through shared memory in chunks of 64 blocks, double
// buffered with cp.async. Per chunk: S = Q K_bar^T on the tensor cores, the running maximum M
// (Eq. 19), and the chunk's block energies E_J under that M. After the pass the energies are
// rescaled to the final maximum and thresholded together with the forced rules (Eq. 20). The
// grid is persistent so that each CTA can load its next query tile while finishing the current.
// An e4m3 query tile lands as bytes and is widened in shared memory to the bfloat16 operands
// (cuda/index/operand.cuh), which the pooling wrote rho(k_mean) in too.
#include "cuda/index/score_select.cuh"

#include <algorithm>
#include <cmath>

#include "cuda/index/operand.cuh"
#include "cuda/ptx.cuh"

namespace flashprefill::cuda::index {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = kTileRows / kWarps;  // 32 rows = two m16 tiles per warp
constexpr int kMTiles = kWarpRows / 16;
constexpr int kChunk = 64;                     // pooled keys per step of the pass
constexpr int kMinBlocksPerSm = 3;             // register budget: 65536 / (3 * 128) per thread
constexpr size_t kSmemReservedPerBlock = 1024; // shared memory the runtime keeps per CTA
constexpr int kNTiles = kChunk / 8;
constexpr uint32_t kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;  // the reference's float32 log2(e)

template <int D>
struct Layout {
  static constexpr int kRowVecs = D * 2 / 16;  // 16-byte vectors per row of a 16-bit tile
  static constexpr int kKSteps = D / 16;
  static constexpr size_t kQBytes = size_t(kTileRows) * D * 2;
  static constexpr size_t kChunkBytes = size_t(kChunk) * D * 2;
  // A CTA copies a tile kRowStep rows at a time, each thread one vector of each row; the step
  // keeps (row & 7), so a thread's swizzled offset advances by a constant.
  static constexpr int kRowStep = kThreads / kRowVecs;
  static constexpr int kRowStepElements = kRowStep * kRowVecs * 8;
  static_assert(kRowStep % 8 == 0);
  // Element offset of vector `vec` of row `row`: XOR-swizzled so that the eight rows one
  // ldmatrix phase reads fall in distinct banks.
  static __device__ __forceinline__ int offset(int row, int vec) {
    return (row * kRowVecs + (vec ^ (row & 7))) * 8;
  }
};

__host__ __device__ size_t padded_blocks(int32_t max_blocks) {
  return size_t((max_blocks + kChunk - 1) / kChunk) * kChunk;
}

// Shared memory: Q tile | two K_bar chunks | E_J | chunk maxima | cross-warp reductions.
struct Smem {
  char* base;
  size_t q_bytes, chunk_bytes, energies;
  __device__ void* q() const { return base; }
  __device__ void* chunk(int i) const { return base + q_bytes + i * chunk_bytes; }
  __device__ float* energy() const {
    return reinterpret_cast<float*>(base + q_bytes + 2 * chunk_bytes);
  }
  __device__ float* chunk_max() const { return energy() + energies; }
  __device__ float* warp_max() const { return chunk_max() + energies / kChunk; }
  __device__ float* warp_sums() const { return warp_max() + kWarps; }   // [kWarps][kChunk]
  __device__ int32_t* warp_tiles() const {
    return reinterpret_cast<int32_t*>(warp_sums() + kWarps * kChunk);
  }
};

// Where a unit's Q tile lands from global memory, in 16-byte copies: 16-bit q straight into the
// swizzled operand tile; e4m3 q as bytes, row-major, in the upper half of the operand tile's
// area, from which widen_q_tile makes the operand tile.
template <typename TQ, int D>
struct QLanding {
  static constexpr int kElems = 16 / sizeof(TQ);        // elements per 16-byte vector
  static constexpr int kRowVecs = D / kElems;           // vectors per row
  static constexpr int kRowStep = kThreads / kRowVecs;  // rows between a thread's copies
  static constexpr int kRowStepElements = kRowStep * D;
  static constexpr bool kE4m3 = IndexTypes<TQ>::kE4m3;
  static_assert(kE4m3 || kRowVecs == Layout<D>::kRowVecs);
  static __device__ __forceinline__ int offset(int row, int vec) {
    if constexpr (kE4m3) return (row * kRowVecs + vec) * kElems;
    else return Layout<D>::offset(row, vec);
  }
  static __device__ __forceinline__ TQ* area(const Smem& sm) {
    return reinterpret_cast<TQ*>(static_cast<char*>(sm.q()) + (kE4m3 ? Layout<D>::kQBytes / 2 : 0));
  }
};

// e4m3 q: widens the landed bytes in place into the bfloat16 operand tile, exactly. Operand rows
// 0 .. 63 fill the lower half of the area, below the bytes, and are written as they are read;
// rows 64 .. 127 fill the upper half, over the bytes, so all of theirs are read first. Kept out
// of line: inlined, it changes the register allocation of the whole unit loop (at D = 128, 92
// bytes of spills instead of the 16-bit kernels' 28).
template <int D>
__device__ __noinline__ void widen_q_tile(const Smem& sm) {
  using Land = QLanding<__nv_fp8_e4m3, D>;
  constexpr int kVecs = kTileRows * Land::kRowVecs / kThreads;  // 16-byte vectors per thread
  constexpr int kHalf = kVecs / 2;  // vectors k < kHalf lie in rows 0 .. 63
  const char* bytes = reinterpret_cast<const char*>(Land::area(sm));
  auto* tile = static_cast<__nv_bfloat16*>(sm.q());
  auto load = [&](int k) {
    return *reinterpret_cast<const uint4*>(bytes + (threadIdx.x + k * kThreads) * 16);
  };
  auto widen = [&](int k, const uint4& raw) {
    const int v = threadIdx.x + k * kThreads;
    const int row = v / Land::kRowVecs, vec = v % Land::kRowVecs;
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t pairs[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float x[4];
      widen_e4m3x4(words[w], x);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
        pairs[2 * w + i] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
    // Elements 16 vec .. 16 vec + 15: the operand tile's vectors 2 vec and 2 vec + 1.
    *reinterpret_cast<uint4*>(tile + Layout<D>::offset(row, 2 * vec)) =
        make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    *reinterpret_cast<uint4*>(tile + Layout<D>::offset(row, 2 * vec + 1)) =
        make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
  };
#pragma unroll
  for (int k = 0; k < kHalf; ++k) widen(k, load(k));
  uint4 upper[kHalf];
#pragma unroll
  for (int k = 0; k < kHalf; ++k) upper[k] = load(kHalf + k);
  __syncthreads();  // q_bytes_read
#pragma unroll
  for (int k = 0; k < kHalf; ++k) widen(kHalf + k, upper[k]);
  __syncthreads();  // q_widened
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int s = 16; s > 0; s /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, s));
  return v;
}

// One unit of work: the CSR segment (b, h, I). Units u = rank * (B * Hkv) + (b * Hkv + h) are
// numbered heavy-first (rank 0 is the range's last query tile, with the most candidate blocks)
// and dealt round-robin to the persistent CTAs; a cursor walks a CTA's units without dividing.
struct UnitCursor {
  int32_t rank = 0, bh = 0;  // u / (B * Hkv) and u % (B * Hkv)

  __device__ void advance(int32_t step_rank, int32_t step_bh, int32_t heads) {
    rank += step_rank;
    bh += step_bh;
    if (bh >= heads) {
      bh -= heads;
      ++rank;
    }
  }
};

// A unit's request geometry with every per-row quotient it needs taken once, by the
// precomputed divisors of the group size and the block size.
struct Unit {
  int32_t b, h, tile, num_tiles;
  int32_t packed_rows;         // g * L_q of the request
  int32_t pmin, pmax;          // positions of the tile's first and last packed rows (Eq. 13)
  int32_t candidates;          // blocks J <= pmax / bs, clipped to max_blocks
  int64_t segment;
  SeqGeometry seq;

  __device__ Unit(const ScoreParams& p, const UnitCursor& c) {
    const int32_t local = p.range_tiles - 1 - c.rank;
    tile = p.tile_begin + local;
    p.heads_kv.divmod(c.bh, b, h);
    seq = p.meta.seq(b);
    packed_rows = seq.group * seq.len_q;
    num_tiles = int32_t(ceil_div(packed_rows, kTileRows));
    segment = int64_t(c.bh) * p.range_tiles + local;
    if (empty()) return;
    const int32_t row0 = tile * kTileRows;
    pmin = seq.offset() + p.group.div(row0);
    pmax = seq.offset() + p.group.div(min(row0 + kTileRows, packed_rows) - 1);
    candidates = min(p.block.div(pmax) + 1, p.max_blocks);
  }
  __device__ bool empty() const { return tile >= num_tiles; }
  // The recent rule and alpha = 0 select every candidate: no scoring needed.
  __device__ bool dense(const ScoreParams& p) const {
    return tile >= num_tiles - p.rules.dense_recent_tiles || p.alpha == 0.f;
  }
};

// Issues the cp.async copies of a unit's 128 PackGQA rows (Eq. 12-13): packed row R -> query
// R / g of head h * g + R % g. A thread copies one 16-byte column of every kRowStep-th row: it
// divides once per tile, then steps its source by the quotient and remainder of kRowStep and
// carries into the next query when the head passes the group. Row arithmetic is 32-bit
// (build_index checks g * max_seqlen_q < 2^31). The tile lands as QLanding<TQ, D> says.
template <typename TQ, int D>
__device__ __forceinline__ void load_q_tile(const ScoreParams& p, const Unit& u, const Smem& sm) {
  using L = QLanding<TQ, D>;
  constexpr int kRowStep = L::kRowStep;
  const int32_t group = u.seq.group;
  const int vec = threadIdx.x % L::kRowVecs;
  const int first_row = threadIdx.x / L::kRowVecs;
  TQ* dst = L::area(sm) + L::offset(first_row, vec);
  int32_t packed = u.tile * kTileRows + first_row;
  int32_t query, head, step_query, step_head;
  p.group.divmod(packed, query, head);
  p.group.divmod(kRowStep, step_query, step_head);
  const int64_t step = int64_t(step_query) * p.q_stride_token + int64_t(step_head) * p.q_stride_head;
  const int64_t carry = p.q_stride_token - int64_t(group) * p.q_stride_head;
  const TQ* q = static_cast<const TQ*>(p.q);
  int64_t offset = int64_t(p.meta.cu_seqlens_q[u.b] + query) * p.q_stride_token +
                   int64_t(u.h * group + head) * p.q_stride_head + vec * L::kElems;
#pragma unroll 1
  for (int r = first_row; r < kTileRows; r += kRowStep, packed += kRowStep) {
    const bool valid = packed < u.packed_rows;
    cp_async_16(dst, valid ? q + offset : q, valid);
    dst += L::kRowStepElements;
    offset += step;
    head += step_head;
    if (head >= group) {
      head -= group;
      offset += carry;
    }
  }
  cp_async_commit();
}

// Scores and selects one non-empty unit. `prefetched` names the unit whose Q tile is already in
// flight to sm.q(); during the unit's last chunk the next unit's tile is prefetched there (the Q
// fragments live in registers by then), hiding its load behind this unit's tail. TQ: q's stored
// type; T: the operand type of the products.
template <typename TQ, int D>
__device__ __forceinline__ void process_unit(const ScoreParams& p, const Unit& unit,
                                             const Smem& sm, const UnitCursor& next_cursor,
                                             bool& prefetched) {
  using L = Layout<D>;
  using T = typename IndexTypes<TQ>::Operand;
  constexpr bool kE4m3 = IndexTypes<TQ>::kE4m3;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int32_t b = unit.b, h = unit.h, tile = unit.tile, num_tiles = unit.num_tiles;
  const SeqGeometry& seq = unit.seq;
  const BlockGeometry blocks{p.block_size, seq.len_kv};
  const int32_t pmin = unit.pmin;
  const int32_t causal_tiles = unit.pmax / kKvTile + 1;
  const int32_t candidates = unit.candidates;
  const int32_t num_chunks = (candidates + kChunk - 1) / kChunk;
  const bool dense = unit.dense(p);

  float running_max = -INFINITY;  // M of Eq. 19
  if (!dense) {
    const T* k_bar = static_cast<const T*>(p.k_rounded) +
                     (int64_t(b) * p.num_heads_kv + h) * p.max_blocks * D;
    auto load_chunk = [&](int c) {
      const int first_row = tid / L::kRowVecs, vec = tid % L::kRowVecs;
      T* dst = static_cast<T*>(sm.chunk(c & 1)) + L::offset(first_row, vec);
      int32_t block = c * kChunk + first_row;
      const T* src = k_bar + int64_t(block) * D + vec * 8;
#pragma unroll 1
      for (int r = first_row; r < kChunk; r += L::kRowStep) {
        const bool valid = block < candidates;
        cp_async_16(dst, valid ? src : k_bar, valid);
        dst += L::kRowStepElements;
        src += L::kRowStep * D;
        block += L::kRowStep;
      }
      cp_async_commit();
    };
    if (!prefetched) load_q_tile<TQ, D>(p, unit, sm);
    prefetched = false;
    load_chunk(0);

    // Row r of the tile may score block J when J * bs <= p(r): J <= last_block[r].
    int32_t last_block[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int32_t packed = tile * kTileRows + warp * kWarpRows + mt * 16 + lane / 4 + half * 8;
        last_block[mt][half] = packed < unit.packed_rows
                                   ? p.block.div(seq.offset() + p.group.div(packed))
                                   : -1;
      }

    cp_async_wait_committed();
    __syncthreads();  // q_tile_landed
    if constexpr (kE4m3) widen_q_tile<D>(sm);
    // x_rJ's factor (Eq. 19): scale * log2(e), times c_q c_k of the unit for e4m3 q and k.
    const float x_scale =
        kE4m3 ? p.scale * (p.q_descale(b, h) * p.k_descale(b, h)) * kLog2e : p.scale_log2;
    uint32_t qa[kMTiles][L::kKSteps][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < L::kKSteps; ++ks)
        ldmatrix_x4(qa[mt][ks], static_cast<const T*>(sm.q()) +
                                    L::offset(warp * kWarpRows + mt * 16 + lane % 16,
                                              ks * 2 + lane / 16));

    for (int c = 0; c < num_chunks; ++c) {
      cp_async_wait_committed();
      __syncthreads();  // chunk_landed: chunk c is in smem, chunk c - 1 is consumed
      if (c + 1 < num_chunks) {
        load_chunk(c + 1);
      } else if (next_cursor.rank < p.range_tiles) {
        const Unit next(p, next_cursor);
        if (!next.empty() && !next.dense(p)) {
          load_q_tile<TQ, D>(p, next, sm);
          prefetched = true;
        }
      }
      const T* kc = static_cast<const T*>(sm.chunk(c & 1));
      // Pairs of n8 tiles holding candidates; the rest of the last chunk is skipped (warp-uniform).
      const int live_pairs = min(kNTiles / 2, (candidates - c * kChunk + 15) / 16);

      float s[kMTiles][kNTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.f;
#pragma unroll
      for (int ks = 0; ks < L::kKSteps; ++ks)
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          if (np >= live_pairs) break;
          uint32_t kb[4];
          ldmatrix_x4(kb, kc + L::offset(np * 16 + lane % 8 + lane / 16 * 8, ks * 2 + lane / 8 % 2));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(s[mt][2 * np], qa[mt][ks], kb[0], kb[1]);
            mma_16816<T>(s[mt][2 * np + 1], qa[mt][ks], kb[2], kb[3]);
          }
        }

      // x_rJ = (q_r . rho(k_mean_J)) * scale * log2(e) (e4m3: * c_q c_k) over valid pairs; M
      // over the tile.
      const int32_t first = c * kChunk + lane % 4 * 2;
      float local_max = -INFINITY;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          if (nt / 2 >= live_pairs) break;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int32_t block = first + nt * 8 + i % 2;
            const float x = block <= last_block[mt][i / 2] ? s[mt][nt][i] * x_scale : -INFINITY;
            s[mt][nt][i] = x;
            local_max = fmaxf(local_max, x);
          }
        }
      local_max = warp_max(local_max);
      if (lane == 0) sm.warp_max()[warp] = local_max;
      __syncthreads();  // chunk_max_ready
#pragma unroll
      for (int w = 0; w < kWarps; ++w) running_max = fmaxf(running_max, sm.warp_max()[w]);

      // Eq. 19: this chunk's E_J = sum over valid rows of 2^(x_rJ - M).
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        if (nt / 2 >= live_pairs) break;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float sum = 0.f;
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
            sum += fast_exp2(s[mt][nt][e] - running_max) + fast_exp2(s[mt][nt][e + 2] - running_max);
#pragma unroll
          for (int stride = 4; stride < 32; stride *= 2)
            sum += __shfl_xor_sync(kFullMask, sum, stride);
          if (lane < 4) sm.warp_sums()[warp * kChunk + nt * 8 + lane * 2 + e] = sum;
        }
      }
      __syncthreads();  // chunk_sums_ready
      if (tid < kChunk) {
        float energy = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) energy += sm.warp_sums()[w * kChunk + tid];
        sm.energy()[c * kChunk + tid] = energy;
      }
      if (tid == 0) sm.chunk_max()[c] = running_max;
    }
    __syncthreads();  // energies_ready

    // Eq. 20: rescale E_J from its chunk's maximum M_c to the final M; E_max over blocks.
    float peak = 0.f;
    for (int32_t j = tid; j < candidates; j += kThreads) {
      const float energy =
          sm.energy()[j] * fast_exp2(sm.chunk_max()[j / kChunk] - running_max);
      sm.energy()[j] = energy;
      peak = fmaxf(peak, energy);
    }
    peak = warp_max(peak);
    if (lane == 0) sm.warp_max()[warp] = peak;
    __syncthreads();  // peak_ready
  }

  // Eq. 20 selection, one 32-block mask word per warp step; tiles clipped to t < T_c(I).
  float threshold = 0.f;
  if (!dense) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) threshold = fmaxf(threshold, sm.warp_max()[w]);
    threshold *= p.alpha;
  }
  uint32_t* mask = p.mask + unit.segment * p.mask_words;
  int32_t tiles = 0;
  for (int32_t word = warp; word * 32 < candidates; word += kWarps) {
    const int32_t block = word * 32 + lane;
    bool selected = block < candidates;
    if (selected && !dense)
      selected = p.rules.forced(blocks, block, pmin, tile, num_tiles) ||
                 sm.energy()[block] >= threshold;
    const uint32_t bits = __ballot_sync(kFullMask, selected);
    if (lane == 0) mask[word] = bits;
    if (selected) tiles += min(blocks.end_tile(block), causal_tiles) - blocks.first_tile(block);
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) tiles += __shfl_xor_sync(kFullMask, tiles, s);
  if (lane == 0) sm.warp_tiles()[warp] = tiles;
  __syncthreads();  // tile_counts_ready
  if (tid == 0) {
    int32_t total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sm.warp_tiles()[w];
    p.counts[unit.segment] = total;
  }
  __syncthreads();  // unit_done: the next unit may rewrite warp_tiles and the energies
}

template <typename TQ, int D>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) score_select_kernel(const ScoreParams p) {
  using L = Layout<D>;
  extern __shared__ __align__(128) char smem_raw[];
  const Smem sm{smem_raw, L::kQBytes, L::kChunkBytes, padded_blocks(p.max_blocks)};
  const int32_t heads = p.batch * p.num_heads_kv;
  const int32_t step_rank = int32_t(gridDim.x) / heads, step_bh = int32_t(gridDim.x) % heads;
  UnitCursor cursor;
  cursor.rank = int32_t(blockIdx.x) / heads;
  cursor.bh = int32_t(blockIdx.x) % heads;
  bool prefetched = false;  // whether this unit's Q tile is already in flight to sm.q()
  while (cursor.rank < p.range_tiles) {
    UnitCursor next = cursor;
    next.advance(step_rank, step_bh, heads);
    const Unit unit(p, cursor);
    if (unit.empty()) {
      if (threadIdx.x == 0) p.counts[unit.segment] = 0;
    } else {
      process_unit<TQ, D>(p, unit, sm, next, prefetched);
    }
    cursor = next;
  }
}

// A persistent grid: as many CTAs as fit on the device at once (the launch bound allows
// kMinBlocksPerSm by registers; shared memory may allow fewer), each walking units round-robin.
template <typename TQ, int D>
cudaError_t launch(const ScoreParams& p, cudaStream_t stream) {
  const size_t smem = score_select_smem_bytes(D, p.max_blocks);
  auto* kernel = score_select_kernel<TQ, D>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  int device = 0, sms = 0, smem_per_sm = 0;
  if (err == cudaSuccess) err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  if (err != cudaSuccess) return err;
  const int64_t per_sm = std::clamp<int64_t>(
      int64_t(smem_per_sm) / int64_t(smem + kSmemReservedPerBlock), 1, kMinBlocksPerSm);
  const int64_t units = int64_t(p.batch) * p.num_heads_kv * p.range_tiles;
  const int64_t grid = std::min<int64_t>(units, per_sm * sms);
  kernel<<<dim3(unsigned(grid)), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

size_t score_select_smem_bytes(int32_t head_dim, int32_t max_blocks) {
  const size_t energies = padded_blocks(max_blocks);
  return size_t(kTileRows) * head_dim * 2 + 2 * size_t(kChunk) * head_dim * 2 +
         (energies + energies / kChunk + kWarps + kWarps * kChunk) * sizeof(float) +
         kWarps * sizeof(int32_t);
}

cudaError_t launch_score_select(const ScoreParams& params, fp_dtype dtype, int32_t head_dim,
                                cudaStream_t stream) {
  if (params.range_tiles == 0) return cudaSuccess;
  return dispatch_index_types(dtype, head_dim, [&]<typename TQ, int D>() {
    return launch<TQ, D>(params, stream);
  });
}

}  // namespace flashprefill::cuda::index
