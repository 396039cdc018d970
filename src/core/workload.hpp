// The demo's embedded workload: deterministic Q/K/V shaped like long-context LLM attention.
#pragma once

#include <cstdint>

namespace flashprefill::demo {

struct WorkloadShape {
  int32_t seqlen = 4096;
  int32_t num_heads_q = 32;
  int32_t num_heads_kv = 8;
  int32_t head_dim = 128;
  uint64_t seed = 20260823;
};

// Fills row-major float32 tensors q [L, Hq, D], k and v [L, Hkv, D]. Per KV head the logits
// carry attention sinks (the first 4 keys), a local band (a smooth positional kernel), a few
// heavy "vertical" key columns that every query reads, and far-back "needle" blocks that only
// some query ranges retrieve. KV heads are generated in parallel, each from its own stream, so the
// result does not depend on the thread count.
void make_workload(const WorkloadShape& shape, float* q, float* k, float* v);

}  // namespace flashprefill::demo
