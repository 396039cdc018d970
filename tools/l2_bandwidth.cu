// L2-to-SM read bandwidth of the GPU, the number docs/KERNEL.md's "What other tilings would cost"
// needs: a tiling whose CTAs each load their own K and V (two CTAs per SM, one consumer
// warpgroup each) moves twice the attention kernel's bytes per FLOP from L2 to the SMs.
//
// Every CTA (one per SM, or two) streams chunks of a working set of W bytes, chunk c of CTA b at
// offset ((b + c * grid) * chunk) mod W, so all SMs read the whole set over and over: with W well
// under the L2's size every read after the first pass is an L2 hit; with W of a gigabyte they
// come from HBM. Two ways of reading, as the attention kernel's producers do:
//   ld    every thread loads 16 bytes at a time (ld.global.cg: L2, not L1) and folds them into
//         a checksum that is written out, so nothing is optimized away;
//   bulk  one thread per CTA issues cp.async.bulk copies (the TMA engine) of `chunk` bytes into a
//         ring of shared-memory slots, each completing an mbarrier that it waits on before
//         reusing the slot.
// Times are CUDA-event medians of 20 launches after 5 warm-up launches; bandwidth counts the
// bytes the SMs read. Usage: fp_l2_bandwidth (prints a table).
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

#define FP_CHECK(call)                                                                  \
  do {                                                                                  \
    cudaError_t err_ = (call);                                                          \
    if (err_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                 \
                   cudaGetErrorString(err_));                                           \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

constexpr int kThreads = 256;
constexpr int kSlots = 4;  // bulk: shared-memory ring of this many chunks

__global__ void __launch_bounds__(kThreads) read_ld(const uint4* __restrict__ data,
                                                     int64_t words, int64_t chunk_words,
                                                     int chunks_per_cta, uint32_t* sink) {
  uint32_t acc = 0;
  for (int c = 0; c < chunks_per_cta; ++c) {
    const int64_t base = ((int64_t(blockIdx.x) + int64_t(c) * gridDim.x) * chunk_words) % words;
    for (int64_t i = threadIdx.x; i < chunk_words; i += kThreads) {
      uint4 v;
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(data + base + i));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // almost never true: keeps the loads alive
}

__global__ void __launch_bounds__(32) read_bulk(const char* __restrict__ data, int64_t bytes,
                                                 int chunk, int chunks_per_cta) {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  extern __shared__ __align__(128) char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSlots * chunk);
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kSlots; ++s) Barrier::init(&bars[s], 1);
  cutlass::arch::fence_barrier_init();
  for (int c = 0; c < chunks_per_cta; ++c) {
    const int s = c % kSlots;
    if (c >= kSlots) Barrier::wait(&bars[s], uint32_t((c / kSlots - 1) & 1));
    const int64_t offset = ((int64_t(blockIdx.x) + int64_t(c) * gridDim.x) * chunk) % bytes;
    Barrier::arrive_and_expect_tx(&bars[s], uint32_t(chunk));
    cute::SM90_BULK_COPY_G2S::copy(data + offset, &bars[s], smem + s * chunk, chunk);
  }
  // The last kSlots copies must land before the CTA exits.
  for (int c = chunks_per_cta > kSlots ? chunks_per_cta - kSlots : 0; c < chunks_per_cta; ++c)
    Barrier::wait(&bars[c % kSlots], uint32_t((c / kSlots) & 1));
}

template <class Launch>
float median_ms(Launch&& launch) {
  cudaEvent_t start, stop;
  FP_CHECK(cudaEventCreate(&start));
  FP_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) launch();
  FP_CHECK(cudaGetLastError());
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    FP_CHECK(cudaEventRecord(start));
    launch();
    FP_CHECK(cudaEventRecord(stop));
    FP_CHECK(cudaEventSynchronize(stop));
    float t = 0.f;
    FP_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  FP_CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  FP_CHECK(cudaEventDestroy(start));
  FP_CHECK(cudaEventDestroy(stop));
  return ms[ms.size() / 2];
}

struct Result {
  const char* how;
  int ctas_per_sm;
  int64_t working_set;
  int chunk;
  double tb_per_s;
};

}  // namespace

int main() {
  cudaDeviceProp prop{};
  FP_CHECK(cudaGetDeviceProperties(&prop, 0));
  int clock_khz = 0;
  FP_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("# %s: %d SMs, L2 %d MB, max SM clock %.2f GHz\n", prop.name, sms,
              prop.l2CacheSize >> 20, clock_khz / 1e6);

  const int64_t kMaxBytes = int64_t(1) << 30;
  char* data = nullptr;
  uint32_t* sink = nullptr;
  FP_CHECK(cudaMalloc(&data, kMaxBytes));
  FP_CHECK(cudaMalloc(&sink, 4 * sms * sizeof(uint32_t)));
  {  // random bytes: never time on zeros
    std::vector<uint32_t> host(kMaxBytes / 4);
    uint64_t x = 0x2545f4914f6cdd1dull ^ uint64_t(std::rand());
    for (auto& w : host) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      w = uint32_t(x);
    }
    FP_CHECK(cudaMemcpy(data, host.data(), kMaxBytes, cudaMemcpyHostToDevice));
  }

  const int64_t sets[] = {int64_t(8) << 20, int64_t(24) << 20, int64_t(40) << 20, kMaxBytes};
  const int64_t kReadPerCta = int64_t(64) << 20;  // bytes each CTA reads per launch
  std::vector<Result> results;
  for (int64_t set : sets) {
    for (int per_sm : {1, 2}) {
      const int grid = sms * per_sm;
      {
        const int chunk = 32 << 10;
        const int chunks = int(kReadPerCta / per_sm / chunk);
        const float ms = median_ms([&] {
          read_ld<<<grid, kThreads>>>(reinterpret_cast<const uint4*>(data), set / 16, chunk / 16,
                                      chunks, sink);
        });
        const double bytes = double(grid) * chunks * chunk;
        results.push_back({"ld", per_sm, set, chunk, bytes / (ms * 1e-3) / 1e12});
      }
      for (int chunk : {16 << 10, 32 << 10}) {
        const int smem = kSlots * chunk + kSlots * 8;
        if (smem * per_sm > int(prop.sharedMemPerMultiprocessor) - 2048) continue;
        FP_CHECK(cudaFuncSetAttribute(read_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      smem));
        const int chunks = int(kReadPerCta / per_sm / chunk);
        const float ms = median_ms(
            [&] { read_bulk<<<grid, 32, smem>>>(data, set, chunk, chunks); });
        const double bytes = double(grid) * chunks * chunk;
        results.push_back({"bulk", per_sm, set, chunk, bytes / (ms * 1e-3) / 1e12});
      }
    }
  }
  // Per SM and nanosecond: divide by the SM clock in GHz for bytes per clock.
  std::printf("%-5s %8s %12s %9s %10s %12s\n", "read", "CTAs/SM", "working set", "chunk",
              "TB/s", "B/ns per SM");
  for (const auto& r : results)
    std::printf("%-5s %8d %9lld MB %6d KB %10.2f %12.1f\n", r.how, r.ctas_per_sm,
                static_cast<long long>(r.working_set >> 20), r.chunk >> 10, r.tb_per_s,
                r.tb_per_s * 1e3 / sms);
  FP_CHECK(cudaFree(data));
  FP_CHECK(cudaFree(sink));
  return 0;
}
