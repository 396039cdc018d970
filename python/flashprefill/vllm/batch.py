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
        strides, head dimension contiguous), read in place: nothing is copied.

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
    """

    cpu: bool = False

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

    def plan(self, q, key_cache, softmax_scale, config):
        """The part's plan for this cache and scale (built once, then reused)."""
        key = (q.dtype, tuple(key_cache.shape), float(softmax_scale))
        plan = self._plans.get(key)
        if plan is None:
            num_heads_kv, head_dim = key_cache.shape[2:]
            plan = Plan(q.shape[1], num_heads_kv, head_dim, q.dtype, q.device,
                        self.cu_seqlens_q, self.max_seqlen_q, self.max_seqlen_k,
                        seqlens_k=self.seqlens_k, page_table=self.page_table,
                        softmax_scale=softmax_scale, config=None if self.dense else config,
                        dense=self.dense, validate_metadata=q.device.type != "cuda")
            self._plans[key] = plan
        return plan


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

    def run(self, q, key_cache, value_cache, out, softmax_scale):
        """Writes the attention of every part's rows into out (other rows are left alone).

        q [>= num_tokens, Hq, D], out likewise (head dimension contiguous); key_cache and
        value_cache [num_blocks, block_size, Hkv, D] in q's dtype and place."""
        for part in self.parts:
            plan = part.plan(q, key_cache, softmax_scale, self.config)
            if part.rows is not None:
                plan.run(q[part.rows], key_cache, value_cache, out=out[part.rows])
            else:
                rows = plan.run(q.index_select(0, part.token_index), key_cache, value_cache)
                out.index_copy_(0, part.token_index, rows)
        return out


def write_kv(key, value, key_cache, value_cache, slot_mapping):
    """Stores key, value [>= n, Hkv, D] of the n = len(slot_mapping) new tokens at their slots
    (block = slot // block_size, row = slot % block_size; negative slots are skipped), in
    place in caches of any strides."""
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
    key_cache[blocks, rows] = key.to(key_cache.dtype)
    value_cache[blocks, rows] = value.to(value_cache.dtype)


def kv_views(kv_cache, head_size):
    """vLLM's per-layer cache [num_blocks, Hkv, block_size, 2 * head_size] (logical shape, any
    physical layout) as key and value views [num_blocks, block_size, Hkv, head_size]: keys
    are the first head_size channels of a token's slot, values the last (FLASH_ATTN's
    convention). No copy."""
    if kv_cache.dim() != 4 or kv_cache.shape[-1] != 2 * head_size:
        raise ValueError(f"kv_cache: expected [num_blocks, Hkv, block_size, 2 * {head_size}], "
                         f"got {tuple(kv_cache.shape)}")
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
