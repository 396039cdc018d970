"""dense_attention against the float64 reference: GQA, varlen, cached prefix, dtypes, strides."""

import numpy as np
import pytest

import flashprefill as fp
from conftest import cu_of, random_qkv, reference_attention, rel_l2


@pytest.mark.parametrize("num_heads_q,num_heads_kv,head_dim", [(4, 4, 64), (8, 2, 32), (3, 1, 5)])
def test_dense_matches_float64(rng, num_heads_q, num_heads_kv, head_dim):
    lens_q, lens_kv = [300, 0, 77], [300, 40, 500]
    q, k, v = random_qkv(rng, sum(lens_q), sum(lens_kv), num_heads_q, num_heads_kv, head_dim)
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_kv)
    out, lse = fp.dense_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, cu_q, cu_k)
    assert out.dtype == np.float32 and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (num_heads_q, sum(lens_q))
    assert rel_l2(out, ref) <= 1e-6
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)


def test_softmax_scale(rng):
    q, k, v = random_qkv(rng, 200, 200, 2, 2, 16)
    out = fp.dense_attention(q, k, v, softmax_scale=0.5)
    ref, _ = reference_attention(q, k, v, scale=0.5)
    assert rel_l2(out, ref) <= 1e-6


def test_float16(rng):
    q, k, v = random_qkv(rng, 256, 384, 4, 2, 64, dtype=np.float16)
    out = fp.dense_attention(q, k, v)
    assert out.dtype == np.float16
    ref, _ = reference_attention(q, k, v)
    assert rel_l2(out, ref) <= 1e-3


def test_bfloat16(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = random_qkv(rng, 256, 384, 4, 2, 64, dtype=ml_dtypes.bfloat16)
    out = fp.dense_attention(q, k, v)
    assert out.dtype == ml_dtypes.bfloat16
    ref, _ = reference_attention(q, k, v)
    assert rel_l2(out, ref) <= 1e-2


def test_strided_inputs_and_output(rng):
    """q, k, v as slices of one packed qkv buffer and a head-major view; out into a strided
    destination: the same numbers as the contiguous call."""
    total, num_heads_q, num_heads_kv, head_dim = 333, 4, 2, 32
    qkv = rng.standard_normal((total, num_heads_q + 2 * num_heads_kv, head_dim)).astype(np.float32)
    q = qkv[:, :num_heads_q]
    k = qkv[:, num_heads_q:num_heads_q + num_heads_kv]
    v_heads_major = np.ascontiguousarray(qkv[:, num_heads_q + num_heads_kv:].transpose(1, 0, 2))
    v = v_heads_major.transpose(1, 0, 2)
    assert not q.flags.c_contiguous and not v.flags.c_contiguous
    destination = np.full((num_heads_q, total, head_dim), np.nan, dtype=np.float32)
    out = fp.dense_attention(q, k, v, out=destination.transpose(1, 0, 2))
    expected = fp.dense_attention(np.ascontiguousarray(q), np.ascontiguousarray(k),
                                  np.ascontiguousarray(v))
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(destination.transpose(1, 0, 2), expected)


def test_integer_metadata_is_converted(rng):
    lens = [100, 150]
    q, k, v = random_qkv(rng, 250, 250, 2, 1, 16)
    as_int32 = fp.dense_attention(q, k, v, cu_seqlens_q=cu_of(lens), cu_seqlens_k=cu_of(lens))
    as_list = fp.dense_attention(q, k, v, cu_seqlens_q=[0, 100, 250],
                                 cu_seqlens_k=np.array([0, 100, 250], dtype=np.int64))
    np.testing.assert_array_equal(as_int32, as_list)
