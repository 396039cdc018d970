// Explicit instantiation: fp16, head dim 64, paged KV.
#include "cuda/attention/launch.cuh"

namespace flashprefill::cuda::attention {
template cudaError_t launch_attention<cutlass::half_t, 64, KvLayout::kPaged>(
    const AttentionParams&, cudaStream_t);
}  // namespace flashprefill::cuda::attention
