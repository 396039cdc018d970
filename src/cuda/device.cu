// Whether the CUDA backend can run here: device 0 exists and is a Hopper (compute capability 9.x).
#include <cuda_runtime.h>

#include "cuda/backend.hpp"

namespace flashprefill::cuda {

bool available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();  // clear the error a missing driver or device leaves behind
    return false;
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess)
    return false;
  return major == 9;
}

}  // namespace flashprefill::cuda
