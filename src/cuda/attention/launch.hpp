// Per-(dtype, head dim, KV layout) kernel launch, explicitly instantiated in instantiate_*.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/params.hpp"

namespace flashprefill::cuda::attention {

// ElementOut: void for the operands' output type (kernel_traits.hpp), or cutlass::half_t for an
// e4m3 kernel writing float16.
template <class Element, int kHeadDim, KvLayout kLayout, class ElementOut = void>
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream);

}  // namespace flashprefill::cuda::attention
