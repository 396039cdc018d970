// Per-(dtype, head dim, KV layout) kernel launch, explicitly instantiated in instantiate_*.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/params.hpp"

namespace flashprefill::cuda::attention {

template <class Element, int kHeadDim, KvLayout kLayout>
cudaError_t launch_attention(const AttentionParams& p, cudaStream_t stream);

}  // namespace flashprefill::cuda::attention
