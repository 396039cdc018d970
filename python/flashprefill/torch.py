"""torch custom ops (torch.library) over the library: torch.ops.flashprefill.*.

    import flashprefill.torch                      # registers the ops
    out = torch.ops.flashprefill.prefill(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q=L, max_seqlen_k=L)
    out = flashprefill.torch.prefill(q, k, v)      # the same op with keyword defaults

Ops (each has a fake implementation, so torch.compile(fullgraph=True) traces through it, and
passes torch.library.opcheck):
    prefill, dense_attention, sparse_attention -> out [total_q, Hq, D]
    prefill_out, dense_attention_out, sparse_attention_out: write out (and lse, when given)
    build_index -> (cu, idx, k_mean, v_mean); build_index_out writes them
    pool_kv: updates k_mean (and v_mean) in place

Tensors and metadata follow help(flashprefill.api): q [total_q, Hq, D]; contiguous KV
k, v [total_k, Hkv, D] with cu_seqlens_k; paged KV k, v [num_pages, page_size, Hkv, D] with
page_table [B, max_pages_per_seq] and seqlens_k [B]; cu_seqlens_q [B + 1] (None: one request).
lse is [Hq, total_q] float32. v_mean is an empty tensor when mean correction is off.

FP8 e4m3 (docs/ALGORITHM.md "FP8 e4m3"): q, k and v in torch.float8_e4m3fn, or a bfloat16 /
float16 q over float8_e4m3fn k and v (an FP8 KV cache), with the optional float32 descale
tensors q_descale, k_descale, v_descale (the last arguments of the attention and index ops;
pool_kv takes k_descale and v_descale): shape () or (1,) for one factor, or [B, Hkv] (FA3's),
on q's device; None is 1, except q_descale over a bfloat16 / float16 q, where None is the
library's dynamic max|q| / 448 per request and KV head. A new out is bfloat16 for an e4m3 q,
else q's dtype; an out given in bfloat16 or float16 chooses. What the library does not compute
on a device (help(flashprefill.api)) raises its FlashPrefillError there.

CUDA graphs: a call is capturable when the metadata tensors are int32 on q's device,
max_seqlen_q and max_seqlen_k are given and validate_metadata is False; it then copies nothing
from the host, never synchronizes and allocates only through torch's caching allocator (out and
the workspace). With validate_metadata True (the default) a CUDA call copies the metadata to the
host and validates it first (one synchronization).

Functional shapes that depend on the metadata (build_index's) need max_seqlen_q and
max_seqlen_k under torch.compile.
"""

import ctypes
from typing import Optional

import numpy as np
import torch

from . import _arrays, _lib, api
from ._index import Index, IndexSizes, SelectConfig
from ._problem import PagedKV, build_problem
from .plan import Plan

Tensor = torch.Tensor
_PLAN_CACHE_SIZE = 64
_plans = {}


def _config(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles, mean_correction):
    return SelectConfig(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles,
                        bool(mean_correction))


def _kv(k, v, page_table, seqlens_k):
    """(k, v) for the functional API: a PagedKV when a page table is given."""
    if page_table is None and seqlens_k is None:
        return k, v
    if page_table is None or seqlens_k is None:
        raise ValueError("paged KV needs both page_table and seqlens_k")
    return PagedKV(k, v, page_table, seqlens_k), None


def _reusable(t, device):
    """True when `t` is metadata a Plan uses as it is (int32, contiguous, on `device`): a cached
    plan then reads the caller's tensor itself, whatever its contents are now."""
    return (t is None or (t.dtype == torch.int32 and t.device == device and t.is_contiguous()))


def _cached_plan(q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                 max_seqlen_k, softmax_scale, select, validate_metadata):
    """A Plan for this call, reused across calls on the same metadata tensors; `select` is the
    selection arguments as a tuple (a SelectConfig is made only for a new plan), None for dense
    attention.

    None when the call cannot use one: maxima not given, or metadata that a plan would have to
    convert (a converted copy would not follow later changes of the caller's tensor)."""
    if max_seqlen_q is None or max_seqlen_k is None or cu_seqlens_q is None:
        return None
    if page_table is None and cu_seqlens_k is None:
        return None
    meta = (cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k)
    if not all(_reusable(t, q.device) for t in meta):
        return None
    key = (q.device, q.dtype, q.shape[1], k.shape[-2], q.shape[2], k.dim(),
           *((None, 0) if t is None else (t.data_ptr(), t.shape[0]) for t in meta),
           None if page_table is None else page_table.shape[1],
           max_seqlen_q, max_seqlen_k, softmax_scale, select, validate_metadata)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
        plan = Plan(q.shape[1], k.shape[-2], q.shape[2], q.dtype, q.device, cu_seqlens_q,
                    max_seqlen_q, max_seqlen_k, cu_seqlens_k=cu_seqlens_k, seqlens_k=seqlens_k,
                    page_table=page_table, softmax_scale=softmax_scale,
                    config=None if select is None else _config(*select), dense=select is None,
                    validate_metadata=validate_metadata)
        plan._validate_every_run = validate_metadata
        _plans[key] = plan
    return plan


def _functional(q, k, descales):
    """True for an e4m3 q, k in another dtype than q's (an FP8 KV cache, or a dtype the
    library refuses) or any descale given: such calls go through the functional API, which
    takes descales, chooses the output dtype from out and names what it refuses."""
    return (q.dtype == torch.float8_e4m3fn or k.dtype != q.dtype or
            any(d is not None for d in descales))


def _check_lse(q, lse):
    """A caller's lse on the functional paths (which copy the result into it), checked before
    any work as Plan.run checks it: float32 [Hq, total_q], contiguous, on q's device."""
    if lse is None:
        return
    _arrays.require(_arrays.Array(lse, "lse"), "float32", (q.shape[1], q.shape[0]))
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device} but q is on {q.device}")


def _attention_into(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, select, validate_metadata, out, lse, descales):
    """prefill (select: the selection arguments' tuple) or dense attention (select None) into
    out and lse; descales: (q_descale, k_descale, v_descale)."""
    plan = None
    if not _functional(q, k, descales):
        plan = _cached_plan(q, k, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k,
                            max_seqlen_q, max_seqlen_k, softmax_scale, select, validate_metadata)
    if plan is not None:
        plan._run(q, k, v, out, lse, per_call_workspace=True)
        return
    _check_lse(q, lse)
    kk, vv = _kv(k, v, page_table, seqlens_k)
    common = dict(softmax_scale=softmax_scale, cu_seqlens_q=cu_seqlens_q,
                  cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k, validate_metadata=validate_metadata, out=out,
                  q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    if select is None:
        result = api.dense_attention(q, kk, vv, return_lse=lse is not None, **common)
    else:
        c = _config(*select)
        result = api.prefill(q, kk, vv, block_size=c.block_size, alpha=c.alpha,
                             sink_tokens=c.sink_tokens, window_tokens=c.window_tokens,
                             dense_recent_tiles=c.dense_recent_tiles,
                             mean_correction=c.mean_correction, return_lse=lse is not None,
                             **common)
    if lse is not None:
        lse.copy_(result[1])


def _out_dtype(q):
    """A new out's dtype: bfloat16 for an e4m3 q, else q's."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def _new_out(q):
    return torch.empty(q.shape, dtype=_out_dtype(q), device=q.device)


# --- prefill ------------------------------------------------------------------------------------

def _prefill_out_impl(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor] = None,
                cu_seqlens_q: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                page_table: Optional[Tensor] = None, seqlens_k: Optional[Tensor] = None,
                max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                softmax_scale: Optional[float] = None, block_size: int = 128,
                alpha: float = 0.1, sink_tokens: int = 256, window_tokens: int = 512,
                dense_recent_tiles: int = 1, mean_correction: bool = True,
                validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
                k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> None:
    """Block-sparse causal prefill (index stage + attention) into out (and lse)."""
    select = (block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles, mean_correction)
    _attention_into(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, select, validate_metadata, out, lse,
                    (q_descale, k_descale, v_descale))


def _prefill_out_fake(q, k, v, out, lse=None, *args, **kwargs):
    return None


def _prefill_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor] = None,
            cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
            seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
            max_seqlen_k: Optional[int] = None, softmax_scale: Optional[float] = None,
            block_size: int = 128, alpha: float = 0.1, sink_tokens: int = 256,
            window_tokens: int = 512, dense_recent_tiles: int = 1, mean_correction: bool = True,
            validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
            k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Tensor:
    """Block-sparse causal prefill; returns out [total_q, Hq, D] in q's dtype (bfloat16 for an
    e4m3 q)."""
    out = _new_out(q)
    select = (block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles, mean_correction)
    _attention_into(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, select, validate_metadata, out, None,
                    (q_descale, k_descale, v_descale))
    return out


def _prefill_fake(q, *args, **kwargs):
    return _new_out(q)


# --- dense attention ----------------------------------------------------------------------------

def _dense_attention_out_impl(q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                        lse: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                        cu_seqlens_k: Optional[Tensor] = None,
                        page_table: Optional[Tensor] = None, seqlens_k: Optional[Tensor] = None,
                        max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                        softmax_scale: Optional[float] = None,
                        validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
                        k_descale: Optional[Tensor] = None,
                        v_descale: Optional[Tensor] = None) -> None:
    """Exact causal attention into out (and lse)."""
    _attention_into(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, None, validate_metadata, out, lse,
                    (q_descale, k_descale, v_descale))


def _dense_attention_out_fake(q, k, v, out, lse=None, *args, **kwargs):
    return None


def _dense_attention_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor] = None,
                    cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
                    seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                    max_seqlen_k: Optional[int] = None, softmax_scale: Optional[float] = None,
                    validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None,
                    v_descale: Optional[Tensor] = None) -> Tensor:
    """Exact causal attention; returns out [total_q, Hq, D] in q's dtype (bfloat16 for an e4m3
    q)."""
    out = _new_out(q)
    _attention_into(q, k, v, cu_seqlens_q, cu_seqlens_k, page_table, seqlens_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, None, validate_metadata, out, None,
                    (q_descale, k_descale, v_descale))
    return out


def _dense_attention_fake(q, *args, **kwargs):
    return _new_out(q)


# --- index stage --------------------------------------------------------------------------------

def _fill(total, count, bound, floor=None):
    """`count` lengths summing to `total`, each <= bound (and >= floor[i]), or None."""
    lengths = [0] * count if floor is None else list(floor)
    left = total - sum(lengths)
    for i in range(count):
        take = min(bound - lengths[i], left)
        if take < 0:
            return None
        lengths[i] += take
        left -= take
    return lengths if left == 0 else None


def _index_sizes(q, k, cu_seqlens_q, page_table, max_seqlen_q, max_seqlen_k, config):
    """The library's IndexSizes for a call, from shapes and maxima alone (no tensor is read), so
    that fake tensors have them too: the size query runs on a stand-in CPU problem with the same
    dimensions, totals and maxima, lengths consistent with them, and data pointers to a buffer
    that the query never reads."""
    if max_seqlen_q is None or max_seqlen_k is None:
        raise ValueError("build_index under torch.compile (or with fake tensors) needs "
                         "max_seqlen_q and max_seqlen_k: its output sizes follow them")
    batch = 1 if cu_seqlens_q is None else int(cu_seqlens_q.shape[0]) - 1
    total_q, heads_q, dim = (int(s) for s in q.shape)
    heads_kv = int(k.shape[-2])
    paged = page_table is not None
    lens_q = _fill(total_q, batch, max_seqlen_q)
    if paged:
        lens_k = lens_q
        capacity = int(page_table.shape[1]) * int(k.shape[1])
        if lens_k is not None and max(lens_k, default=0) > capacity:
            lens_k = None
    else:
        lens_k = None if lens_q is None else _fill(int(k.shape[0]), batch, max_seqlen_k, lens_q)
    if lens_q is None or lens_k is None:
        raise ValueError(f"no {batch} requests of {total_q} queries and {int(k.shape[0])} KV "
                         f"rows fit max_seqlen_q = {max_seqlen_q}, max_seqlen_k = "
                         f"{max_seqlen_k}")
    unread = np.zeros(64, np.float32)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    c = _lib.Problem()
    c.device, c.dtype = _lib.Device.CPU, _lib.DType.FLOAT32
    c.batch_size, c.num_heads_q, c.num_heads_kv, c.head_dim = batch, heads_q, heads_kv, dim
    c.q = c.k = c.v = unread.ctypes.data
    c.q_stride_token, c.q_stride_head = heads_q * dim, dim
    c.total_q, c.cu_seqlens_q, c.max_seqlen_q = total_q, cu_q.ctypes.data, max_seqlen_q
    c.max_seqlen_k = max_seqlen_k
    if paged:
        pages, page_size = int(k.shape[0]), int(k.shape[1])
        table = np.zeros((batch, int(page_table.shape[1])), np.int32)
        lengths = np.asarray(lens_k, np.int32)
        c.kv_layout = _lib.KvLayout.PAGED
        c.k_stride_page = c.v_stride_page = page_size * heads_kv * dim
        c.num_pages, c.page_size = pages, page_size
        c.page_table, c.max_pages_per_seq = table.ctypes.data, table.shape[1]
        c.seqlens_k = lengths.ctypes.data
        keep = (table, lengths)
    else:
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        c.kv_layout = _lib.KvLayout.CONTIGUOUS
        c.total_k, c.cu_seqlens_k = int(k.shape[0]), cu_k.ctypes.data
        keep = (cu_k,)
    c.k_stride_token = c.v_stride_token = heads_kv * dim
    c.k_stride_head = c.v_stride_head = dim
    sizes = _lib.IndexSizes()
    c_config = config.to_c()
    _lib.call("fp_index_sizes_query", ctypes.byref(c), ctypes.byref(c_config),
              ctypes.byref(sizes))
    del keep
    return IndexSizes(sizes.num_segments, sizes.max_q_tiles, sizes.max_blocks,
                      sizes.idx_capacity, sizes.mean_elements)


def _index_outputs(q, k, cu_seqlens_q, page_table, max_seqlen_q, max_seqlen_k, config):
    """build_index's outputs, zero-filled: the entries the index stage leaves unwritten (idx past
    cu[-1], the means of blocks past a request's keys) are then zeros, not whatever the
    allocator held, so the functional op is deterministic."""
    sizes = _index_sizes(q, k, cu_seqlens_q, page_table, max_seqlen_q, max_seqlen_k, config)
    batch = 1 if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    means = (batch, k.shape[-2], sizes.max_blocks, q.shape[2])
    device = q.device
    return (torch.zeros(sizes.num_segments + 1, dtype=torch.int32, device=device),
            torch.zeros(sizes.idx_capacity, dtype=torch.int32, device=device),
            torch.zeros(means, dtype=torch.float32, device=device),
            torch.zeros(means if config.mean_correction else (0,), dtype=torch.float32,
                        device=device))


def _build_index_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                      seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, config,
                      means_pooled, validate_metadata, descales):
    kk, vv = _kv(k, v, page_table, seqlens_k)
    problem = build_problem(q, kk, vv, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, validate_metadata, descales)
    if means_pooled:
        problem.c.flags |= _lib.FLAG_MEANS_POOLED
    index = Index(cu, idx, k_mean, v_mean if config.mean_correction else None, config)
    api._run_build_index(problem, config, index)


def _build_index_out_impl(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, idx: Tensor, k_mean: Tensor,
                    v_mean: Tensor, cu_seqlens_q: Optional[Tensor] = None,
                    cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
                    seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                    max_seqlen_k: Optional[int] = None, softmax_scale: Optional[float] = None,
                    block_size: int = 128, alpha: float = 0.1, sink_tokens: int = 256,
                    window_tokens: int = 512, dense_recent_tiles: int = 1,
                    mean_correction: bool = True, means_pooled: bool = False,
                    validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None,
                    v_descale: Optional[Tensor] = None) -> None:
    """Index stage into caller buffers sized as index_sizes() reports (v_mean: empty without
    mean correction). means_pooled: k_mean / v_mean already hold every block's means (kept by
    pool_kv); only scoring and selection run."""
    config = _config(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles,
                     mean_correction)
    _build_index_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                      seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, config, means_pooled,
                      validate_metadata, (q_descale, k_descale, v_descale))


def _build_index_out_fake(*args, **kwargs):
    return None


def _build_index_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
                seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_k: Optional[int] = None, softmax_scale: Optional[float] = None,
                block_size: int = 128, alpha: float = 0.1, sink_tokens: int = 256,
                window_tokens: int = 512, dense_recent_tiles: int = 1,
                mean_correction: bool = True, validate_metadata: bool = True,
                q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                v_descale: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Index stage; returns (cu, idx, k_mean, v_mean) as flashprefill.Index holds them."""
    config = _config(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles,
                     mean_correction)
    if max_seqlen_q is None or max_seqlen_k is None:
        kk, vv = _kv(k, v, page_table, seqlens_k)
        problem = build_problem(q, kk, vv, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, validate_metadata=False)
        max_seqlen_q, max_seqlen_k = problem.c.max_seqlen_q, problem.c.max_seqlen_k
    cu, idx, k_mean, v_mean = _index_outputs(q, k, cu_seqlens_q, page_table, max_seqlen_q,
                                             max_seqlen_k, config)
    _build_index_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                      seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, config, False,
                      validate_metadata, (q_descale, k_descale, v_descale))
    return cu, idx, k_mean, v_mean


def _build_index_fake(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, page_table=None, seqlens_k=None,
      max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None, block_size=128, alpha=0.1,
      sink_tokens=256, window_tokens=512, dense_recent_tiles=1, mean_correction=True,
      validate_metadata=True, q_descale=None, k_descale=None, v_descale=None):
    config = _config(block_size, alpha, sink_tokens, window_tokens, dense_recent_tiles,
                     mean_correction)
    return _index_outputs(q, k, cu_seqlens_q, page_table, max_seqlen_q, max_seqlen_k, config)


def _pool_kv_impl(q: Tensor, k: Tensor, v: Tensor, k_mean: Tensor, v_mean: Optional[Tensor] = None,
            pooled_keys: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
            cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
            seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
            max_seqlen_k: Optional[int] = None, block_size: int = 128,
            validate_metadata: bool = True, k_descale: Optional[Tensor] = None,
            v_descale: Optional[Tensor] = None) -> None:
    """Incremental pooling (fp_pool_kv): the blocks from pooled_keys[b] // block_size on of
    k_mean (and v_mean, when given) [B, Hkv, max_blocks, D] float32; e4m3 k and v are pooled
    dequantized (k_descale, v_descale)."""
    kk, vv = _kv(k, v, page_table, seqlens_k)
    config = SelectConfig(block_size=block_size, mean_correction=v_mean is not None)
    api.pool_kv(q, kk, vv, config, (k_mean, v_mean), pooled_keys, cu_seqlens_q, cu_seqlens_k,
                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                validate_metadata=validate_metadata, k_descale=k_descale, v_descale=v_descale)


def _pool_kv_fake(*args, **kwargs):
    return None


# --- attention over a given index ---------------------------------------------------------------

def _sparse_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                 seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, block_size,
                 mean_correction, validate_metadata, out, lse, descales):
    _check_lse(q, lse)
    config = SelectConfig(block_size=block_size, mean_correction=bool(mean_correction))
    index = Index(cu, idx, k_mean, v_mean if mean_correction else None, config)
    kk, vv = _kv(k, v, page_table, seqlens_k)
    result = api.sparse_attention(q, kk, vv, index, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                  return_lse=lse is not None, max_seqlen_q=max_seqlen_q,
                                  max_seqlen_k=max_seqlen_k,
                                  validate_metadata=validate_metadata, out=out,
                                  q_descale=descales[0], k_descale=descales[1],
                                  v_descale=descales[2])
    if lse is not None:
        lse.copy_(result[1])


def _sparse_attention_out_impl(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, idx: Tensor,
                         k_mean: Tensor, v_mean: Tensor, out: Tensor,
                         lse: Optional[Tensor] = None, cu_seqlens_q: Optional[Tensor] = None,
                         cu_seqlens_k: Optional[Tensor] = None,
                         page_table: Optional[Tensor] = None,
                         seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                         max_seqlen_k: Optional[int] = None,
                         softmax_scale: Optional[float] = None, block_size: int = 128,
                         mean_correction: bool = True, validate_metadata: bool = True,
                         q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                         v_descale: Optional[Tensor] = None) -> None:
    """Attention over the index (cu, idx, k_mean, v_mean) into out (and lse)."""
    _sparse_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                 seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, block_size,
                 mean_correction, validate_metadata, out, lse, (q_descale, k_descale, v_descale))


def _sparse_attention_out_fake(*args, **kwargs):
    return None


def _sparse_attention_impl(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, idx: Tensor, k_mean: Tensor,
                     v_mean: Tensor, cu_seqlens_q: Optional[Tensor] = None,
                     cu_seqlens_k: Optional[Tensor] = None, page_table: Optional[Tensor] = None,
                     seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                     max_seqlen_k: Optional[int] = None, softmax_scale: Optional[float] = None,
                     block_size: int = 128, mean_correction: bool = True,
                     validate_metadata: bool = True, q_descale: Optional[Tensor] = None,
                     k_descale: Optional[Tensor] = None,
                     v_descale: Optional[Tensor] = None) -> Tensor:
    """Attention over the index; returns out [total_q, Hq, D] in q's dtype (bfloat16 for an
    e4m3 q)."""
    out = _new_out(q)
    _sparse_into(q, k, v, cu, idx, k_mean, v_mean, cu_seqlens_q, cu_seqlens_k, page_table,
                 seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, block_size,
                 mean_correction, validate_metadata, out, None, (q_descale, k_descale, v_descale))
    return out


def _sparse_attention_fake(q, *args, **kwargs):
    return _new_out(q)


# --- registration -------------------------------------------------------------------------------
# Defined through torch.library.Library with the schemas inferred from the annotations above: the
# dispatcher calls the Python kernels directly (custom_op's Python wrapper would add ~0.1 ms of
# host time a call, more than Plan.run costs in all).

_LIBRARY = torch.library.Library("flashprefill", "DEF")
_MUTATES = {
    "prefill_out": ("out", "lse"), "prefill": (),
    "dense_attention_out": ("out", "lse"), "dense_attention": (),
    "build_index_out": ("cu", "idx", "k_mean", "v_mean"), "build_index": (),
    "pool_kv": ("k_mean", "v_mean"),
    "sparse_attention_out": ("out", "lse"), "sparse_attention": (),
}
for _name, _mutates in _MUTATES.items():
    _impl = globals()[f"_{_name}_impl"]
    _LIBRARY.define(_name + torch.library.infer_schema(_impl, mutates_args=_mutates))
    for _key in ("CPU", "CUDA"):
        _LIBRARY.impl(_name, _impl, _key)
    torch.library.register_fake(f"flashprefill::{_name}", globals()[f"_{_name}_fake"],
                                lib=_LIBRARY)

prefill = torch.ops.flashprefill.prefill
prefill_out = torch.ops.flashprefill.prefill_out
dense_attention = torch.ops.flashprefill.dense_attention
dense_attention_out = torch.ops.flashprefill.dense_attention_out
build_index = torch.ops.flashprefill.build_index
build_index_out = torch.ops.flashprefill.build_index_out
pool_kv = torch.ops.flashprefill.pool_kv
sparse_attention = torch.ops.flashprefill.sparse_attention
sparse_attention_out = torch.ops.flashprefill.sparse_attention_out
