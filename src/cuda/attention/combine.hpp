// Merges the float partials of a split KV range (Eq. 18) into the output and LSE.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/params.hpp"
#include "flashprefill/flashprefill.h"

namespace flashprefill::cuda::attention {

// Launches the combine kernel on `stream` for p.num_splits > 1.
void launch_combine(const AttentionParams& p, fp_dtype dtype, int head_dim, cudaStream_t stream);

}  // namespace flashprefill::cuda::attention
