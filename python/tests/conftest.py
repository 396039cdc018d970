"""Shared fixtures and the float64 numpy references the tests compare the library against."""

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

TILE_ROWS = 128
KV_TILE = 64


@pytest.fixture
def rng():
    """A fresh generator per test; the seed is printed so a failure can be replayed."""
    seed = np.random.SeedSequence().entropy % 2**32
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def random_qkv(rng, total_q, total_k, num_heads_q, num_heads_kv, head_dim, dtype=np.float32):
    """q [total_q, Hq, D], k and v [total_k, Hkv, D], standard normal, contiguous."""
    q = rng.standard_normal((total_q, num_heads_q, head_dim)).astype(dtype)
    k = rng.standard_normal((total_k, num_heads_kv, head_dim)).astype(dtype)
    v = rng.standard_normal((total_k, num_heads_kv, head_dim)).astype(dtype)
    return q, k, v


def structured_qkv(rng, total_q, total_k, num_heads_q, num_heads_kv, head_dim, block_size=128):
    """Inputs on which selection is sparse: q rows share one direction per head, and k and v
    are nearly constant within each block of block_size rows, so block energies differ widely
    and a block mean stands in for its keys almost exactly (Eq. 6 then recovers the mass of a
    dropped block). float32, contiguous, shapes as random_qkv."""
    num_blocks = -(-total_k // block_size)
    block_of = np.arange(total_k) // block_size
    shared = rng.standard_normal((1, num_heads_q, head_dim))
    q = 2.0 * shared + rng.standard_normal((total_q, num_heads_q, head_dim))
    k = 1.5 * rng.standard_normal((num_blocks, num_heads_kv, head_dim))[block_of]
    v = rng.standard_normal((num_blocks, num_heads_kv, head_dim))[block_of]
    k += 0.02 * rng.standard_normal(k.shape)
    v += 0.02 * rng.standard_normal(v.shape)
    return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cu_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def reference_attention(q, k, v, cu_q=None, cu_k=None, scale=None, allowed=None):
    """Causal bottom-right attention in float64: (out [total_q, Hq, D], lse [Hq, total_q]).

    `allowed(b, h, L_q, L_kv)`, when given, returns a boolean [L_q, L_kv] mask of the keys a
    sparse index lists for query head h of request b; it is combined with the causal mask.
    """
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    total_q, num_heads_q, head_dim = q.shape
    group = num_heads_q // k.shape[1]
    scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
    cu_q = [0, total_q] if cu_q is None else cu_q
    cu_k = [0, k.shape[0]] if cu_k is None else cu_k
    out = np.zeros(q.shape)
    lse = np.full((num_heads_q, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        len_q, len_kv = q1 - q0, k1 - k0
        if len_q == 0:
            continue
        mask = np.arange(len_kv)[None, :] <= (len_kv - len_q + np.arange(len_q))[:, None]
        for h in range(num_heads_q):
            keep = mask if allowed is None else mask & allowed(b, h, len_q, len_kv)
            logits = np.where(keep, q64[q0:q1, h] @ k64[k0:k1, h // group].T * scale, -np.inf)
            m = logits.max(axis=1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(logits - m)
            denom = p.sum(axis=1, keepdims=True)
            out[q0:q1, h] = (p @ v64[k0:k1, h // group]) / np.where(denom > 0, denom, 1.0)
            lse[h, q0:q1] = (m + np.log(denom))[:, 0]
    return out, lse


def causal_tiles(len_q, len_kv, group, tile):
    """T_c(I): query tile I of a (request, KV head) reaches KV tiles t < T_c (ALGORITHM.md)."""
    rows = group * len_q
    last_row = min(TILE_ROWS * (tile + 1), rows) - 1
    return (len_kv - len_q + last_row // group) // KV_TILE + 1


def first_position(len_q, len_kv, group, tile):
    """pmin(I): the absolute position of query tile I's first packed row."""
    return len_kv - len_q + (TILE_ROWS * tile) // group


def num_q_tiles(len_q, group):
    return -(-group * len_q // TILE_ROWS)
