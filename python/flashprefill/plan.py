"""Plan/run: the batch layout once per forward, a cheap run() per layer.

    plan = flashprefill.Plan(32, 8, 128, torch.bfloat16, "cuda", cu_seqlens_q,
                             max_seqlen_q=8192, max_seqlen_k=8192, cu_seqlens_k=cu_seqlens_k)
    for layer in layers:
        out = plan.run(q[layer], k[layer], v[layer])

A serving engine builds one Plan per forward from the batch's metadata (varlen lengths, a page
table, maxima, the selection config) and every attention layer of that forward calls run() with its
own q, k, v. The plan holds the library's problem and config structs, the metadata tensors and a
workspace; run() checks its tensors against the plan, swaps their data pointers into the problem
and calls the library: no metadata conversion, no host synchronization, no allocation beyond out
(and lse) when they are not given. On CUDA a run() is capturable in a CUDA graph whenever the plan's
metadata tensors are int32 on the device (torch tensors of another integer dtype or on the host
are converted once, here) and validate_metadata is False or the first run() happened outside the
capture.

Chunked prefill with kept means: run(..., means=(k_mean, v_mean), pooled_keys=...) pools only the
blocks each request has not pooled yet (fp_pool_kv), builds the index from the caller's means
(fp_build_index under FP_FLAG_MEANS_POOLED) and attends (fp_sparse_attention); the caller keeps
the means beside its KV cache from one chunk to the next (flashprefill.vllm does).

The functional calls (flashprefill.prefill, dense_attention) remain for one-off use; they build a
problem on every call.
"""

import ctypes

import numpy as np

from . import _arrays, _fp8, _lib
from ._index import SelectConfig, pool_buffers
from ._problem import tuning_struct


class _Like:
    """Stands in for an array when only the place (numpy, torch CPU, a CUDA device) is known."""

    def __init__(self, dtype, device, name="plan"):
        self.dtype = dtype
        self.device = device
        self.name = name  # in messages: "plan", or the argument its dtype came from

    @property
    def on_cuda(self):
        return self.device is not None and self.device.type == "cuda"

    def place(self):
        return "numpy" if self.device is None else f"torch:{self.device}"


def _place(dtype, device):
    """(numpy or torch dtype, torch.device or None) from the Plan's dtype and device arguments."""
    torch = _arrays._torch()
    if device is None or (isinstance(device, str) and device == "numpy"):
        return np.dtype(dtype), None
    if torch is None:
        raise TypeError(f"device {device!r} needs torch (import torch first), or pass "
                        f"device=None for numpy arrays")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype for a torch device, got {dtype!r}")
    return dtype, device


class Plan:
    """One forward's attention layout; see the module docstring.

    Args:
        num_heads_q, num_heads_kv, head_dim: Hq (a multiple of Hkv), Hkv and D of every layer.
        dtype: of q, k, v and out: a torch dtype (torch.bfloat16 / float16 / float32) with a
            torch device, or a numpy dtype with device None.
        device: "cpu", "cuda", "cuda:N" or a torch.device for torch tensors; None for numpy.
        cu_seqlens_q: [B + 1] integers, cu[0] = 0, non-decreasing; request b's queries are rows
            cu[b] .. cu[b+1] of q.
        max_seqlen_q, max_seqlen_k: Python ints, bounds on every L_q(b) and L_kv(b).
        cu_seqlens_k: contiguous KV: [B + 1] integers over the rows of k and v.
        seqlens_k, page_table: paged KV: [B] key lengths L_kv(b) (cached prefix included) and
            [B, max_pages_per_seq] page ids; k and v are then [num_pages, page_size, Hkv, D].
        softmax_scale: None means 1 / sqrt(D).
        config: a SelectConfig; None means SelectConfig() (the paper's defaults).
        dense: True runs exact causal attention (fp_dense_attention) instead of the
            block-sparse prefill; config is then unused.
        validate_metadata: CUDA only: the first run() copies the metadata to the host and
            validates it (one host synchronization); later runs never synchronize. False: no
            run synchronizes, and the caller guarantees the metadata. The CPU always validates.
        tuning: an AttentionTuning fixing the CUDA attention stage's split count, head section
            or lead tiles for every run (workspace included); None leaves them to the library's
            heuristic.
        kv_dtype: the dtype of k and v when it is not `dtype`: torch.float8_e4m3fn (numpy:
            ml_dtypes.float8_e4m3fn) under a bfloat16 or float16 dtype is an FP8 KV cache
            (docs/ALGORITHM.md "FP8 e4m3"); run() then takes its descales. None means `dtype`.
        total_k: paged KV: a Python int bounding the sum of seqlens_k (checked where the lengths
            are validated). The CUDA FP8 attention gathers the pages into its workspace, sized by
            it; None sets aside batch * max_seqlen_k rows.

    Attention is causal and bottom-right aligned: a request's queries are its last L_q keys.
    """

    def __init__(self, num_heads_q, num_heads_kv, head_dim, dtype, device, cu_seqlens_q,
                 max_seqlen_q, max_seqlen_k, *, cu_seqlens_k=None, seqlens_k=None,
                 page_table=None, softmax_scale=None, config=None, dense=False,
                 validate_metadata=True, tuning=None, kv_dtype=None, total_k=None):
        dtype, device = _place(dtype, device)
        like = _Like(dtype, device)
        self._like = like
        self._kv_like = like if kv_dtype is None else _Like(_place(kv_dtype, device)[0], device)
        self.config = SelectConfig() if config is None else config
        if not isinstance(self.config, SelectConfig):
            raise TypeError(f"config: expected a flashprefill.SelectConfig, got "
                            f"{type(self.config).__name__}")
        self.dense = bool(dense)
        paged = page_table is not None or seqlens_k is not None
        if paged and (page_table is None or seqlens_k is None):
            raise ValueError("paged KV needs both seqlens_k and page_table")
        if paged == (cu_seqlens_k is not None):
            raise ValueError("give cu_seqlens_k (contiguous KV) or seqlens_k and page_table "
                             "(paged KV), not both or neither")
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"{name}: expected a Python int, got {type(value).__name__}")
            if not 0 <= value < 2**31:
                raise ValueError(f"{name} must lie in [0, 2^31), got {value}")

        c = _lib.Problem()
        c.tuning = tuning_struct(tuning)
        c.device = _lib.Device.CUDA if like.on_cuda else _lib.Device.CPU
        c.flags = _lib.FLAG_VALIDATE_DEVICE_METADATA if like.on_cuda and validate_metadata else 0
        c.dtype = _arrays.fp_dtype(_Like(like.dtype, device, "dtype"))
        if c.dtype == _lib.DType.FLOAT8_E4M3:  # its out would be bf16, not the plan's dtype
            raise TypeError("dtype: a Plan takes float32, bfloat16 or float16; FP8 e4m3 goes "
                            "through prefill() / dense_attention() with descales")
        kv_code = _arrays.fp_dtype(_Like(self._kv_like.dtype, device, "kv_dtype"))
        if kv_code != c.dtype:
            if kv_code != _lib.DType.FLOAT8_E4M3:
                raise TypeError(f"kv_dtype: {self._kv_like.dtype} differs from dtype {dtype}; a "
                                f"Plan's k and v are in its dtype or, for an FP8 KV cache, "
                                f"float8_e4m3fn")
            c.kv_dtype = kv_code  # the library checks the combination (bf16 / fp16 q)
        self._fp8 = kv_code == _lib.DType.FLOAT8_E4M3
        self._descaled = False  # the problem holds descales (cleared when a run has none)
        c.num_heads_q = _arrays.int32(num_heads_q, "num_heads_q")
        c.num_heads_kv = _arrays.int32(num_heads_kv, "num_heads_kv")
        c.head_dim = _arrays.int32(head_dim, "head_dim")
        c.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
        cu_q, _ = _arrays.int32_metadata(cu_seqlens_q, like, "cu_seqlens_q")
        if len(cu_q.shape) != 1 or cu_q.shape[0] < 2:
            raise ValueError(f"cu_seqlens_q: expected shape [B + 1] with B >= 1, got "
                             f"{cu_q.shape}")
        batch = cu_q.shape[0] - 1
        c.batch_size = batch
        c.cu_seqlens_q = cu_q.ptr
        c.max_seqlen_q, c.max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        self._metadata = [cu_q]
        if paged:
            table, _ = _arrays.int32_metadata(page_table, like, "page_table")
            if len(table.shape) != 2 or table.shape[0] != batch:
                raise ValueError(f"page_table: expected shape [B = {batch}, max_pages_per_seq], "
                                 f"got {table.shape}")
            lengths, _ = _arrays.int32_metadata(seqlens_k, like, "seqlens_k")
            if lengths.shape != (batch,):
                raise ValueError(f"seqlens_k: expected shape [B = {batch}], got "
                                 f"{lengths.shape}")
            c.kv_layout = _lib.KvLayout.PAGED
            c.page_table, c.max_pages_per_seq, c.seqlens_k = (table.ptr, table.shape[1],
                                                              lengths.ptr)
            if total_k is not None:
                if not isinstance(total_k, (int, np.integer)) or isinstance(total_k, bool):
                    raise TypeError(f"total_k: expected a Python int, got "
                                    f"{type(total_k).__name__}")
                if not 0 < total_k < 2**62:
                    raise ValueError(f"total_k must lie in (0, 2^62), got {total_k}")
                c.total_k = int(total_k)
            self._metadata += [table, lengths]
        else:
            if total_k is not None:
                raise ValueError("total_k applies to paged KV (contiguous KV: k's rows)")
            cu_k, _ = _arrays.int32_metadata(cu_seqlens_k, like, "cu_seqlens_k")
            if cu_k.shape != cu_q.shape:
                raise ValueError(f"cu_seqlens_k has shape {cu_k.shape} but cu_seqlens_q has "
                                 f"{cu_q.shape}; both are [B + 1]")
            c.kv_layout = _lib.KvLayout.CONTIGUOUS
            c.cu_seqlens_k = cu_k.ptr
            self._metadata.append(cu_k)
        self.paged = paged
        self._c = c
        self._c_config = self.config.to_c()
        self._kv_ndim = 4 if paged else 3
        self._rows = None          # (total_q, kv rows, kept means) the workspace was sized for
        self._workspace = None
        self._index = _lib.Index()            # a run with kept means: its index (cu, idx)
        self._index_buffers = (None, None)
        self._validate_once = bool(c.flags & _lib.FLAG_VALIDATE_DEVICE_METADATA)
        self._validate_every_run = False
        c.flags &= ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        self._out = _lib.Output()
        torch = _arrays._torch()
        self._torch_place = device is not None
        self._tensor = torch.Tensor if self._torch_place else None
        self._cuda_index = device.index if like.on_cuda else None
        if self.dense:
            self._call = _lib.lib.fp_dense_attention
            self._call_args = (ctypes.byref(c), ctypes.byref(self._out))
        else:
            self._call = _lib.lib.fp_prefill
            self._call_args = (ctypes.byref(c), ctypes.byref(self._c_config),
                               ctypes.byref(self._out))

    @property
    def batch_size(self):
        return self._c.batch_size

    def _check(self, a, name, ndim, heads, like):
        """a's dimensions, dtype and place against the plan's (the library checks strides);
        `like` is the plan's q/out or k/v place and dtype."""
        shape = tuple(a.shape)
        c = self._c
        if len(shape) != ndim or shape[-2] != heads or shape[-1] != c.head_dim:
            dims = ("[num_pages, page_size, Hkv, D]" if ndim == 4 else
                    f"[rows, {'Hq' if heads == c.num_heads_q else 'Hkv'}, D]")
            raise ValueError(f"{name}: expected {dims} with H = {heads}, D = {c.head_dim}, got "
                             f"shape {shape}")
        if a.dtype != like.dtype:
            raise TypeError(f"{name}: dtype {a.dtype} differs from the plan's {like.dtype}")
        device = getattr(a, "device", None) if _arrays.is_torch(a) else None
        if device != self._like.device:
            raise ValueError(f"{name} is on {device or 'numpy'} but the plan is for "
                             f"{self._like.place()}")

    def _size_workspace(self, total_q, kv_rows, pooled):
        """Sizes the workspace (and, for a run with kept means, the index buffers) for q of
        total_q rows and KV of kv_rows rows; pointers and strides are already in the problem."""
        c = self._c
        nbytes = ctypes.c_size_t()
        saved, c.flags = c.flags, c.flags & ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        try:
            if self.dense:
                _lib.call("fp_dense_attention_workspace_size", ctypes.byref(c),
                          ctypes.byref(nbytes))
            elif not pooled:
                _lib.call("fp_prefill_workspace_size", ctypes.byref(c),
                          ctypes.byref(self._c_config), ctypes.byref(nbytes))
            else:
                nbytes.value = self._size_index(c)
        finally:
            c.flags = saved
        self._workspace_bytes = nbytes.value
        if self._workspace is None or self._workspace.nbytes < nbytes.value:
            self._workspace = _arrays.Workspace(self._like, nbytes.value)
        self._rows = (total_q, kv_rows, pooled)

    def _size_index(self, c):
        """The index of a run with kept means: its sizes, cu and idx (grown when too small);
        returns the workspace bytes fp_build_index and fp_sparse_attention need."""
        config = ctypes.byref(self._c_config)
        sizes = _lib.IndexSizes()
        _lib.call("fp_index_sizes_query", ctypes.byref(c), config, ctypes.byref(sizes))
        index_bytes, attention_bytes = ctypes.c_size_t(), ctypes.c_size_t()
        _lib.call("fp_build_index_workspace_size", ctypes.byref(c), config,
                  ctypes.byref(index_bytes))
        _lib.call("fp_sparse_attention_workspace_size", ctypes.byref(c), config,
                  ctypes.byref(attention_bytes))
        self._index_sizes = sizes
        cu, idx = self._index_buffers
        if cu is None or cu.shape[0] < sizes.num_segments + 1:
            cu = _arrays.empty(self._like, (sizes.num_segments + 1,), "int32")
        if idx is None or idx.shape[0] < max(sizes.idx_capacity, 1):
            idx = _arrays.empty(self._like, (max(sizes.idx_capacity, 1),), "int32")
        self._index_buffers = (cu, idx)
        index = self._index
        index.cu, index.idx = _arrays.Array(cu, "cu").ptr, _arrays.Array(idx, "idx").ptr
        index.idx_capacity = idx.shape[0]
        return max(index_bytes.value, attention_bytes.value)

    @property
    def means_shape(self):
        """(B, Hkv, max_blocks, D), max_blocks = ceil(max_seqlen_k / block_size): the shape of
        the float32 k_mean and v_mean a run with kept means takes."""
        c = self._c
        return (c.batch_size, c.num_heads_kv, -(-c.max_seqlen_k // self.config.block_size),
                c.head_dim)

    def _means(self, means, pooled_keys):
        """(k_mean, v_mean, pooled_keys) pointers of a run with kept means, checked."""
        if self.dense:
            raise ValueError("means: a dense plan builds no index; kept means are for sparse "
                             "plans")
        if not isinstance(means, (tuple, list)) or len(means) != 2:
            raise TypeError("means: expected (k_mean, v_mean)")
        if (means[1] is None) == self.config.mean_correction:
            raise ValueError("means: v_mean must be given with mean correction and None "
                             "without it")
        return pool_buffers(means, pooled_keys, self._like, self.means_shape,
                            self._c.batch_size)

    def run(self, q, k, v, out=None, return_lse=False, *, means=None, pooled_keys=None,
            q_descale=None, k_descale=None, v_descale=None):
        """Attention of one layer under this plan.

        Args:
            q: [total_q, Hq, D] in the plan's dtype and place, head dimension contiguous.
            k, v: contiguous plan: [total_k, Hkv, D]; paged plan: [num_pages, page_size,
                Hkv, D]; in the plan's dtype and place, head dimension contiguous.
            out: optional [total_q, Hq, D] destination in q's dtype and place.
            return_lse: also return lse [Hq, total_q] float32.
            means: sparse plans: (k_mean, v_mean) float32 [B, Hkv, max_blocks, D]
                (means_shape), contiguous, in the plan's place, that the caller keeps beside
                its KV cache; v_mean is None without mean correction. The blocks from key
                pooled_keys[b] on (the block holding it included) are pooled into them
                (fp_pool_kv), the lower ones are used as they are; the index is built from them
                (FP_FLAG_MEANS_POOLED) and attended. When the lower blocks hold their Eq. 5
                means, the selection and the output are those of a run without means, bit for
                bit. On return every block of every request holds its mean. None: the library
                pools every block in its workspace (fp_prefill).
            pooled_keys: with means: [B] integers (int32 in the plan's place is used as is),
                0 <= pooled_keys[b] <= L_kv(b); None pools every block.
            q_descale, k_descale, v_descale: an FP8 KV cache's descale factors (kv_dtype
                float8_e4m3fn): None (k, v: 1; q: the library's dynamic max|q| / 448 per
                request and KV head), a number, or float32 of shape () / (1,) / [B, Hkv] in the
                plan's place (help(flashprefill.api), "FP8 e4m3").

        Returns:
            out, or (out, lse).
        """
        lse = None
        if return_lse:
            lse = _arrays.empty(_arrays.Array(q, "q"), (self._c.num_heads_q, q.shape[0]),
                                "float32")
        kept = None if means is None else self._means(means, pooled_keys)
        if kept is None and pooled_keys is not None:
            raise ValueError("pooled_keys: given without means")
        out = self._run(q, k, v, out, lse, kept=kept,
                        descales=(q_descale, k_descale, v_descale))
        return out if lse is None else (out, lse)

    def _view(self, a, name, ndim, heads, like):
        """(data pointer, shape, strides in elements) of a tensor that fits the plan (`like`:
        its q/out or k/v dtype and place); the detailed checks (and their messages) run only
        when the quick one fails."""
        if self._torch_place:
            shape = a.shape
            if (a.__class__ is not self._tensor or a.dtype != like.dtype or
                    a.device != like.device or len(shape) != ndim or
                    shape[-2] != heads or shape[-1] != self._c.head_dim):
                self._check(a, name, ndim, heads, like)
            return a.data_ptr(), shape, a.stride()
        self._check(a, name, ndim, heads, like)
        view = _arrays.Array(a, name)
        return view.ptr, view.shape, view.strides

    def _run(self, q, k, v, out, lse, per_call_workspace=False, kept=None,
             descales=(None, None, None)):
        """run() with lse given as a buffer (or None); per_call_workspace takes the workspace
        from the allocator for this call only (the torch ops' path, where plans are shared by
        calls that may run on different streams); kept: the checked pointers of run()'s means
        and pooled_keys, or None; descales: (q_descale, k_descale, v_descale)."""
        c = self._c
        kv_ndim = self._kv_ndim
        like, kv_like = self._like, self._kv_like
        c.q, q_shape, q_strides = self._view(q, "q", 3, c.num_heads_q, like)
        c.k, k_shape, k_strides = self._view(k, "k", kv_ndim, c.num_heads_kv, kv_like)
        c.v, v_shape, v_strides = self._view(v, "v", kv_ndim, c.num_heads_kv, kv_like)
        descale_arrays = None
        if self._fp8 or self._descaled or any(d is not None for d in descales):
            # Set on every run (the layers of a forward have their own scales); a plan without
            # e4m3 tensors passes them on for the library to refuse, and clears them next run.
            descale_arrays = []
            _fp8.set_fields(c, like, descales, descale_arrays)
            self._descaled = bool(descale_arrays)
        if k_shape != v_shape:
            raise ValueError(f"k has shape {tuple(k_shape)} but v has {tuple(v_shape)}")
        total_q = q_shape[0]
        c.total_q = total_q
        c.q_stride_token, c.q_stride_head = q_strides[0], q_strides[1]
        if kv_ndim == 4:
            c.num_pages, c.page_size = k_shape[0], k_shape[1]
            c.k_stride_page, c.k_stride_token, c.k_stride_head = k_strides[:3]
            c.v_stride_page, c.v_stride_token, c.v_stride_head = v_strides[:3]
            kv_rows = k_shape[0] * k_shape[1]
        else:
            c.total_k = k_shape[0]
            c.k_stride_token, c.k_stride_head = k_strides[0], k_strides[1]
            c.v_stride_token, c.v_stride_head = v_strides[0], v_strides[1]
            kv_rows = k_shape[0]
        if self._rows != (total_q, kv_rows, kept is not None):
            self._size_workspace(total_q, kv_rows, kept is not None)
        if out is None:
            out = _arrays.empty(self._like, tuple(q_shape))
        o = self._out
        o.out, out_shape, out_strides = self._view(out, "out", 3, c.num_heads_q, like)
        if out_shape != q_shape:
            raise ValueError(f"out: expected shape {tuple(q_shape)}, got {tuple(out_shape)}")
        o.out_stride_token, o.out_stride_head = out_strides[0], out_strides[1]
        if lse is None:
            o.lse = None
        else:
            la = _arrays.Array(lse, "lse")
            _arrays.require(la, "float32", (c.num_heads_q, total_q))
            if la.place() != self._like.place():
                raise ValueError(f"lse is on {la.place()} but the plan is for "
                                 f"{self._like.place()}")
            o.lse = la.ptr
        if per_call_workspace:
            ws = _arrays.Workspace(self._like, self._workspace_bytes)
        else:
            ws = self._workspace
        if self._validate_every_run or self._validate_once:
            c.flags |= _lib.FLAG_VALIDATE_DEVICE_METADATA
        call = self._call_kept if kept is not None else self._call
        args = (kept, ws) if kept is not None else (*self._call_args, ws.ptr, ws.nbytes)
        if self._cuda_index is None:
            status = call(*args)
        else:
            c.stream = _arrays.raw_stream(self._cuda_index)
            with _arrays.device_guard_index(self._cuda_index):
                status = call(*args)
        if self._validate_once:
            self._validate_once = False
        if not self._validate_every_run:
            c.flags &= ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        if status != _lib.Status.OK:
            raise _lib.FlashPrefillError(status, _lib.lib.fp_last_error_message().decode(
                errors="replace"))
        return out

    def _call_kept(self, kept, ws):
        """A run with kept means: fp_pool_kv of the blocks not pooled yet, fp_build_index from
        the means, fp_sparse_attention; the first failing call's status. Metadata validation,
        when asked for, happens in the first call."""
        c, config = self._c, ctypes.byref(self._c_config)
        k_mean, v_mean, pooled_keys = kept
        index = self._index
        index.k_mean, index.v_mean = k_mean, v_mean
        lib = _lib.lib
        status = lib.fp_pool_kv(ctypes.byref(c), config, k_mean, v_mean,
                                None if pooled_keys is None else pooled_keys.ptr)
        validating = c.flags & _lib.FLAG_VALIDATE_DEVICE_METADATA
        c.flags = (c.flags & ~_lib.FLAG_VALIDATE_DEVICE_METADATA) | _lib.FLAG_MEANS_POOLED
        try:
            if status == _lib.Status.OK:
                status = lib.fp_build_index(ctypes.byref(c), config, ctypes.byref(index),
                                            ws.ptr, ws.nbytes)
            c.flags &= ~_lib.FLAG_MEANS_POOLED
            if status == _lib.Status.OK:
                status = lib.fp_sparse_attention(ctypes.byref(c), config, ctypes.byref(index),
                                                 ctypes.byref(self._out), ws.ptr, ws.nbytes)
        finally:
            c.flags = (c.flags & ~_lib.FLAG_MEANS_POOLED) | validating
        return status
