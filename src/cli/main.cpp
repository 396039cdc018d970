// `flashprefill demo`: the whole pipeline on the embedded workload, on the GPU when one is
// present and on the CPU otherwise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/workload.hpp"
#include "flashprefill/flashprefill.hpp"
#include "reference/numerics.hpp"

#ifdef FP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using flashprefill::demo::WorkloadShape;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "flashprefill: %s\n", what.c_str());
  std::exit(1);
}

void check(fp_status s, const char* what) {
  if (s != FP_OK) die(std::string(what) + ": " + fp_status_string(s) + ": " + fp_last_error_message());
}

// Host or CUDA memory and timing behind one interface.
struct Device {
  bool cuda = false;

  void* alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
#ifdef FP_WITH_CUDA
    if (cuda) {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) die("cudaMalloc failed");
      return p;
    }
#endif
    return std::malloc(bytes);
  }
  void release(void* p) {
#ifdef FP_WITH_CUDA
    if (cuda) {
      cudaFree(p);
      return;
    }
#endif
    std::free(p);
  }
  void upload(void* dst, const void* src, size_t bytes) {
#ifdef FP_WITH_CUDA
    if (cuda) {
      if (cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) die("upload failed");
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) {
#ifdef FP_WITH_CUDA
    if (cuda) {
      if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) die("download failed");
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  // Median milliseconds of `fn`. On the GPU: in steady state, as bench/common.py's median_ms
  // measures it. `fn` first runs back to back for at least a second, because the H200's SM clock
  // follows its power limiter's running average (~1 s) and a call timed right after a lighter
  // stretch runs faster than it keeps running; then each timed call sits between its own pair of
  // events, queued without synchronizing, so the host's launch work overlaps the GPU's.
  // On the CPU: wall clock per call.
  double time_ms(const std::function<void()>& fn, int repeats) {
#ifdef FP_WITH_CUDA
    if (cuda) {
      const auto warm0 = std::chrono::steady_clock::now();
      for (int done = 1;; ++done) {
        fn();
        if (done % 4 != 0) continue;
        cudaDeviceSynchronize();
        if (std::chrono::steady_clock::now() - warm0 >= std::chrono::seconds(1)) break;
      }
      std::vector<cudaEvent_t> start(repeats), stop(repeats);
      for (int i = 0; i < repeats; ++i) {
        cudaEventCreate(&start[i]);
        cudaEventCreate(&stop[i]);
      }
      for (int i = 0; i < repeats; ++i) {
        cudaEventRecord(start[i]);
        fn();
        cudaEventRecord(stop[i]);
      }
      cudaDeviceSynchronize();
      std::vector<double> ms;
      for (int i = 0; i < repeats; ++i) {
        float t = 0;
        cudaEventElapsedTime(&t, start[i], stop[i]);
        ms.push_back(t);
        cudaEventDestroy(start[i]);
        cudaEventDestroy(stop[i]);
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    }
#endif
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

struct Buffer {
  Device* dev;
  void* ptr;
  size_t bytes;
  Buffer(Device& d, size_t n) : dev(&d), ptr(d.alloc(n)), bytes(n) {}
  ~Buffer() { dev->release(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
};

// One input tensor in the demo's dtype: bf16 bytes, or e4m3 bytes quantized with one descale
// factor c = max|x| / 448 per tensor (at least FLT_MIN); `exact` holds the values the library sees, in float32.
struct Input {
  std::vector<unsigned char> bytes;
  std::vector<float> exact;
  float descale = 1.f;
};

Input quantize(const std::vector<float>& x, bool fp8) {
  namespace ref = flashprefill::ref;
  Input in;
  in.exact.resize(x.size());
  if (!fp8) {
    in.bytes.resize(x.size() * 2);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t h = ref::float_to_bf16(x[i]);
      std::memcpy(&in.bytes[i * 2], &h, 2);
      in.exact[i] = ref::bf16_to_float(h);
    }
    return in;
  }
  float amax = 0.f;
  for (float a : x) amax = std::max(amax, std::fabs(a));
  in.descale = amax > 0.f ? std::max(amax / ref::kE4m3Max, std::numeric_limits<float>::min()) : 1.f;
  in.bytes.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    in.bytes[i] = ref::float_to_e4m3(x[i] * (1.f / in.descale));
    in.exact[i] = in.descale * ref::e4m3_to_float(in.bytes[i]);
  }
  return in;
}

std::vector<float> widen_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = flashprefill::ref::bf16_to_float(x[i]);
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num / den);
}

struct Options {
  std::string device = "auto";
  std::string dtype = "bf16";
  int32_t seqlen = 0;
  fp_select_config config{};
};

void usage() {
  std::printf(
      "usage: flashprefill demo [--device auto|cpu|cuda] [--dtype bf16|fp8] [--seqlen N]\n"
      "                         [--alpha A] [--block-size B]\n"
      "Runs the FlashPrefill V2 pipeline (index stage + sparse attention with mean correction)\n"
      "on an embedded long-context workload (GQA 32/8, D = 128) and compares it with exact\n"
      "attention. --dtype fp8: q, k and v in e4m3 with per-tensor descales, output bf16.\n");
}

Options parse(int argc, char** argv) {
  Options o;
  fp_select_config_default(&o.config);
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--device") o.device = value();
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--seqlen") o.seqlen = std::atoi(value().c_str());
    else if (a == "--alpha") o.config.alpha = float(std::atof(value().c_str()));
    else if (a == "--block-size") o.config.block_size = std::atoi(value().c_str());
    else if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    } else die("unknown option " + a);
  }
  if (o.device != "auto" && o.device != "cpu" && o.device != "cuda") die("--device must be auto, cpu or cuda");
  if (o.dtype != "bf16" && o.dtype != "fp8") die("--dtype must be bf16 or fp8");
  return o;
}

int demo(const Options& opt) {
  Device dev;
  const bool fp8 = opt.dtype == "fp8";
  dev.cuda = opt.device == "cuda" || (opt.device == "auto" && fp_cuda_available());
  if (dev.cuda && !fp_cuda_available()) die("--device cuda, but no CUDA backend or sm_90 GPU is available");
  WorkloadShape shape;
  shape.seqlen = opt.seqlen > 0 ? opt.seqlen : (dev.cuda ? 32768 : 4096);
  const int32_t L = shape.seqlen, Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  std::printf("flashprefill %s demo on %s: L = %d, Hq = %d, Hkv = %d, D = %d, %s, causal\n",
              fp_version(), dev.cuda ? "CUDA" : "CPU", L, Hq, Hkv, D,
              fp8 ? "e4m3 q/k/v (per-tensor descales), bf16 output" : "bf16");
  std::printf("config: block_size = %d, alpha = %g, sink = %d, window = %d, dense recent tiles = %d\n",
              opt.config.block_size, double(opt.config.alpha), opt.config.sink_tokens,
              opt.config.window_tokens, opt.config.dense_recent_tiles);

  std::vector<float> wq(size_t(L) * Hq * D), wk(size_t(L) * Hkv * D), wv(wk.size());
  check(fp_demo_workload(L, Hq, Hkv, D, shape.seed, wq.data(), wk.data(), wv.data()), "workload");
  const Input q = quantize(wq, fp8), k = quantize(wk, fp8), v = quantize(wv, fp8);
  if (!fp8) wq = wk = wv = {};  // FP8 also compares with exact attention on these inputs
  const size_t q_bytes = q.bytes.size(), kv_bytes = k.bytes.size();
  const size_t out_bytes = q.exact.size() * 2;  // bf16
  Buffer dq(dev, q_bytes), dk(dev, kv_bytes), dv(dev, kv_bytes), dcu(dev, 2 * sizeof(int32_t)),
      ddescale(dev, 3 * sizeof(float));
  dev.upload(dq.ptr, q.bytes.data(), q_bytes);
  dev.upload(dk.ptr, k.bytes.data(), kv_bytes);
  dev.upload(dv.ptr, v.bytes.data(), kv_bytes);
  const int32_t cu[2] = {0, L};
  dev.upload(dcu.ptr, cu, sizeof(cu));
  const float descales[3] = {q.descale, k.descale, v.descale};
  dev.upload(ddescale.ptr, descales, sizeof(descales));

  fp_problem p = flashprefill::contiguous_problem(
      dev.cuda ? FP_DEVICE_CUDA : FP_DEVICE_CPU, fp8 ? FP_FLOAT8_E4M3 : FP_BFLOAT16, 1, Hq, Hkv,
      D, dq.ptr, L, dcu.as<int32_t>(), L, dk.ptr, dv.ptr, L, dcu.as<int32_t>(), L);
  if (fp8) {  // per-tensor descales: one float each, strides 0
    p.q_descale = ddescale.as<float>();
    p.k_descale = ddescale.as<float>() + 1;
    p.v_descale = ddescale.as<float>() + 2;
  }

  fp_select_config corrected = opt.config, plain = opt.config, dense_cfg = opt.config;
  corrected.mean_correction = 1;
  plain.mean_correction = 0;
  dense_cfg.alpha = 0.f;
  dense_cfg.mean_correction = 0;

  fp_index_sizes sizes;
  check(fp_index_sizes_query(&p, &corrected, &sizes), "index sizes");
  Buffer cu_buf(dev, (sizes.num_segments + 1) * 4), idx_buf(dev, sizes.idx_capacity * 4),
      km(dev, sizes.mean_elements * 4), vm(dev, sizes.mean_elements * 4);
  fp_index index{cu_buf.as<int32_t>(), idx_buf.as<int32_t>(), km.as<float>(), vm.as<float>(),
                 sizes.idx_capacity};
  size_t ws_index = 0, ws_attn = 0, ws_dense = 0;
  check(fp_build_index_workspace_size(&p, &corrected, &ws_index), "workspace size");
  check(fp_sparse_attention_workspace_size(&p, &corrected, &ws_attn), "workspace size");
  check(fp_dense_attention_workspace_size(&p, &ws_dense), "workspace size");
  Buffer ws(dev, std::max({ws_index, ws_attn, ws_dense}));
  Buffer out_corr(dev, out_bytes), out_plain(dev, out_bytes), out_dense(dev, out_bytes);
  auto output = [&](Buffer& b) {
    return fp_output{b.ptr, int64_t(Hq) * D, D, nullptr};
  };
  const fp_output o_corr = output(out_corr), o_plain = output(out_plain), o_dense = output(out_dense);
  const int reps = dev.cuda ? 20 : 1;

  const double t_index = dev.time_ms([&] { check(fp_build_index(&p, &corrected, &index, ws.ptr, ws.bytes), "build index"); }, reps);
  double density = 0;
  check(fp_index_density(&p, &corrected, &index, &density), "density");
  const double t_corr = dev.time_ms([&] { check(fp_sparse_attention(&p, &corrected, &index, &o_corr, ws.ptr, ws.bytes), "sparse attention"); }, reps);
  const double t_plain = dev.time_ms([&] { check(fp_sparse_attention(&p, &plain, &index, &o_plain, ws.ptr, ws.bytes), "sparse attention"); }, reps);

  // Dense baseline: the same engine visiting every causal tile.
  double t_dense = 0;
  if (dev.cuda) {
    t_dense = dev.time_ms([&] { check(fp_dense_attention(&p, &o_dense, ws.ptr, ws.bytes), "dense attention"); }, reps);
  } else {
    Buffer dcu2(dev, (sizes.num_segments + 1) * 4), didx2(dev, sizes.idx_capacity * 4);
    fp_index full{dcu2.as<int32_t>(), didx2.as<int32_t>(), km.as<float>(), vm.as<float>(), sizes.idx_capacity};
    check(fp_build_index(&p, &dense_cfg, &full, ws.ptr, ws.bytes), "build dense index");
    t_dense = dev.time_ms([&] { check(fp_sparse_attention(&p, &dense_cfg, &full, &o_dense, ws.ptr, ws.bytes), "dense attention"); }, reps);
  }

  // Exact reference: float64 on the CPU (every row on the CPU path; sampled chunks of rows on the GPU).
  std::vector<uint16_t> corr_bf16(q.exact.size()), plain_bf16(q.exact.size());
  dev.download(corr_bf16.data(), out_corr.ptr, out_bytes);
  dev.download(plain_bf16.data(), out_plain.ptr, out_bytes);
  const std::vector<float> got_corr = widen_bf16(corr_bf16), got_plain = widen_bf16(plain_bf16);
  const int32_t chunk = dev.cuda ? 128 : L;
  std::vector<int32_t> starts;
  if (dev.cuda) {
    for (int32_t c = 1; c <= 6; ++c) starts.push_back(std::max(0, int32_t(int64_t(L) * c / 7) - chunk));
  } else {
    starts.push_back(0);
  }
  // Float32 inputs (bf16: the bf16 values; FP8: the dequantized e4m3 values, and the float32
  // workload before quantization) on the CPU, float64 accumulation.
  std::vector<float> sub_corr, sub_plain;
  auto exact_rows = [&](const std::vector<float>& eq, const std::vector<float>& ek,
                        const std::vector<float>& ev) {
    std::vector<float> exact;
    for (int32_t s : starts) {
      const int32_t n = std::min(chunk, L - s);
      const int32_t cuq[2] = {0, n}, cuk[2] = {0, s + n};
      const fp_problem hp = flashprefill::contiguous_problem(
          FP_DEVICE_CPU, FP_FLOAT32, 1, Hq, Hkv, D, eq.data() + size_t(s) * Hq * D, n, cuq, n,
          ek.data(), ev.data(), s + n, cuk, s + n);
      std::vector<float> ref(size_t(n) * Hq * D);
      const fp_output o{ref.data(), int64_t(Hq) * D, D, nullptr};
      check(fp_dense_attention(&hp, &o, nullptr, 0), "exact reference");
      exact.insert(exact.end(), ref.begin(), ref.end());
    }
    return exact;
  };
  for (int32_t s : starts) {
    const size_t a = size_t(s) * Hq * D, e = a + size_t(std::min(chunk, L - s)) * Hq * D;
    sub_corr.insert(sub_corr.end(), got_corr.begin() + a, got_corr.begin() + e);
    sub_plain.insert(sub_plain.end(), got_plain.begin() + a, got_plain.begin() + e);
  }
  const auto t_ref0 = std::chrono::steady_clock::now();
  const std::vector<float> exact = exact_rows(q.exact, k.exact, v.exact);
  const double t_ref = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_ref0).count();
  const std::vector<float> exact_unquantized = fp8 ? exact_rows(wq, wk, wv) : std::vector<float>{};

  std::printf("\n%-44s %12s\n", "stage", "time (ms)");
  std::printf("%-44s %12.3f\n", "index: pool + score/select + CSR", t_index);
  std::printf("%-44s %12.3f\n", "sparse attention + mean correction", t_corr);
  std::printf("%-44s %12.3f\n", "sparse attention, no correction", t_plain);
  std::printf("%-44s %12.3f\n", dev.cuda ? "dense attention (dense mode)" : "dense attention (same engine, every tile)", t_dense);
  std::printf("%-44s %12.3f\n", "exact float64 reference (CPU)", t_ref);
  std::printf("\ndensity (selected / causal 64-token tiles)   %10.2f %%\n", 100 * density);
  auto error_row = [](const std::string& label, double value) {
    std::printf("%-46s%10.3e\n", label.c_str(), value);
  };
  if (fp8) std::printf("(exact: float64 attention on the dequantized e4m3 inputs)\n");
  error_row("rel. L2 error vs exact, mean correction", rel_l2(sub_corr, exact));
  error_row("rel. L2 error vs exact, no correction", rel_l2(sub_plain, exact));
  if (fp8) {
    error_row("  vs exact on float32 inputs, mean correction", rel_l2(sub_corr, exact_unquantized));
    error_row("  vs exact on float32 inputs, no correction", rel_l2(sub_plain, exact_unquantized));
  }
  std::printf("rows compared                                 %10zu of %d%s\n", exact.size() / (size_t(Hq) * D),
              L, dev.cuda ? " (sampled chunks)" : "");
  std::printf("speedup of index + corrected sparse vs dense  %10.2fx\n", t_dense / (t_index + t_corr));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    usage();
    return argc < 2 ? 1 : 0;
  }
  if (std::string(argv[1]) == "demo") return demo(parse(argc, argv));
  if (std::string(argv[1]) == "version") {
    std::printf("%s\n", fp_version());
    return 0;
  }
  usage();
  return 1;
}
