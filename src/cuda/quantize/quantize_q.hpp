// A bfloat16 / float16 q over an e4m3 KV cache on CUDA (docs/ALGORITHM.md "FP8 e4m3"): the e4m3
// kernels take e4m3 q, so a call first quantizes q into the front of its workspace,
// q~ = round_e4m3(q * (1 / c_q)) with c_q from q_descale, or, when q_descale is NULL,
// c_q = max|q| / 448 over the finite q of the request's queries in the KV head's group (1 when
// all are 0; at least FLT_MIN, so that 1 / c_q is finite), exactly as the CPU reference rounds it; the call then runs the e4m3 problem of
// that q (its c_q in the workspace too) over the rest of the workspace.
#pragma once

#include <cstddef>

#include "core/problem.hpp"

namespace flashprefill::cuda {

// Bytes at the front of the workspace: [e4m3 q: total_q x Hq x D][c_q: B x Hkv floats][max|q|
// bits: B x Hkv], each aligned; 0 unless `info` is a bf16/fp16 q over an e4m3 cache.
size_t quantized_q_bytes(const ProblemInfo& info);

// The e4m3 problem of `info` with its q quantized at `front` (quantized_q_bytes of workspace;
// null for the size queries and for fp_pool_kv, which reads no q: q then stays the caller's).
struct E4m3Problem {
  fp_problem p{};
  ProblemInfo info;
};
void e4m3_problem(const ProblemInfo& info, void* front, E4m3Problem* out);

// Writes the quantized q and its c_q into `front` on the problem's stream.
fp_status quantize_q(const ProblemInfo& info, void* front);

// Runs fn(info, workspace, bytes) on the problem as the e4m3 kernels take it: as given, or, for
// a bf16/fp16 q over an e4m3 cache, on its quantized q in the front of the workspace and the
// rest of the workspace.
template <class Fn>
fp_status with_e4m3_q(const ProblemInfo& info, void* workspace, size_t bytes, Fn&& fn) {
  const size_t front = quantized_q_bytes(info);
  if (front == 0) return fn(info, workspace, bytes);
  if (bytes < front)
    return fail(FP_ERROR_WORKSPACE_TOO_SMALL, "the workspace has no room for the quantized q");
  if (fp_status s = quantize_q(info, workspace); s != FP_OK) return s;
  E4m3Problem e4m3;
  e4m3_problem(info, workspace, &e4m3);
  return fn(e4m3.info, static_cast<char*>(workspace) + front, bytes - front);
}

}  // namespace flashprefill::cuda
