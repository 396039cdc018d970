"""Varlen batches equal their requests run alone; cached prefixes (L_q < L_kv) align
bottom-right."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, random_qkv, reference_attention, rel_l2

PARAMS = dict(alpha=0.3, sink_tokens=64, window_tokens=128, block_size=128)


@pytest.mark.parametrize("call", ["prefill", "dense_attention"])
def test_batch_equals_each_request_alone(rng, call):
    attend = getattr(fp, call)
    extra = PARAMS if call == "prefill" else {}
    lens_q, lens_kv = [500, 0, 130, 257], [500, 64, 900, 257]
    q, k, v = random_qkv(rng, sum(lens_q), sum(lens_kv), 4, 2, 32)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    out, lse = attend(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True, **extra)
    for b in range(len(lens_q)):
        if lens_q[b] == 0:
            continue
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alone, alone_lse = attend(q[rows], k[keys], v[keys], return_lse=True, **extra)
        np.testing.assert_allclose(out[rows], alone, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse[:, rows], alone_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("len_q,len_kv", [(1, 700), (100, 1024), (129, 130)])
def test_cached_prefix(rng, len_q, len_kv):
    q, k, v = random_qkv(rng, len_q, len_kv, 4, 1, 64)
    ref, _ = reference_attention(q, k, v)
    assert rel_l2(fp.dense_attention(q, k, v), ref) <= 1e-6
    assert rel_l2(fp.prefill(q, k, v, alpha=0.0), ref) <= 1e-5
    out, stats = fp.prefill(q, k, v, return_stats=True, **PARAMS)
    assert np.isfinite(out).all() and 0.0 < stats["density"] <= 1.0


def test_cached_prefix_rows_equal_full_dense_rows(rng):
    """The last L_q queries against all L_kv keys are the last rows of the full problem."""
    length, len_q = 800, 200
    q, k, v = random_qkv(rng, length, length, 2, 2, 32)
    full = fp.dense_attention(q, k, v)
    suffix = fp.dense_attention(q[-len_q:], k, v)
    np.testing.assert_allclose(suffix, full[-len_q:], rtol=1e-6, atol=1e-6)
