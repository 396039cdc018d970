"""From one vLLM forward's attention metadata and paged KV cache to flashprefill calls.

This module does not import vLLM: it takes the tensors vLLM's attention layer hands over
(torch, CPU or CUDA), so it runs and is tested where vLLM is not installed. backend.py wraps
it in vLLM's AttentionBackend classes.

A forward's batch, in the order vLLM's model runner gives it when the metadata builder asks for
reorder_batch_threshold = 1:
    query_start_loc [R + 1]: request r's new tokens are rows query_start_loc[r] ..
        query_start_loc[r + 1] of q (and of out); decode requests (one new token) first.
    seq_lens [R]: request r's keys, cached prefix (earlier chunks, prefix-cache hits) plus its
        new tokens; its new tokens are its last keys. That is the library's bottom-right-aligned
        causal attention with a cached prefix, so every request is one library request.
    block_table [R, max_blocks] int32: key j of request r is row j % block_size of pool block
        block_table[r, j // block_size]; it is the library's page table as it is.
    key_cache, value_cache: [num_blocks, block_size, Hkv, D] views of the layer's cache (any
        strides, head dimension contiguous), read in place: nothing is copied. An FP8 cache
        (kv_cache_dtype "fp8" / "fp8_e4m3", which vLLM allocates as uint8) is viewed as
        float8_e4m3fn, with the layer's k_scale and v_scale as its descales.

ForwardBatch splits the requests into parts, each one library plan built at the first layer
that runs the forward and reused by every other layer (they share the shapes and the
metadata):
    decode requests (leading requests with one new token): left to the caller (vLLM's own
        decode kernel), or, with include_decodes, exact attention through the library;
    prefill / extend requests with at least Settings.min_sparse_len keys: block-sparse
        FlashPrefill attention with Settings' selection;
    shorter prefill / extend requests: exact attention through the library.
A part whose requests are consecutive in the batch reads q and writes out through row views;
otherwise its rows are gathered and scattered back.

Kept means (Settings.keep_means): a layer's KeptMeans holds the Eq. 5 means of selection blocks
beside its paged KV cache, so a chunk of a chunked prefill (or a prompt after a prefix-cache hit)
pools only the blocks it has not pooled yet; see KeptMeans.
"""

import dataclasses

import numpy as np

from .. import serving
from ..plan import Plan

@dataclasses.dataclass(frozen=True)
class Settings(serving.Settings):
    """The vLLM backend's settings: flashprefill.serving's selection settings (FLASHPREFILL_ALPHA,
    _BLOCK_SIZE, _SINK_TOKENS, _WINDOW_TOKENS, _DENSE_RECENT_TILES, _MEAN_CORRECTION,
    _MIN_SPARSE_LEN), read once when vLLM builds the metadata builder, and:

        cpu (FLASHPREFILL_VLLM_CPU, 0): on vLLM's CPU platform, replace its CPU_ATTN backend
            with flashprefill's CPU backend (own cache writes, the library's CPU path for
            prefill and decode). Never on by default.
        keep_means (FLASHPREFILL_KEEP_MEANS, 0): keep the selection blocks' means beside the
            KV cache (KeptMeans) so that each chunk pools only its new blocks; the same
            selection and output as pooling every block, bit for bit. Off unless asked for:
            the means take memory outside vLLM's KV cache budget (a K and a V mean per cache
            block, 1 / cache block size of the cache's bytes: 6.25 % at vLLM's block size 16,
            0.8 % at 128; half without mean correction), and they cannot follow KV that a KV
            connector loads (refused, refuse_kept_means_with_kv_transfer).
    """

    cpu: bool = False
    keep_means: bool = False

    ENV_NAMES = {"cpu": "VLLM_CPU"}


def _torch():
    import torch
    return torch


def _host_ints(x):
    """A host numpy int64 copy of integer metadata (torch tensor, numpy array or list)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.int64).numpy()
    return np.asarray(x, dtype=np.int64)


class Part:
    """Requests of one forward that run as one library plan (sparse or dense).

    Attributes:
        requests: their indices in the batch (ascending).
        dense: exact attention (else the Settings' selection).
        rows: slice(start, stop) of q / out when the requests are consecutive, else None.
        token_index: [tokens] int64 rows of q / out in the part's order (on the device) when
            they are not consecutive, else None.
        cu_seqlens_q, seqlens_k, page_table: the part's library metadata (int32 on the device).
        max_seqlen_q, max_seqlen_k: bounds (python ints).
    """

    def __init__(self, requests, dense, starts, lens_q, seq_lens, seq_lens_host, block_table,
                 device):
        torch = _torch()
        self.requests = requests
        self.dense = dense
        lens = lens_q[requests]
        consecutive = bool(np.all(np.diff(requests) == 1))
        first, last = int(requests[0]), int(requests[-1])
        cu = np.zeros(len(requests) + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        self.cu_seqlens_q = torch.from_numpy(cu).to(device)
        self.max_seqlen_q = int(lens.max())
        self.max_seqlen_k = int(seq_lens_host[requests].max())
        self.total_k = int(seq_lens_host[requests].sum())  # sizes a gathered FP8 cache
        if consecutive:
            self.rows = slice(int(starts[first]), int(starts[last] + lens_q[last]))
            self.token_index = None
            self.seqlens_k = seq_lens[first:last + 1]
            self.page_table = block_table[first:last + 1]
        else:
            self.rows = None
            tokens = np.concatenate([np.arange(starts[r], starts[r] + lens_q[r])
                                     for r in requests])
            self.token_index = torch.from_numpy(tokens).to(device)
            picked = torch.from_numpy(requests.astype(np.int64)).to(device)
            self.seqlens_k = seq_lens.index_select(0, picked)
            self.page_table = block_table.index_select(0, picked)
        if self.seqlens_k.dtype != torch.int32:
            self.seqlens_k = self.seqlens_k.to(torch.int32)
        if self.page_table.dtype != torch.int32:
            self.page_table = self.page_table.to(torch.int32)
        self._plans = {}
        self._mean_rows = {}

    def plan(self, q, key_cache, softmax_scale, config):
        """The part's plan for this cache and scale (built once, then reused)."""
        key = (q.dtype, key_cache.dtype, tuple(key_cache.shape), float(softmax_scale))
        plan = self._plans.get(key)
        if plan is None:
            num_heads_kv, head_dim = key_cache.shape[2:]
            plan = Plan(q.shape[1], num_heads_kv, head_dim, q.dtype, q.device,
                        self.cu_seqlens_q, self.max_seqlen_q, self.max_seqlen_k,
                        seqlens_k=self.seqlens_k, page_table=self.page_table,
                        softmax_scale=softmax_scale, config=None if self.dense else config,
                        dense=self.dense, validate_metadata=q.device.type != "cuda",
                        kv_dtype=key_cache.dtype, total_k=max(self.total_k, 1))
            self._plans[key] = plan
        return plan

    def mean_rows(self, kept, max_blocks):
        """[requests, max_blocks] int64 on the device: the KeptMeans row of each request's
        selection block J when its keys fill the block, else kept.scratch (built once per
        forward and cache layout)."""
        key = (kept.page_size, kept.block_size, kept.scratch, max_blocks)
        rows = self._mean_rows.get(key)
        if rows is None:
            rows = kept.rows(self.page_table, self.seqlens_k, max_blocks)
            self._mean_rows[key] = rows
        return rows

    def run(self, plan, q, key_cache, value_cache, out, kept, descales):
        """The part's attention into out (rows, or the scattered token_index rows); with a
        KeptMeans for the sparse part, through the kept means; descales: the keyword
        arguments k_descale, v_descale of an FP8 cache (else empty)."""
        means = pooled_keys = mean_rows = None
        if kept is not None and not self.dense:
            mean_rows = self.mean_rows(kept, plan.means_shape[2])
            means, pooled_keys = kept.gather(mean_rows)
        if self.rows is not None:
            plan.run(q[self.rows], key_cache, value_cache, out=out[self.rows], means=means,
                     pooled_keys=pooled_keys, **descales)
        else:
            result = plan.run(q.index_select(0, self.token_index), key_cache, value_cache,
                              means=means, pooled_keys=pooled_keys, **descales)
            out.index_copy_(0, self.token_index, result)
        if mean_rows is not None:
            kept.store(mean_rows, means)


class ForwardBatch:
    """The library's share of one forward, built once from the batch metadata (see the module
    docstring) and run by every attention layer of the forward.

    Args:
        settings: a Settings.
        query_start_loc: [R + 1] int, on the device (or a host copy is enough on the CPU).
        seq_lens: [R] int, on the device.
        block_table: [R, max_blocks] int, on the device.
        query_start_loc_cpu, seq_lens_cpu: host copies (seq_lens_cpu may be an upper bound
            on decode rows; prefill rows must be exact); None copies the device tensors back
            (a synchronization on CUDA).
        include_decodes: run the decode requests too (exact attention), else leave their rows
            of out to the caller.
        num_actual_tokens: rows of q that belong to requests (q may be padded past them);
            None means query_start_loc_cpu[R].

    Attributes:
        parts: the Parts the library runs (none for a batch of decodes left to the caller).
        num_decodes, num_decode_tokens: the leading one-token requests and their rows.
        starts, lens_q, seq_lens_host: host numpy copies of the metadata (int64).
        seq_lens, block_table: the device metadata, first R rows.
    """

    def __init__(self, settings, query_start_loc, seq_lens, block_table, *,
                 query_start_loc_cpu=None, seq_lens_cpu=None, include_decodes=False,
                 num_actual_tokens=None):
        starts = _host_ints(query_start_loc if query_start_loc_cpu is None
                            else query_start_loc_cpu)
        num_reqs = len(starts) - 1
        seq_host = _host_ints(seq_lens if seq_lens_cpu is None else seq_lens_cpu)[:num_reqs]
        if num_reqs < 0 or seq_lens.shape[0] < num_reqs or block_table.shape[0] < num_reqs:
            raise ValueError(f"query_start_loc has {len(starts)} entries but seq_lens has "
                             f"{seq_lens.shape[0]} and block_table {block_table.shape[0]} "
                             f"rows; expected R + 1, R and R")
        lens_q = np.diff(starts)
        if np.any(lens_q < 0) or np.any(lens_q > seq_host):
            raise ValueError("query lengths must be >= 0 and at most the sequence lengths")
        self.settings = settings
        self.config = settings.select_config()
        self.num_reqs = num_reqs
        self.starts, self.lens_q, self.seq_lens_host = starts, lens_q, seq_host
        self.seq_lens, self.block_table = seq_lens[:num_reqs], block_table[:num_reqs]
        self.num_tokens = int(starts[-1]) if num_actual_tokens is None else num_actual_tokens
        is_decode = np.zeros(num_reqs, dtype=bool)
        leading = np.flatnonzero(lens_q > 1)
        self.num_decodes = int(leading[0]) if len(leading) else num_reqs
        is_decode[:self.num_decodes] = True
        self.num_decode_tokens = int(starts[self.num_decodes])
        has_q = lens_q > 0
        sparse = has_q & ~is_decode & (seq_host >= settings.min_sparse_len)
        dense = has_q & ~sparse & (include_decodes | ~is_decode)
        self.parts = [Part(np.flatnonzero(mask), is_dense, starts, lens_q, self.seq_lens,
                           seq_host, self.block_table, block_table.device)
                      for mask, is_dense in ((sparse, False), (dense, True)) if mask.any()]

    def run(self, q, key_cache, value_cache, out, softmax_scale, kept=None, k_scale=None,
            v_scale=None):
        """Writes the attention of every part's rows into out (other rows are left alone).

        q [>= num_tokens, Hq, D], out likewise (head dimension contiguous); key_cache and
        value_cache [num_blocks, block_size, Hkv, D] in q's dtype and place, or float8_e4m3fn
        (an FP8 cache under a bfloat16 / float16 q); kept: the layer's KeptMeans (for this
        cache, under these settings' block size and mean correction), or None to pool every
        block; k_scale, v_scale: an FP8 cache's descales (the layer's _k_scale and _v_scale,
        float32 of one element, on q's device); q is quantized by the library, with
        max|q| / 448 per request and KV head (docs/ALGORITHM.md "FP8 e4m3")."""
        descales = {}
        if k_scale is not None or v_scale is not None:
            descales = dict(k_descale=k_scale, v_descale=v_scale)
        for part in self.parts:
            part.run(part.plan(q, key_cache, softmax_scale, self.config), q, key_cache,
                     value_cache, out, kept, descales)
        return out


class KeptMeans:
    """One attention layer's kept block means, beside its paged KV cache.

    Selection block J of a request (keys J * bs .. J * bs + bs - 1, bs = Settings.block_size)
    whose keys fill it has its mean at the cache block holding its last key, key
    J * bs + bs - 1: that block is shared (prefix caching) only by requests whose keys agree up
    to that key, so the mean is the same for all of them. (The cache block of its first key
    would not do: requests sharing it may differ in the rest of the selection block.) A cache
    block of `page_size` keys holds the last keys of at most ceil(page_size / bs) selection
    blocks: entry e = (last key's offset in its cache block) // bs of row
    cache_block * ends + e.

    Every write to a cache block marks its entries stale (invalidate(), from the KV cache
    update); a sparse run takes, per request, the leading run of its filled blocks whose
    entries are current as pooled (gather), the library pools the rest, and the run stores
    every filled block's mean back as current (store). So preemption, block reuse and prefix
    caching need no bookkeeping: whatever was not pooled since its cache block was last
    written is pooled again. Means are stored rounded to the cache dtype, which is exact
    (every consumer of a mean rounds it to the problem's dtype first, docs/ALGORITHM.md); for
    an FP8 cache they are stored in float32 (its consumers round a mean divided by the
    descale, so a mean rounded to e4m3 would not do), 4 / cache block size of the cache's
    bytes per kept tensor.

    Attributes:
        page_size, block_size, ends: the cache's block size, the selection block, entries per
            cache block.
        k, v: [num_blocks * ends + 1, Hkv, D] in the cache's dtype (float32 for an e4m3
            cache) and place; v is None without mean correction. The last row (`scratch`) takes the reads and writes of
            blocks a request does not fill and is never current.
        current: [num_blocks * ends + 1] bool.
    """

    def __init__(self, key_cache, block_size, mean_correction):
        torch = _torch()
        num_blocks, page_size, heads, dim = key_cache.shape
        self.page_size, self.block_size = int(page_size), int(block_size)
        self.ends = -(-self.page_size // self.block_size)
        self.scratch = int(num_blocks) * self.ends
        shape = (self.scratch + 1, heads, dim)
        dtype = torch.float32 if key_cache.dtype == torch.float8_e4m3fn else key_cache.dtype
        self.k = torch.zeros(shape, dtype=dtype, device=key_cache.device)
        self.v = torch.zeros_like(self.k) if mean_correction else None
        self.current = torch.zeros(self.scratch + 1, dtype=torch.bool, device=key_cache.device)
        self._cache = (key_cache.data_ptr(), tuple(key_cache.shape), key_cache.dtype)
        self._entries = torch.arange(self.ends, device=key_cache.device)

    def fits(self, key_cache):
        """True when these means belong to this key cache (same storage, shape and dtype)."""
        return self._cache == (key_cache.data_ptr(), tuple(key_cache.shape), key_cache.dtype)

    def invalidate(self, slot_mapping):
        """Marks the entries of every cache block that slot_mapping (slot = block * page_size +
        row; negative slots are padding) writes as stale."""
        torch = _torch()
        slots = slot_mapping.to(torch.int64)
        blocks = slots.div(self.page_size, rounding_mode="floor")
        rows = (blocks[:, None] * self.ends + self._entries).flatten()
        rows = torch.where(slots.repeat_interleave(self.ends) >= 0, rows, self.scratch)
        self.current[rows] = False

    def rows(self, page_table, seqlens_k, max_blocks):
        """[B, max_blocks] int64: the row of block J of each request (page_table [B, pages],
        seqlens_k [B], on the device) when its keys fill it, else scratch."""
        torch = _torch()
        device = page_table.device
        bs, page = self.block_size, self.page_size
        last = torch.arange(max_blocks, device=device) * bs + (bs - 1)
        column = last.div(page, rounding_mode="floor").clamp(max=page_table.shape[1] - 1)
        entry = last.remainder(page).div(bs, rounding_mode="floor")
        rows = page_table.index_select(1, column).to(torch.int64) * self.ends + entry
        filled = torch.arange(max_blocks, device=device)[None, :] < (
            seqlens_k.to(torch.int64).div(bs, rounding_mode="floor")[:, None])
        return torch.where(filled, rows, self.scratch)

    def gather(self, rows):
        """((k_mean, v_mean) float32 [B, Hkv, max_blocks, D], pooled_keys [B] int32): what
        the rows of `rows` hold (stale values where a block is not current, the scratch row's
        where it is not filled: the run pools those) and, per request, the keys of its
        leading run of current blocks."""
        torch = _torch()
        flat = rows.flatten()
        shape = tuple(rows.shape) + tuple(self.k.shape[1:])

        def means(table):
            return table.index_select(0, flat).view(shape).permute(0, 2, 1, 3).to(
                torch.float32).contiguous()

        current = self.current.index_select(0, flat).view(rows.shape).to(torch.int32)
        pooled_keys = (current.cumprod(1).sum(1) * self.block_size).to(torch.int32)
        return ((means(self.k), None if self.v is None else means(self.v)), pooled_keys)

    def store(self, rows, means):
        """Stores the means of the filled blocks of `rows` (every block of `means`, float32
        [B, Hkv, max_blocks, D], is the Eq. 5 mean after a run) and marks them current."""
        flat = rows.flatten()
        for table, mean in zip((self.k, self.v), means):
            if table is not None:
                table.index_copy_(0, flat, mean.permute(0, 2, 1, 3).reshape(
                    (-1,) + tuple(table.shape[1:])).to(table.dtype))
        self.current.index_fill_(0, flat, True)
        self.current[self.scratch] = False


def refuse_kept_means_with_kv_transfer(settings, vllm_config):
    """Raises ValueError when keep_means meets a KV connector (vllm_config.kv_transfer_config:
    disaggregated prefill, KV offloading): the kept means are current only for KV that the
    backend's cache update wrote, and a connector fills blocks behind its back."""
    if settings.keep_means and getattr(vllm_config, "kv_transfer_config", None) is not None:
        raise ValueError(f"{settings.env_name('keep_means')}=1 cannot be used with a KV "
                         f"connector (kv_transfer_config): the kept means would not follow "
                         f"the KV it loads")


def write_kv(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None):
    """Stores key, value [>= n, Hkv, D] of the n = len(slot_mapping) new tokens at their slots
    (block = slot // block_size, row = slot % block_size; negative slots are skipped), in
    place in caches of any strides. A float8_e4m3fn cache stores round_e4m3(x / scale),
    saturating at +-448, with k_scale / v_scale (a number or a one-element tensor) as the scales: what
    vLLM's reshape_and_cache_flash writes for kv_cache_dtype "fp8"."""
    torch = _torch()
    n = slot_mapping.shape[0]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    block_size = key_cache.shape[1]
    if not bool(keep.all()):
        index = torch.nonzero(keep).squeeze(1)
        slots = slots.index_select(0, index)
        key, value = key[:n].index_select(0, index), value[:n].index_select(0, index)
    else:
        key, value = key[:n], value[:n]
    blocks, rows = slots // block_size, slots % block_size
    key_cache[blocks, rows] = _stored(key, key_cache.dtype, k_scale, "k_scale")
    value_cache[blocks, rows] = _stored(value, value_cache.dtype, v_scale, "v_scale")


def _stored(x, dtype, scale, name):
    """x as a cache of `dtype` stores it (quantized with `scale` for float8_e4m3fn)."""
    torch = _torch()
    if dtype != torch.float8_e4m3fn:
        return x.to(dtype)
    if scale is None:
        raise ValueError(f"{name}: an FP8 cache needs its scale")
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return (x.to(torch.float32) / scale).clamp(-448.0, 448.0).to(dtype)


def kv_views(kv_cache, head_size):
    """vLLM's per-layer cache [num_blocks, Hkv, block_size, 2 * head_size] (logical shape, any
    physical layout) as key and value views [num_blocks, block_size, Hkv, head_size]: keys
    are the first head_size channels of a token's slot, values the last (FLASH_ATTN's
    convention). No copy. A uint8 cache is vLLM's FP8 cache, viewed as float8_e4m3fn (the
    backends take kv_cache_dtype "fp8" and "fp8_e4m3" only)."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] != 2 * head_size:
        raise ValueError(f"kv_cache: expected [num_blocks, Hkv, block_size, 2 * {head_size}], "
                         f"got {tuple(kv_cache.shape)}")
    torch = _torch()
    if kv_cache.dtype == torch.uint8:
        kv_cache = kv_cache.view(torch.float8_e4m3fn)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return key_cache, value_cache


def consecutive_span_share(block_table, seq_lens, block_size, span=128):
    """(consecutive, total): of the `span`-key spans [i * span, (i + 1) * span) that lie inside
    the requests' keys, how many have all their blocks in consecutive pool rows (block_table
    entries increasing by one). A span inside one block counts as consecutive."""
    table = _host_ints(block_table)
    consecutive = total = 0
    for r, length in enumerate(_host_ints(seq_lens)):
        for i in range(int(length) // span):
            blocks = table[r, i * span // block_size:((i + 1) * span - 1) // block_size + 1]
            consecutive += int(np.all(np.diff(blocks) == 1))
            total += 1
    return consecutive, total
