// Launches an index-stage kernel behind the previous one on the stream with programmatic
// dependent launch: it may start while that kernel's last CTAs still run, overlapping its
// prologue (and the launch latency) with their tail. The kernel must call wait_for_prior_grid()
// (ptx.cuh) before it touches memory the previous kernel writes or reads. Stream capture keeps
// the relaxed edge, so the index stage stays graph capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace flashprefill::cuda::index {

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = overlap;
  config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, kernel, args...) == cudaSuccess) return cudaSuccess;
  // A runtime or stream that refuses the attribute gets an ordinary launch, which is equally
  // correct (wait_for_prior_grid returns at once); a genuine launch error reappears there.
  (void)cudaGetLastError();
  kernel<<<grid, block, smem, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace flashprefill::cuda::index
