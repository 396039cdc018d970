// fp_prefill on CUDA: pool once, then select and attend the query tiles range by range, so that
// the index never holds more than one range (docs/ALGORITHM.md, "Sizes and the prefill
// workspace"). Scratch: [index stage | attention stage], both live through the range loop.
#include "core/checked.hpp"
#include "cuda/backend.hpp"
#include "cuda/prefill.hpp"
#include "cuda/quantize/quantize_q.hpp"

namespace flashprefill::cuda {
namespace {

constexpr int64_t kAlign = 256;

Size backend_size(size_t bytes) { return Size(bytes == SIZE_MAX ? -1 : int64_t(bytes)); }

}  // namespace

// A bf16/fp16 q over an e4m3 cache: the quantized q first (cuda/quantize/quantize_q.hpp).
size_t prefill_workspace(const ProblemInfo& info, const fp_select_config& config,
                         int64_t range_tiles) {
  E4m3Problem e4m3;
  const size_t front = quantized_q_bytes(info);
  if (front > 0) e4m3_problem(info, nullptr, &e4m3);
  const ProblemInfo& seen = front > 0 ? e4m3.info : info;
  return (Size(int64_t(front)) +
          backend_size(range_index_workspace(seen, config, range_tiles)).align_up(kAlign) +
          backend_size(attention_workspace(seen, config, true)))
      .bytes_or_max();
}

fp_status prefill(const ProblemInfo& given, const fp_select_config& config, const fp_index& index,
                  int32_t range_tiles, const fp_output& output, void* workspace,
                  size_t workspace_bytes) {
  const Size need = backend_size(prefill_workspace(given, config, range_tiles));
  if (!need.ok() || workspace_bytes < size_t(need.value()))
    return fail(FP_ERROR_WORKSPACE_TOO_SMALL, "prefill stage: the workspace is too small");
  return with_e4m3_q(given, workspace, workspace_bytes,
                     [&](const ProblemInfo& info, void* rest, size_t) {
    const Size index_bytes = backend_size(range_index_workspace(info, config, range_tiles));
    char* const index_ws = static_cast<char*>(rest);
    char* const attention_ws = index_ws + index_bytes.align_up(kAlign).value();
    if (fp_status s = prepare_index(info, config, index, range_tiles, index_ws,
                                    size_t(index_bytes.value()));
        s != FP_OK)
      return s;
    return sparse_attention_in_ranges(
        info, config, index, output, attention_ws, range_tiles,
        [&](int32_t tile_begin, int32_t tiles) {
          return select_range(info, config, index, range_tiles, index_ws, tile_begin, tiles);
        });
  });
}

}  // namespace flashprefill::cuda
