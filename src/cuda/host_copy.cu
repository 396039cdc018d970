// The one synchronous metadata copy, used only when the caller asks for host-side validation.
#include <cuda_runtime.h>

#include <string>

#include "cuda/backend.hpp"

namespace flashprefill::cuda {

fp_status copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess)
    return fail(FP_ERROR_CUDA, std::string("copying metadata to the host failed: ") +
                                   cudaGetErrorString(err));
  return FP_OK;
}

}  // namespace flashprefill::cuda
