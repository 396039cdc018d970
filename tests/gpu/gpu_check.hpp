// What the GPU checks share: exiting on a CUDA or library error, and an owning device buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "flashprefill/flashprefill.h"

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));    \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)
#define FP_OK_OR_DIE(call)                                                               \
  do {                                                                                   \
    fp_status s_ = (call);                                                               \
    if (s_ != FP_OK) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, fp_status_string(s_),   \
                   fp_last_error_message());                                             \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n = 0) { resize(n); }
  // n elements; a buffer that holds n already keeps its allocation (and its address, which a
  // captured graph or a problem view may hold).
  void resize(size_t n) {
    if (n == count && (ptr != nullptr || n == 0)) return;
    if (ptr) CUDA_OK(cudaFree(ptr));
    ptr = nullptr;
    count = n;
    if (n) CUDA_OK(cudaMalloc(&ptr, n * sizeof(T)));
  }
  void upload(const std::vector<T>& h) {
    resize(h.size());
    if (count) CUDA_OK(cudaMemcpy(ptr, h.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const { return download(count); }
  // The first n elements (a buffer of which the call wrote only a prefix).
  std::vector<T> download(size_t n) const {
    if (n > count) {
      std::fprintf(stderr, "download of %zu elements from a buffer of %zu\n", n, count);
      std::exit(2);
    }
    std::vector<T> h(n);
    if (n) CUDA_OK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // Every byte 0xff: NaN in float32, bfloat16 and float16, -1 in integers.
  void poison() {
    if (count) CUDA_OK(cudaMemset(ptr, 0xff, count * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr, other.ptr);
    std::swap(count, other.count);
    return *this;
  }
};

// The start of a GPU check: line-buffered output, a usable sm_90 device (false, said, without
// one) and the seed, argv[1] or a fresh one.
inline bool start_check(int argc, char** argv, uint64_t& seed) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!fp_cuda_available()) {
    std::printf("no usable sm_90 device\n");
    return false;
  }
  seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
  return true;
}
