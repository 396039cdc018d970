"""SGLang's batch and KV pools as the library's paged call; this module does not import SGLang.

SGLang holds a forward's KV as

    req_to_token [rows, max_context_len] int32: the pool slot of token j of the request in row r
    k_buffer, v_buffer [size + page_size, Hkv, D] per layer (NHD; slot s is row s), or
        [num_pages, Hkv, page_size, D] (HND)

and pages of page_size consecutive slots, page p holding slots p * page_size .. + page_size - 1,
with token j of a request at offset j % page_size of its page (SGLang's paged allocator). So the
library's page table is req_to_token strided every page_size entries, divided by page_size, and
the pool's buffers are read in place as [num_pages, page_size, Hkv, D] (`paged_kv`).

`ExtendAttention` is one forward's metadata (built once from the batch) and the plans every layer
runs: a request of `min_sparse_len` keys or more runs the block-sparse prefill, a shorter one exact
attention; the first `dense_layers` layers run exact attention for every request. Each request's
queries are its last L_q keys (its cached prefix comes first), which is the library's
bottom-right alignment, so radix-cache hits, chunked prefill and the one-query requests of a MIXED
batch need nothing else.

Needs torch.
"""

import dataclasses
import itertools

from .. import serving
from ..plan import Plan

@dataclasses.dataclass(frozen=True)
class Settings(serving.Settings):
    """The backend's settings: flashprefill.serving's selection settings (FLASHPREFILL_ALPHA,
    _BLOCK_SIZE, _SINK_TOKENS, _WINDOW_TOKENS, _DENSE_RECENT_TILES, _MEAN_CORRECTION,
    _MIN_SPARSE_LEN), read when the backend is built, and:

        dense_layers (FLASHPREFILL_DENSE_LAYERS, 0): the first n attention layers (by layer id)
            run exact attention.
        validate_metadata (FLASHPREFILL_VALIDATE_METADATA, 0): CUDA: each plan's first run
            copies its metadata to the host and checks it (a host synchronization per forward);
            off by default in serving.
    """

    dense_layers: int = 0
    validate_metadata: bool = False


def page_table(req_to_token, req_pool_indices, page_size, max_seqlen_k):
    """[B, max(1, ceil(max_seqlen_k / page_size))] int32 page ids of the batch's requests.

    req_to_token: [rows, max_context_len] pool slots; req_pool_indices: [B] rows of the batch.
    """
    import torch

    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    pages = max(1, -(-max_seqlen_k // page_size))
    columns = req_to_token[:, :pages * page_size:page_size]
    table = columns.index_select(0, req_pool_indices.to(torch.long))
    if page_size > 1:
        table = torch.div(table, page_size, rounding_mode="floor")
    return table.to(torch.int32).contiguous()


def paged_kv(buffer, page_size):
    """A layer's K or V buffer as [num_pages, page_size, Hkv, D], in place (no copy).

    buffer: NHD [slots, Hkv, D] (slots beyond the last whole page are left out) or HND
    [num_pages, Hkv, page_size, D].
    """
    if buffer.dim() == 3:
        pages = buffer.shape[0] // page_size
        return buffer[:pages * page_size].view(pages, page_size, *buffer.shape[1:])
    if buffer.dim() == 4:
        if buffer.shape[2] != page_size:
            raise ValueError(f"HND KV buffer {tuple(buffer.shape)} does not hold pages of "
                             f"{page_size} tokens")
        return buffer.transpose(1, 2)
    raise ValueError(f"KV buffer: expected [slots, Hkv, D] or [num_pages, Hkv, page_size, D], "
                     f"got {tuple(buffer.shape)}")


class ExtendAttention:
    """One extend forward's metadata and plans, shared by every layer.

    Args:
        seq_lens: [B] L_kv(b) (cached prefix included), on the device.
        extend_seq_lens: [B] L_q(b), on the device.
        seq_lens_cpu, extend_seq_lens_cpu: the same as Python ints (lists or CPU tensors);
            SGLang's batch carries both, so nothing here reads the device.
        req_to_token, req_pool_indices, page_size: SGLang's request-to-slot table, the batch's
            rows of it and the pool's page size.
        settings: a Settings.

    Plans are made on the first layer of each (heads, head_dim, dtype, softmax scale) and
    reused by the others.
    """

    def __init__(self, seq_lens, extend_seq_lens, seq_lens_cpu, extend_seq_lens_cpu,
                 req_to_token, req_pool_indices, page_size, settings):
        import torch

        lengths_k = [int(x) for x in seq_lens_cpu]
        lengths_q = [int(x) for x in extend_seq_lens_cpu]
        if len(lengths_k) != len(lengths_q) or len(lengths_k) != seq_lens.shape[0]:
            raise ValueError(f"batch of {seq_lens.shape[0]} requests with {len(lengths_k)} key "
                             f"lengths and {len(lengths_q)} query lengths")
        for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
            if not 0 <= lq <= lk:
                raise ValueError(f"request {b}: {lq} new tokens but {lk} keys")
        device = seq_lens.device
        self.settings = settings
        self.config = settings.select_config()
        self.page_size = page_size
        self.total_q = sum(lengths_q)
        self.max_seqlen_q = max(lengths_q, default=0)
        self.max_seqlen_k = max(lengths_k, default=0)
        self.total_k = sum(lengths_k)  # sizes a gathered FP8 cache
        self.seqlens_k = seq_lens.to(torch.int32)
        self.cu_seqlens_q = torch.nn.functional.pad(
            torch.cumsum(extend_seq_lens.to(torch.int32), 0, dtype=torch.int32), (1, 0))
        self.page_table = page_table(req_to_token, req_pool_indices, page_size,
                                     self.max_seqlen_k)

        short = [b for b, lk in enumerate(lengths_k) if lk < settings.min_sparse_len]
        self.all_dense = len(short) == len(lengths_k)
        self.dense_rows = None
        if short and not self.all_dense:
            # Exact attention for the short requests, over their own rows (gathered).
            starts = [0] + list(itertools.accumulate(lengths_q))
            rows = [r for b in short for r in range(starts[b], starts[b + 1])]
            picked = torch.tensor(short, dtype=torch.long, device=device)
            self.dense_rows = torch.tensor(rows, dtype=torch.long, device=device)
            short_q = [lengths_q[b] for b in short]
            self.dense_subset = dict(
                cu_seqlens_q=torch.tensor([0] + list(itertools.accumulate(short_q)),
                                          dtype=torch.int32, device=device),
                seqlens_k=self.seqlens_k.index_select(0, picked),
                page_table=self.page_table.index_select(0, picked),
                max_seqlen_q=max(short_q), max_seqlen_k=max(lengths_k[b] for b in short),
                total_k=sum(lengths_k[b] for b in short))
        self._plans = {}

    def _plan(self, q, k_pages, softmax_scale, dense, subset):
        _, heads_q, head_dim = q.shape
        heads_kv = k_pages.shape[2]
        key = (heads_q, heads_kv, head_dim, q.dtype, k_pages.dtype, softmax_scale, dense, subset)
        plan = self._plans.get(key)
        if plan is None:
            meta = self.dense_subset if subset else dict(
                cu_seqlens_q=self.cu_seqlens_q, seqlens_k=self.seqlens_k,
                page_table=self.page_table, max_seqlen_q=self.max_seqlen_q,
                max_seqlen_k=self.max_seqlen_k, total_k=self.total_k)
            plan = Plan(heads_q, heads_kv, head_dim, q.dtype, q.device,
                        meta["cu_seqlens_q"], meta["max_seqlen_q"], meta["max_seqlen_k"],
                        seqlens_k=meta["seqlens_k"], page_table=meta["page_table"],
                        softmax_scale=softmax_scale, config=self.config, dense=dense,
                        validate_metadata=self.settings.validate_metadata,
                        kv_dtype=k_pages.dtype, total_k=max(meta["total_k"], 1))
            self._plans[key] = plan
        return plan

    def run(self, q, k_pages, v_pages, softmax_scale, layer_id=None, out=None, k_descale=None,
            v_descale=None):
        """One layer: q [total_q, Hq, D]; k_pages, v_pages [num_pages, page_size, Hkv, D]
        (`paged_kv` of the pool's buffers, the batch's new tokens already saved), in q's dtype
        or float8_e4m3fn (an FP8 pool under a bfloat16 / float16 q, which the library
        quantizes with max|q| / 448 per request and KV head); k_descale, v_descale: an FP8
        pool's descales (the layer's k_scale / v_scale; None is 1). Returns out
        [total_q, Hq, D]."""
        if q.shape[0] != self.total_q:
            raise ValueError(f"q has {q.shape[0]} rows but the batch has {self.total_q} new "
                             f"tokens")
        if k_pages.shape[1] != self.page_size:
            raise ValueError(f"KV pages of {k_pages.shape[1]} tokens, the batch's page size is "
                             f"{self.page_size}")
        dense_layer = layer_id is not None and layer_id < self.settings.dense_layers
        descales = {}
        if k_descale is not None or v_descale is not None:
            descales = dict(k_descale=k_descale, v_descale=v_descale)
        whole = self._plan(q, k_pages, softmax_scale, self.all_dense or dense_layer, False)
        out = whole.run(q, k_pages, v_pages, out=out, **descales)
        if self.dense_rows is not None and not dense_layer:
            rows = self.dense_rows
            exact = self._plan(q, k_pages, softmax_scale, True, True)
            out.index_copy_(0, rows, exact.run(q.index_select(0, rows), k_pages, v_pages,
                                               **descales))
        return out
