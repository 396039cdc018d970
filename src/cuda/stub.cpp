// The CUDA backend of a build without CUDA: every entry reports that clearly.
#include "cuda/backend.hpp"
#include "cuda/quantize/quantize_q.hpp"

namespace flashprefill::cuda {
namespace {
fp_status no_cuda() {
  return fail(FP_ERROR_UNSUPPORTED, "this build of flashprefill has no CUDA backend");
}
}  // namespace

bool available() { return false; }
fp_status copy_to_host(void*, const void*, size_t, void*) { return no_cuda(); }
size_t build_index_workspace(const ProblemInfo&, const fp_select_config&) { return 0; }
fp_status build_index(const ProblemInfo&, const fp_select_config&, const fp_index&, void*, size_t) {
  return no_cuda();
}
fp_status pool_kv(const ProblemInfo&, const fp_select_config&, float*, float*, const int32_t*) {
  return no_cuda();
}
fp_status check_attention_support(const ProblemInfo&, const fp_output&, const fp_index*) {
  return no_cuda();
}
size_t attention_workspace(const ProblemInfo&, const fp_select_config&, bool) { return 0; }
fp_status sparse_attention(const ProblemInfo&, const fp_select_config&, const fp_index&,
                           const fp_output&, void*, size_t) {
  return no_cuda();
}
fp_status dense_attention(const ProblemInfo&, const fp_output&, void*, size_t) { return no_cuda(); }
size_t prefill_workspace(const ProblemInfo&, const fp_select_config&, int64_t) { return 0; }
fp_status prefill(const ProblemInfo&, const fp_select_config&, const fp_index&, int32_t,
                  const fp_output&, void*, size_t) {
  return no_cuda();
}
size_t quantized_q_bytes(const ProblemInfo&) { return 0; }
void e4m3_problem(const ProblemInfo& info, void*, E4m3Problem* out) {
  out->p = *info.p;
  out->info = info;
  out->info.p = &out->p;
}
fp_status quantize_q(const ProblemInfo&, void*) { return no_cuda(); }

}  // namespace flashprefill::cuda
