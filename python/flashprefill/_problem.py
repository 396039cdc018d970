"""From arrays to an fp_problem: the KV description (contiguous or PagedKV), the varlen metadata,
and the checks the library cannot make because it only sees pointers (dimensions, one shape for
k and v, one dtype and one place for every array). Everything the library does validate is left
to it, so its messages reach the caller."""

import dataclasses

import numpy as np

from . import _arrays, _fp8, _lib


@dataclasses.dataclass(frozen=True)
class PagedKV:
    """A paged KV cache; pass it as `k` (with `v` left out) to any attention call.

    Key j of request b is row j % page_size of page page_table[b, j // page_size] (Eq. 22).

    Speed on CUDA (H200, bf16, D = 128, dense 32K; docs/PERF.md, "Paged KV"): caches
    whose page stride is page_size token strides (pages back to back, as in a contiguous
    [num_pages, page_size, Hkv, D] tensor) with pages of a multiple of 16 keys are read by TMA:
    1.02-1.05x the contiguous time at 128 keys per page; at 64 keys 1.02-1.04x with a request's
    pages in consecutive order and 1.12-1.14x shuffled; 1.18-1.20x at 32 and 1.21-1.26x at 16,
    shuffled. Other caches (SGLang's default page size of 1, pages of 8 or 100 keys, pages with
    gaps) go through cp.async: 1.44-1.50x shuffled. With pages back to back, wherever 128
    consecutive keys of a request lie in consecutive pool rows (pages allocated in order) they
    come in one TMA box at any page size: 1.00-1.09x at page size 1 or 100, 1.04-1.08x at 16,
    1.06-1.12x at page size 1 or 16 with the pages in runs of 1024 keys.

    Attributes:
        k_cache, v_cache: [num_pages, page_size, Hkv, D] in q's dtype and place; the head
            dimension contiguous, the other strides free (in elements; on CUDA multiples of 8,
            and the pool's rows numbered in 32 bits: include/flashprefill/flashprefill.h).
        page_table: [B, max_pages_per_seq] integer; the entries a request uses lie in
            [0, num_pages). int32 in q's place is used as is; anything else (another integer
            dtype, a list, a host array for CUDA q) is converted into q's place.
        seqlens_k: [B] integer L_kv(b), cached prefix included; converted like page_table.
    """

    k_cache: object
    v_cache: object
    page_table: object
    seqlens_k: object


@dataclasses.dataclass(frozen=True)
class AttentionTuning:
    """How the CUDA attention stage lays out its work; mirrors fp_attention_tuning
    (docs/ALGORITHM.md, "Work units"). A field left 0 is chosen by the library's heuristic from
    the problem's shapes; a value overrides it, for the workspace size and the call alike. The
    library validates the values (FlashPrefillError INVALID_ARGUMENT outside their ranges); the
    CPU has no such choices and ignores valid ones.

    Attributes:
        num_splits: ways to split each query tile's KV iterations (Eq. 18), 1 .. MAX_SPLITS
            (16); above 1 the workspace holds float partials that a combine kernel merges.
        head_section: KV heads per section of the work order, 1 .. Hkv.
        lead_tiles: query tiles of every request taken from every KV head before the head
            sections, >= 1.
    """

    num_splits: int = 0
    head_section: int = 0
    lead_tiles: int = 0

    def to_c(self):
        i32 = _arrays.int32
        return _lib.AttentionTuning(i32(self.num_splits, "num_splits"),
                                    i32(self.head_section, "head_section"),
                                    i32(self.lead_tiles, "lead_tiles"))


def tuning_struct(tuning):
    """The fp_attention_tuning of an AttentionTuning or None (every choice the heuristic's)."""
    if tuning is None:
        return _lib.AttentionTuning()
    if not isinstance(tuning, AttentionTuning):
        raise TypeError(f"tuning: expected a flashprefill.AttentionTuning, got "
                        f"{type(tuning).__name__}")
    return tuning.to_c()


class BuiltProblem:
    """An fp_problem (`c`) and every array its pointers refer to (kept alive with it)."""

    def __init__(self, c, q, keep, out_dtype):
        self.c = c
        self.q = q
        self.keep = keep
        self.out_dtype = out_dtype  # of a new out (numpy or torch dtype)
        self.fp8 = c.kv_dtype == _lib.DType.FLOAT8_E4M3 or c.dtype == _lib.DType.FLOAT8_E4M3

    def guard(self):
        return _arrays.device_guard(self.q)


def _max_length(metadata, host, cumulative):
    """The longest request of lengths (or of cumulative offsets) in `metadata`; reads `host`, the
    host copy, when there is one, else copies metadata back (a synchronization on CUDA)."""
    values = _arrays.to_host(metadata) if host is None else host
    return int((np.diff(values) if cumulative else values).max(initial=0))


def build_problem(q, k, v, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, validate_metadata=True,
                  descales=(None, None, None), tuning=None):
    """The fp_problem of q against contiguous k, v or a PagedKV passed as k (see api.py);
    descales: (q_descale, k_descale, v_descale) of an FP8 problem (_fp8.py); tuning: an
    AttentionTuning or None."""
    qa = _arrays.wrap(q, "q", 3)
    c = _lib.Problem()
    c.tuning = tuning_struct(tuning)
    c.dtype = _arrays.fp_dtype(qa)
    paged = isinstance(k, PagedKV)
    if paged:
        if v is not None:
            raise ValueError("v must be left out when k is a PagedKV (its v_cache holds the "
                             "values)")
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k does not apply to a PagedKV; its seqlens_k gives the "
                             "key lengths")
        ka = _arrays.wrap(k.k_cache, "k_cache", 4)
        va = _arrays.wrap(k.v_cache, "v_cache", 4)
    else:
        if v is None:
            raise TypeError("v is required unless k is a PagedKV")
        ka = _arrays.wrap(k, "k", 3)
        va = _arrays.wrap(v, "v", 3)
    for a in (ka, va):
        _arrays.require_same_place(qa, a)
    c.kv_dtype = _fp8.kv_dtype_code(qa, ka, va)  # the library checks the combination
    if ka.shape != va.shape:
        raise ValueError(f"{ka.name} has shape {ka.shape} but {va.name} has {va.shape}; they "
                         f"must match")
    if ka.shape[-1] != qa.shape[-1]:
        raise ValueError(f"head dimension differs: q has D = {qa.shape[-1]}, {ka.name} has "
                         f"D = {ka.shape[-1]}")

    total_q = qa.shape[0]
    cu_q, cu_q_host = _arrays.int32_metadata([0, total_q] if cu_seqlens_q is None
                                             else cu_seqlens_q, qa, "cu_seqlens_q")
    if len(cu_q.shape) != 1:
        raise ValueError(f"cu_seqlens_q: expected shape [B + 1], got {cu_q.shape}")
    batch = cu_q.shape[0] - 1
    keep = [qa, ka, va, cu_q]

    c.device = qa.fp_device
    c.stream = _arrays.stream_of(qa)
    c.flags = _lib.FLAG_VALIDATE_DEVICE_METADATA if qa.on_cuda and validate_metadata else 0
    c.batch_size = _arrays.int32(batch, "batch size (len(cu_seqlens_q) - 1)")
    c.num_heads_q = _arrays.int32(qa.shape[1], "q.shape[1]")
    c.num_heads_kv = _arrays.int32(ka.shape[-2], f"{ka.name}.shape[-2]")
    c.head_dim = _arrays.int32(qa.shape[2], "q.shape[2]")
    c.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
    c.q = qa.ptr
    c.q_stride_token, c.q_stride_head = qa.strides[0], qa.strides[1]
    c.total_q = total_q
    c.cu_seqlens_q = cu_q.ptr
    if max_seqlen_q is None:
        max_seqlen_q = _max_length(cu_q, cu_q_host, cumulative=True)
    c.max_seqlen_q = _arrays.int32(max_seqlen_q, "max_seqlen_q")
    c.k, c.v = ka.ptr, va.ptr

    if paged:
        table, table_host = _arrays.int32_metadata(k.page_table, qa, "page_table")
        if len(table.shape) != 2 or table.shape[0] != batch:
            raise ValueError(f"page_table: expected shape [B = {batch}, max_pages_per_seq], got "
                             f"{table.shape}")
        lengths, lengths_host = _arrays.int32_metadata(k.seqlens_k, qa, "seqlens_k")
        if lengths.shape != (batch,):
            raise ValueError(f"seqlens_k: expected shape [B = {batch}], got {lengths.shape}")
        keep += [table, lengths]
        c.kv_layout = _lib.KvLayout.PAGED
        c.k_stride_page, c.k_stride_token, c.k_stride_head = ka.strides[:3]
        c.v_stride_page, c.v_stride_token, c.v_stride_head = va.strides[:3]
        c.num_pages = _arrays.int32(ka.shape[0], "k_cache.shape[0] (pages)")
        c.page_size = _arrays.int32(ka.shape[1], "k_cache.shape[1] (page size)")
        c.page_table = table.ptr
        c.max_pages_per_seq = _arrays.int32(table.shape[1], "page_table.shape[1]")
        c.seqlens_k = lengths.ptr
        if max_seqlen_k is None:
            max_seqlen_k = _max_length(lengths, lengths_host, cumulative=False)
    else:
        total_k = ka.shape[0]
        if cu_seqlens_k is None and batch != 1:
            raise ValueError(f"cu_seqlens_k is required for a batch of {batch} requests (it "
                             f"defaults to [0, total_k] only for one)")
        cu_k, cu_k_host = _arrays.int32_metadata([0, total_k] if cu_seqlens_k is None
                                                 else cu_seqlens_k, qa, "cu_seqlens_k")
        if cu_k.shape != cu_q.shape:
            raise ValueError(f"cu_seqlens_k has shape {cu_k.shape} but cu_seqlens_q has "
                             f"{cu_q.shape}; both are [B + 1]")
        keep.append(cu_k)
        c.kv_layout = _lib.KvLayout.CONTIGUOUS
        c.k_stride_token, c.k_stride_head = ka.strides[0], ka.strides[1]
        c.v_stride_token, c.v_stride_head = va.strides[0], va.strides[1]
        c.total_k = total_k
        c.cu_seqlens_k = cu_k.ptr
        if max_seqlen_k is None:
            max_seqlen_k = _max_length(cu_k, cu_k_host, cumulative=True)
    c.max_seqlen_k = _arrays.int32(max_seqlen_k, "max_seqlen_k")
    _fp8.set_fields(c, qa, descales, keep)
    return BuiltProblem(c, qa, keep, _fp8.default_out_dtype(qa))
