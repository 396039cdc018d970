// Explicit instantiation: e4m3, head dim 64, contiguous KV, float16 output (Eq. 15).
#include "cuda/attention/launch.cuh"

namespace flashprefill::cuda::attention {
template cudaError_t launch_attention<cutlass::float_e4m3_t, 64, KvLayout::kContiguous,
                                     cutlass::half_t>(const AttentionParams&, cudaStream_t);
}  // namespace flashprefill::cuda::attention
