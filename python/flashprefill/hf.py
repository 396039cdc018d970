"""Hugging Face transformers attention backend: FlashPrefill V2 prefill, dense decode.

    import flashprefill.hf
    flashprefill.hf.register()                     # attn_implementation "sparse_prefill"
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="sparse_prefill")

Every causal self-attention call of the model goes through the library: a call with more than
one query per request runs `flashprefill.prefill` (index stage, block-sparse attention, mean
correction; a cached prefix is the request's KV beyond its queries), a call with one query per
request (decoding) runs exact `flashprefill.dense_attention`, as the paper keeps decoding dense.
Tensors stay where the model has them: CUDA tensors (bfloat16 / float16, head_dim 64 or 128)
on the GPU kernels, CPU tensors (float32 too) on the CPU reference.

Masks: the backend registers a FlashAttention-style mask function (causal_padding_mask), so a
batch without padding reaches it with no mask and a padded batch with the [B, kv_length]
boolean padding mask; padded rows are dropped (each request keeps its valid tokens, in order)
and their outputs are zeros. Rows whose position_ids restart hold several requests packed back
to back, in a batch of any size. What the library cannot compute raises instead of falling
back: non-causal attention, sliding windows and chunked attention (from the layer's arguments
or from the model's mask function), mask overlays, logit softcapping, attention sinks, additive
position biases, dropout in training, attention weights (output_attentions), masks of any
other shape, and caches whose new tokens are not their last positions (static caches).

Precision (register's dtype and kv_dtype): by default attention runs in the tensors' own dtype.
dtype="bfloat16" or "float16" casts q, k and v to it for the library (the output is cast back to
the query's dtype); dtype="float8_e4m3" quantizes each of q, k and v per tensor, FP8 Q/K/V
(docs/ALGORITHM.md "FP8 e4m3"): `x~ = round_e4m3(x * (1 / c))` with the descale
`c = max|x| / 448` over the call's tensor (1 when it is all zeros), passed as q_descale /
k_descale / v_descale; the library writes bfloat16, cast back to the query's dtype.
kv_dtype="float8_e4m3" with dtype "bfloat16" or "float16" (or None for such a model) quantizes
k and v per tensor from their own values and casts only q (the arithmetic of an FP8 KV cache;
the library quantizes q per request and KV head). transformers' cache itself stays in the
model's dtype, so this saves no memory: k and v are quantized anew at every call. The
per-tensor descales span the call's whole batch, so a request's result depends on the other
requests batched with it (engines keep one scale per layer instead: flashprefill.vllm,
flashprefill.sglang). Every call of the model, prefill and decode, runs in that precision, on
the CPU reference or the CUDA e4m3 kernels alike; nothing falls back to another precision.

Needs torch and transformers >= 5 (its AttentionInterface and AttentionMaskInterface); importing
this module does not import either.
"""

import functools

from . import api

_UNSUPPORTED = {
    "sliding_window": "sliding-window attention",
    "softcap": "logit softcapping",
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "position_bias": "additive position biases",
}

FP8 = "float8_e4m3"
E4M3_MAX = 448.0            # the largest finite e4m3fn value
_DTYPES = (None, "float32", "bfloat16", "float16", FP8)
_KV_DTYPES = (None, FP8)


def register(name="sparse_prefill", *, alpha=0.1, block_size=128, sink_tokens=256,
             window_tokens=512, dense_recent_tiles=1, mean_correction=True, dtype=None,
             kv_dtype=None):
    """Registers the backend under `name` with transformers' attention and mask interfaces.

    The selection arguments are prefill's (help(flashprefill.prefill)); alpha = 0 makes every
    call exact. dtype: the precision attention runs in, None (the tensors' own), "float32",
    "bfloat16", "float16" or "float8_e4m3" (FP8 Q/K/V, per-tensor descales); kv_dtype: None
    (dtype's) or "float8_e4m3" (k and v only, with dtype "bfloat16" or "float16"); see
    help(flashprefill.hf). Returns the attention function that was registered.

    The name may not contain "flash": transformers takes any such attn_implementation for a
    FlashAttention kernel to fetch from the Hugging Face hub (from_pretrained and
    set_attn_implementation then fail)."""
    if "flash" in name:
        raise ValueError(f"flashprefill.hf.register: the name {name!r} contains 'flash', which "
                         f"transformers reserves for FlashAttention kernels from the hub; choose "
                         f"another (the default is 'sparse_prefill')")
    _check_dtypes(dtype, kv_dtype)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    forward = functools.partial(attention_forward, alpha=alpha, block_size=block_size,
                                sink_tokens=sink_tokens, window_tokens=window_tokens,
                                dense_recent_tiles=dense_recent_tiles,
                                mean_correction=mean_correction, dtype=dtype,
                                kv_dtype=kv_dtype)
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, causal_padding_mask)
    return forward


# The parts of a transformers mask function (masking_utils) that the backend computes: causal
# attention, padding, and requests packed in a row; and_masks / the packed-sequence remapping
# are walked into. Any other part (a sliding window, chunked attention, bidirectional blocks, an
# or_mask_function overlay, a model's own function) is refused by name.
_MASK_PARTS = {"causal_mask_function", "padding_mask_function.<locals>.inner_mask",
               "packed_sequence_mask_function.<locals>.inner_mask"}
_MASK_NAMES = {"sliding_window_overlay.<locals>.inner_mask": "sliding-window attention",
               "chunked_overlay.<locals>.inner_mask": "chunked attention",
               "or_masks.<locals>.or_mask": "a mask overlay (or_mask_function, block_sequence_ids)",
               "bidirectional_mask_function": "bidirectional attention"}


def _unsupported_mask_parts(mask_function):
    """What of transformers' mask function the backend cannot compute (a list of names)."""
    name = getattr(mask_function, "__qualname__", repr(mask_function))
    if name in ("and_masks.<locals>.and_mask",
                "remap_positions_for_packed_sequence.<locals>.inner_mask"):
        parts = []
        for cell in mask_function.__closure__ or ():
            inner = cell.cell_contents
            for f in inner if isinstance(inner, tuple) else (inner,):
                if callable(f) and not hasattr(f, "shape"):  # functions, not tensors
                    parts += _unsupported_mask_parts(f)
        return parts
    return [] if name in _MASK_PARTS else [_MASK_NAMES.get(name, name)]


def causal_padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                        mask_function=None, attention_mask=None, **kwargs):
    """The mask transformers builds for this backend (its AttentionMaskInterface entry): None,
    or the [B, kv_length] boolean padding mask, as for FlashAttention; but only for causal
    attention whose queries are the last positions of the keys. Any other pattern raises
    NotImplementedError here, where transformers' mask function still says what it is, rather
    than reaching the attention calls without it: sliding windows, chunked attention and mask
    overlays, and static caches (keys past the queries' last position)."""
    from transformers.masking_utils import causal_mask_function, flash_attention_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    unsupported = _unsupported_mask_parts(mask_function)
    if unsupported:
        raise NotImplementedError(f"flashprefill.hf: the model's attention mask holds "
                                  f"{', '.join(unsupported)}; the backend computes causal "
                                  f"attention over each request's keys only")
    if int(q_offset) + q_length != int(kv_offset) + kv_length:
        raise NotImplementedError(f"flashprefill.hf: {q_length} queries from position "
                                  f"{int(q_offset)} against {kv_length} keys from position "
                                  f"{int(kv_offset)}: the new tokens are not the last positions "
                                  f"of the keys (a static cache?)")
    return flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                                mask_function, attention_mask, **kwargs)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      *, alpha=0.1, block_size=128, sink_tokens=256, window_tokens=512,
                      dense_recent_tiles=1, mean_correction=True, dtype=None, kv_dtype=None,
                      **kwargs):
    """One attention call in transformers' convention.

    query [B, Hq, Lq, D], key and value [B, Hkv, Lk, D] (Lk >= Lq: the last Lq keys are the
    queries' own); attention_mask None or a [B, >= Lk] boolean padding mask (True = a token);
    dtype and kv_dtype as register's. Returns (out [B, Lq, Hq, D] in query's dtype, None)."""
    import torch

    _check_dtypes(dtype, kv_dtype)
    _check_supported(module, attention_mask, dropout, kwargs)
    batch, heads_q, len_q, head_dim = query.shape
    if (key.dim() != 4 or key.shape[0] != batch or key.shape[3] != head_dim or
            key.shape != value.shape):
        raise ValueError(f"flashprefill.hf: key {tuple(key.shape)} and value {tuple(value.shape)} "
                         f"do not match query {tuple(query.shape)}")
    len_k = key.shape[2]
    if len_q > len_k:
        raise ValueError(f"flashprefill.hf: {len_q} queries against {len_k} keys")
    if attention_mask is not None:
        if attention_mask.shape[1] != len_k:  # transformers keeps such a mask for static caches
            raise NotImplementedError(f"flashprefill.hf: a padding mask of "
                                      f"{attention_mask.shape[1]} positions for {len_k} keys (a "
                                      f"static cache?)")
        if bool(attention_mask.all()):
            attention_mask = None

    # [B, H, L, D] -> [B, L, H, D]: the head dimension stays contiguous.
    q = query.transpose(1, 2)
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    heads_k = k.shape[2]
    q_rows = None
    packed = _packed_lengths(kwargs, batch, len_q, len_k, attention_mask)
    given_lengths = False
    if attention_mask is None:
        if packed is not None:  # rows holding several requests back to back
            cu_q, cu_k, max_q, max_k, given_lengths = packed
        else:  # made where the tensors are: no host-to-device copy (nor its synchronization)
            cu_q = torch.arange(0, (batch + 1) * len_q, len_q, dtype=torch.int32,
                                device=query.device)
            cu_k = torch.arange(0, (batch + 1) * len_k, len_k, dtype=torch.int32,
                                device=query.device)
            max_q, max_k = len_q, len_k
        if batch == 1:  # views, no copies: token and head strides are free
            q, k, v = q[0], k[0], v[0]
        else:
            q = q.reshape(batch * len_q, heads_q, head_dim)
            k = k.reshape(batch * len_k, heads_k, head_dim)
            v = v.reshape(batch * len_k, heads_k, head_dim)
    else:
        # Each request keeps its valid tokens in order; its queries are the last len_q of its
        # positions, so the valid ones are its last valid keys (bottom-right alignment holds).
        valid_k = attention_mask.to(device=query.device, dtype=torch.bool)
        valid_q = valid_k[:, -len_q:]
        if len_q < len_k and not bool(valid_q.all()):
            # New tokens behind a cache must be its last positions (a static cache's unfilled
            # slots would put them elsewhere).
            raise NotImplementedError("flashprefill.hf: new tokens that are not the last "
                                      "positions of the cache (a static cache?)")
        k_rows = valid_k.reshape(-1).nonzero().squeeze(1)
        q_rows = valid_q.reshape(-1).nonzero().squeeze(1)
        cu_k = [0] + valid_k.sum(1).cumsum(0).tolist()
        cu_q = [0] + valid_q.sum(1).cumsum(0).tolist()
        max_q, max_k = len_q, len_k
        q = q.reshape(batch * len_q, heads_q, head_dim).index_select(0, q_rows)
        k = k.reshape(batch * len_k, heads_k, head_dim).index_select(0, k_rows)
        v = v.reshape(batch * len_k, heads_k, head_dim).index_select(0, k_rows)

    # The lengths made here from the tensors' shapes, the mask or position_ids are valid by
    # construction: on CUDA the library then skips its host-side check of them (a
    # synchronization per call). cu_seq_lens given by the caller (a collator's) are checked.
    metadata = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                    max_seqlen_k=max_k, validate_metadata=given_lengths)
    q, k, v, descales = operands(q, k, v, dtype, kv_dtype)
    metadata.update(descales)
    if max_q == 1:
        out = api.dense_attention(q, k, v, softmax_scale=scaling, **metadata)
    else:
        out = api.prefill(q, k, v, softmax_scale=scaling, block_size=block_size, alpha=alpha,
                          sink_tokens=sink_tokens, window_tokens=window_tokens,
                          dense_recent_tiles=dense_recent_tiles,
                          mean_correction=mean_correction, **metadata)
    out = out.to(query.dtype)
    if q_rows is None:
        return out.reshape(batch, len_q, heads_q, head_dim), None
    full = out.new_zeros(batch * len_q, heads_q, head_dim)
    full.index_copy_(0, q_rows, out)
    return full.reshape(batch, len_q, heads_q, head_dim), None


def operands(q, k, v, dtype=None, kv_dtype=None):
    """The library's operands for `dtype` and `kv_dtype` (as register's) from q [Lq, Hq, D] and
    k, v [Lk, Hkv, D] torch tensors: (q, k, v, descales), descales the q_descale / k_descale /
    v_descale keywords of the library's calls (empty when no tensor is e4m3)."""
    _check_dtypes(dtype, kv_dtype)
    if dtype == FP8:
        (q, cq), (k, ck), (v, cv) = (quantize_per_tensor(x) for x in (q, k, v))
        return q, k, v, dict(q_descale=cq, k_descale=ck, v_descale=cv)
    import torch

    if kv_dtype != FP8:
        if dtype is not None:
            q, k, v = (x.to(getattr(torch, dtype)) for x in (q, k, v))
        return q, k, v, {}
    if dtype is not None:
        q = q.to(getattr(torch, dtype))  # k and v are quantized from their own values
    if str(q.dtype) not in ("torch.bfloat16", "torch.float16"):
        raise TypeError(f"flashprefill.hf: an e4m3 KV cache takes a bfloat16 or float16 query, "
                        f"got {q.dtype}; register with dtype='bfloat16' (or 'float16')")
    (k, ck), (v, cv) = quantize_per_tensor(k), quantize_per_tensor(v)
    return q, k, v, dict(k_descale=ck, v_descale=cv)


def quantize_per_tensor(x):
    """Direct per-tensor e4m3 quantization of a torch tensor: (round_e4m3(x * (1 / c)) as
    torch.float8_e4m3fn, c as a 0-d float32 tensor in x's place) with c = max|x| / 448 (1 when x
    is all zeros; at least the smallest normal float32, which the library requires of a descale). Out-of-range products saturate to +-448 (docs/ALGORITHM.md "FP8 e4m3"); a
    non-finite max gives a non-finite c, which the library refuses."""
    import torch

    x = x.float()
    amax = x.abs().amax() if x.numel() else x.new_zeros(())
    tiny = torch.finfo(torch.float32).tiny
    descale = torch.where(amax == 0, torch.ones_like(amax), (amax / E4M3_MAX).clamp(min=tiny))
    scaled = x * (1 / descale)
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), descale


def _check_dtypes(dtype, kv_dtype):
    if dtype not in _DTYPES:
        raise ValueError(f"flashprefill.hf: dtype {dtype!r}: expected one of {_DTYPES}")
    if kv_dtype not in _KV_DTYPES:
        raise ValueError(f"flashprefill.hf: kv_dtype {kv_dtype!r}: expected one of {_KV_DTYPES}")
    if kv_dtype == FP8 and dtype not in (None, "bfloat16", "float16"):
        raise ValueError(f"flashprefill.hf: kv_dtype {FP8!r} takes dtype None, 'bfloat16' or "
                         f"'float16' (with dtype {FP8!r} every operand is e4m3 already), got "
                         f"{dtype!r}")


def _packed_lengths(kwargs, batch, len_q, len_k, attention_mask):
    """Requests packed back to back in rows (padding-free batches): the request boundaries
    transformers passes (cu_seq_lens_q / _k with max_length_q / _k, one row) or, failing those,
    the restarts of position_ids in each row, every row starting a request (read on the host).
    (cu_q, cu_k, max_q, max_k, given: whether the caller gave the boundaries), or None."""
    given = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                     "max_length_k")]
    if all(x is not None for x in given):
        if batch != 1 or attention_mask is not None:
            raise NotImplementedError("flashprefill.hf: cu_seq_lens with a batch of several rows "
                                      "or a padding mask")
        return given[0], given[1], int(given[2]), int(given[3]), True  # int() of a 0-d tensor too
    positions = kwargs.get("position_ids")
    if positions is None or len_q != len_k or len_q < 2 or attention_mask is not None:
        return None
    positions = positions.reshape(-1, len_q).expand(batch, len_q)
    restarts = (positions[:, 1:] - positions[:, :-1]) != 1  # [B, L - 1]
    if not bool(restarts.any()):
        return None
    starts = []
    for row, steps in enumerate(restarts.tolist()):
        starts += [row * len_q] + [row * len_q + i + 1 for i, r in enumerate(steps) if r]
    starts.append(batch * len_q)
    longest = max(b - a for a, b in zip(starts, starts[1:]))
    return starts, starts, longest, longest, False


def _check_supported(module, attention_mask, dropout, kwargs):
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"flashprefill.hf: {what} ({name}) is not supported")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("flashprefill.hf: attention weights (output_attentions) are "
                                  "not computed")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if not is_causal:
        raise NotImplementedError("flashprefill.hf: only causal attention is supported")
    if dropout and getattr(module, "training", False):
        raise NotImplementedError("flashprefill.hf: attention dropout is not supported")
    import torch

    if attention_mask is not None and (attention_mask.dim() != 2 or
                                       attention_mask.dtype != torch.bool):
        raise NotImplementedError(
            "flashprefill.hf: only a [batch, kv_length] boolean padding mask is supported, got "
            f"{str(attention_mask.dtype)} {tuple(attention_mask.shape)} (register() installs the "
            "matching mask function)")
