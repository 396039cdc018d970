// Explicit instantiation: bf16, head dim 128, contiguous KV.
#include "cuda/attention/launch.cuh"

namespace flashprefill::cuda::attention {
template cudaError_t launch_attention<cutlass::bfloat16_t, 128, KvLayout::kContiguous>(
    const AttentionParams&, cudaStream_t);
}  // namespace flashprefill::cuda::attention
