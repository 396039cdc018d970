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

The functional calls (flashprefill.prefill, dense_attention) remain for one-off use; they build a
problem on every call.
"""

import ctypes

import numpy as np

from . import _arrays, _lib
from ._index import SelectConfig


class _Like:
    """Stands in for an array when only the place (numpy, torch CPU, a CUDA device) is known."""

    def __init__(self, dtype, device):
        self.dtype = dtype
        self.device = device
        self.name = "plan"

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

    Attention is causal and bottom-right aligned: a request's queries are its last L_q keys.
    """

    def __init__(self, num_heads_q, num_heads_kv, head_dim, dtype, device, cu_seqlens_q,
                 max_seqlen_q, max_seqlen_k, *, cu_seqlens_k=None, seqlens_k=None,
                 page_table=None, softmax_scale=None, config=None, dense=False,
                 validate_metadata=True):
        dtype, device = _place(dtype, device)
        like = _Like(dtype, device)
        self._like = like
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
        c.device = _lib.Device.CUDA if like.on_cuda else _lib.Device.CPU
        c.flags = _lib.FLAG_VALIDATE_DEVICE_METADATA if like.on_cuda and validate_metadata else 0
        c.dtype = _arrays.fp_dtype(like)
        c.num_heads_q, c.num_heads_kv, c.head_dim = num_heads_q, num_heads_kv, head_dim
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
            self._metadata += [table, lengths]
        else:
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
        self._rows = None          # (total_q, kv rows) the workspace was sized for
        self._workspace = None
        self._validate_once = bool(c.flags & _lib.FLAG_VALIDATE_DEVICE_METADATA)
        self._validate_every_run = False
        c.flags &= ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        self._out = _lib.Output()
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

    def _check(self, a, name, ndim, heads):
        """a's dimensions, dtype and place against the plan's (the library checks strides)."""
        shape = tuple(a.shape)
        c = self._c
        if len(shape) != ndim or shape[-2] != heads or shape[-1] != c.head_dim:
            dims = ("[num_pages, page_size, Hkv, D]" if ndim == 4 else
                    f"[rows, {'Hq' if heads == c.num_heads_q else 'Hkv'}, D]")
            raise ValueError(f"{name}: expected {dims} with H = {heads}, D = {c.head_dim}, got "
                             f"shape {shape}")
        if a.dtype != self._like.dtype:
            raise TypeError(f"{name}: dtype {a.dtype} differs from the plan's "
                            f"{self._like.dtype}")
        device = getattr(a, "device", None) if _arrays.is_torch(a) else None
        if device != self._like.device:
            raise ValueError(f"{name} is on {device or 'numpy'} but the plan is for "
                             f"{self._like.place()}")

    def _size_workspace(self, total_q, kv_rows):
        c = self._c
        nbytes = ctypes.c_size_t()
        saved, c.flags = c.flags, c.flags & ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        try:
            if self.dense:
                _lib.call("fp_dense_attention_workspace_size", ctypes.byref(c),
                          ctypes.byref(nbytes))
            else:
                _lib.call("fp_prefill_workspace_size", ctypes.byref(c),
                          ctypes.byref(self._c_config), ctypes.byref(nbytes))
        finally:
            c.flags = saved
        self._workspace_bytes = nbytes.value
        if self._workspace is None or self._workspace.nbytes < nbytes.value:
            self._workspace = _arrays.Workspace(self._like, nbytes.value)
        self._rows = (total_q, kv_rows)

    def run(self, q, k, v, out=None, return_lse=False):
        """Attention of one layer under this plan.

        Args:
            q: [total_q, Hq, D] in the plan's dtype and place, head dimension contiguous.
            k, v: contiguous plan: [total_k, Hkv, D]; paged plan: [num_pages, page_size,
                Hkv, D]; in the plan's dtype and place, head dimension contiguous.
            out: optional [total_q, Hq, D] destination in q's dtype and place.
            return_lse: also return lse [Hq, total_q] float32.

        Returns:
            out, or (out, lse).
        """
        lse = None
        if return_lse:
            lse = _arrays.empty(_arrays.Array(q, "q"), (self._c.num_heads_q, q.shape[0]),
                                "float32")
        out = self._run(q, k, v, out, lse)
        return out if lse is None else (out, lse)

    def _run(self, q, k, v, out, lse, per_call_workspace=False):
        """run() with lse given as a buffer (or None); per_call_workspace takes the workspace
        from the allocator for this call only (the torch ops' path, where plans are shared by
        calls that may run on different streams)."""
        c = self._c
        self._check(q, "q", 3, c.num_heads_q)
        self._check(k, "k", self._kv_ndim, c.num_heads_kv)
        self._check(v, "v", self._kv_ndim, c.num_heads_kv)
        if tuple(k.shape) != tuple(v.shape):
            raise ValueError(f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}")
        qa, ka, va = _arrays.Array(q, "q"), _arrays.Array(k, "k"), _arrays.Array(v, "v")
        total_q = qa.shape[0]
        c.q, c.k, c.v = qa.ptr, ka.ptr, va.ptr
        c.total_q = total_q
        c.q_stride_token, c.q_stride_head = qa.strides[0], qa.strides[1]
        if self.paged:
            c.num_pages, c.page_size = ka.shape[0], ka.shape[1]
            c.k_stride_page, c.k_stride_token, c.k_stride_head = ka.strides[:3]
            c.v_stride_page, c.v_stride_token, c.v_stride_head = va.strides[:3]
            kv_rows = ka.shape[0] * ka.shape[1]
        else:
            c.total_k = ka.shape[0]
            c.k_stride_token, c.k_stride_head = ka.strides[0], ka.strides[1]
            c.v_stride_token, c.v_stride_head = va.strides[0], va.strides[1]
            kv_rows = ka.shape[0]
        if self._rows != (total_q, kv_rows):
            self._size_workspace(total_q, kv_rows)
        if out is None:
            out = _arrays.empty(qa, qa.shape)
        else:
            self._check(out, "out", 3, c.num_heads_q)
            if tuple(out.shape) != qa.shape:
                raise ValueError(f"out: expected shape {qa.shape}, got {tuple(out.shape)}")
        oa = _arrays.Array(out, "out")
        o = self._out
        o.out, o.out_stride_token, o.out_stride_head = oa.ptr, oa.strides[0], oa.strides[1]
        if lse is None:
            o.lse = None
        else:
            la = _arrays.Array(lse, "lse")
            _arrays.require(la, "float32", (c.num_heads_q, total_q))
            _arrays.require_same_place(qa, la)
            o.lse = la.ptr
        c.stream = _arrays.stream_of(qa)
        ws = (_arrays.Workspace(qa, self._workspace_bytes) if per_call_workspace
              else self._workspace)
        if self._validate_every_run or self._validate_once:
            c.flags |= _lib.FLAG_VALIDATE_DEVICE_METADATA
        with _arrays.device_guard(qa):
            status = self._call(*self._call_args, ws.ptr, ws.nbytes)
        if self._validate_once:
            self._validate_once = False
            c.flags &= ~_lib.FLAG_VALIDATE_DEVICE_METADATA
        if status != _lib.Status.OK:
            raise _lib.FlashPrefillError(status, _lib.lib.fp_last_error_message().decode(
                errors="replace"))
        return out
