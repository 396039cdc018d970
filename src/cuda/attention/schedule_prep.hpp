// Per-call preparation of the persistent scheduler (scheduler.hpp): the work counter set to zero
// and the prefix of query tiles over the batch, both in the attention workspace.
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/params.hpp"

namespace flashprefill::cuda::attention {

// Bytes of workspace the scheduler needs for `batch` requests (counter + batch + 1 prefix entries).
inline size_t schedule_bytes(int32_t batch) { return sizeof(int32_t) * (size_t(batch) + 2); }

// Launches the one-CTA kernel that fills p.work_counter and p.tile_prefix (in the workspace,
// schedule_bytes) on `stream`.
cudaError_t launch_prepare_schedule(const AttentionParams& p, cudaStream_t stream);

// Fills the run table p.pair_rows (p.tma_runs; params.hpp) from the page table on `stream`.
cudaError_t launch_pair_rows(const AttentionParams& p, int32_t* pair_rows, cudaStream_t stream);

}  // namespace flashprefill::cuda::attention
