"""The public calls: prefill, dense_attention, build_index, sparse_attention, index_sizes.

Shared conventions (every call):
    q: [total_q, Hq, D] float32, float16 or bfloat16 (numpy via ml_dtypes, or torch); a packed
        varlen batch, the rows of request b at cu_seqlens_q[b] .. cu_seqlens_q[b+1]. The head
        dimension D must be contiguous; the token and head strides are free (in elements).
    k, v: [total_k, Hkv, D] in q's dtype and place, rows of request b at cu_seqlens_k[b] ..
        cu_seqlens_k[b+1]; same layout rule as q; Hq a multiple of Hkv. Or pass a PagedKV as k
        and leave v out.
    cu_seqlens_q, cu_seqlens_k: [B + 1] integer, starting at 0, non-decreasing; None means one
        request over all rows (cu_seqlens_k is required when B > 1). int32 arrays in q's place
        are used as they are; lists, other integer dtypes and host arrays for CUDA q are
        converted into q's place.
    Attention is causal and bottom-right aligned: query i of request b sits at absolute
    position L_kv(b) - L_q(b) + i (L_q <= L_kv; the difference is a cached prefix) and sees the
    keys at positions <= its own.
    softmax_scale: None (or 0) means 1 / sqrt(D).
    Place: all arrays are numpy (CPU), or all are torch tensors on the CPU, or all on one CUDA
        device; on CUDA the call is queued on torch.cuda.current_stream() of that device and
        its workspace comes from torch's allocator.
    max_seqlen_q, max_seqlen_k: bounds on the lengths (>= every L_q(b), L_kv(b)); None reads
        the metadata, which costs a host synchronization when it is a CUDA tensor.
    validate_metadata: CUDA only: copy the metadata to the host and validate it (one host
        synchronization). With False, max_seqlen_q / max_seqlen_k given and metadata tensors
        already int32 on the device, a call never synchronizes the host (CUDA-graph
        capturable) and the caller guarantees the metadata is valid. The CPU always validates.
    out: optional [total_q, Hq, D] destination in q's dtype and place, head dimension
        contiguous; a new contiguous array when None.
    Returned out: [total_q, Hq, D] in q's dtype; lse: [Hq, total_q] float32, the natural-log
    log-sum-exp of the scaled logits of every row. Nothing is differentiable.
    tuning (keyword-only, the attention calls): an AttentionTuning that fixes the CUDA attention
        stage's split count, head section or lead tiles; None (or a field 0) leaves each to the
        library's heuristic. The CPU ignores it.
    FP8 e4m3 (docs/ALGORITHM.md "FP8 e4m3"): q, k and v in float8_e4m3fn
        (ml_dtypes.float8_e4m3fn or torch.float8_e4m3fn), or a bfloat16/float16 q over
        float8_e4m3fn k and v (an FP8 KV cache; the library quantizes q per (request, KV head)
        with q_descale, or with c_q = max|q| / 448 when q_descale is None). q_descale,
        k_descale, v_descale (keyword-only): the descale factors c (value = c * e4m3 value):
        None (1), a number, or float32 of shape () / (1,) / [B, Hkv] in q's place (FA3's
        descales; strides free, 0 broadcasts). out is bfloat16 for an e4m3 q, else q's dtype;
        an out given in bfloat16 or float16 chooses the output dtype. On CUDA
        (torch.float8_e4m3fn tensors and float32 descale tensors on q's device) every call
        takes both FP8 problems, e4m3 q, k and v, and a bfloat16 / float16 q over e4m3 k and v
        (quantized on the device), contiguous or paged KV, with a bfloat16 or float16 out and
        e4m3 strides (token, head, page) of multiples of 16 elements; anything else raises
        FlashPrefillError UNSUPPORTED.

Errors: every failure the library reports raises FlashPrefillError(status, message); what the
library cannot see (dimensions, k and v shapes, dtypes, places, buffer sizes) raises ValueError
or TypeError here.
"""

import ctypes

from . import _arrays, _fp8, _lib
from ._index import Index, SelectConfig, index_struct, pool_buffers, query_sizes
from ._problem import build_problem


class _Outputs:
    """out (given or new) and lse (when asked for) of one attention call, as an fp_output."""

    def __init__(self, problem, out, return_lse):
        q = problem.q
        total_q, num_heads_q, _ = q.shape
        if out is None:
            out = _fp8.empty(q, q.shape, problem.out_dtype)
        oa = _arrays.wrap(out, "out", 3)
        _arrays.require_same_place(q, oa)
        if problem.fp8 and oa.shape == q.shape and oa.dtype != problem.out_dtype:
            problem.c.out_dtype = _fp8.out_dtype_code(oa)
        elif oa.dtype != problem.out_dtype or oa.shape != q.shape:
            raise ValueError(f"out: expected shape {q.shape} and dtype {problem.out_dtype}, got "
                             f"{oa.shape} {oa.dtype}")
        if oa.device is None and not out.flags.writeable:
            raise ValueError("out: the array is read-only")
        self.out = out
        self.lse = _arrays.empty(q, (num_heads_q, total_q), "float32") if return_lse else None
        lse_ptr = None if self.lse is None else _arrays.Array(self.lse, "lse").ptr
        self.c = _lib.Output(oa.ptr, oa.strides[0], oa.strides[1], lse_ptr)

    def result(self):
        return self.out if self.lse is None else (self.out, self.lse)


def _workspace(problem, query, *args):
    nbytes = ctypes.c_size_t()
    _lib.call(query, ctypes.byref(problem.c), *args, ctypes.byref(nbytes))
    return _arrays.Workspace(problem.q, nbytes.value)


def _means_shape(problem, config):
    c = problem.c
    return (c.batch_size, c.num_heads_kv, query_sizes(problem, config).max_blocks, c.head_dim)


def _build_index(problem, config, means=None):
    q = problem.q
    sizes = query_sizes(problem, config)
    if means is None:
        shape = _means_shape(problem, config)
        means = (_arrays.empty(q, shape, "float32"),
                 _arrays.empty(q, shape, "float32") if config.mean_correction else None)
    else:
        problem.c.flags |= _lib.FLAG_MEANS_POOLED
    index = Index(cu=_arrays.empty(q, (sizes.num_segments + 1,), "int32"),
                  idx=_arrays.empty(q, (sizes.idx_capacity,), "int32"),
                  k_mean=means[0], v_mean=means[1], config=config)
    _run_build_index(problem, config, index)
    return index


def _run_build_index(problem, config, index):
    """fp_build_index of a BuiltProblem into the buffers of `index`."""
    c_index = index_struct(index, problem)
    c_config = config.to_c()
    workspace = _workspace(problem, "fp_build_index_workspace_size", ctypes.byref(c_config))
    with problem.guard():
        _lib.call("fp_build_index", ctypes.byref(problem.c), ctypes.byref(c_config),
                  ctypes.byref(c_index), workspace.ptr, workspace.nbytes)
    index._problem = problem


def _sparse_attention(problem, index, out, return_lse):
    c_index = index_struct(index, problem)
    c_config = index.config.to_c()
    outputs = _Outputs(problem, out, return_lse)
    workspace = _workspace(problem, "fp_sparse_attention_workspace_size", ctypes.byref(c_config))
    with problem.guard():
        _lib.call("fp_sparse_attention", ctypes.byref(problem.c), ctypes.byref(c_config),
                  ctypes.byref(c_index), ctypes.byref(outputs.c), workspace.ptr,
                  workspace.nbytes)
    return outputs


def prefill(q, k, v=None, softmax_scale=None, block_size=128, alpha=0.1, sink_tokens=256,
            window_tokens=512, dense_recent_tiles=1, mean_correction=True, cu_seqlens_q=None,
            cu_seqlens_k=None, return_stats=False, *, return_lse=False, max_seqlen_q=None,
            max_seqlen_k=None, validate_metadata=True, out=None, q_descale=None, k_descale=None,
            v_descale=None, tuning=None):
    """Block-sparse causal prefill attention (FlashPrefill V2): index stage, then attention.

    Args:
        q: [total_q, Hq, D] float32 / float16 / bfloat16, a numpy array (CPU) or a torch
            tensor (CPU or CUDA), head dimension contiguous.
        k, v: [total_k, Hkv, D] in q's dtype and place, head dimension contiguous; or a
            PagedKV as k with v left out.
        softmax_scale: None means 1 / sqrt(D).
        block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles, mean_correction:
            the selection (see SelectConfig; alpha = 0 is dense attention).
        cu_seqlens_q, cu_seqlens_k: [B + 1] integer, in q's place or convertible to it; None
            means one request.
        return_stats: also return a dict of index statistics. This runs the two stages as
            separate calls (build_index, fp_index_density, sparse_attention) and reads the
            index back (a host synchronization on CUDA).
        return_lse, max_seqlen_q, max_seqlen_k, validate_metadata, out, tuning: see
            help(flashprefill.api).

    Returns:
        out [total_q, Hq, D] in q's dtype and place; with return_lse also lse [Hq, total_q]
        float32; with return_stats also a dict with 'density' (selected / causal 64-token
        tiles, float), 'selected_tiles', 'num_segments', 'max_q_tiles', 'max_blocks' and
        'idx_capacity' (ints). In that order: out, lse, stats.
    """
    config = SelectConfig(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles,
                          bool(mean_correction))
    problem = build_problem(q, k, v, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, (q_descale, k_descale, v_descale),
                            tuning)
    if not return_stats:
        c_config = config.to_c()
        outputs = _Outputs(problem, out, return_lse)
        workspace = _workspace(problem, "fp_prefill_workspace_size", ctypes.byref(c_config))
        with problem.guard():
            _lib.call("fp_prefill", ctypes.byref(problem.c), ctypes.byref(c_config),
                      ctypes.byref(outputs.c), workspace.ptr, workspace.nbytes)
        return outputs.result()
    index = _build_index(problem, config)
    outputs = _sparse_attention(problem, index, out, return_lse)
    sizes = query_sizes(problem, config)
    stats = {"density": index.density(),
             "selected_tiles": int(index.cu[-1]),
             "num_segments": sizes.num_segments, "max_q_tiles": sizes.max_q_tiles,
             "max_blocks": sizes.max_blocks, "idx_capacity": sizes.idx_capacity}
    result = outputs.result()
    return (*result, stats) if isinstance(result, tuple) else (result, stats)


def dense_attention(q, k, v=None, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    return_lse=False, *, max_seqlen_q=None, max_seqlen_k=None,
                    validate_metadata=True, out=None, q_descale=None, k_descale=None,
                    v_descale=None, tuning=None):
    """Exact causal attention over every causal key (on the CPU accumulated in float64).

    Args:
        q: [total_q, Hq, D] float32 / float16 / bfloat16, a numpy array (CPU) or a torch
            tensor (CPU or CUDA), head dimension contiguous.
        k, v: [total_k, Hkv, D] in q's dtype and place, head dimension contiguous; or a
            PagedKV as k with v left out.
        softmax_scale: None means 1 / sqrt(D).
        cu_seqlens_q, cu_seqlens_k: [B + 1] integer; None means one request.
        return_lse, max_seqlen_q, max_seqlen_k, validate_metadata, out, tuning: see
            help(flashprefill.api).

    Returns:
        out [total_q, Hq, D] in q's dtype and place, or (out, lse [Hq, total_q] float32).
    """
    problem = build_problem(q, k, v, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, (q_descale, k_descale, v_descale),
                            tuning)
    outputs = _Outputs(problem, out, return_lse)
    workspace = _workspace(problem, "fp_dense_attention_workspace_size")
    with problem.guard():
        _lib.call("fp_dense_attention", ctypes.byref(problem.c), ctypes.byref(outputs.c),
                  workspace.ptr, workspace.nbytes)
    return outputs.result()


def build_index(q, k, v=None, config=None, softmax_scale=None, cu_seqlens_q=None,
                cu_seqlens_k=None, *, max_seqlen_q=None, max_seqlen_k=None,
                validate_metadata=True, means=None, q_descale=None, k_descale=None,
                v_descale=None):
    """Index stage: pool K/V block means, score and select blocks, write the CSR (Eq. 5, 19-20).

    Args:
        q: [total_q, Hq, D] float32 / float16 / bfloat16, a numpy array (CPU) or a torch
            tensor (CPU or CUDA), head dimension contiguous.
        k, v: [total_k, Hkv, D] in q's dtype and place; or a PagedKV as k with v left out.
        config: a SelectConfig; None means SelectConfig().
        softmax_scale: None means 1 / sqrt(D) (it scales the block scores).
        cu_seqlens_q, cu_seqlens_k: [B + 1] integer; None means one request.
        max_seqlen_q, max_seqlen_k, validate_metadata: see help(flashprefill.api).
        means: None pools K/V here; or (k_mean, v_mean) kept current by pool_kv(), which the
            index then uses as they are (FP_FLAG_MEANS_POOLED: only scoring and selection run).

    Returns:
        An Index in q's place: cu [num_segments + 1] int32, idx [idx_capacity] int32,
        k_mean and v_mean [B, Hkv, max_blocks, D] float32 (v_mean None without mean
        correction), and its config. Index.density() gives the selected fraction.
    """
    problem = build_problem(q, k, v, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, (q_descale, k_descale, v_descale))
    return _build_index(problem, SelectConfig() if config is None else config, means)


def pool_kv(q, k, v=None, config=None, means=None, pooled_keys=None, cu_seqlens_q=None,
            cu_seqlens_k=None, *, max_seqlen_q=None, max_seqlen_k=None, validate_metadata=True,
            k_descale=None, v_descale=None):
    """Incremental pooling of K/V block means for chunked prefill (fp_pool_kv, Eq. 5).

    A serving engine keeps the means beside its KV cache: each chunk pools only the blocks from
    pooled_keys[b] // block_size on (the partial block at the boundary is pooled again), then
    passes the means to build_index(..., means=...), which skips pooling.

    Args:
        q, k, v, cu_seqlens_q, cu_seqlens_k: the chunk's problem, as for build_index (the
            queries only size the problem; pooling reads k and v).
        config: a SelectConfig (its block_size and mean_correction); None means SelectConfig().
        means: (k_mean, v_mean) float32 [B, Hkv, max_blocks, D], contiguous, in q's place, to
            update in place; None allocates them (and pools every block). v_mean is None when
            mean correction is off.
        pooled_keys: [B] integers, keys of each request already pooled (0 <= pooled_keys[b]
            <= L_kv(b)); None pools every block.

    Returns:
        (k_mean, v_mean).
    """
    problem = build_problem(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, (None, k_descale, v_descale))
    config = SelectConfig() if config is None else config
    shape = _means_shape(problem, config)
    if means is None:
        means = (_arrays.empty(problem.q, shape, "float32"),
                 _arrays.empty(problem.q, shape, "float32") if config.mean_correction else None)
    k_mean, v_mean, done = pool_buffers(means, pooled_keys, problem.q, shape,
                                        problem.c.batch_size)
    c_config = config.to_c()
    with problem.guard():
        _lib.call("fp_pool_kv", ctypes.byref(problem.c), ctypes.byref(c_config), k_mean,
                  v_mean, None if done is None else done.ptr)
    return means


def sparse_attention(q, k, v=None, index=None, softmax_scale=None, cu_seqlens_q=None,
                     cu_seqlens_k=None, return_lse=False, *, max_seqlen_q=None,
                     max_seqlen_k=None, validate_metadata=True, out=None, q_descale=None,
                     k_descale=None, v_descale=None, tuning=None):
    """Attention stage: exact attention over the index's tiles plus, when index.config has
    mean_correction, one Eq. 6 surrogate key per unlisted fully visible block.

    Args:
        q: [total_q, Hq, D] float32 / float16 / bfloat16, a numpy array (CPU) or a torch
            tensor (CPU or CUDA), head dimension contiguous.
        k, v: [total_k, Hkv, D] in q's dtype and place; or a PagedKV as k with v=None.
        index: an Index for this problem (from build_index, or built from a block mask with
            the sizes index_sizes() reports), in q's place; required.
        softmax_scale: None means 1 / sqrt(D).
        cu_seqlens_q, cu_seqlens_k: [B + 1] integer; None means one request.
        return_lse, max_seqlen_q, max_seqlen_k, validate_metadata, out, tuning: see
            help(flashprefill.api).

    Returns:
        out [total_q, Hq, D] in q's dtype and place, or (out, lse [Hq, total_q] float32).
    """
    if not isinstance(index, Index):
        raise TypeError(f"index: expected a flashprefill.Index, got {type(index).__name__}")
    problem = build_problem(q, k, v, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, (q_descale, k_descale, v_descale),
                            tuning)
    return _sparse_attention(problem, index, out, return_lse).result()


def index_sizes(q, k, v=None, config=None, cu_seqlens_q=None, cu_seqlens_k=None, *,
                max_seqlen_q=None, max_seqlen_k=None, q_descale=None, k_descale=None,
                v_descale=None):
    """The IndexSizes of an index for this problem and config (fp_index_sizes_query).

    Args as for build_index; no array is read except the length metadata (and that only when
    max_seqlen_q / max_seqlen_k are not given).
    """
    problem = build_problem(q, k, v, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata=False,
                            descales=(q_descale, k_descale, v_descale))
    return query_sizes(problem, SelectConfig() if config is None else config)


def cuda_available():
    """True when the library has the CUDA path and a usable sm_90 device is present."""
    return _lib.cuda_available()
