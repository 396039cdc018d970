// Explicit instantiation: bf16, head dim 64.
#include "cuda/attention/launch.cuh"

namespace flashprefill::cuda::attention {
template cudaError_t launch_attention<cutlass::bfloat16_t, 64>(const AttentionParams&, cudaStream_t);
}  // namespace flashprefill::cuda::attention
