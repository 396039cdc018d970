"""Llama decoder forward (SmolLM2-135M) with a per-layer prefill-attention hook and a dense KV cache.

Array backend: numpy float32 on the CPU, torch float32 on CUDA when torch sees a GPU (`Ops.pick`).
The prefill attention of every layer goes through `attention(layer, q, k, v)` with
q [L, Hq, D], k and v [L, Hkv, D] (RoPE applied), returning [L, Hq, D] in the same array type;
decode steps always use exact attention over the cache, as in the paper's serving setup.

RoPE pairs adjacent dimensions (2i, 2i+1): the GGUF converter permutes the Q/K projection rows so
that this matches the checkpoint's original rotate-half layout.
"""

from __future__ import annotations

import math

import numpy as np

from gguf_weights import LlamaConfig


class Ops:
    """The handful of array operations the forward needs, for numpy or torch."""

    def __init__(self, torch_module=None, device=None):
        self.torch = torch_module
        self.device = device

    @staticmethod
    def pick(prefer_gpu: bool = True) -> "Ops":
        if prefer_gpu:
            try:
                import torch
            except ImportError:
                return Ops()
            if torch.cuda.is_available():
                torch.backends.cuda.matmul.allow_tf32 = False
                return Ops(torch, torch.device("cuda"))
        return Ops()

    @property
    def name(self) -> str:
        return "torch-cuda" if self.torch is not None else "numpy-cpu"

    def asarray(self, x, dtype=np.float32):
        if self.torch is None:
            return np.ascontiguousarray(x, dtype=dtype)
        tdtype = {np.float32: self.torch.float32, np.int64: self.torch.int64}[dtype]
        return self.torch.as_tensor(np.asarray(x, dtype=dtype), device=self.device, dtype=tdtype)

    def numpy(self, x) -> np.ndarray:
        return x if self.torch is None else x.detach().cpu().numpy()

    def rsqrt_mean_sq(self, x, eps):
        if self.torch is None:
            return 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return self.torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)

    def silu(self, x):
        if self.torch is None:
            return x / (1.0 + np.exp(-x))
        return self.torch.nn.functional.silu(x)

    def concat(self, xs, axis):
        return np.concatenate(xs, axis=axis) if self.torch is None else self.torch.cat(xs, dim=axis)

    def softmax_lastdim(self, s):
        if self.torch is None:
            s = s - s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            return s / s.sum(axis=-1, keepdims=True)
        return self.torch.softmax(s, dim=-1)


def rope_tables(positions: np.ndarray, head_dim: int, theta: float):
    """cos, sin [L, head_dim/2] in float64 then float32, pair i rotating by positions * theta^(-2i/d)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x, cos, sin):
    """x [L, H, D] with adjacent pairs (x[2i], x[2i+1]) rotated; cos/sin [L, D/2]."""
    even, odd = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out_even = even * c - odd * s
    out_odd = even * s + odd * c
    if isinstance(x, np.ndarray):
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = out_even, out_odd
        return out
    import torch
    return torch.stack((out_even, out_odd), dim=-1).flatten(-2)


def exact_causal_attention(ops: Ops, q, k, v, q_offset: int, scale: float, chunk: int = 512):
    """Exact causal GQA attention, bottom-right aligned: query i sits at q_offset + i.
    q [Lq, Hq, D], k/v [Lk, Hkv, D] -> [Lq, Hq, D]. Processes `chunk` queries at a time."""
    lq, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    outs = []
    kt = k.transpose(1, 2, 0) if ops.torch is None else k.permute(1, 2, 0)       # [Hkv, D, Lk]
    vh = v.transpose(1, 0, 2) if ops.torch is None else v.permute(1, 0, 2)       # [Hkv, Lk, D]
    for start in range(0, lq, chunk):
        stop = min(start + chunk, lq)
        n_keys = q_offset + stop
        qc = q[start:stop].reshape(stop - start, hkv, g, d)
        qc = qc.transpose(1, 2, 0, 3) if ops.torch is None else qc.permute(1, 2, 0, 3)   # [Hkv, g, n, D]
        s = qc.reshape(hkv, g * (stop - start), d) @ kt[:, :, :n_keys]                 # [Hkv, g*n, Lk]
        s = s.reshape(hkv, g, stop - start, n_keys) * scale
        pos = np.arange(q_offset + start, q_offset + stop)
        future = np.arange(n_keys)[None, :] > pos[:, None]                             # [n, Lk]
        if ops.torch is None:
            s[:, :, future] = -np.inf
        else:
            s = s.masked_fill(ops.asarray(future.astype(np.float32)).bool(), float("-inf"))
        p = ops.softmax_lastdim(s)
        o = p.reshape(hkv, g * (stop - start), n_keys) @ vh[:, :n_keys]              # [Hkv, g*n, D]
        o = o.reshape(hkv, g, stop - start, d)
        o = o.transpose(2, 0, 1, 3) if ops.torch is None else o.permute(2, 0, 1, 3)
        outs.append(o.reshape(stop - start, hq, d))
    return ops.concat(outs, 0)


class Llama:
    def __init__(self, config: LlamaConfig, weights: dict, ops: Ops | None = None):
        self.cfg = config
        self.ops = ops or Ops()
        w = {k: self.ops.asarray(v) for k, v in weights.items()}
        self.embed = w["token_embd.weight"]                    # [V, d_model]
        self.lm_head = w.get("output.weight", self.embed)       # tied in SmolLM2
        self.final_norm = w["output_norm.weight"]
        self.layers = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            self.layers.append({
                "attn_norm": w[p + "attn_norm.weight"], "ffn_norm": w[p + "ffn_norm.weight"],
                # fused QKV and gate/up projections, transposed once: x @ W
                "wqkv": self._t(self.ops.concat([w[p + "attn_q.weight"], w[p + "attn_k.weight"],
                                                 w[p + "attn_v.weight"]], 0)),
                "wo": self._t(w[p + "attn_output.weight"]),
                "wgu": self._t(self.ops.concat([w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]], 0)),
                "wd": self._t(w[p + "ffn_down.weight"]),
            })
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def _t(self, m):
        return np.ascontiguousarray(m.T) if self.ops.torch is None else m.t().contiguous()

    def _norm(self, x, weight):
        return x * self.ops.rsqrt_mean_sq(x, self.cfg.rms_eps) * weight

    def _qkv(self, layer, h, positions):
        c = self.cfg
        qkv = h @ layer["wqkv"]
        n = h.shape[0]
        q = qkv[:, :c.n_heads * c.head_dim].reshape(n, c.n_heads, c.head_dim)
        k = qkv[:, c.n_heads * c.head_dim:(c.n_heads + c.n_kv_heads) * c.head_dim]
        v = qkv[:, (c.n_heads + c.n_kv_heads) * c.head_dim:]
        k = k.reshape(n, c.n_kv_heads, c.head_dim)
        v = v.reshape(n, c.n_kv_heads, c.head_dim)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        cos, sin = self.ops.asarray(cos), self.ops.asarray(sin)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _mlp(self, layer, x):
        h = self._norm(x, layer["ffn_norm"])
        gu = h @ layer["wgu"]
        gate, up = gu[:, :self.cfg.d_ff], gu[:, self.cfg.d_ff:]
        return x + (self.ops.silu(gate) * up) @ layer["wd"]

    def logits(self, hidden, rows, to_host: bool = True):
        """hidden [L, d_model] (before the final norm) -> float32 logits [len(rows), V], as numpy
        (or, with to_host=False, in the backend's array type: on the GPU they stay there)."""
        if self.ops.torch is not None:
            rows = self.ops.asarray(rows, np.int64)
        h = self._norm(hidden[rows], self.final_norm)
        out = h @ self.lm_head.T
        return self.ops.numpy(out) if to_host else out

    def prefill(self, tokens, attention=None):
        """tokens [L] -> (hidden [L, d_model] before the final norm, cache).
        attention(layer, q, k, v) replaces exact attention in every layer when given."""
        c, ops = self.cfg, self.ops
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.arange(len(tokens))
        x = self.embed[ops.asarray(tokens, np.int64) if ops.torch is not None else tokens]
        cache = []
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, self._norm(x, layer["attn_norm"]), positions)
            if attention is None:
                a = exact_causal_attention(ops, q, k, v, 0, self.scale)
            else:
                a = attention(i, q, k, v)
            cache.append((k, v))
            x = x + a.reshape(len(tokens), c.d_model) @ layer["wo"]
            x = self._mlp(layer, x)
        return x, cache

    def decode_step(self, token: int, cache):
        """One dense decode step at position len(cache[0][0]); extends cache; returns logits [V]."""
        c, ops = self.cfg, self.ops
        pos = cache[0][0].shape[0]
        x = self.embed[[token]] if ops.torch is None else self.embed[ops.asarray([token], np.int64)]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, self._norm(x, layer["attn_norm"]), np.array([pos]))
            k_all = ops.concat([cache[i][0], k], 0)
            v_all = ops.concat([cache[i][1], v], 0)
            cache[i] = (k_all, v_all)
            a = exact_causal_attention(ops, q, k_all, v_all, pos, self.scale)
            x = x + a.reshape(1, c.d_model) @ layer["wo"]
            x = self._mlp(layer, x)
        return self.logits(x, [0])[0]

    def greedy(self, prompt_tokens, n_new: int, attention=None, stop_ids=()):
        """Sparse/dense prefill of the prompt, then dense greedy decode. Returns (new ids, hidden)."""
        hidden, cache = self.prefill(prompt_tokens, attention)
        token = int(np.argmax(self.logits(hidden, [len(prompt_tokens) - 1])[0]))
        out = [token]
        while len(out) < n_new and token not in stop_ids:
            token = int(np.argmax(self.decode_step(token, cache)))
            out.append(token)
        return out, hidden
