/*
 * flashprefill — block-sparse prefill attention (FlashPrefill V2) with a flat C ABI.
 *
 * Every entry point validates its inputs and returns an fp_status; on failure
 * fp_last_error_message() (thread-local) says what was wrong. No call allocates
 * device memory: buffers and workspace are the caller's, sized by the *_size queries. Workspace
 * pointers must be 256-byte aligned on CUDA (cudaMalloc's and torch's allocations are) and
 * 16-byte aligned on the CPU (malloc's are).
 *
 * Layout conventions (all strides are in elements, the head dimension is contiguous):
 *   q        [total_q, Hq, D]                       packed varlen, rows of request b at
 *                                                   cu_seqlens_q[b] .. cu_seqlens_q[b+1]
 *   k, v     contiguous: [total_k, Hkv, D]          rows of request b at cu_seqlens_k[b] ..
 *            paged:      [num_pages, page_size, Hkv, D]  key j of request b lives in page
 *                        page_table[b * max_pages_per_seq + j / page_size], row j % page_size
 *   out      [total_q, Hq, D] in q's dtype (FP8 problems: fp_problem.out_dtype)
 *   lse      [Hq, total_q] float32, natural-log log-sum-exp of the scaled logits
 * Attention is causal and bottom-right aligned: new query i of request b sits at absolute
 * position L_kv(b) - L_q(b) + i and sees keys at positions <= its own.
 *
 * The CUDA attention (sm_90) returns FP_ERROR_UNSUPPORTED, and launches nothing, unless: the
 * dtype is bfloat16 or float16, or e4m3 as below; D is 64 or 128; every q/k/v stride (page
 * strides included) is a multiple of 8 elements; q, k and v are 16-byte aligned; out is 4-byte
 * aligned with even strides; with mean correction, the index's k_mean and v_mean are 16-byte
 * aligned; and, paged, (num_pages - 1) * page_stride + (page_size - 1) * token_stride of K and of
 * V is below 2^32 times gcd(page_stride, token_stride) (for [num_pages, page_size, Hkv, D]
 * pools: at most 2^32 rows in all). FP8 on CUDA: every call takes dtype = FP_FLOAT8_E4M3 (e4m3
 * q, k and v) and a bfloat16 / float16 q over e4m3 K/V (kv_dtype; q is quantized to e4m3 in the
 * workspace first, as the CPU reference quantizes it), contiguous or paged KV of any page size
 * (attention gathers a paged cache into its workspace: total_k, when > 0, bounds the sum of
 * seqlens_k there, else batch_size * max_seqlen_k rows are set aside), mean correction and KV
 * splits included, with out_dtype bfloat16 or float16, e4m3 strides (token, head, page) of multiples of 16
 * elements (a bf16/fp16 q: of 8, 16-byte aligned), at most 65535 requests and KV heads, and the
 * keys read (total_k, or the paged bound) + 128 B below 2^31.
 *
 * docs/ALGORITHM.md is the contract for the index format and every stage.
 */
#ifndef FLASHPREFILL_H_
#define FLASHPREFILL_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FP_API __declspec(dllexport)
#else
#define FP_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FP_VERSION_MAJOR 0
#define FP_VERSION_MINOR 3
#define FP_VERSION_PATCH 0

/* Rows of the PackGQA query tile (Eq. 12-13) and tokens of one physical KV tile. */
#define FP_TILE_ROWS 128
#define FP_KV_TILE 64
/* The most ways fp_attention_tuning.num_splits may split a query tile's KV iterations. */
#define FP_MAX_SPLITS 16

typedef enum fp_status {
  FP_OK = 0,
  FP_ERROR_INVALID_ARGUMENT = 1,   /* a shape, stride, pointer, length or config is wrong */
  FP_ERROR_UNSUPPORTED = 2,        /* valid, but not supported by this build or device */
  FP_ERROR_WORKSPACE_TOO_SMALL = 3,
  FP_ERROR_CUDA = 4,               /* a CUDA runtime call failed */
  FP_ERROR_INTERNAL = 5
} fp_status;

/* FP_FLOAT8_E4M3: OCP e4m3fn (1 sign, 4 exponent and 3 mantissa bits, bias 7, no infinity,
 * NaN = S.1111.111, largest finite 448), stored one byte per element with descale factors
 * (fp_problem's FP8 fields; docs/ALGORITHM.md "FP8 e4m3"). */
typedef enum fp_dtype {
  FP_FLOAT32 = 0,
  FP_BFLOAT16 = 1,
  FP_FLOAT16 = 2,
  FP_FLOAT8_E4M3 = 3
} fp_dtype;

typedef enum fp_device { FP_DEVICE_CPU = 0, FP_DEVICE_CUDA = 1 } fp_device;

typedef enum fp_kv_layout { FP_KV_CONTIGUOUS = 0, FP_KV_PAGED = 1 } fp_kv_layout;

/* Problem flags. */
/* CUDA only: copy cu_seqlens / seqlens_k / page_table (and the cu / idx of an index given to
 * fp_sparse_attention) to the host and validate them before launching (one host
 * synchronization). Without it nothing synchronizes the host, the call is CUDA-graph capturable,
 * and the caller guarantees the metadata is valid. The CPU path always validates. */
#define FP_FLAG_VALIDATE_DEVICE_METADATA 1u
/* fp_build_index takes index->k_mean / v_mean as already pooled for every key (kept current
 * beside the KV cache by fp_pool_kv across chunked-prefill steps) and only scores and selects.
 * fp_prefill pools itself and refuses it. Any other flag bit is an error. */
#define FP_FLAG_MEANS_POOLED 2u

/* How the CUDA attention stage lays out its work (docs/ALGORITHM.md, "Work units"). Each field
 * 0 leaves the choice to the library's heuristic, made from the problem's shapes alone; a value
 * overrides it, for the workspace size query and the call alike (they must see the same
 * values: the split count sizes the workspace). Results do not depend on them beyond the split
 * combine's rounding. Every call validates them (FP_ERROR_INVALID_ARGUMENT); the CPU path has no
 * such choices and ignores valid values. */
typedef struct fp_attention_tuning {
  int32_t num_splits;          /* ways to split each query tile's KV iterations (Eq. 18), 1 ..
                                  FP_MAX_SPLITS; more than 1 adds float partials to the
                                  workspace and a combine kernel */
  int32_t head_section;        /* KV heads per section of the work order, 1 .. num_heads_kv */
  int32_t lead_tiles;          /* query tiles of every request taken from every KV head before
                                  the head sections, >= 1 (past a request's tiles: all of them) */
} fp_attention_tuning;

/* One attention problem: a varlen batch of new queries against (possibly cached) keys. */
typedef struct fp_problem {
  fp_device device;
  void* stream;              /* cudaStream_t for FP_DEVICE_CUDA (NULL = default stream) */
  uint32_t flags;
  fp_dtype dtype;            /* of q, and of k, v and out unless the FP8 fields below say
                                otherwise */
  int32_t batch_size;        /* B >= 1 */
  int32_t num_heads_q;       /* Hq, a multiple of Hkv */
  int32_t num_heads_kv;      /* Hkv */
  int32_t head_dim;          /* D: 64 or 128 on CUDA; 1..512 on the CPU */
  float softmax_scale;       /* 0 means 1/sqrt(D); else within [2^-64, 2^64] */

  const void* q;
  int64_t q_stride_token, q_stride_head;
  int64_t total_q;
  const int32_t* cu_seqlens_q; /* [B + 1], cu[0] = 0, cu[B] = total_q, non-decreasing */
  int32_t max_seqlen_q;        /* >= every L_q(b); sizes buffers without reading lengths (a
                                  bound above total_q counts as total_q) */

  fp_kv_layout kv_layout;
  const void* k;
  const void* v;
  int64_t k_stride_page, k_stride_token, k_stride_head; /* stride_page: paged only */
  int64_t v_stride_page, v_stride_token, v_stride_head;
  int32_t max_seqlen_k;        /* >= every L_kv(b) */
  /* FP_KV_CONTIGUOUS */
  int64_t total_k;
  const int32_t* cu_seqlens_k; /* [B + 1] */
  /* FP_KV_PAGED */
  int32_t num_pages;
  int32_t page_size;           /* any value >= 1. On CUDA, pages of a multiple of 16 keys whose
                                  page stride is page_size token strides (pages back to back)
                                  are read by TMA (fastest at multiples of 128 keys, or of 64
                                  with consecutive pages); other paged layouts by cp.async.
                                  With pages back to back, any 128 keys of a request that lie
                                  in consecutive pool rows come in one TMA box at any page size
                                  (docs/PERF.md) */
  const int32_t* page_table;   /* [B, max_pages_per_seq], entries in [0, num_pages) */
  int32_t max_pages_per_seq;
  const int32_t* seqlens_k;    /* [B] */

  /* FP8 e4m3 (Eq. 15; docs/ALGORITHM.md "FP8 e4m3"). Appended, so the fields above keep their
   * offsets; zero-initialized, they leave the problem as described above. The two supported
   * FP8 problems: dtype = FP_FLOAT8_E4M3 (q, k and v all e4m3), and dtype = FP_BFLOAT16 or
   * FP_FLOAT16 with kv_dtype = FP_FLOAT8_E4M3 (an FP8 KV cache; the library quantizes q to e4m3
   * per (request, KV head) with q_descale, or, when q_descale is NULL, with
   * c_q = max|q| / 448 over the request's queries of the KV head's group, held at FLT_MIN
   * where max|q| is below 448 FLT_MIN). The CPU and CUDA
   * compute both, in every entry point: the index stage (fp_build_index, fp_pool_kv, their size
   * queries and fp_index_density) and the attention calls (CUDA's conditions: the top of this
   * file; on CUDA the quantized q lies at the front of the call's workspace). */
  fp_dtype kv_dtype;           /* of k and v; FP_FLOAT32 (0) means dtype */
  fp_dtype out_dtype;          /* of out; FP_FLOAT32 (0) means dtype, or FP_BFLOAT16 when dtype
                                  is FP_FLOAT8_E4M3. An FP8 problem writes FP_BFLOAT16 or
                                  FP_FLOAT16; other problems write dtype */
  /* Descale factors c of the e4m3 tensors (real value = c * stored e4m3 value): each NULL (1;
   * for a bf16/fp16 q, NULL means the dynamic c_q above), or float32 on the problem's device,
   * c(b, h) = descale[b * stride_batch + h * stride_head] for request b and KV head h (FA3's
   * [B, Hkv] q_descale / k_descale / v_descale). Strides are in elements and may be 0: a
   * per-tensor factor is one float with both strides 0. Every factor must be finite and at
   * least FLT_MIN, the smallest normal float32, so that 1 / c is finite (checked on the CPU,
   * and on CUDA under FP_FLAG_VALIDATE_DEVICE_METADATA, which copies the factors to the host;
   * otherwise CUDA reads them only in its kernels, the caller guarantees them, and the call
   * stays CUDA-graph capturable). */
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_stride_batch, q_descale_stride_head;
  int64_t k_descale_stride_batch, k_descale_stride_head;
  int64_t v_descale_stride_batch, v_descale_stride_head;

  /* Attention tuning, appended like the FP8 fields; zero-initialized, every choice is the
   * heuristic's. fp_build_index and fp_pool_kv only validate it. */
  fp_attention_tuning tuning;
} fp_problem;

/* Block selection (Eq. 19-20) and mean correction (Eq. 6). */
typedef struct fp_select_config {
  int32_t block_size;          /* logical KV block, a multiple of 64 (default 128) */
  float alpha;                 /* keep blocks with energy >= alpha * max energy, in [0, 1] (0.1) */
  int32_t sink_tokens;         /* keys [0, sink_tokens) always kept (256) */
  int32_t window_tokens;       /* keys within this distance before a tile's first query (512) */
  int32_t dense_recent_tiles;  /* the last n query tiles of every (request, KV head) run dense (1) */
  int32_t mean_correction;     /* 1: add Eq. 6 surrogates for unselected fully visible blocks */
} fp_select_config;

/* The CSR index of selected 64-token KV tiles plus the pooled block means (docs/ALGORITHM.md).
 * Segment s = (b * Hkv + h) * max_q_tiles + I. All buffers live on the problem's device. */
typedef struct fp_index {
  int32_t* cu;                 /* [num_segments + 1] */
  int32_t* idx;                /* [idx_capacity], ascending tile ids within each segment */
  float* k_mean;               /* [B, Hkv, max_blocks, D] */
  float* v_mean;               /* [B, Hkv, max_blocks, D]; may be NULL without mean correction */
  int64_t idx_capacity;
} fp_index;

typedef struct fp_index_sizes {
  int64_t num_segments;        /* B * Hkv * max_q_tiles */
  int32_t max_q_tiles;         /* ceil(g * min(max_seqlen_q, total_q) / 128) */
  int32_t max_blocks;          /* ceil(max_seqlen_k / block_size) */
  int64_t idx_capacity;        /* upper bound on selected tiles, over all segments */
  int64_t mean_elements;       /* B * Hkv * max_blocks * D, per pooled tensor */
} fp_index_sizes;

typedef struct fp_output {
  void* out;                   /* [total_q, Hq, D] in the problem's output dtype */
  int64_t out_stride_token, out_stride_head;
  float* lse;                  /* optional [Hq, total_q] */
} fp_output;

FP_API const char* fp_version(void);
FP_API const char* fp_status_string(fp_status status);
/* The message of the last failing call on this thread ("" if none). */
FP_API const char* fp_last_error_message(void);
/* 1 when this build has the CUDA path and a usable sm_90 device is present. */
FP_API int fp_cuda_available(void);

FP_API void fp_select_config_default(fp_select_config* config);

FP_API fp_status fp_index_sizes_query(const fp_problem* problem, const fp_select_config* config,
                                      fp_index_sizes* sizes);

/* Index stage: pool -> score and select -> CSR. */
FP_API fp_status fp_build_index_workspace_size(const fp_problem* problem,
                                               const fp_select_config* config, size_t* bytes);
FP_API fp_status fp_build_index(const fp_problem* problem, const fp_select_config* config,
                                const fp_index* index, void* workspace, size_t workspace_bytes);

/* Incremental pooling (Eq. 5) for chunked prefill: pools the blocks of request b from key
 * pooled_keys[b] / block_size on into k_mean (and v_mean when not NULL), [B, Hkv, max_blocks, D]
 * float32 buffers that the caller keeps beside its KV cache; lower blocks keep their means and
 * the partial block at the boundary is pooled again. pooled_keys: [B] int32 on the problem's
 * device with 0 <= pooled_keys[b] <= L_kv(b), or NULL to pool every block. No host
 * synchronization on CUDA. Follow it with fp_build_index under FP_FLAG_MEANS_POOLED. */
FP_API fp_status fp_pool_kv(const fp_problem* problem, const fp_select_config* config,
                            float* k_mean, float* v_mean, const int32_t* pooled_keys);

/* Attention stage over a given index; config->mean_correction and block_size select the
 * correction (it needs index->k_mean and v_mean). */
FP_API fp_status fp_sparse_attention_workspace_size(const fp_problem* problem,
                                                    const fp_select_config* config,
                                                    size_t* bytes);
FP_API fp_status fp_sparse_attention(const fp_problem* problem, const fp_select_config* config,
                                     const fp_index* index, const fp_output* output,
                                     void* workspace, size_t workspace_bytes);

/* Both stages; the index lives in the workspace (docs/ALGORITHM.md, "Sizes and the prefill
 * workspace"). On the CPU the index is built and consumed in query-tile ranges, so the workspace
 * grows linearly with the tokens; the call runs with less than the size query asks for, down to
 * room for one query tile's index entries, and gives the same output. */
FP_API fp_status fp_prefill_workspace_size(const fp_problem* problem,
                                           const fp_select_config* config, size_t* bytes);
FP_API fp_status fp_prefill(const fp_problem* problem, const fp_select_config* config,
                            const fp_output* output, void* workspace, size_t workspace_bytes);

/* Exact causal attention (every causal key). */
FP_API fp_status fp_dense_attention_workspace_size(const fp_problem* problem, size_t* bytes);
FP_API fp_status fp_dense_attention(const fp_problem* problem, const fp_output* output,
                                    void* workspace, size_t workspace_bytes);

/* Fraction of causal 64-token tiles (over every packed query row's visible tiles, counted per
 * query tile) that the index selects. Reads the index back: synchronizes on CUDA. */
FP_API fp_status fp_index_density(const fp_problem* problem, const fp_select_config* config,
                                  const fp_index* index, double* density);

/* The embedded benchmark workload of `flashprefill demo`, so that benchmarks in any language run
 * on the same inputs: deterministic float32 q [L, Hq, D], k and v [L, Hkv, D] (row-major, host
 * memory) with attention sinks, a local band, heavy key columns and far-back needle blocks. */
FP_API fp_status fp_demo_workload(int32_t seqlen, int32_t num_heads_q, int32_t num_heads_kv,
                                  int32_t head_dim, uint64_t seed, float* q, float* k, float* v);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHPREFILL_H_ */
